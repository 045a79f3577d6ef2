"""`make plugin`: the single-file kubectl-triton (a zipapp) runs on a bare interpreter and carries only
what the plugin imports."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from testkit import REPO

BASE_PYTHON = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist") / "kubectl-triton"
    subprocess.run(
        [sys.executable, str(REPO / "e2e" / "build_plugin.py"), "--output", str(out)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


def bare(plugin: Path, home: Path, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The plugin on the base interpreter (no venv, no PYTHONPATH), with an empty home."""
    return subprocess.run(
        [str(BASE_PYTHON), "-I", str(plugin), *argv],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(home), **env},
        timeout=120,
        check=False,
    )


def test_the_archive_holds_the_plugins_modules_and_not_the_operators(plugin: Path) -> None:
    assert plugin.read_bytes().startswith(b"#!/usr/bin/env python3\n") and plugin.stat().st_mode & 0o111
    names = set(zipfile.ZipFile(plugin).namelist())
    assert {
        "__main__.py",
        "lib/triton_operator/kubectl_plugin.py",
        "lib/triton_operator/adapters/control.py",
    } <= names
    assert any(n.startswith("lib/lightkube/") for n in names) and any(
        n.startswith("lib/pydantic_core/") for n in names
    )
    for absent in (
        "kopf/",
        "triton_operator/handlers.py",
        "triton_operator/reconcile/",
        "triton_operator/commands/",
    ):
        assert not [n for n in names if n.startswith(f"lib/{absent}")], absent


def test_it_runs_on_a_bare_interpreter_version_completion_and_get_without_a_cluster(
    plugin: Path, tmp_path: Path
) -> None:
    from triton_operator import __version__  # noqa: PLC0415

    alone = subprocess.run(
        [str(BASE_PYTHON), "-I", "-c", "import lightkube"], capture_output=True, check=False
    )
    assert alone.returncode != 0  # the venv's packages are not there: the archive brings its own
    done = bare(plugin, tmp_path, "--version")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == [f"kubectl-triton {__version__}", "API: triton-operator.io/v1alpha1"]
    assert lines[2].startswith("Operator: unknown (cannot read it from the cluster: ")
    assert [p.name for p in (tmp_path / ".cache" / "kubectl-triton").iterdir()]  # unpacked once, there
    done = bare(plugin, tmp_path, "completion", "bash")
    assert done.returncode == 0 and "complete -F _kubectl_triton kubectl-triton" in done.stdout
    dead = tmp_path / "kubeconfig"
    dead.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "d", "cluster": {"server": "https://127.0.0.1:9"}}],
                "users": [{"name": "d", "user": {"token": "t"}}],
                "contexts": [{"name": "d", "context": {"cluster": "d", "user": "d"}}],
                "current-context": "d",
            }
        )
    )
    done = bare(plugin, tmp_path, "get", "-A", "-o", "json", KUBECONFIG=str(dead))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("error: ") and "refused" in done.stderr.lower()
