"""The core imports no I/O library: the import-linter exceptions are checked to the submodule here.

core/spec/modelconfig.py loads tritonclient's model_config_pb2.py by its path (not through the
tritonclient.grpc package, which imports grpc and numpy): import-linter cannot see that load, so the
runtime test below imports every core module and checks what of google and tritonclient got loaded.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testkit import REPO

CORE = REPO / "operator" / "src" / "triton_operator" / "core"
ALLOWED_PREFIXES = ("google.protobuf", "tritonclient.grpc.model_config_pb2")
WATCHED_ROOTS = ("google", "tritonclient")


def imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.extend(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("path", sorted(CORE.rglob("*.py")), ids=lambda p: str(p.relative_to(CORE)))
def test_core_uses_only_protobuf_data_of_google_and_tritonclient(path: Path) -> None:
    offending = [
        name
        for name in imported_modules(path)
        if name.split(".")[0] in WATCHED_ROOTS and not name.startswith(ALLOWED_PREFIXES)
    ]
    assert offending == [], f"{path.name} imports {offending}"


def test_the_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from google.cloud import storage\nfrom tritonclient.http import InferenceServerClient\n")
    flagged = [n for n in imported_modules(bad) if not n.startswith(ALLOWED_PREFIXES)]
    assert flagged == ["google.cloud.storage", "tritonclient.http.InferenceServerClient"]


def test_every_core_module_loads_only_protobuf_data_of_google_and_tritonclient() -> None:
    paths = [p.relative_to(CORE).with_suffix("") for p in CORE.rglob("*.py") if p.stem != "__init__"]
    modules = sorted(".".join(p.parts) for p in paths)
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module('triton_operator.core.' + m)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env)
    loaded = json.loads(out.stdout)
    assert "tritonclient.grpc.model_config_pb2" in loaded
    offending = [
        name
        for name in loaded
        if name.split(".")[0] in WATCHED_ROOTS
        and name not in ("google", "tritonclient")  # the namespace and the (empty) package
        and not name.startswith((*ALLOWED_PREFIXES, "google._upb"))  # protobuf's C runtime
    ]
    assert offending == []
