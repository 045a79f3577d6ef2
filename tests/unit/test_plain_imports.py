"""The operator imports its modules plainly, so that import-linter's contracts see every import."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from testkit import REPO

SRC = REPO / "operator" / "src" / "triton_operator"
INDIRECTIONS = ("importlib.import_module", "importlib.util", "importlib.__import__", "__import__")
EXCEPTIONS = {
    # Triton's ModelConfig protobuf module is loaded from tritonclient/grpc/model_config_pb2.py by path:
    # a plain import runs tritonclient.grpc's package init (grpc, numpy, the gRPC client: about 38 MiB
    # of the operator's start-up memory). What it loads is checked by tests/unit/test_purity.py and
    # tests/unit/test_operator_imports.py instead of import-linter.
    "core/spec/modelconfig.py",
}


def indirections(source: str, filename: str = "<source>") -> list[str]:
    """Each `importlib` import or dynamic-import call in ``source``, as 'line: text'."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names]
            if any(name.split(".")[0] == "importlib" for name in names):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and ast.unparse(node.func).startswith(INDIRECTIONS):
            found.append(f"{node.lineno}: {ast.unparse(node.func)}(...)")
    return found


@pytest.mark.parametrize("path", sorted(SRC.rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_the_operator_has_no_import_indirection(path: Path) -> None:
    if str(path.relative_to(SRC)) in EXCEPTIONS:
        assert indirections(path.read_text(), str(path)), "an exception that no longer needs to be one"
        return
    assert indirections(path.read_text(), str(path)) == [], (
        f"{path.relative_to(SRC)}: import the module plainly (inside the function that needs it "
        "when it must stay lazy), so that lint-imports checks it"
    )


def test_the_check_sees_every_kind_of_indirection() -> None:
    source = (
        "import importlib\n"
        "from importlib import util\n"
        "def f():\n"
        "    importlib.import_module('triton_operator.handlers')\n"
        "    __import__('kopf')\n"
        "    from triton_operator import handlers\n"
    )
    assert indirections(source) == [
        "1: import importlib",
        "2: from importlib import util",
        "4: importlib.import_module(...)",
        "5: __import__(...)",
    ]
