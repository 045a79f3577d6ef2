"""The `triton-operator` command line: run | render | import | crd | sync."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Each subcommand lives in triton_operator.commands.<module> and exposes
# ``register(subparsers) -> None`` which adds its parser and sets ``func``.
SUBCOMMANDS: tuple[str, ...] = ("run", "render", "import_", "crd", "sync")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="triton-operator",
        description="Run NVIDIA Triton Inference Server on Kubernetes from one TritonService resource.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"triton_operator.commands.{name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
