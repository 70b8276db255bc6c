"""One engine with a remote tier, in a process of its own, driven over stdin/stdout by
test_e2e_remote.py: `python remote_engine.py MODEL_DIR CONFIG_JSON`, then one JSON command per line on stdin;
each answer is one stdout line starting with RESULT_PREFIX, followed by JSON.

Commands:
    {"run": [prompt, ...]}   greedy generation, one request at a time → {"tokens", "cached", "new_hashes"
                             (hex of the blocks the manager gained), "ids", "counters" (the scheduler's
                             and inspection's remote_* counters), "remote_up"}
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
import sys
from pathlib import Path

RESULT_PREFIX = "RESULT "


def main(model: str, config: dict) -> None:
    from helpers import engine, generate, scheduler_side, tokens, worker_side

    log = logging.getLogger("tiercache")  # its remote-store lines (down, up, why) into this engine's log
    log.setLevel(logging.INFO)
    log.addHandler(logging.StreamHandler(sys.stderr))

    with engine(Path(model), config) as llm:
        sched = scheduler_side(llm)

        def state() -> dict:
            remote = {k: v for k, v in sched.inspection.counters.items() if k.startswith("remote_")}
            return {"counters": {**sched.counters, **remote}, "remote_up": sched.remote.up}

        answer({"ready": True})
        for line in sys.stdin:
            cmd = json.loads(line)
            if "run" in cmd:
                seen = set(sched.manager.view().hashes())
                outs = generate(llm, cmd["run"])
                new = [h.hex() for h in sched.manager.view().hashes() if h not in seen]
                cached = [o.num_cached_tokens for o in outs]
                ids = [o.request_id for o in outs]
                answer({"tokens": tokens(outs), "cached": cached, "new_hashes": new, "ids": ids, **state()})
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
    main(sys.argv[1], json.loads(sys.argv[2]))
