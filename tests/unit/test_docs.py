"""README.md and docs/ stay true to the tree: links resolve, named files, tests and make targets exist,
and the architecture's Layout lists every module of the package."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from testkit import REPO

PACKAGE = REPO / "operator" / "src" / "triton_operator"
DOCS = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
TOP = ("operator/", "tests/", "e2e/", "bench/", "examples/", "charts/", "crds/", "manifests/", "docs/")
NAMED = re.compile(r"(?<![\w./-])((?:" + "|".join(map(re.escape, TOP)) + r")[\w./\-]*(?:::\w+)?)")


def doc_id(path: Path) -> str:
    return str(path.relative_to(REPO))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens.

    >>> slug("Canary analysis on Triton's own numbers")
    'canary-analysis-on-tritons-own-numbers'
    >>> slug("`kubectl triton`")
    'kubectl-triton'
    """
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M)}


def links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return [m.group(1) for m in re.finditer(r"\]\(([^)\s]+)\)", text) if "://" not in m.group(1)]


def named_paths(path: Path) -> list[str]:
    """Repository paths a document names in backticks or commands: `tests/unit/x.py::test_y`, `bench/...`."""
    found = []
    for m in NAMED.finditer(path.read_text()):
        name = m.group(1).rstrip(".,:;")
        if "<" in name or "*" in name:
            continue
        found.append(name)
    return found


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_relative_link_resolves(doc: Path) -> None:
    broken = []
    for link in links(doc):
        target, _, anchor = link.partition("#")
        dest = (doc.parent / target).resolve() if target else doc
        if not dest.exists():
            broken.append(f"{link}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{link}: no heading with anchor #{anchor}")
    assert not broken, broken


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_named_file_and_test_exists(doc: Path) -> None:
    missing = []
    for name in named_paths(doc):
        file, _, test = name.partition("::")
        if not (REPO / file).exists():
            missing.append(f"{name}: no such path")
        elif test and not re.search(
            rf"^\s*((async )?def|class) {re.escape(test)}\b", (REPO / file).read_text(), re.M
        ):
            missing.append(f"{name}: no test {test} in {file}")
    assert not missing, missing


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_make_target_and_console_script_exists(doc: Path) -> None:
    makefile = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):", makefile, re.M))
    scripts = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])
    tools = {"python", "python3", "pytest", "ruff", "mypy", "lint-imports", "pip"}
    text = doc.read_text()
    wrong = [f"make {t}" for t in re.findall(r"`make ([\w-]+)", text) if t not in targets]
    wrong += [f".venv/bin/{s}" for s in re.findall(r"\.venv/bin/([\w-]+)", text) if s not in scripts | tools]
    assert not wrong, wrong


def layout_paths() -> list[str]:
    """The module paths docs/architecture.md's Layout names, from its indentation (two spaces a level)."""
    text = (REPO / "docs" / "architecture.md").read_text()
    block = text[text.index("## Layout\n") :]
    block = block[block.index("```\n") + 4 : block.index("\n```", block.index("```\n") + 4)]
    lines = block.splitlines()
    start = lines.index("operator/src/triton_operator/") + 1
    folders: list[str] = []
    paths: list[str] = []
    for line in lines[start:]:
        if not line.startswith("  "):
            break
        depth = (len(line) - len(line.lstrip(" "))) // 2
        name = line.split()[0]
        folders = folders[: depth - 1]
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
        else:
            paths.append("/".join([*folders, name]))
    return paths


def test_every_module_has_one_line_in_the_layout() -> None:
    modules = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py")
    listed = layout_paths()
    assert len(listed) == len(set(listed)), "a module is listed twice"
    assert sorted(listed) == modules
