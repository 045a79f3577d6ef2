#!/usr/bin/env python3
"""perf_analyzer 2.51.0 on this machine, for the tests of `kubectl triton tune` (run by e2e/bootstrap).

    .venv/bin/python e2e/perf_analyzer.py install    fetch and set it up (a no-op once done)
    .venv/bin/python e2e/perf_analyzer.py path       print the wrapper's path; exit 1 when not installed

The PyPI `perf-analyzer` package is an empty placeholder; the binary is in tritonclient's manylinux
wheel (the version of the tritonserver the project runs: 2.51.0, nvidia-pytriton 0.7.0's). It links
libb64.so.0d and libcudart.so.12, which the nvidia-pytriton wheel (in .venv) ships under other names
in nvidia_pytriton.libs: they are linked there under their sonames, in a folder of our own. The
wrapper sets LD_LIBRARY_PATH and runs it. The pod image (e2e/images/tritonserver/Containerfile)
does the same. Standard library only.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

VERSION = "2.51.0"
CACHE = Path(os.environ.get("TRITON_OPERATOR_CACHE") or Path.home() / ".cache" / "triton-operator")
HOME = CACHE / f"perf_analyzer-{VERSION}"
WRAPPER = HOME / "bin" / "perf_analyzer"
MEMBER = f"tritonclient-{VERSION}.data/data/bin/perf_analyzer"
SONAMES = {"libb64.so.0d": "libb64-", "libcudart.so.12": "libcudart-"}


def pytriton_libs() -> Path:
    """nvidia_pytriton.libs of the nvidia-pytriton wheel this Python has."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("nvidia-pytriton is not installed in this Python (e2e/bootstrap installs it)")
    libs = Path(next(iter(spec.submodule_search_locations))).parent / "nvidia_pytriton.libs"
    if not libs.is_dir():
        raise RuntimeError(f"{libs} is missing")
    return libs


def installed() -> Path | None:
    return WRAPPER if WRAPPER.is_file() and os.access(WRAPPER, os.X_OK) else None


def install() -> Path:
    """Fetch tritonclient's wheel (pip), take perf_analyzer out, link its libraries, write the wrapper."""
    if installed():
        return WRAPPER
    libs = pytriton_libs()
    (HOME / "bin").mkdir(parents=True, exist_ok=True)
    (HOME / "lib").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        subprocess.run(
            [
                *[sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"],
                *["--platform", "manylinux1_x86_64", "-d", tmp, f"tritonclient=={VERSION}"],
            ],
            check=True,
        )
        (wheel,) = Path(tmp).glob("tritonclient-*.whl")
        binary = HOME / "lib" / "perf_analyzer"
        with zipfile.ZipFile(wheel) as z:
            binary.write_bytes(z.read(MEMBER))
        binary.chmod(0o755)
    for soname, prefix in SONAMES.items():
        (found,) = sorted(libs.glob(f"{prefix}*"))
        link = HOME / "lib" / soname
        link.unlink(missing_ok=True)
        link.symlink_to(found)
    WRAPPER.write_text(
        "#!/bin/sh\n"
        f'LD_LIBRARY_PATH="{HOME / "lib"}:{libs}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" '
        f'exec "{HOME / "lib" / "perf_analyzer"}" "$@"\n'
    )
    WRAPPER.chmod(0o755)
    out = subprocess.run([str(WRAPPER), "--version"], capture_output=True, text=True, check=False)
    if f"Version {VERSION}" not in out.stdout + out.stderr:
        WRAPPER.unlink()
        raise RuntimeError(f"perf_analyzer does not start: {(out.stdout + out.stderr).strip()[-500:]}")
    return WRAPPER


def main(argv: list[str]) -> int:
    if argv[:1] == ["install"]:
        print(install())
        return 0
    if argv[:1] == ["path"]:
        path = installed()
        if path is None:
            print("perf_analyzer is not installed (python e2e/perf_analyzer.py install)", file=sys.stderr)
            return 1
        print(path)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
