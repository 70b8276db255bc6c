"""One engine with a remote tier, in a process of its own, driven over stdin/stdout by the remote tier's
end-to-end tests: `python remote_engine.py MODEL_DIR CONFIG_JSON [LLM_KWARGS_JSON]`, then one JSON command
per line on stdin; each answer is one stdout line starting with RESULT_PREFIX, followed by JSON.
EngineProcess (below) is the tests' side: it starts the script and asks it commands.

Commands:
    {"run": [prompt, ...]}   greedy generation, one request at a time → {"tokens", "prompt_ids", "cached",
                             "new_hashes"
                             (hex of the blocks the manager gained), "ids", "seconds" (each request's
                             wall time), "counters" (the scheduler's and inspection's remote_* counters),
                             "remote_up"}; a prompt is a string, or {"prompt": text, "cache_salt": salt}
    {"batch": [prompt, ...]} the same, all requests in one generate call ("seconds": one, the call's)
    {"holds": [hex, ...]}    where the manager holds these blocks now → {"tiers": [tier or None, ...]}
    {"counters": true}       the counters and the store's state now, without running anything →
                             {"counters", "remote_up"}
    {"flush": seconds}       wait for the remote write queue → {"flushed", "writer"}
    {"explain": request_id}  inspection's explain_request → {"summary", "blocks": [(outcome, tier), ...]}
    {"events": "text"}       reasons of the scheduler's recent events containing text → {"reasons"}
    {"quit": true}           shut the engine down and exit

Why a process of its own: importing LMCache imports numba and so llvmlite, whose library wrapper answers
any attribute; vLLM 0.32's kernel-override scan (triton_utils/dispatcher.py, run at every worker start)
then fails on it, so no engine can start after it in the same process. Each engine here is a separate
process with its own local tiers, which is also the deployment the remote tier exists for.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

RESULT_PREFIX = "RESULT "
SCRIPT = Path(__file__)


class EngineProcess:
    """This script in a child process: ask(command) → its answer. env: variables to set for the child (on
    top of this process's and the PYTHONPATH that makes it import this checkout's tiercache)."""

    def __init__(
        self, model: Path, config: dict, log: Path, llm_kwargs: dict | None = None, env: dict | None = None
    ) -> None:
        from helpers import rank_env

        env = {**os.environ, "PYTHONPATH": rank_env(2)["PYTHONPATH"], **(env or {})}
        self.log = log.open("w")
        argv = [sys.executable, str(SCRIPT), str(model), json.dumps(config), json.dumps(llm_kwargs or {})]
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env,
            cwd=SCRIPT.parent,
        )  # fmt: skip
        assert self._read()["ready"]

    def ask(self, **command) -> dict:
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def _read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(RESULT_PREFIX):
                return json.loads(line[len(RESULT_PREFIX) :])
        raise AssertionError(f"engine process ended (code {self.proc.wait()}); its log: {self.log.name}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=120)
        self.log.close()


def main(model: str, config: dict, llm_kwargs: dict) -> None:
    from helpers import MAX_TOKENS, engine, scheduler_side, tokens, worker_side

    log = logging.getLogger("tiercache")  # its remote-store lines (down, up, why) into this engine's log
    log.setLevel(logging.INFO)
    log.addHandler(logging.StreamHandler(sys.stderr))

    with engine(Path(model), config, **llm_kwargs) as llm:
        from vllm import SamplingParams

        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)  # greedy, as helpers.generate
        sched = scheduler_side(llm)

        def state() -> dict:
            remote = {k: v for k, v in sched.inspection.counters.items() if k.startswith("remote_")}
            return {"counters": {**sched.counters, **remote}, "remote_up": sched.remote.up}

        answer({"ready": True})
        for line in sys.stdin:
            cmd = json.loads(line)
            if "run" in cmd or "batch" in cmd:
                seen = set(sched.manager.view().hashes())
                outs, seconds = [], []
                for group in [[p] for p in cmd["run"]] if "run" in cmd else [cmd["batch"]]:
                    start = time.monotonic()
                    outs += llm.generate(group, params, use_tqdm=False)  # one call: one request, or a batch
                    seconds.append(time.monotonic() - start)
                new = [h.hex() for h in sched.manager.view().hashes() if h not in seen]
                cached = [o.num_cached_tokens for o in outs]
                ids = [o.request_id for o in outs]
                prompt_ids = [list(o.prompt_token_ids) for o in outs]
                answer({"tokens": tokens(outs), "prompt_ids": prompt_ids, "cached": cached, "new_hashes": new,
                        "ids": ids, "seconds": seconds, **state()})  # fmt: skip
            elif "holds" in cmd:
                infos = [sched.manager.info(bytes.fromhex(h)) for h in cmd["holds"]]
                answer({"tiers": [None if info is None else info.tier for info in infos]})
            elif "counters" in cmd:
                answer(state())
            elif "flush" in cmd:
                writer = worker_side().remote.writer
                flushed = writer.flush(cmd["flush"])
                answer({"flushed": flushed, "writer": writer.stats()})
            elif "explain" in cmd:
                from tiercache.inspect import connect

                with connect(state=sched.inspection) as client:
                    why = client.explain_request(request_id=cmd["explain"])
                answer({"summary": why.summary, "blocks": [(b.outcome, b.tier) for b in why.blocks]})
            elif "events" in cmd:
                answer({"reasons": [e.reason for e in sched.events if cmd["events"] in e.reason]})
            else:
                break


def answer(value: dict) -> None:
    print(RESULT_PREFIX + json.dumps(value), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]) if len(sys.argv) > 3 else {})
