"""No two modules of triton_operator share a basename: each is named once, by what it does; the same of
the test modules, which pytest imports by basename (tests/ has no __init__.py)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from testkit import REPO

PACKAGE = REPO / "operator" / "src" / "triton_operator"

PENDING: dict[str, str] = {}
"""Basenames still shared, each with the change that ends it; the test fails once one is no longer shared."""


def _modules_by_basename() -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name != "__init__.py":
            found[path.stem].append(str(path.relative_to(PACKAGE)))
    return found


def test_no_two_modules_share_a_basename() -> None:
    shared = {name: paths for name, paths in _modules_by_basename().items() if len(paths) > 1}
    assert {name: paths for name, paths in shared.items() if name not in PENDING} == {}
    stale = sorted(name for name in PENDING if name not in shared)
    assert stale == [], f"no longer shared, remove from PENDING: {stale}"


def test_the_check_sees_the_whole_package() -> None:
    modules = _modules_by_basename()
    assert "decide" in modules
    assert modules["decide"] == [str(Path("core", "decision", "decide.py"))]
    assert len(modules) > 100


def test_no_two_test_modules_share_a_basename() -> None:
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted((REPO / "tests").rglob("*.py")):
        rel = path.relative_to(REPO / "tests")
        if rel.parts[0] != "data" and path.name not in {"__init__.py", "conftest.py"}:
            found[path.stem].append(str(rel))
    assert {name: paths for name, paths in found.items() if len(paths) > 1} == {}
    assert "test_module_names" in found
