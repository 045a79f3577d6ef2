"""The `triton-operator` command line: run | render | import | crd | sync | node-cache | agent | leave."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

# Each subcommand lives in triton_operator.commands.<module> and exposes
# ``register(subparsers) -> None`` which adds its parser and sets ``func``. A command line that
# names its subcommand loads that module alone: a pod's `sync` init container starts without the
# operator's models, the agent or the importer.
COMMANDS: tuple[str, ...] = ("run", "render", "import", "crd", "sync", "node-cache", "agent", "leave")
"""The subcommands, in the order the help lists them; _command imports each one's module."""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or of the subcommand ``only`` alone."""
    parser = argparse.ArgumentParser(
        prog="triton-operator",
        description="Run NVIDIA Triton Inference Server on Kubernetes from one TritonService resource.",
    )
    parser.add_argument("--version", action=_Version, help="print the version and the CRD's API version")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        if only is None or name == only:
            _command(name).register(subparsers)
    if only is None:
        completion = subparsers.add_parser(
            "completion",
            help="print a shell completion script (bash, zsh, fish)",
            description="Print a completion script for triton-operator: source <(triton-operator completion "
            "bash), source <(triton-operator completion zsh), triton-operator completion fish | source.",
        )
        completion.add_argument("shell", choices=("bash", "zsh", "fish"), metavar="bash|zsh|fish")
        completion.set_defaults(func=lambda args: _completion(parser, args.shell))
    return parser


def _completion(parser: argparse.ArgumentParser, shell: str) -> int:
    from triton_operator.core.commandline.completion import script  # noqa: PLC0415 - only when asked

    sys.stdout.write(script(shell, "triton-operator", parser))
    return 0


class _Version(argparse.Action):
    """argparse's version action, without re-wrapping the lines."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:  # noqa: A002
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        sys.stdout.write(version_text() + "\n")
        parser.exit()


def version_text() -> str:
    """`triton-operator --version`: the package's version and the CRD's API version it serves."""
    from triton_operator import GROUP, VERSION, __version__  # noqa: PLC0415 - constants only

    return f"triton-operator {__version__}\nAPI: {GROUP}/{VERSION}"


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
    if name == "leave":
        from triton_operator.commands import leave  # noqa: PLC0415 - imported when named

        return leave
    from triton_operator.commands import agent  # noqa: PLC0415 - imported when named

    return agent


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    named = next((a for a in argv if not a.startswith("-")), None)
    if named is None and "--version" in argv:
        named = ""  # no subcommand's module is needed to print the version
    parser = build_parser(named if named in (*COMMANDS, "") else None)
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
