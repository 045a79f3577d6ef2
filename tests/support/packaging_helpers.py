"""Helpers of the packaging tests: charts/chartlib.py loaded as a module, lookups in rendered documents."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testkit import load_chartlib

chartlib = load_chartlib()

Render = Callable[..., list[dict[str, Any]]]
"""The `render` fixture: render(values: dict | None = None, *sets) -> rendered documents."""


def render_error(helm: Path, *sets: str) -> str:
    """Render with ``sets`` expecting helm to fail; return its message."""
    cmd = [str(helm), "template", "triton-operator", str(chartlib.CHART_DIR)]
    cmd += ["--kube-version", chartlib.kube_version_or_default()]
    proc = subprocess.run(
        [*cmd, *[a for s in sets for a in ("--set", s)]], check=False, capture_output=True, text=True
    )
    assert proc.returncode != 0, f"helm template {' '.join(sets)} unexpectedly succeeded"
    return proc.stderr


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["operator"]
    result: dict[str, Any] = spec["containers"][0]
    return result


def env(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(docs)["env"]}
