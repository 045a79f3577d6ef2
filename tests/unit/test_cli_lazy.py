"""A command line that names its subcommand loads that subcommand alone: a pod's `sync` starts
without the operator's models, kopf or the other subcommands, and every subcommand still parses."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from testkit import REPO
from triton_operator.cli import COMMANDS, _command, build_parser

HEAVY = ("pydantic", "kopf", "lightkube", "triton_operator.models", "triton_operator.handlers")
SYNC_HEAVY = (
    "google.protobuf",
    "triton_operator.core.spec.modelconfig",
    "triton_operator.core.commandline.completion",
)
"""What the sync does not need either: it parses manifests, never a ModelConfig (core.spec.field_error), and
builds no completion script."""


def loaded_after(argv: list[str]) -> set[str]:
    """The modules a fresh interpreter holds after `triton-operator <argv>` has parsed its arguments."""
    code = (
        "import json, sys\n"
        "from triton_operator.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    env = {"PYTHONPATH": str(REPO / "operator" / "src"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, timeout=60, check=True
    )
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_sync_loads_neither_the_models_nor_the_other_subcommands() -> None:
    loaded = loaded_after(["sync", "--help"])
    assert "triton_operator.commands.sync" in loaded
    assert not [m for m in HEAVY if m in loaded]
    assert not [m for m in SYNC_HEAVY if m in loaded]
    others = {_command(n).__name__ for n in COMMANDS if n != "sync"}
    assert not others & loaded


def test_no_subcommand_named_loads_them_all_for_the_help() -> None:
    loaded = loaded_after(["--help"])
    assert {_command(n).__name__ for n in COMMANDS} <= loaded


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_subcommand_parses_with_its_own_parser_alone(name: str) -> None:
    parser = build_parser(name)
    with pytest.raises(SystemExit) as info:
        parser.parse_args([name, "--help"])
    assert info.value.code == 0
    with pytest.raises(SystemExit) as info:
        parser.parse_args([next(n for n in COMMANDS if n != name), "--help"])  # not registered here
    assert info.value.code == 2


def test_version_loads_no_subcommand_and_names_the_package_and_api_versions() -> None:
    from triton_operator import GROUP, VERSION, __version__  # noqa: PLC0415

    loaded = loaded_after(["--version"])
    assert not {_command(n).__name__ for n in COMMANDS} & loaded
    assert not [m for m in HEAVY if m in loaded]
    env = {"PYTHONPATH": str(REPO / "operator" / "src"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "triton_operator.cli", "--version"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    assert done.stdout == f"triton-operator {__version__}\nAPI: {GROUP}/{VERSION}\n"


def test_the_package_version_is_the_projects() -> None:
    import tomllib  # noqa: PLC0415

    from triton_operator import __version__  # noqa: PLC0415

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["version"] == __version__
