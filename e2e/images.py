#!/usr/bin/env python3
"""Container images for the real-node e2e tests, built from the project's own files (no registry).

    python3 e2e/images.py build [NAME...]             build what changed (a no-op takes well under 1 s)
    python3 e2e/images.py load --address SOCK [NAME...]   import into a containerd (k8s.io namespace)
    python3 e2e/images.py list                         names, refs, cache keys, built or not
    python3 e2e/images.py check                        exit 0 if this machine can build and run containers

Images (IMAGES, in build order):
  pause         localhost/triton-operator/pause:3.10
                e2e/images/pause/pause.c compiled here (gcc -Os -static), FROM scratch
  base          localhost/python:3.11-slim-bookworm
                mmdebstrap of Debian bookworm (this machine's mirror) with python3, pip, venv
  operator      ghcr.io/triton-operator/triton-operator:VERSION (pyproject.toml)
                the repository's Dockerfile, unchanged, FROM base
  tritonserver  localhost/triton-operator/tritonserver-cpu:2.51.0
                e2e/images/tritonserver/Containerfile, FROM base: tritonserver from the nvidia-pytriton wheel
  perf-analyzer localhost/triton-operator/perf-analyzer:2.51.0
                e2e/images/perf-analyzer/Containerfile, FROM tritonserver: tritonclient's perf_analyzer

Each image has a cache key: sha256 over its inputs (recipe files, build arguments, the key of the image
it is built FROM). The key is stored as the label LABEL on the image in podman storage and on the image in
containerd; an image is rebuilt (or re-imported) only when its key changed or it is missing. Saved
docker-archive tarballs are kept under ${TRITON_OPERATOR_CACHE:-~/.cache/triton-operator}/images/, so
loading into a fresh containerd root does not save again.

podman is pointed at e2e/images/containers.conf with CONTAINERS_CONF (/etc/containers is left alone).
Standard library only: this runs before any virtualenv exists.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import tomllib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "e2e" / "images"
CONTAINERS_CONF = RECIPES / "containers.conf"
CACHE = Path(os.environ.get("TRITON_OPERATOR_CACHE") or Path.home() / ".cache" / "triton-operator") / "images"
LABEL = "dev.triton-operator.e2e.cache-key"
# Bump to rebuild every image (a change in how images are made that the inputs do not show).
RECIPE_VERSION = "1"


def project_version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])


VERSION = project_version()
BASE_REF = "localhost/python:3.11-slim-bookworm"

# name -> ref (the exact name pods and the kubelet use), parent (the image it is built FROM, by name),
# load (imported into containerd by default: what pods run).
IMAGES: dict[str, dict[str, Any]] = {
    "pause": {"ref": "localhost/triton-operator/pause:3.10", "parent": None, "load": True},
    "base": {"ref": BASE_REF, "parent": None, "load": False},
    "operator": {"ref": f"ghcr.io/triton-operator/triton-operator:{VERSION}", "parent": "base", "load": True},
    "tritonserver": {
        "ref": "localhost/triton-operator/tritonserver-cpu:2.51.0",
        "parent": "base",
        "load": True,
    },
    "perf-analyzer": {
        "ref": "localhost/triton-operator/perf-analyzer:2.51.0",
        "parent": "tritonserver",
        "load": True,
    },
}

# The pause binary: static, so the image can be FROM scratch (-s: stripped).
PAUSE_CFLAGS = ["-Os", "-static", "-Wall", "-s"]

# ---- base image: mmdebstrap ----------------------------------------------------------------------------
BASE_PACKAGES = ["python3", "python3-venv", "python3-pip", "python-is-python3", "ca-certificates"]
# Like Debian's slim images: no man pages, docs (copyright files stay) or translations; the dpkg
# options stay in the image (/etc/dpkg/dpkg.cfg.d/99mmdebstrap), so later apt-get installs obey them.
BASE_DPKG_OPTS = [
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
    "path-exclude=/usr/share/lintian/*",
]
BASE_APT_OPTS = ['Acquire::Languages "none"']
# The image config podman import gives the rootfs tarball (what the python:3.11-slim image sets).
BASE_CHANGES = [
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["python3"]',
]
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
DEFAULT_MIRRORS = [
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
]


def debian_sources() -> list[str]:
    """This machine's apt sources for Debian bookworm, as one-line `deb` entries (the image keeps them)."""
    entries: list[str] = []
    files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in files:
        try:
            text = path.read_text()
        except OSError:
            continue
        if path.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields: dict[str, str] = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line or line[:1].isspace():
                        continue
                    k, v = line.split(":", 1)
                    fields[k.strip().lower()] = v.strip()
                if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes") == "no":
                    continue
                for uri in fields.get("uris", "").split():
                    for suite in fields.get("suites", "").split():
                        entries.append(f"deb {uri} {suite} {fields.get('components', 'main')}")
        elif path.name == "sources.list" or path.suffix == ".list":
            for line in text.splitlines():
                words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
                if len(words) >= 3 and words[0] == "deb":
                    entries.append(" ".join(words))
    debian = [
        e
        for e in entries
        if re.search(r"/debian(-security)?/?$", e.split()[1]) and e.split()[2].startswith("bookworm")
    ]
    return list(dict.fromkeys(debian)) or DEFAULT_MIRRORS


def host_ca_files() -> list[Path]:
    return sorted(HOST_CA_DIR.glob("*.crt")) if HOST_CA_DIR.is_dir() else []


def mmdebstrap_args(out: Path) -> list[str]:
    args = ["mmdebstrap", "--mode=root", "--variant=minbase", "--include=" + ",".join(BASE_PACKAGES)]
    # merged-/usr by symlinks, as debootstrap makes it: without this hook, bookworm's essential set
    # pulls in usrmerge and with it perl (50 MB).
    args.append("--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr")
    args += [f"--dpkgopt={o}" for o in BASE_DPKG_OPTS] + [f"--aptopt={o}" for o in BASE_APT_OPTS]
    cas = host_ca_files()
    if cas:
        # pip and apt inside image builds go through this machine's TLS-intercepting egress.
        files = " ".join(shlex.quote(str(c)) for c in cas)
        args.append(f'--customize-hook=cp -- {files} "$1{HOST_CA_DIR}/"')
        args.append('--customize-hook=chroot "$1" update-ca-certificates >/dev/null')
    return [*args, "bookworm", str(out), *debian_sources()]


# ---- cache keys ------------------------------------------------------------------------------------
def _dockerignore_patterns(context: Path) -> list[tuple[bool, str]]:
    path = context / ".dockerignore"
    patterns: list[tuple[bool, str]] = []
    if path.is_file():
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
            patterns.append((negate, pattern))
    return patterns


def dockerignore_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go filepath.Match plus `**`) as a regex over slash-separated paths."""
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):
                i += 1
                out += "(?:.*/)?"
            else:
                out += ".*"
            continue
        if c == "*":
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                out += re.escape(c)
            else:
                out += "[" + pattern[i + 1 : end].replace("\\", "\\\\").replace("!", "^", 1) + "]"
                i = end
        else:
            out += re.escape(c)
        i += 1
    return re.compile(out + r"\Z")


def dockerignore_excludes(rel: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent folders decides."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    result = False
    for negate, regex in patterns:
        if any(regex.match(p) for p in prefixes):
            result = not negate
    return result


def context_files(context: Path) -> list[str]:
    """The files a `podman build` of `context` sends, by the context's .dockerignore."""
    raw = _dockerignore_patterns(context)
    patterns = [(neg, dockerignore_regex(p)) for neg, p in raw]
    # Literal folder prefixes of the `!` patterns: an excluded folder is only walked into when one
    # of them lies inside it (or a `!` pattern starts with a wildcard).
    reinclude = [re.split(r"[*?\[]", p, maxsplit=1)[0] for neg, p in raw if neg]
    files: list[str] = []
    for dirpath, dirnames, filenames in os.walk(context):
        reldir = os.path.relpath(dirpath, context)
        reldir = "" if reldir == "." else reldir + "/"
        keep = []
        for d in sorted(dirnames):
            rel = reldir + d
            if d == ".git" or (
                dockerignore_excludes(rel, patterns)
                and not any(r == "" or r.startswith(rel + "/") or rel.startswith(r) for r in reinclude)
            ):
                continue
            keep.append(d)
        dirnames[:] = keep
        files += [reldir + f for f in sorted(filenames) if not dockerignore_excludes(reldir + f, patterns)]
    return sorted(files)


def _hash_files(h: Any, base: Path, rels: Iterable[str]) -> None:
    for rel in rels:
        path = base / rel
        h.update(f"{rel}\0{os.access(path, os.X_OK):d}\0".encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())


def _recipe_files(name: str) -> list[str]:
    folder = RECIPES / name
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def cache_key(name: str, _memo: dict[str, str] | None = None) -> str:
    """sha256 over everything the image is made from (and the key of the image it is built FROM)."""
    memo = {} if _memo is None else _memo
    if name in memo:
        return memo[name]
    spec = IMAGES[name]
    h = hashlib.sha256()
    h.update(json.dumps({"recipe": RECIPE_VERSION, "name": name, "ref": spec["ref"]}).encode())
    if spec["parent"]:
        h.update(b"parent\0" + cache_key(spec["parent"], memo).encode())
    if name == "base":
        h.update(json.dumps({"args": mmdebstrap_args(Path("OUT")), "changes": BASE_CHANGES}).encode())
        _hash_files(h, HOST_CA_DIR, [c.name for c in host_ca_files()])
    elif name == "operator":
        h.update(json.dumps(_build_args(name)).encode())
        # The Dockerfile and .dockerignore decide the build but are not sent with the context.
        _hash_files(h, ROOT, sorted({"Dockerfile", ".dockerignore", *context_files(ROOT)}))
    else:
        if name == "pause":
            h.update(json.dumps(PAUSE_CFLAGS).encode())
        h.update(json.dumps(_build_args(name)).encode())
        _hash_files(h, RECIPES / name, _recipe_files(name))
    memo[name] = h.hexdigest()
    return memo[name]


def cache_keys(names: Iterable[str] | None = None) -> dict[str, str]:
    memo: dict[str, str] = {}
    return {n: cache_key(n, memo) for n in (IMAGES if names is None else names)}


# ---- podman ----------------------------------------------------------------------------------------
def podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def run(
    cmd: Sequence[str], capture: bool = True, check: bool = True, **kw: Any
) -> subprocess.CompletedProcess[str]:
    """subprocess.run; a failing command's captured output goes to stderr before the error is raised."""
    pipe = subprocess.PIPE if capture else None
    out = subprocess.run(list(cmd), check=False, text=True, stdout=pipe, stderr=pipe, **kw)
    if check and out.returncode != 0:
        if capture:
            sys.stderr.write((out.stdout or "")[-20000:] + (out.stderr or "")[-20000:])
        raise subprocess.CalledProcessError(out.returncode, list(cmd), out.stdout, out.stderr)
    return out


def podman(*args: str, capture: bool = True, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run(["podman", *args], capture=capture, check=check, env=podman_env())


def podman_images() -> dict[str, dict[str, Any]]:
    """ref -> {"id": image id, "key": cache-key label, "size": bytes} for every tagged image."""
    out = podman("images", "--format", "json").stdout
    found: dict[str, dict[str, Any]] = {}
    for image in json.loads(out or "[]"):
        labels = image.get("Labels") or {}
        for ref in image.get("Names") or []:
            found[ref] = {"id": image["Id"], "key": labels.get(LABEL, ""), "size": image.get("Size", 0)}
    return found


_thread_lock = threading.RLock()
_lock_file: list[Any] = []  # the open lock file while this process holds the lock


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    """One build (or archive save) at a time on this machine, across processes (bootstrap and a
    test run may overlap) and threads; re-entrant."""
    with _thread_lock:
        if _lock_file:
            yield
            return
        CACHE.mkdir(parents=True, exist_ok=True)
        with (CACHE / ".lock").open("w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            _lock_file.append(f)
            try:
                yield
            finally:
                _lock_file.clear()
                fcntl.flock(f, fcntl.LOCK_UN)


def _build_args(name: str) -> dict[str, str]:
    if name == "operator":
        # The Dockerfile's default (the short name python:3.11-slim-bookworm) would also resolve to the
        # localhost image with --pull=never; naming it keeps a pulled docker.io copy from winning.
        return {"PYTHON_IMAGE": BASE_REF, "VERSION": VERSION}
    if name == "tritonserver":
        return {"BASE_IMAGE": BASE_REF}
    if name == "perf-analyzer":
        return {"TRITON_IMAGE": IMAGES["tritonserver"]["ref"]}
    return {}


def _build_base(ref: str, key: str) -> None:
    if not shutil.which("mmdebstrap"):
        raise RuntimeError("mmdebstrap not found (apt-get install mmdebstrap)")
    with tempfile.TemporaryDirectory(prefix="base-", dir=CACHE) as tmp:
        tar = Path(tmp) / "base.tar"
        cmd = mmdebstrap_args(tar)
        run([cmd[0], "--quiet", *cmd[1:]])
        changes = [f"--change={c}" for c in [*BASE_CHANGES, f"LABEL {LABEL}={key}"]]
        podman("import", "--quiet", *changes, str(tar), ref)


def _build_pause(ref: str, key: str) -> None:
    if not shutil.which("gcc"):
        raise RuntimeError("gcc not found (apt-get install gcc libc6-dev)")
    with tempfile.TemporaryDirectory(prefix="pause-", dir=CACHE) as tmp:
        shutil.copy(RECIPES / "pause" / "Containerfile", tmp)
        run(["gcc", *PAUSE_CFLAGS, "-o", f"{tmp}/pause", str(RECIPES / "pause" / "pause.c")])
        _podman_build(ref, key, Path(tmp), Path(tmp) / "Containerfile", {})


def _podman_build(ref: str, key: str, context: Path, file: Path, build_args: dict[str, str]) -> None:
    # --layers=false: no intermediate images pile up in storage (the cache key decides rebuilds).
    args = ["build", "--pull=never", "--layers=false", "--quiet", "-f", str(file), "-t", ref]
    args += ["--label", f"{LABEL}={key}"]
    args += [f"--build-arg={k}={v}" for k, v in build_args.items()]
    if os.environ.get("TRITON_OPERATOR_BUILD_NETWORK"):  # e.g. "host", when podman's bridge has no way out
        args.append("--network=" + os.environ["TRITON_OPERATOR_BUILD_NETWORK"])
    podman(*args, str(context))


def _build_one(name: str, key: str) -> None:
    ref = IMAGES[name]["ref"]
    if name == "base":
        _build_base(ref, key)
    elif name == "pause":
        _build_pause(ref, key)
    elif name == "operator":
        _podman_build(ref, key, ROOT, ROOT / "Dockerfile", _build_args(name))
    else:
        _podman_build(ref, key, RECIPES / name, RECIPES / name / "Containerfile", _build_args(name))


def _with_parents(names: Iterable[str] | None) -> list[str]:
    wanted = set(IMAGES if names is None else names)
    unknown = wanted - set(IMAGES)
    if unknown:
        raise KeyError(f"unknown image(s) {sorted(unknown)}; known: {list(IMAGES)}")
    for name in list(wanted):
        parent = IMAGES[name]["parent"]
        while parent:
            wanted.add(parent)
            parent = IMAGES[parent]["parent"]
    return [n for n in IMAGES if n in wanted]


def build(names: Iterable[str] | None = None, log: Any = None) -> dict[str, str]:
    """Build the named images (default: all) and what they are built FROM, when their key changed
    or they are missing. Returns name -> ref for the names asked for. `log`: called with one line
    per image (default: print to stderr)."""
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    asked = list(IMAGES if names is None else names)
    order = _with_parents(asked)
    with _lock():
        keys = cache_keys(order)
        have = podman_images()
        replaced = []
        for name in order:
            ref, key, t0 = IMAGES[name]["ref"], keys[name], time.monotonic()
            old = have.get(ref)
            if old and old["key"] == key:
                say(f"{name:<13} {ref}  cached  {time.monotonic() - t0:.1f}s")
                continue
            _build_one(name, key)
            if old:
                replaced.append(old["id"])
            say(f"{name:<13} {ref}  built  {time.monotonic() - t0:.1f}s")
        # Drop the images replaced, children first, where nothing else uses them (errors are fine).
        for image_id in reversed(replaced):
            podman("rmi", image_id, check=False)
    return {n: IMAGES[n]["ref"] for n in asked}


# ---- containerd ------------------------------------------------------------------------------------
def _ctr_images(ctr: Sequence[str], namespace: str) -> dict[str, tuple[str, str]]:
    """ref -> (manifest digest, labels as "k=v,k=v") from `ctr images ls`."""
    out = run([*ctr, "-n", namespace, "images", "ls"]).stdout
    found = {}
    for line in out.splitlines()[1:]:
        cols = line.split()  # REF TYPE DIGEST SIZE(2 words) PLATFORMS LABELS
        if len(cols) >= 3:
            found[cols[0]] = (cols[2], cols[-1])
    return found


def archive(name: str, key: str | None = None) -> Path:
    """The image as a docker-archive tarball, saved once per cache key."""
    key = key or cache_key(name)
    path = CACHE / "archives" / f"{name}-{key[:16]}.tar"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        for old in path.parent.glob(f"{name}-*.tar"):
            old.unlink()
        tmp = path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        podman("save", "--quiet", "--format", "docker-archive", "-o", str(tmp), IMAGES[name]["ref"])
        tmp.rename(path)
    return path


def load(
    ctr: Sequence[str],
    namespace: str = "k8s.io",
    names: Iterable[str] | None = None,
    snapshotter: str | None = None,
    log: Any = None,
) -> dict[str, str]:
    """Import the images (default: those pods run) into a containerd, unpacked, under the exact refs
    pods use. `ctr`: the command prefix, e.g. ["ctr", "--address", "/run/x/containerd.sock"].
    Skips images containerd already has with the same cache key. Returns name -> ref."""
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    wanted = [n for n, spec in IMAGES.items() if spec["load"]] if names is None else list(names)
    build(wanted, log=lambda _line: None)
    keys = cache_keys(wanted)
    have = _ctr_images(ctr, namespace)
    base = [*ctr, "-n", namespace, "images"]
    for name in wanted:
        ref, key, t0 = IMAGES[name]["ref"], keys[name], time.monotonic()
        label = f"{LABEL}={key}"
        old_digest, labels = have.get(ref, ("", ""))
        if label in labels.split(","):
            say(f"{name:<13} {ref}  present  {time.monotonic() - t0:.1f}s")
            continue
        with _lock():
            tar = archive(name, key)
        imp = ["import", f"--snapshotter={snapshotter}"] if snapshotter else ["import"]
        run([*base, *imp, str(tar)])
        now = _ctr_images(ctr, namespace)
        if ref not in now:
            # ctr names the image after the archive's RepoTags, normalised (a name without a
            # registry becomes docker.io/library/...): tag it with the ref pods use.
            source = _normalise(_ref_in_archive(tar))
            run([*base, "tag", "--force", source, ref])
            run([*base, "rm", source], check=False)
            now = _ctr_images(ctr, namespace)
        # The image this one replaced: drop the CRI's by-id name for it when no name is left on it,
        # so containerd can collect its content (running containers keep their snapshots).
        if old_digest and old_digest != now.get(ref, ("", ""))[0]:
            refs = [r for r, (digest, _) in now.items() if digest == old_digest]
            if all(r.startswith("sha256:") for r in refs):
                run([*base, "rm", *refs], check=False)
        # The key marks the import as current; "pinned" keeps the kubelet's image GC off it.
        run([*base, "label", ref, label, "io.cri-containerd.pinned=pinned"])
        say(f"{name:<13} {ref}  imported  {time.monotonic() - t0:.1f}s")
    return {n: IMAGES[n]["ref"] for n in wanted}


def _ref_in_archive(tar: Path) -> str:
    with tarfile.open(tar) as t:
        member = t.extractfile("manifest.json")
        manifest = json.load(member) if member else [{}]
    return str((manifest[0].get("RepoTags") or [""])[0])


def _normalise(ref: str) -> str:
    """A docker reference as containerd spells it (docker.io/library/NAME for a bare name)."""
    first = ref.split("/", 1)[0]
    if "/" not in ref or not ("." in first or ":" in first or first == "localhost"):
        ref = "docker.io/" + (ref if "/" in ref else "library/" + ref)
    return ref if ":" in ref.rsplit("/", 1)[-1] or "@" in ref else ref + ":latest"


# ---- can this machine run containers? ----------------------------------------------------------------
def can_run_containers() -> str | None:
    """None when this machine can build and run the images, else the reason it cannot."""
    if os.geteuid() != 0:
        return "not root (podman here runs rootful: overlay storage, cgroupfs)"
    for tool in ("podman", "runc", "gcc"):
        if not shutil.which(tool):
            return f"{tool} not found"
    try:
        build(["pause"], log=lambda _line: None)
        out = podman("run", "--rm", "--network=none", IMAGES["pause"]["ref"], "-v", check=False)
    except (subprocess.CalledProcessError, RuntimeError, OSError) as e:
        return f"cannot build the pause image: {e}"
    if out.returncode != 0 or "pause" not in out.stdout:
        return f"podman run failed (rc {out.returncode}): {(out.stderr or out.stdout).strip()[-2000:]}"
    return None


# ---- command line ------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("build", help="build the images whose inputs changed")
    p.add_argument("names", nargs="*", metavar="NAME", help=f"default: all ({', '.join(IMAGES)})")
    p = sub.add_parser("load", help="import images into a containerd")
    p.add_argument("--address", required=True, help="containerd socket")
    p.add_argument("--namespace", default="k8s.io")
    p.add_argument("--ctr", default="ctr", help="ctr binary (default: ctr on PATH)")
    p.add_argument("--snapshotter", default=None, help="unpack for this snapshotter (default: ctr's)")
    pods = ", ".join(n for n, spec in IMAGES.items() if spec["load"])
    p.add_argument("names", nargs="*", metavar="NAME", help=f"default: the images pods run ({pods})")
    sub.add_parser("list", help="names, refs, cache keys, built or not")
    sub.add_parser("check", help="exit 0 if this machine can build and run containers")
    args = parser.parse_args(argv)
    try:
        return _main(args)
    except (KeyError, RuntimeError, OSError, subprocess.CalledProcessError) as e:
        print(f"images: {args.cmd} failed: {e}", file=sys.stderr)
        return 1


def _main(args: argparse.Namespace) -> int:
    if args.cmd == "build":
        build(args.names or None, log=print)
    elif args.cmd == "load":
        load(
            [args.ctr, "--address", args.address],
            args.namespace,
            args.names or None,
            args.snapshotter,
            log=print,
        )
    elif args.cmd == "list":
        keys = cache_keys()
        have = podman_images() if shutil.which("podman") else {}
        for name, spec in IMAGES.items():
            image = have.get(spec["ref"])
            state = "missing" if not image else "built" if image["key"] == keys[name] else "stale"
            size = f"{image['size'] / 1e6:.0f}MB" if image else "-"
            print(f"{name:<13} {spec['ref']:<50} {keys[name][:16]}  {state:<7} {size}")
    else:
        reason = can_run_containers()
        if reason:
            print(f"images: this machine cannot run containers: {reason}")
            return 1
        print("images: podman builds and runs containers here")
    return 0


if __name__ == "__main__":
    sys.exit(main())
