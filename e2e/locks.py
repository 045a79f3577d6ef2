#!/usr/bin/env python3
"""The hash-pinned installs (requirements/*.lock), regenerated from pyproject.toml by `make lock`.

    python3 e2e/locks.py compile            re-resolve the locks (`make lock`), keeping every pin that
                                            still fits pyproject.toml
    python3 e2e/locks.py compile --upgrade  re-resolve to the newest versions it admits (`make lock-upgrade`)
    python3 e2e/locks.py unlocked LOCK...   the distributions this Python has that no LOCK names
                                            (e2e/bootstrap removes them from .venv), the project's aside

Three locks, for CPython 3.11 on Linux x86_64 with glibc 2.36 (Debian bookworm: this machine and the
image), each `name==version` with the sha256 of every file PyPI has for that version (pip install
--require-hashes --no-deps -r LOCK):
  requirements/build.lock    pyproject.toml's [build-system] requires and pip: what builds the package
  requirements/test.lock     the build lock, the dependencies and the `test` extra: e2e/bootstrap's .venv
  requirements/runtime.lock  the dependencies alone, at the test lock's versions: the image (Dockerfile)
The runtime lock is resolved with the test lock as constraints, so the image runs what the tests ran.
The resolver is uv (UV_VERSION, installed from PyPI with pip into the cache folder on first use).
tests/packaging/test_locks.py checks that the locks agree with pyproject.toml. Standard library only.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ROOT / "requirements"
UV_VERSION = "0.13.9"
CACHE = Path(os.environ.get("TRITON_OPERATOR_CACHE") or Path.home() / ".cache" / "triton-operator")
UV = CACHE / f"uv-{UV_VERSION}" / "bin" / "uv"
PYTHON_VERSION = "3.11"
PLATFORM = "x86_64-manylinux_2_36"


PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(\S+)")
HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")
PROJECT = "triton-operator"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> dict[str, tuple[str, list[str]]]:
    """A lock's pins: canonical name -> (version, the sha256 hashes of its files)."""
    pins: dict[str, tuple[str, list[str]]] = {}
    current: str | None = None
    for line in path.read_text().splitlines():
        pin = PIN.match(line.rstrip(" \\"))
        if pin:
            current = canonical(pin.group(1))
            if current in pins:
                raise ValueError(f"{path}: {current} is pinned twice")
            pins[current] = (pin.group(2), [])
        elif line.startswith((" ", "\t")) and "--hash=" in line and current is not None:
            pins[current][1].extend(HASH.findall(line))
        elif not line.startswith((" ", "\t", "#")) and line.strip():
            raise ValueError(f"{path}: not a `name==version` pin: {line!r}")
        elif not line.startswith((" ", "\t")):
            current = None
    return pins


def unlocked(locks: list[Path]) -> list[str]:
    """The distributions installed in this Python that none of ``locks`` pins (the project aside)."""
    pinned = {name for lock in locks for name in read_lock(lock)}
    installed = {canonical(d.metadata["Name"]) for d in importlib.metadata.distributions()}
    return sorted(installed - pinned - {PROJECT})


def uv() -> Path:
    """The pinned uv, in a virtualenv of its own under the cache folder."""
    if not UV.exists():
        venv = UV.parent.parent
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, f"uv=={UV_VERSION}"], check=True)
    return UV


def compile_lock(output: Path, sources: list[str], extra: list[str], upgrade: bool) -> None:
    cmd = [str(uv()), "pip", "compile", "--quiet", "--generate-hashes", "--no-strip-extras"]
    cmd += ["--python-version", PYTHON_VERSION, "--python-platform", PLATFORM]
    cmd += ["--custom-compile-command", "make lock", "--output-file", str(output.relative_to(ROOT))]
    cmd += [*(["--upgrade"] if upgrade else []), *extra, *sources]
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "UV_NO_CONFIG": "1"})


def compile_locks(upgrade: bool) -> None:
    build_requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    LOCKS.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        # The build requirements (and pip) as a file of their own; the locks' comments name it so.
        build_in = Path(tmp) / "build-system.requires"
        build_in.write_text("\n".join([*build_requires, "pip"]) + "\n")
        compile_lock(LOCKS / "build.lock", [str(build_in)], [], upgrade)
        compile_lock(
            LOCKS / "test.lock",
            ["pyproject.toml", str(build_in)],
            ["--extra", "test", "--constraint", "requirements/build.lock"],
            upgrade,
        )
        for lock in (LOCKS / "build.lock", LOCKS / "test.lock"):
            lock.write_text(lock.read_text().replace(str(build_in), "pyproject.toml [build-system] requires"))
    runtime_extra = ["--constraint", "requirements/test.lock"]
    compile_lock(LOCKS / "runtime.lock", ["pyproject.toml"], runtime_extra, upgrade)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    compile_ = commands.add_parser("compile", help="write requirements/*.lock from pyproject.toml")
    compile_.add_argument("--upgrade", action="store_true", help="newest versions pyproject.toml admits")
    listing = commands.add_parser("unlocked", help="installed distributions that no lock pins")
    listing.add_argument("locks", nargs="+", type=Path)
    args = parser.parse_args(argv)
    if args.command == "compile":
        compile_locks(args.upgrade)
    else:
        print(" ".join(unlocked(args.locks)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
