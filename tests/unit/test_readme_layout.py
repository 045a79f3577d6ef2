"""The README's Layout section lists every module of the package, one line each, where it lives."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "src" / "triton_operator"


def layout_paths() -> list[str]:
    """The module paths the Layout block names, rebuilt from its indentation (two spaces a level)."""
    text = (ROOT / "README.md").read_text()
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
