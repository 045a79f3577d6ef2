"""Every distribution the operator's code imports is declared in pyproject.toml's dependencies (what
a TYPE_CHECKING block imports: in the test extra), and the version ranges admit what the code needs."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import re
import sys
import tomllib
from functools import cache
from pathlib import Path

from testkit import REPO

SOURCE = REPO / "operator" / "src" / "triton_operator"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert match, requirement
    return canonical(match.group(0))


DECLARED = {requirement_name(r) for r in PYPROJECT["project"]["dependencies"]}
TEST_EXTRA = {requirement_name(r) for r in PYPROJECT["project"]["optional-dependencies"]["test"]}


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
    return lines


def _optional_lines(tree: ast.Module) -> set[int]:
    """The lines of a ``try:`` that catches ImportError: an optional import, whose absence the code
    handles (azure-identity for Azure workload identity)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        catches = [ast.unparse(h.type) for h in getattr(node, "handlers", []) if h.type is not None]
        if isinstance(node, ast.Try) and any("ImportError" in caught for caught in catches):
            for inner in node.body:
                lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
    return lines


def imported_modules() -> dict[str, tuple[str, bool]]:
    """Every absolute module the package imports (its own, the standard library's and optional ones
    left out): the deepest importable name -> (where, whether only for type checking)."""
    found: dict[str, tuple[str, bool]] = {}
    for path in sorted(SOURCE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        typing_only = _type_checking_lines(tree)
        optional = _optional_lines(tree)
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in optional:
                continue
            names: list[str] = []
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in ("triton_operator", "__future__"):
                    continue
                where = f"{path.relative_to(REPO)}:{node.lineno}"
                only_types = node.lineno in typing_only
                earlier = found.get(name)
                found[name] = (where, only_types and (earlier is None or earlier[1]))
    return found


@cache
def _file_owners() -> dict[Path, str]:
    owners: dict[Path, str] = {}
    for dist in importlib.metadata.distributions():
        for file in dist.files or []:
            if file.suffix in (".py", ".so", ".pyd"):
                owners[Path(str(dist.locate_file(file))).resolve()] = canonical(dist.metadata["Name"])
    return owners


def distribution_of(module: str) -> str | None:
    """The installed distribution whose files hold ``module`` (the deepest importable prefix of it:
    ``from google.cloud import storage`` is google-cloud-storage, not another google-* package)."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        try:
            spec = importlib.util.find_spec(".".join(parts[:end]))
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.origin and spec.origin not in ("built-in", "frozen"):
            return _file_owners().get(Path(spec.origin).resolve())
    return None


def test_every_imported_distribution_is_declared() -> None:
    undeclared = []
    for module, (where, only_types) in sorted(imported_modules().items()):
        dist = distribution_of(module)
        assert dist is not None, f"{module} ({where}) is not installed"
        allowed = DECLARED | TEST_EXTRA if only_types else DECLARED
        # An extra's package (boto3-stubs[s3] installs mypy-boto3-s3) counts as its extra's.
        if dist not in allowed and not (only_types and dist.startswith("mypy-boto3-")):
            undeclared.append(f"{dist} (import {module}, {where})")
    assert undeclared == [], "imported but not declared in pyproject.toml's dependencies"


def test_the_imports_are_found() -> None:
    """The check above sees the imports it must judge (not a walk that finds nothing)."""
    modules = imported_modules()
    assert "google_crc32c" in modules
    assert "httpx2.HTTPError" in modules or any(m.startswith("httpx2") for m in modules)
    assert {distribution_of("google.cloud.storage"), distribution_of("google.protobuf.message")} == {
        "google-cloud-storage",
        "protobuf",
    }


def _requirement(name: str) -> str:
    return str(next(r for r in PYPROJECT["project"]["dependencies"] if requirement_name(r) == name))


def test_lightkube_is_bounded_to_the_releases_on_httpx2() -> None:
    """lightkube 1.0 moved from httpx to httpx2, which adapters.kube catches errors of: a 0.x
    lightkube would raise httpx's, which the operator would not know as transient."""
    spec = _requirement("lightkube")
    assert ">=1.0" in spec
    assert "<2" in spec
    requires = importlib.metadata.requires("lightkube") or []
    assert any(requirement_name(r) == "httpx2" for r in requires)


def test_kopf_is_bounded_to_the_tested_minor_release() -> None:
    """core.edges.peering_rules copies kopf's pause rule (tests/unit/test_peering.py compares it with kopf's
    own function): a kopf outside the tested range could change the rule unseen."""
    spec = _requirement("kopf")
    upper = re.search(r"<(\d+)\.(\d+)", spec)
    assert upper, f"kopf has no upper bound: {spec}"
    installed = tuple(int(p) for p in importlib.metadata.version("kopf").split(".")[:2])
    assert installed < (int(upper.group(1)), int(upper.group(2)))


def test_the_installed_versions_are_inside_the_declared_ranges() -> None:
    """The environment the tests run in is one the declared ranges admit: the bounds are the tested ones."""
    from packaging.requirements import Requirement  # noqa: PLC0415 - pytest's own dependency

    outside = []
    for text in PYPROJECT["project"]["dependencies"]:
        requirement = Requirement(text)
        version = importlib.metadata.version(requirement.name)
        if not requirement.specifier.contains(version, prereleases=True):
            outside.append(f"{requirement.name} {version} (declared {requirement.specifier})")
    assert outside == []
