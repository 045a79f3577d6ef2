"""Shell completion of both CLIs: scripts generated from their argparse parsers, run in a real bash."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from testkit import REPO

ENV = {"PYTHONPATH": str(REPO / "operator" / "src"), "PATH": "/usr/bin:/bin"}
CLIS = {"triton-operator": "triton_operator.cli", "kubectl-triton": "triton_operator.kubectl_plugin"}


def generated(prog: str, shell: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", CLIS[prog], "completion", shell],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
        check=True,
    )
    return done.stdout


def complete(prog: str, line: str) -> list[str]:
    """What bash offers after ``line`` (its last word being completed), with the generated script."""
    words = line.split(" ")
    code = (
        f"source /dev/stdin\nCOMP_WORDS=({' '.join(repr(w) for w in words)})\nCOMP_CWORD={len(words) - 1}\n"
        f"_{prog.replace('-', '_')}\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n"
    )
    script = generated(prog, "bash")
    done = subprocess.run(
        ["bash", "-c", code], input=script, capture_output=True, text=True, timeout=30, check=True, cwd=REPO
    )
    return [w for w in done.stdout.splitlines() if w]


@pytest.mark.parametrize(
    ("prog", "line", "expected"),
    [
        (
            "kubectl-triton",
            "kubectl-triton ",
            ["get", "status", "promote", "tune", "completion", "--version"],
        ),
        ("kubectl-triton", "kubectl-triton st", ["status"]),
        ("kubectl-triton", "kubectl-triton get -", ["-o", "--output", "--watch", "--context", "-A"]),
        ("kubectl-triton", "kubectl-triton -n ml get -o ", ["json", "yaml", "name"]),
        ("kubectl-triton", "kubectl-triton tune x --output ", ["json", "yaml"]),
        ("kubectl-triton", "kubectl-triton completion ", ["bash", "zsh", "fish"]),
        ("triton-operator", "triton-operator ", ["run", "render", "import", "sync", "agent", "completion"]),
        ("triton-operator", "triton-operator render -o ", ["yaml", "json", "name"]),
        ("triton-operator", "triton-operator sync --", ["--help"]),
    ],
)
def test_bash_completes_subcommands_options_and_choices(prog: str, line: str, expected: list[str]) -> None:
    offered = complete(prog, line)
    assert set(expected) <= set(offered), offered


def test_bash_offers_no_choices_where_the_last_word_is_a_free_value() -> None:
    assert complete("kubectl-triton", "kubectl-triton get --context ") == []
    assert complete("kubectl-triton", "kubectl-triton status x -o j") == ["json"]


@pytest.mark.parametrize("prog", sorted(CLIS))
def test_zsh_and_fish_scripts_name_every_subcommand_and_choice(prog: str) -> None:
    zsh = generated(prog, "zsh")
    assert "bashcompinit" in zsh and f"complete -F _{prog.replace('-', '_')} {prog}" in zsh
    fish = generated(prog, "fish")
    lines = fish.splitlines()
    assert all(line.startswith(("#", f"complete -c {prog} ")) for line in lines)
    assert f"complete -c {prog} -n '__fish_use_subcommand' -a completion" in lines
    assert (
        f"complete -c {prog} -n '__fish_seen_subcommand_from completion' -x -a 'bash zsh fish'" not in lines
    )
    if prog == "kubectl-triton":
        assert f"complete -c {prog} -n '__fish_seen_subcommand_from get' -s o -x -a 'json yaml name'" in lines
        assert f"complete -c {prog} -n '__fish_seen_subcommand_from get' -l kubeconfig -r -F" in lines
    else:
        assert (
            f"complete -c {prog} -n '__fish_seen_subcommand_from render' -l output -x -a 'json yaml name'"
            in lines
        )


def test_an_unknown_shell_is_refused() -> None:
    done = subprocess.run(
        [sys.executable, "-m", CLIS["kubectl-triton"], "completion", "tcsh"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "invalid choice: 'tcsh'" in done.stderr


def test_a_file_option_completes_file_names() -> None:
    offered = complete("triton-operator", "triton-operator render -f pyproject.t")
    assert offered == ["pyproject.toml"]


def test_kubectl_runs_the_kubectl_complete_program_for_kubectl_triton(tmp_path: Path) -> None:
    """kubectl (1.26+) completes `kubectl triton ...` by running kubectl_complete-triton with the
    words after `triton` and reading Cobra's answer: candidates, then `:4`."""
    program = tmp_path / "kubectl_complete-triton"
    program.write_text(generated("kubectl-triton", "kubectl"))
    program.chmod(0o755)

    def answer(*words: str) -> list[str]:
        done = subprocess.run([str(program), *words], capture_output=True, text=True, timeout=30, check=True)
        return done.stdout.splitlines()

    assert answer("get", "-o", "") == ["json", "yaml", "name", ":4"]
    assert answer("sta") == ["status", ":4"]
    assert {"get", "status", "tune", "completion"} <= set(answer()[:-1]) and answer()[-1] == ":4"
    assert answer("completion", "")[:4] == ["bash", "zsh", "fish", "kubectl"]
