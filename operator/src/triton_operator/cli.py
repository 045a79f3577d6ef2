"""The `triton-operator` command line: run | render | import | crd | sync | node-cache | agent."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

# Each subcommand lives in triton_operator.commands.<module> and exposes
# ``register(subparsers) -> None`` which adds its parser and sets ``func``. A command line that
# names its subcommand loads that module alone: a pod's `sync` init container starts without the
# operator's models, the agent or the importer.
COMMANDS: tuple[str, ...] = ("run", "render", "import", "crd", "sync", "node-cache", "agent")
"""The subcommands, in the order the help lists them; _command imports each one's module."""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or of the subcommand ``only`` alone."""
    parser = argparse.ArgumentParser(
        prog="triton-operator",
        description="Run NVIDIA Triton Inference Server on Kubernetes from one TritonService resource.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        if only is None or name == only:
            _command(name).register(subparsers)
    return parser


def _command(name: str) -> ModuleType:
    """The module of subcommand ``name``, imported now (plain imports, so lint-imports sees them)."""
    if name == "run":
        from triton_operator.commands import run  # noqa: PLC0415 - imported when named

        return run
    if name == "render":
        from triton_operator.commands import render  # noqa: PLC0415 - imported when named

        return render
    if name == "import":
        from triton_operator.commands import import_  # noqa: PLC0415 - imported when named

        return import_
    if name == "crd":
        from triton_operator.commands import crd  # noqa: PLC0415 - imported when named

        return crd
    if name == "sync":
        from triton_operator.commands import sync  # noqa: PLC0415 - imported when named

        return sync
    if name == "node-cache":
        from triton_operator.commands import node_cache  # noqa: PLC0415 - imported when named

        return node_cache
    from triton_operator.commands import agent  # noqa: PLC0415 - imported when named

    return agent


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    named = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(named if named in COMMANDS else None)
    args = parser.parse_args(argv)
    try:
        result: int = args.func(args)
    except ValueError as exc:
        from triton_operator.settings import SettingsError  # noqa: PLC0415 - only when one failed

        if not isinstance(exc, SettingsError):
            raise
        print(f"triton-operator: {exc}", file=sys.stderr)  # a bad setting stops the process
        return 2
    return result


if __name__ == "__main__":
    sys.exit(main())
