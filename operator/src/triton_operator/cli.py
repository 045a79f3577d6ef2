"""The `triton-operator` command line: run | render | import | crd | sync | node-cache | agent."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

from triton_operator.commands import agent, crd, import_, node_cache, render, run, sync

# Each subcommand lives in triton_operator.commands.<module> and exposes
# ``register(subparsers) -> None`` which adds its parser and sets ``func``.
_COMMANDS: tuple[ModuleType, ...] = (run, render, import_, crd, sync, node_cache, agent)
SUBCOMMANDS: tuple[str, ...] = tuple(module.__name__.rsplit(".", 1)[1] for module in _COMMANDS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="triton-operator",
        description="Run NVIDIA Triton Inference Server on Kubernetes from one TritonService resource.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in _COMMANDS:
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
