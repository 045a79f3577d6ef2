#!/usr/bin/env python3
"""Build the single-file `kubectl-triton` plugin (krew-style): a zipapp of the modules the plugin imports.

    .venv/bin/python e2e/build_plugin.py [--output dist/kubectl-triton]      (make plugin)

What goes in: every module a fresh interpreter holds after importing the plugin's entry modules
(ENTRY: the verbs, the kubeconfig and tuning adapters, the Triton client), as whole top-level
packages of site-packages (with their `.libs` folders) and the operator's own modules one by one.
Compiled modules (pydantic_core, numpy...) cannot be imported from a zip, so the archive's
__main__ unpacks its `lib/` once into ~/.cache/kubectl-triton/<build id>/ (atomically: a rename)
and runs from there. The build is for this interpreter's Python version and platform: the archive
refuses another, saying which one it needs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "operator" / "src"
ENTRY = (
    "triton_operator.kubectl_plugin",
    "triton_operator.adapters.control",
    "triton_operator.adapters.tuning_cluster",
    "triton_operator.client.tuning_runner",
    "triton_operator.client.triton",
    "lightkube.resources.apps_v1",
    "lightkube.resources.core_v1",
)
LEFT_OUT = {"_distutils_hack", "__editable___triton_operator_0_1_0_finder"}
"""setuptools' shims, not the plugin's."""
LEFT_OUT_DISTS = {"setuptools", "pip", "triton-operator"}
"""Installers (a requirement of tritonclient's, never imported by the plugin) and the operator itself."""

MAIN = '''"""kubectl-triton, one file: unpack the modules once, then run the plugin."""
import os, sys, zipfile
NEEDS = {needs!r}
BUILD = {build!r}
if "%d.%d" % sys.version_info[:2] != NEEDS["python"] or sys.platform != NEEDS["platform"]:
    sys.exit("kubectl-triton: this file is built for CPython {{python}} on {{platform}} (it carries compiled "
             "modules); run it with python{{python}}, or pip install triton-operator".format(**NEEDS))
archive = os.path.dirname(os.path.abspath(__file__))
cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kubectl-triton")
target = os.path.join(cache, BUILD)
if not os.path.isdir(target):
    import tempfile
    os.makedirs(cache, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".unpack-", dir=cache)
    with zipfile.ZipFile(archive) as z:
        z.extractall(work, [n for n in z.namelist() if n.startswith("lib/")])
    try:
        os.rename(work, target)
    except OSError:  # another run unpacked it first
        import shutil
        shutil.rmtree(work, ignore_errors=True)
sys.path.insert(0, os.path.join(target, "lib"))
from triton_operator.kubectl_plugin import main
sys.exit(main())
'''


def loaded_files() -> list[str]:
    """The files of every module a fresh interpreter holds after importing ENTRY."""
    code = (
        "import importlib, json, sys\n"
        f"for name in {list(ENTRY)!r}:\n    importlib.import_module(name)\n"
        "files = {getattr(m, '__file__', None) or '' for m in list(sys.modules.values())}\n"
        "print(json.dumps(sorted(files)))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SOURCE)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return [f for f in json.loads(done.stdout) if f]


def members(files: list[str]) -> dict[str, Path]:
    """Archive name (under lib/) -> file: the operator's loaded modules, and every file of the
    distributions the other loaded modules come from, with the distributions they require (a module
    a request imports late, httpx2's transport, is in the archive too) and their metadata."""
    import importlib.metadata  # noqa: PLC0415

    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    out: dict[str, Path] = {}
    owner: dict[Path, str] = {}
    for dist in importlib.metadata.distributions():
        for file in dist.files or []:
            owner[Path(str(dist.locate_file(file))).resolve()] = dist.metadata["Name"]
    wanted: list[str] = []
    for name in files:
        path = Path(name).resolve()
        if path.is_relative_to(SOURCE):
            out[f"lib/{path.relative_to(SOURCE).as_posix()}"] = path
        elif path in owner:
            wanted.append(owner[path])
    seen: set[str] = set()
    while wanted:
        name = re.split(r"[ ;<>=!~\[(]", wanted.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if name in seen or name in LEFT_OUT_DISTS:
            continue
        seen.add(name)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # an optional dependency that is not installed
        wanted += [r for r in dist.requires or [] if "extra ==" not in r]
        for file in dist.files or []:
            path = Path(str(dist.locate_file(file))).resolve()
            inside = path.is_file() and path.is_relative_to(site) and "__pycache__" not in path.parts
            if inside and path.parts[len(site.parts)].split(".")[0] not in LEFT_OUT:
                out[f"lib/{path.relative_to(site).as_posix()}"] = path
    return out


def build(output: Path) -> Path:
    files = members(loaded_files())
    digest = hashlib.sha256()
    for name, path in sorted(files.items()):
        digest.update(name.encode() + b"\0" + path.read_bytes())
    needs = {"python": "{}.{}".format(*sys.version_info[:2]), "platform": sys.platform}
    main = MAIN.format(needs=needs, build=digest.hexdigest()[:16])
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".partial")
    with partial.open("wb") as f:
        f.write(b"#!/usr/bin/env python3\n")
        with zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as z:
            z.writestr("__main__.py", main)
            for name, path in sorted(files.items()):
                z.write(path, name)
    partial.chmod(0o755)
    partial.replace(output)
    return output


def main() -> int:
    parser = argparse.ArgumentParser(description="Build the single-file kubectl-triton plugin (a zipapp).")
    parser.add_argument("--output", type=Path, default=REPO / "dist" / "kubectl-triton")
    args = parser.parse_args()
    path = build(args.output)
    print(f"{path}: {path.stat().st_size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
