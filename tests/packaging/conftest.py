"""Fixtures of the packaging tests: the helm and kubeconform binaries, and chart rendering."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from packaging_helpers import Render, chartlib


def _tool(name: str) -> Path:
    path = chartlib.find_tool(name)
    if path is None:
        pytest.skip(
            f"{name} is not built yet: `python3 e2e/cluster.py build` puts it under "
            f"~/.cache/triton-operator/bin/<key>/ (or set ${name.upper()})"
        )
    return Path(path)


@pytest.fixture(scope="session")
def helm() -> Path:
    return _tool("helm")


@pytest.fixture(scope="session")
def kubeconform() -> Path:
    return _tool("kubeconform")


@pytest.fixture(scope="session")
def render(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> Render:
    """render(values: dict | None = None, *sets) -> the rendered documents (templates only, no crds/)."""
    counter = iter(range(1_000_000))

    def _render(values: dict[str, Any] | None = None, *sets: str) -> list[dict[str, Any]]:
        files = []
        if values is not None:
            path = tmp_path_factory.getbasetemp() / f"values-{next(counter)}.yaml"
            path.write_text(yaml.safe_dump(values))
            files.append(path)
        text = chartlib.helm_template(files, sets, helm=helm)
        return [d for d in yaml.safe_load_all(text) if d]

    return _render
