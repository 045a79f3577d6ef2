#!/usr/bin/env python3
"""Local Kubernetes test cluster for triton-operator end-to-end tests.

Stdlib only: this runs before any virtualenv exists.

The control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler), kwok (fake nodes / fake kubelet), kubelet and kube-proxy are
built from pinned Go modules through small wrapper modules under
``e2e/tools/<name>/`` and cached outside the repository in
``${TRITON_OPERATOR_CACHE:-~/.cache/triton-operator}/bin/<key>/``.

Metrics: a custom/external metrics API server (sigs.k8s.io/custom-metrics-apiserver's test
provider, e2e/tools/custom-metrics-adapter) registered as APIServices custom.metrics.k8s.io and
external.metrics.k8s.io; tests write values to its URL (``cluster.py env``: $TRITON_E2E_METRICS_WRITE_URL),
and kube-controller-manager's HPA controller reads them.

Nodes: kwok fake nodes (GPU and CPU) and, where this machine can run containers
(root, containerd, runc), the real node ``real-node-1`` run by a real kubelet
(see e2e/node.py; ``TRITON_E2E_REAL_NODE=0`` turns it off, ``TRITON_E2E_IMAGES=pause,...``
limits the e2e/images.py images built and loaded for it).

Subcommands: build, up, down, env, status, leftovers  (see ``e2e/cluster --help``).
Python API: build() -> Path, up() -> Path, down(), bin_dir() -> Path.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import node  # e2e/node.py: the real node

T = TypeVar("T")

E2E_DIR = Path(__file__).resolve().parent
REPO_ROOT = E2E_DIR.parent
TOOLS_DIR = E2E_DIR / "tools"

# --------------------------------------------------------------------------
# Pins
# --------------------------------------------------------------------------
KUBERNETES_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.16"  # latest v3.6 patch
KWOK_VERSION = "v0.8.0"  # latest v0.8.x
HELM_VERSION = "v3.22.0"  # latest v3
KUBECONFORM_VERSION = "v0.8.0"
# v1.7.0 exists but its go.mod needs go >= 1.27; v1.6.3 is the newest release
# usable with the Go 1.26 toolchain installed here.
GATEWAY_API_VERSION = "v1.6.3"
# the release line that matches Kubernetes v1.36 (its k8s.io/* requirements are v0.36.x)
CUSTOM_METRICS_APISERVER_VERSION = "v1.36.0"


def _k8s_staging_version(v: str) -> str:
    # k8s.io/kubernetes v1.X.Y  <->  staging modules k8s.io/foo v0.X.Y
    return "v0." + v[len("v1.") :]


def _version_ldflags() -> list[str]:
    major, minor = KUBERNETES_VERSION[1:].split(".")[:2]
    flags = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={KUBERNETES_VERSION}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.gitCommit=",
            f"-X {pkg}.buildDate=1970-01-01T00:00:00Z",
        ]
    return flags


# name -> spec. "packages" maps output binary name -> Go package path.
TOOLS: dict[str, dict[str, Any]] = {
    "kubernetes": {
        "module": "k8s.io/kubernetes",
        "version": KUBERNETES_VERSION,
        # local (./staging/...) replaces in upstream go.mod are rewritten to this
        "local_replace_version": _k8s_staging_version(KUBERNETES_VERSION),
        "packages": {
            "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
            "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
            "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
            "kubectl": "k8s.io/kubernetes/cmd/kubectl",
            # the real node (e2e/node.py); the kwok cluster comes up without them
            "kubelet": "k8s.io/kubernetes/cmd/kubelet",
            "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy",
        },
        "ldflags": _version_ldflags(),
    },
    "etcd": {
        "module": "go.etcd.io/etcd/server/v3",
        "version": ETCD_VERSION,
        "local_replace_version": ETCD_VERSION,
        "packages": {"etcd": "go.etcd.io/etcd/server/v3"},
        "ldflags": [],
    },
    "kwok": {
        "module": "sigs.k8s.io/kwok",
        "version": KWOK_VERSION,
        "local_replace_version": KWOK_VERSION,
        "packages": {"kwok": "sigs.k8s.io/kwok/cmd/kwok"},
        "ldflags": [],
        # directories copied from the module into the bin dir
        "copy_dirs": {"kustomize/stage": "kwok-stages"},
    },
    "helm": {
        "module": "helm.sh/helm/v3",
        "version": HELM_VERSION,
        "local_replace_version": HELM_VERSION,
        "packages": {"helm": "helm.sh/helm/v3/cmd/helm"},
        "ldflags": [f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}"],
    },
    "kubeconform": {
        "module": "github.com/yannh/kubeconform",
        "version": KUBECONFORM_VERSION,
        "local_replace_version": KUBECONFORM_VERSION,
        "packages": {"kubeconform": "github.com/yannh/kubeconform/cmd/kubeconform"},
        "ldflags": [f"-X main.version={KUBECONFORM_VERSION}"],
    },
    "custom-metrics-adapter": {
        "module": "sigs.k8s.io/custom-metrics-apiserver",
        "version": CUSTOM_METRICS_APISERVER_VERSION,
        "local_replace_version": CUSTOM_METRICS_APISERVER_VERSION,
        # Our own main package, committed in the wrapper module (e2e/tools/custom-metrics-adapter/
        # main.go): the library's AdapterBase and test provider, with the metric-writing HTTP server
        # on a loopback address given by a flag (upstream's test-adapter/main.go hard-codes :8080).
        "main": "main.go",
        "packages": {"custom-metrics-adapter": "triton-operator/e2e/tools/custom-metrics-adapter"},
        # required at the version the kubernetes build uses (upstream asks for v0.36.1), so the
        # packages of k8s.io/* that depend on nothing else newer come from the same Go build cache
        "requires": {
            m: _k8s_staging_version(KUBERNETES_VERSION)
            for m in (
                "k8s.io/api",
                "k8s.io/apimachinery",
                "k8s.io/apiserver",
                "k8s.io/client-go",
                "k8s.io/component-base",
                "k8s.io/metrics",
            )
        },
        "ldflags": [],
    },
    "gateway-api": {
        "module": "sigs.k8s.io/gateway-api",
        "version": GATEWAY_API_VERSION,
        "local_replace_version": GATEWAY_API_VERSION,
        "packages": {},
        "ldflags": [],
        # concatenated standard-channel CRDs
        "concat": {"config/crd/standard": "gateway-api-standard-crds.yaml"},
    },
}

# Build order: biggest first so a failure shows early; all sequential. The metrics adapter right
# after kubernetes, whose k8s.io/* packages it shares where it can.
BUILD_ORDER = ["kubernetes", "custom-metrics-adapter", "etcd", "kwok", "helm", "kubeconform", "gateway-api"]
REQUIRED_BINARIES = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "custom-metrics-adapter",
]

PIN_STAMP_PREFIX = "// triton-operator pins: "


def log(msg: str) -> None:
    print(f"[cluster] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# Paths
# --------------------------------------------------------------------------
def cache_root() -> Path:
    env = os.environ.get("TRITON_OPERATOR_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "triton-operator"


def state_dir() -> Path:
    env = os.environ.get("TRITON_OPERATOR_CLUSTER_DIR")
    return Path(env).resolve() if env else REPO_ROOT / ".cluster"


def kubeconfig_path() -> Path:
    return state_dir() / "kubeconfig"


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GOTOOLCHAIN", "local")
    env["CGO_ENABLED"] = "0"
    env["GOFLAGS"] = "-trimpath -buildvcs=false"
    return env


def _go_version() -> str:
    try:
        return subprocess.run(
            ["go", "env", "GOVERSION"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "nogo"


GOMOD_KEYS = ("module", "version", "local_replace_version", "packages", "requires", "main")


def _main_source(name: str) -> bytes | None:
    """The committed main package file of a wrapper whose spec names one ("main"), else None."""
    main = TOOLS[name].get("main")
    return (TOOLS_DIR / name / main).read_bytes() if main else None


def _tool_pin(name: str, gomod_only: bool = False) -> str:
    """Hash of a tool's spec; gomod_only: just what determines its wrapper go.mod.

    A wrapper with its own main package: that file's content too (its imports decide go.mod/go.sum).
    """
    spec = TOOLS[name]
    keys = GOMOD_KEYS if gomod_only else sorted(spec)
    pin: dict[str, Any] = {k: spec.get(k) for k in keys if k in spec}
    source = _main_source(name)
    if source is not None:
        pin["main_sha256"] = hashlib.sha256(source).hexdigest()
    blob = json.dumps(pin, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cache_key() -> str:
    """Short hash over pins (with any wrapper's own main package) + wrapper go.mod/go.sum + go version."""
    h = hashlib.sha256()
    h.update(_go_version().encode())
    for name in BUILD_ORDER:
        h.update(name.encode())
        h.update(_tool_pin(name).encode())
        for f in ("go.mod", "go.sum"):
            p = TOOLS_DIR / name / f
            h.update(p.read_bytes() if p.exists() else b"-")
    return h.hexdigest()[:12]


def bin_dir() -> Path:
    """Directory that holds (or will hold) the binaries for the current pins."""
    return cache_root() / "bin" / cache_key()


# --------------------------------------------------------------------------
# Wrapper modules
# --------------------------------------------------------------------------
def _run(
    cmd: list[str | Path],
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
    check: bool = True,
    **kw: Any,
) -> subprocess.CompletedProcess[Any]:
    log("$ " + " ".join(str(c) for c in cmd) + (f"   (in {cwd})" if cwd else ""))
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, check=check, **kw)


def _go_with_sumdb_fallback(
    cmd: list[str], cwd: Path | str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if r.returncode != 0 and re.search(r"sum\.golang\.org|verifying .*: .*(dial|lookup|timeout)", r.stderr):
        log("checksum database unreachable, retrying with GOSUMDB=off")
        env = dict(env, GOSUMDB="off", GONOSUMDB="*")
        r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        sys.stderr.write(r.stdout + r.stderr)
        raise subprocess.CalledProcessError(r.returncode, cmd, r.stdout, r.stderr)
    return r


def _download_module(module: str, version: str, env: dict[str, str]) -> dict[str, Any]:
    r = _go_with_sumdb_fallback(
        ["go", "mod", "download", "-json", f"{module}@{version}"], cwd=tempfile.gettempdir(), env=env
    )
    info: dict[str, Any] = json.loads(r.stdout)
    if info.get("Error"):
        raise RuntimeError(f"go mod download {module}@{version}: {info['Error']}")
    return info


def _parse_replaces(gomod: str) -> list[tuple[str, str]]:
    """Return the (left, right) sides of the replace directives of a go.mod."""
    out = []
    lines = gomod.splitlines()
    in_block = False
    for line in lines:
        s = line.split("//")[0].strip()
        if not s:
            continue
        if s.startswith("replace ("):
            in_block = True
            continue
        if in_block and s == ")":
            in_block = False
            continue
        if s.startswith("replace "):
            s = s[len("replace ") :].strip()
        elif not in_block:
            continue
        if "=>" not in s:
            continue
        left, right = (x.strip() for x in s.split("=>", 1))
        out.append((left, right))
    return out


def generate_wrapper_gomod(name: str, env: dict[str, str] | None = None) -> str:
    """Generate the seed go.mod of a wrapper module from the pinned upstream go.mod.

    Upstream replace directives that point at local directories (k8s staging
    modules, etcd's sibling modules) are rewritten to the published module at the
    matching version; other (module => module version) replaces are copied. The spec's
    "requires" (module -> version) are required beside the tool's module.
    """
    env = env or _go_env()
    spec = TOOLS[name]
    info = _download_module(spec["module"], spec["version"], env)
    upstream = Path(info["GoMod"]).read_text()
    go_line = re.search(r"^go\s+(\S+)", upstream, re.M)
    go_version = go_line.group(1) if go_line else "1.26"
    reps = []
    for left, right in _parse_replaces(upstream):
        old = left.split()[0]
        if right.startswith("./") or right.startswith("../"):
            if "FORBIDDEN" in right:
                continue
            reps.append(f"\t{old} => {old} {spec['local_replace_version']}")
        else:
            reps.append(f"\t{left} => {right}")
    requires = {spec["module"]: spec["version"], **spec.get("requires", {})}
    text = (
        f"{PIN_STAMP_PREFIX}{_tool_pin(name, gomod_only=True)} (generated by e2e/cluster.py)\n"
        f"module triton-operator/e2e/tools/{name}\n\n"
        f"go {go_version}\n\n"
    )
    if len(requires) == 1:
        text += f"require {spec['module']} {spec['version']}\n"
    else:
        text += "require (\n" + "".join(f"\t{m} {v}\n" for m, v in requires.items()) + ")\n"
    if reps:
        text += "\nreplace (\n" + "\n".join(reps) + "\n)\n"
    return text


def ensure_wrapper(name: str, env: dict[str, str] | None = None, force: bool = False) -> Path:
    """Make sure e2e/tools/<name>/{go.mod,go.sum} match the pins (regenerate if not)."""
    env = env or _go_env()
    spec = TOOLS[name]
    d = TOOLS_DIR / name
    gomod = d / "go.mod"
    stamp = f"{PIN_STAMP_PREFIX}{_tool_pin(name, gomod_only=True)} "
    if not force and gomod.exists() and gomod.read_text().startswith(stamp) and (d / "go.sum").exists():
        return d
    log(f"generating wrapper module {d.relative_to(REPO_ROOT)} for {spec['module']}@{spec['version']}")
    d.mkdir(parents=True, exist_ok=True)
    gomod.write_text(generate_wrapper_gomod(name, env))
    (d / "go.sum").unlink(missing_ok=True)
    if spec.get("main"):  # our own main package: its imports are what go mod tidy keeps
        (d / "tools.go").unlink(missing_ok=True)
        tidy_env = dict(env, GOFLAGS=env["GOFLAGS"] + " -mod=mod")
        _go_with_sumdb_fallback(["go", "mod", "tidy"], cwd=d, env=tidy_env)
    elif spec["packages"]:
        imports = "\n".join(f'\t_ "{p}"' for p in spec["packages"].values())
        (d / "tools.go").write_text(
            "//go:build tools\n\n// Package tools pins the binaries built by e2e/cluster.py.\n"
            f"package tools\n\nimport (\n{imports}\n)\n"
        )
        tidy_env = dict(env, GOFLAGS=env["GOFLAGS"] + " -mod=mod")
        _go_with_sumdb_fallback(["go", "mod", "tidy"], cwd=d, env=tidy_env)
    else:
        (d / "tools.go").unlink(missing_ok=True)
        _go_with_sumdb_fallback(["go", "mod", "download", spec["module"]], cwd=d, env=env)
    return d


# --------------------------------------------------------------------------
# build
# --------------------------------------------------------------------------
def _build_tool(name: str, out: Path, env: dict[str, str]) -> None:
    spec = TOOLS[name]
    d = TOOLS_DIR / name
    stamp = out / f".built-{name}"
    if stamp.exists():
        return
    t0 = time.monotonic()
    if spec["packages"]:
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=out))
        try:
            ldflags = " ".join(["-s", "-w"] + spec["ldflags"])
            if len(spec["packages"]) == 1:
                ((binname, pkg),) = spec["packages"].items()
                cmd = ["go", "build", "-p", "2", "-ldflags", ldflags, "-o", str(tmp / binname), pkg]
            else:
                cmd = [
                    "go",
                    "build",
                    "-p",
                    "2",
                    "-ldflags",
                    ldflags,
                    "-o",
                    str(tmp) + "/",
                    *spec["packages"].values(),
                ]
            _run(cmd, cwd=d, env=env)
            for binname in spec["packages"]:
                os.replace(tmp / binname, out / binname)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if spec.get("copy_dirs") or spec.get("concat"):
        r = _go_with_sumdb_fallback(["go", "mod", "download", "-json", spec["module"]], cwd=d, env=env)
        moddir = Path(json.loads(r.stdout)["Dir"])
        for src, dst in spec.get("copy_dirs", {}).items():
            shutil.rmtree(out / dst, ignore_errors=True)
            shutil.copytree(moddir / src, out / dst, ignore=shutil.ignore_patterns("*.go", "testdata"))
            for p in [out / dst, *(out / dst).rglob("*")]:
                p.chmod(0o755 if p.is_dir() else 0o644)
        for src, dst in spec.get("concat", {}).items():
            parts = []
            for f in sorted((moddir / src).glob("*.yaml")):
                parts.append(
                    f"# Source: {spec['module']}@{spec['version']}/{src}/{f.name}\n"
                    + f.read_text().strip("\n").removeprefix("---\n")
                    + "\n"
                )
            (out / dst).write_text("---\n".join(parts))
    stamp.write_text(f"{spec['module']}@{spec['version']} built in {time.monotonic() - t0:.0f}s\n")
    log(f"built {name} ({spec['module']}@{spec['version']}) in {time.monotonic() - t0:.0f}s")


def build(tools: list[str] | None = None) -> Path:
    """Build (or reuse cached) binaries for the pinned versions; return the bin dir."""
    if shutil.which("go") is None:
        raise RuntimeError("go toolchain not found in PATH; cannot build cluster binaries")
    env = _go_env()
    for name in BUILD_ORDER:
        ensure_wrapper(name, env)
    out = bin_dir()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    for name in tools or BUILD_ORDER:
        _build_tool(name, out, env)
    if not (out / ".complete").exists() and all((out / f".built-{n}").exists() for n in BUILD_ORDER):
        (out / ".complete").write_text(json.dumps({n: TOOLS[n]["version"] for n in BUILD_ORDER}) + "\n")
    if time.monotonic() - t0 > 1:
        log(f"build finished in {time.monotonic() - t0:.0f}s")
    return out


def binaries_ready() -> bool:
    d = bin_dir()
    return all((d / b).exists() for b in REQUIRED_BINARIES)


# --------------------------------------------------------------------------
# Cluster
# --------------------------------------------------------------------------
ADMIN_TOKEN_FILE = "admin.token"
MARKER = ".triton-operator-cluster"
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"
KWOK_POD_CIDR = "10.244.0.0/16"  # fake pod IPs handed out by kwok
KWOK_NODE_IP = "10.240.0.1"  # fake InternalIP / hostIP of the kwok nodes
NEVER_READY_ANNOTATION = "triton-operator.io/e2e-never-ready"
CRASH_ANNOTATION = "triton-operator.io/e2e-crash"
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"

GPU_NODES = ["gpu-node-1", "gpu-node-2"]
CPU_NODES = ["cpu-node-1"]

# The custom/external metrics API server (e2e/tools/custom-metrics-adapter) runs on the host, bound
# to 127.0.0.1; kube-aggregator reaches it through an ExternalName Service `localhost` (its default
# resolver turns one into https://<externalName>:<APIService port>) and checks its serving cert
# against the cluster CA for the name <service>.<namespace>.svc.
METRICS_ADAPTER = "custom-metrics-adapter"
METRICS_NAMESPACE = "custom-metrics"
METRICS_SERVICE = "custom-metrics-apiserver"
METRICS_APISERVICES = [
    ("custom.metrics.k8s.io", "v1beta1"),
    ("custom.metrics.k8s.io", "v1beta2"),
    ("external.metrics.k8s.io", "v1beta1"),
]
METRICS_WRITE_URL_ENV = "TRITON_E2E_METRICS_WRITE_URL"
# kube-controller-manager's --horizontal-pod-autoscaler-sync-period (default 15s): an HPA test takes
# seconds, not minutes
HPA_SYNC_PERIOD = "5s"


CLUSTER_PORTS = (
    "etcd", "etcd_peer", "apiserver", "kcm", "scheduler", "kwok", "metrics_adapter", "metrics_write",
    "kubelet", "kubelet_healthz", "proxy_healthz", "proxy_metrics",
)  # fmt: skip
"""The ports `up` gives the cluster's components (cluster.json's "ports")."""
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default when unreadable)."""
    try:
        low, high = (int(part) for part in path.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def _port_is_free(port: int) -> bool:
    """Whether nothing on this machine holds ``port`` (bound on any address: the API server and the
    kubelet bind all of them)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _pick_ports(
    names: tuple[str, ...] = CLUSTER_PORTS,
    *,
    ephemeral: tuple[int, int] | None = None,
    randint: Callable[[int, int], int] | None = None,
    is_free: Callable[[int], bool] = _port_is_free,
) -> dict[str, int]:
    """A free port for each of ``names``, distinct, and outside the kernel's ephemeral range.

    A port the kernel hands out (bind to port 0), closed again before its component binds it, could
    meanwhile be handed to anyone else's bind(0) or outgoing connection, or to the next pick: the
    component then fails to start. A port below the ephemeral range is never handed out by the
    kernel, so only a program that names that very port could take it; each is checked free.
    """
    low, _ = ephemeral or _ephemeral_range()
    first = max(1024, low // 2)
    if low - first < 4 * len(names):
        raise RuntimeError(f"the ephemeral port range starts at {low}: no room below it for the cluster")
    pick = randint or random.SystemRandom().randint
    ports: dict[str, int] = {}
    for name in names:
        for _ in range(1000):
            port = pick(first, low - 1)
            if port not in ports.values() and is_free(port):
                ports[name] = port
                break
        else:
            raise RuntimeError(f"no free port for {name} in {first}-{low - 1}")
    return ports


def _pid_alive(pid: int) -> bool:
    return node.pid_alive(pid)


def _read_pids(sd: Path) -> dict[str, int]:
    return node.read_pids(sd / "pids")


def _load_meta(sd: Path) -> dict[str, Any]:
    try:
        meta: dict[str, Any] = json.loads((sd / "cluster.json").read_text())
        return meta
    except (OSError, ValueError):
        return {}


class Api:
    """Tiny stdlib client for the admin kubeconfig."""

    def __init__(self, server: str, token: str, cafile: str):
        self.server = server.rstrip("/")
        self.token = token
        self.ctx = ssl.create_default_context(cafile=cafile)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        timeout: float = 5.0,
        content_type: str = "application/json",
    ) -> Any:
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            req.add_header("Content-Type", content_type)
        with urllib.request.urlopen(req, context=self.ctx, timeout=timeout) as r:
            raw = r.read()
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode()

    def ok(self, path: str) -> bool:
        try:
            return bool(self.request("GET", path, timeout=2) == "ok")
        except (OSError, urllib.error.URLError, ssl.SSLError):
            return False

    def get(self, path: str) -> Any:
        try:
            return self.request("GET", path, timeout=3)
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise


def _api(sd: Path) -> Api | None:
    meta = _load_meta(sd)
    if not meta:
        return None
    return Api(
        f"https://127.0.0.1:{meta['ports']['apiserver']}",
        (sd / ADMIN_TOKEN_FILE).read_text().strip(),
        str(sd / "pki" / "ca.crt"),
    )


def is_up(sd: Path | None = None) -> bool:
    sd = sd or state_dir()
    pids = _read_pids(sd)
    if not pids or not all(_pid_alive(p) for p in pids.values()) or not node.pids_alive(sd):
        return False
    if not set(COMPONENTS) <= set(pids):  # started by an older e2e/cluster.py: up() starts it anew
        return False
    api = _api(sd)
    return bool(api and api.ok("/readyz"))


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _make_pki(pki: Path) -> None:
    pki.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "3650",
        "-subj",
        "/CN=triton-operator-e2e-ca",
        cwd=pki,
    )
    node.sign(
        pki,
        "apiserver",
        "/CN=kube-apiserver",
        f"subjectAltName=IP:127.0.0.1,IP:{SERVICE_IP},IP:{node.NODE_IP},DNS:localhost,DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
        "extendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n",
    )
    # kube-apiserver's client certificate towards aggregated API servers (--proxy-client-cert-file);
    # its CN is the --requestheader-allowed-names they accept
    node.sign(pki, "front-proxy-client", "/CN=front-proxy-client", node.CLIENT_EXT)
    node.sign(
        pki,
        METRICS_ADAPTER,
        f"/CN={METRICS_SERVICE}.{METRICS_NAMESPACE}.svc",
        f"subjectAltName=DNS:{METRICS_SERVICE}.{METRICS_NAMESPACE}.svc,DNS:localhost,IP:127.0.0.1\n"
        "extendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n",
    )
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    for f in pki.iterdir():
        f.chmod(0o600)


def _write_kubeconfig(path: Path, server: str, token: str, ca: Path) -> None:
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "triton-e2e",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode(),
                },
            }
        ],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "triton-e2e", "context": {"cluster": "triton-e2e", "user": "admin"}}],
        "current-context": "triton-e2e",
    }
    path.write_text(json.dumps(cfg, indent=2) + "\n")  # JSON is valid YAML
    path.chmod(0o600)


# ---- kwok stages ---------------------------------------------------------
def _stage_file(bins: Path, rel: str) -> str:
    return (bins / "kwok-stages" / rel).read_text().strip("\n")


def _add_match_expressions(stage_yaml: str, exprs: str) -> str:
    marker = "  selector:\n    matchExpressions:\n"
    assert marker in stage_yaml, "unexpected kwok stage layout"
    return stage_yaml.replace(marker, marker + exprs, 1)


_EXCLUDE_SPECIAL = f"""\
    - key: '.metadata.annotations["{NEVER_READY_ANNOTATION}"]'
      operator: 'NotIn'
      values:
      - 'true'
    - key: '.metadata.annotations["{CRASH_ANNOTATION}"]'
      operator: 'NotIn'
      values:
      - 'true'
"""

_POD_NETWORK_TEMPLATE = """\
      {{ $hostIPs := NodeIPsWith .spec.nodeName }}
      {{ with $hostIPs }}
      hostIP: {{ index . 0 | Quote }}
      hostIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
      {{ $podIPs := PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" )\
 ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
      {{ with $podIPs }}
      podIP: {{ index . 0 | Quote }}
      podIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
      phase: Running
      startTime: {{ $now | Quote }}
"""


def _special_stage(name: str, annotation: str, container_status: str) -> str:
    return (
        f"""\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: {name}
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.annotations["{annotation}"]'
      operator: 'In'
      values:
      - 'true'
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Pending'
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      conditions:
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "True"
        type: Initialized
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "True"
        type: PodScheduled
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "False"
        reason: ContainersNotReady
        type: Ready
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "False"
        reason: ContainersNotReady
        type: ContainersReady
      containerStatuses:
      {{{{ range .spec.containers }}}}
      - image: {{{{ .image | Quote }}}}
        name: {{{{ .name | Quote }}}}
        ready: false
{container_status}      {{{{ end }}}}
"""
        + _POD_NETWORK_TEMPLATE
    )


_NEVER_READY_STATUS = """\
        started: true
        restartCount: 0
        state:
          running:
            startedAt: {{ $now | Quote }}
"""

_CRASH_STATUS = """\
        started: false
        restartCount: 5
        lastState:
          terminated:
            exitCode: 1
            reason: Error
            startedAt: {{ $now | Quote }}
            finishedAt: {{ $now | Quote }}
        state:
          waiting:
            reason: CrashLoopBackOff
            message: 'back-off 5m0s restarting failed container (triton-operator e2e crash simulation)'
"""


def kwok_stages(bins: Path) -> str:
    """All kwok Stage objects as one multi-document YAML."""
    docs = [
        _stage_file(bins, "node/fast/node-initialize.yaml"),
        _stage_file(bins, "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml"),
        _add_match_expressions(_stage_file(bins, "pod/fast/pod-ready.yaml"), _EXCLUDE_SPECIAL),
        _stage_file(bins, "pod/fast/pod-complete.yaml"),
        _stage_file(bins, "pod/fast/pod-delete.yaml"),
        _special_stage("pod-never-ready", NEVER_READY_ANNOTATION, _NEVER_READY_STATUS).strip("\n"),
        _special_stage("pod-crash-loop", CRASH_ANNOTATION, _CRASH_STATUS).strip("\n"),
    ]
    return "\n---\n".join(docs) + "\n"


def _node_manifest(name: str, gpus: int) -> dict[str, Any]:
    res = {"cpu": "32", "memory": "256Gi", "pods": "110", "ephemeral-storage": "1Ti"}
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
    }
    if gpus:
        res["nvidia.com/gpu"] = str(gpus)
        labels["nvidia.com/gpu.present"] = "true"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {FAKE_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {},
        "status": {"capacity": dict(res), "allocatable": dict(res)},
    }


def _spawn(sd: Path, name: str, argv: list[str]) -> int:
    return node.spawn(sd, sd / "pids", sd / "logs", name, argv)


def _wait(what: str, cond: Callable[[], T | None], timeout: float, sd: Path, interval: float = 0.2) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, pid in _read_pids(sd).items():
            if not _pid_alive(pid):
                tail = ""
                lf = sd / "logs" / f"{name}.log"
                if lf.exists():
                    tail = "\n".join(lf.read_text(errors="replace").splitlines()[-30:])
                raise RuntimeError(f"{name} (pid {pid}) exited while waiting for {what}; log {lf}:\n{tail}")
        r: T | None
        try:
            r = cond()
        except (OSError, urllib.error.URLError, ssl.SSLError, ValueError):
            r = None
        if r:
            return r
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}; logs in {sd / 'logs'}")


@contextlib.contextmanager
def _state_lock() -> Iterator[None]:
    """Serialize up/down on one state dir across processes (re-entrant within a process)."""
    global _lock_depth  # noqa: PLW0603
    if _lock_depth:
        _lock_depth += 1
        try:
            yield
        finally:
            _lock_depth -= 1
        return
    locks = cache_root() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha256(str(state_dir()).encode()).hexdigest()[:16]
    with open(locks / f"cluster-{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        _lock_depth = 1
        try:
            yield
        finally:
            _lock_depth = 0
            fcntl.flock(fh, fcntl.LOCK_UN)


_lock_depth = 0


def up(build_if_needed: bool = True, timeout: float = 180.0) -> Path:
    """Start the cluster (idempotent). Returns the kubeconfig path.

    Interrupted (Ctrl-C, or SIGTERM/SIGHUP within stop_signals_interrupt()): what was started is
    brought down again before the KeyboardInterrupt goes on."""
    with _state_lock():
        try:
            return _up(build_if_needed, timeout)
        except KeyboardInterrupt:
            log("interrupted: bringing down what was started")
            _shielded_down(quiet=True)
            raise


# --------------------------------------------------------------------------
# Signals: every way of stopping a command that started the cluster brings it down
# --------------------------------------------------------------------------
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _raise_interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


@contextlib.contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP (a closed terminal, `timeout`, a CI job's cancel) raise
    KeyboardInterrupt in the main thread as Ctrl-C does, so every ``finally`` clean-up (and down)
    runs however the command is stopped. Outside the main thread: no change."""
    if not _in_main_thread():
        yield
        return
    old = {s: signal.signal(s, _raise_interrupt) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def stop_group(process: subprocess.Popen[Any], timeout: float = 15) -> None:
    """SIGTERM to a process started with start_new_session=True and its children, SIGKILL after
    ``timeout`` seconds; nothing when it has exited."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


_deferring = False


@contextlib.contextmanager
def signals_deferred() -> Iterator[list[int]]:
    """Within the block (a clean-up), SIGINT/SIGTERM/SIGHUP are noted in the list it yields instead
    of cutting the clean-up short; the caller decides what to do with them after. Nested: the
    outermost block notes them (the inner list stays empty)."""
    global _deferring  # noqa: PLW0603
    if not _in_main_thread() or _deferring:
        yield []
        return
    got: list[int] = []

    def note(signum: int, _frame: object) -> None:
        got.append(signum)
        log(f"{signal.Signals(signum).name} received: finishing the clean-up first")

    old = {s: signal.signal(s, note) for s in STOP_SIGNALS}
    _deferring = True
    try:
        yield got
    finally:
        _deferring = False
        for s, handler in old.items():
            signal.signal(s, handler)


def _shielded_down(quiet: bool) -> None:
    """_down, which a Ctrl-C or SIGTERM cannot cut short (it is noted and raised after)."""
    with signals_deferred() as got:
        _down(quiet)
    if got:
        raise KeyboardInterrupt(f"stopped by {signal.Signals(got[0]).name} (during down)")


def _up(build_if_needed: bool, timeout: float) -> Path:
    sd = state_dir()
    if is_up(sd):
        log(f"cluster already up ({kubeconfig_path()})")
        return kubeconfig_path()
    if sd.exists():
        log("found stale cluster state; cleaning it up")
        down(quiet=True)
    bins = build() if build_if_needed else bin_dir()
    missing = [b for b in REQUIRED_BINARIES if not (bins / b).exists()]
    if missing:
        raise RuntimeError(f"missing binaries in {bins}: {missing} (run `e2e/cluster build`)")

    t0 = time.monotonic()
    sd.mkdir(parents=True, exist_ok=True)
    (sd / MARKER).write_text("state of e2e/cluster.py; removed by `e2e/cluster down`\n")
    for sub in ("logs", "pids", "pki", "etcd", "certs", "kcm-certs", "sched-certs"):
        (sd / sub).mkdir(parents=True, exist_ok=True)
    sd.chmod(0o700)
    (sd / "etcd").chmod(0o700)
    ports = _pick_ports()
    token = hashlib.sha256(os.urandom(32)).hexdigest()[:40]
    (sd / ADMIN_TOKEN_FILE).write_text(token + "\n")
    (sd / "tokens.csv").write_text(f'{token},admin,admin-uid,"system:masters"\n')
    (sd / "tokens.csv").chmod(0o600)
    pki = sd / "pki"
    _make_pki(pki)
    # The real node's bridge (10.77.0.1) exists before the API server starts; containerd starts
    # (and the images load) in a thread meanwhile.
    real, real_skip = _real_node_start(sd, bins, ports)
    server = f"https://127.0.0.1:{ports['apiserver']}"
    kc = kubeconfig_path()
    _write_kubeconfig(kc, server, token, pki / "ca.crt")
    (sd / "kwok.yaml").write_text(kwok_stages(bins))
    (sd / "cluster.json").write_text(
        json.dumps(
            {
                "ports": ports,
                "bin_dir": str(bins),
                "started": time.time(),
                "kubernetes": KUBERNETES_VERSION,
                "metrics": {"write_url": _metrics_write_url(ports)},
            },
            indent=2,
        )
        + "\n"
    )

    etcd_url = f"http://127.0.0.1:{ports['etcd']}"
    _spawn(
        sd,
        "etcd",
        [
            str(bins / "etcd"),
            "--name=e2e",
            f"--data-dir={sd / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{ports['etcd_peer']}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{ports['etcd_peer']}",
            f"--initial-cluster=e2e=http://127.0.0.1:{ports['etcd_peer']}",
            "--log-level=warn",
            "--unsafe-no-fsync=true",  # throwaway test data; much faster on slow disks
            "--quota-backend-bytes=2147483648",
        ],
    )
    _wait("etcd", lambda: urllib.request.urlopen(etcd_url + "/health", timeout=1).status == 200, 30, sd)

    if real is not None:
        try:
            node.add_apiserver_guard(ports["apiserver"])
        except Exception as e:  # any failure costs only the real node
            real, real_skip = None, _real_node_abandon(sd, e)
    if real is None:
        apiserver_net = [
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            "--endpoint-reconciler-type=none",  # 127.0.0.1 is not a valid endpoint address
        ]
    else:
        # kube-apiserver binds one address, and both 127.0.0.1 (host kubeconfigs) and 10.77.0.1
        # (pods, through the `kubernetes` Service: --advertise-address) must work: it binds all
        # addresses, and the iptables guard node.add_apiserver_guard() drops its port on every
        # interface but loopback and the bridge. The default (lease) endpoint reconciler keeps
        # the `kubernetes` Service's endpoint at 10.77.0.1.
        apiserver_net = ["--bind-address=0.0.0.0", *node.apiserver_flags(pki)]
    _spawn(
        sd,
        "kube-apiserver",
        [
            str(bins / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            *apiserver_net[:2],
            f"--secure-port={ports['apiserver']}",
            f"--cert-dir={sd / 'certs'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--requestheader-client-ca-file={pki / 'ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
            f"--token-auth-file={sd / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC",
            "--anonymous-auth=true",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            *apiserver_net[2:],
            "--allow-privileged=true",
            "--profiling=false",
            "--v=1",
        ],
    )
    api = Api(server, token, str(pki / "ca.crt"))
    _wait("kube-apiserver /readyz", lambda: api.ok("/readyz"), 90, sd)
    t_api = time.monotonic() - t0
    if real is not None:
        try:
            real.start_kubelet(server)
        except Exception as e:
            real, real_skip = None, _real_node_abandon(sd, e, keep_guard=True)

    _spawn(
        sd,
        "kube-controller-manager",
        [
            str(bins / "kube-controller-manager"),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports['kcm']}",
            f"--cert-dir={sd / 'kcm-certs'}",
            "--leader-elect=false",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            # its default, /usr/libexec/kubernetes/kubelet-plugins/volume/exec, would be created
            f"--flex-volume-plugin-dir={sd / 'kcm-flex'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--controllers=*",
            f"--horizontal-pod-autoscaler-sync-period={HPA_SYNC_PERIOD}",
            "--enable-garbage-collector=true",
            "--use-service-account-credentials=false",
            "--profiling=false",
            "--v=1",
        ],
    )
    _spawn(
        sd,
        "kube-scheduler",
        [
            str(bins / "kube-scheduler"),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports['scheduler']}",
            f"--cert-dir={sd / 'sched-certs'}",
            "--leader-elect=false",
            "--profiling=false",
            "--v=1",
        ],
    )
    _spawn(
        sd,
        "kwok",
        [
            str(bins / "kwok"),
            f"--kubeconfig={kc}",
            f"--config={sd / 'kwok.yaml'}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
            f"--server-address=127.0.0.1:{ports['kwok']}",
            "--node-lease-duration-seconds=40",
            f"--node-ip={KWOK_NODE_IP}",
            f"--cidr={KWOK_POD_CIDR}",
            "--v=INFO",
        ],
    )

    _start_metrics_adapter(sd, bins, api, kc, ports)

    # fake nodes
    for n in GPU_NODES + CPU_NODES:
        body = _node_manifest(n, 4 if n in GPU_NODES else 0)
        try:
            api.request("POST", "/api/v1/nodes", body)
        except urllib.error.HTTPError as e:
            if e.code != 409:
                detail = e.read().decode(errors="replace")
                raise RuntimeError(f"creating node {n}: HTTP {e.code}: {detail}") from e

    # Gateway API CRDs
    crds = bins / TOOLS["gateway-api"]["concat"]["config/crd/standard"]
    crd_proc = None
    if crds.exists():
        crd_proc = subprocess.Popen(
            [
                str(bins / "kubectl"),
                f"--kubeconfig={kc}",
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                str(crds),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    else:
        log(f"warning: {crds} missing; Gateway API CRDs not installed")

    def nodes_ready() -> bool:
        items = api.get("/api/v1/nodes")["items"]
        ready = {
            i["metadata"]["name"]
            for i in items
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in i.get("status", {}).get("conditions", [])
            )
        }
        return ready >= set(GPU_NODES + CPU_NODES)

    _wait(
        "default ServiceAccount",
        lambda: api.get("/api/v1/namespaces/default/serviceaccounts/default"),
        timeout,
        sd,
    )
    _wait("fake nodes Ready", nodes_ready, timeout, sd)
    if crd_proc is not None:
        outp, _ = crd_proc.communicate(timeout=120)
        if crd_proc.returncode != 0:
            raise RuntimeError(f"installing Gateway API CRDs failed:\n{outp}")
        _wait(
            "Gateway API CRDs established",
            lambda: all(
                any(
                    c["type"] == "Established" and c["status"] == "True"
                    for c in (api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{n}") or {})
                    .get("status", {})
                    .get("conditions", [])
                )
                for n in ("httproutes.gateway.networking.k8s.io", "grpcroutes.gateway.networking.k8s.io")
            ),
            60,
            sd,
        )
    if real is not None:
        try:
            real.wait_ready(lambda: _node_ready(api, node.NODE_NAME), timeout)
        except Exception as e:
            real, real_skip = None, _real_node_abandon(sd, e, keep_guard=True)
    _wait_metrics_apis(sd, api, timeout)
    _wait("kube-apiserver /readyz", lambda: api.ok("/readyz"), 30, sd)
    took = time.monotonic() - t0
    meta = _load_meta(sd)
    meta["ready_seconds"] = round(took, 1)
    meta["real_node"] = real.meta() if real is not None else {"skipped": real_skip}
    (sd / "cluster.json").write_text(json.dumps(meta, indent=2) + "\n")
    if real is not None:
        t = real.timings
        log(
            f"real node {node.NODE_NAME} ({node.NODE_IP}) Ready: containerd {t.get('containerd')}s, "
            f"images {t.get('images_build')}s + load {t.get('images_load')}s, "
            f"kubelet Ready {t.get('kubelet_ready')}s after start"
        )
    log(f"cluster ready in {took:.1f}s (apiserver ready after {t_api:.1f}s); KUBECONFIG={kc}")
    return kc


def _node_ready(api: Api, name: str) -> bool:
    n = api.get(f"/api/v1/nodes/{name}") or {}
    return any(
        c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", [])
    )


def _metrics_write_url(ports: dict[str, int]) -> str:
    """Where the metrics adapter takes values: POST <url>/namespaces/<ns>/<resource>/<name>/<metric>."""
    return f"http://127.0.0.1:{ports['metrics_write']}/write-metrics"


def _start_metrics_adapter(sd: Path, bins: Path, api: Api, kc: Path, ports: dict[str, int]) -> None:
    """Start the custom/external metrics API server and register its APIServices (not yet Available)."""
    pki = sd / "pki"
    _spawn(
        sd,
        METRICS_ADAPTER,
        [
            str(bins / METRICS_ADAPTER),
            "--bind-address=127.0.0.1",
            f"--secure-port={ports['metrics_adapter']}",
            f"--tls-cert-file={pki / f'{METRICS_ADAPTER}.crt'}",
            f"--tls-private-key-file={pki / f'{METRICS_ADAPTER}.key'}",
            f"--lister-kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--discovery-interval=5s",
            f"--write-metrics-address=127.0.0.1:{ports['metrics_write']}",
            "--v=1",
        ],
    )
    ca = base64.b64encode((pki / "ca.crt").read_bytes()).decode()
    objects: list[tuple[str, dict[str, Any]]] = [
        (
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": METRICS_NAMESPACE}},
        ),
        (
            f"/api/v1/namespaces/{METRICS_NAMESPACE}/services",
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": METRICS_SERVICE, "namespace": METRICS_NAMESPACE},
                "spec": {"type": "ExternalName", "externalName": "localhost"},
            },
        ),
    ]
    for group, version in METRICS_APISERVICES:
        apiservice: dict[str, Any] = {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": f"{version}.{group}"},
            "spec": {
                "group": group,
                "version": version,
                "service": {
                    "namespace": METRICS_NAMESPACE,
                    "name": METRICS_SERVICE,
                    "port": ports["metrics_adapter"],
                },
                "caBundle": ca,
                "groupPriorityMinimum": 100,
                "versionPriority": 200 if version == "v1beta2" else 100,
            },
        }
        objects.append(("/apis/apiregistration.k8s.io/v1/apiservices", apiservice))
    for path, body in objects:
        try:
            api.request("POST", path, body)
        except urllib.error.HTTPError as e:
            if e.code != 409:
                detail = e.read().decode(errors="replace")
                raise RuntimeError(
                    f"creating {body['kind']} {body['metadata']['name']}: HTTP {e.code}: {detail}"
                ) from e


def _wait_metrics_apis(sd: Path, api: Api, timeout: float) -> None:
    """Wait until the metrics APIServices are Available; else fail with their conditions and the log tail."""
    last: dict[str, str] = {}

    def available() -> bool:
        for group, version in METRICS_APISERVICES:
            name = f"{version}.{group}"
            status = (api.get(f"/apis/apiregistration.k8s.io/v1/apiservices/{name}") or {}).get("status", {})
            c: dict[str, Any] = next(
                (x for x in status.get("conditions", []) if x["type"] == "Available"), {}
            )
            last[name] = f"{c.get('status')} {c.get('reason')}: {c.get('message')}"
            if c.get("status") != "True":
                return False
        return True

    try:
        _wait("metrics APIServices Available", available, timeout, sd)
    except TimeoutError as e:
        lf = sd / "logs" / f"{METRICS_ADAPTER}.log"
        tail = "\n".join(lf.read_text(errors="replace").splitlines()[-30:]) if lf.exists() else ""
        raise TimeoutError(f"{e}; last Available conditions: {last}; log {lf}:\n{tail}") from e


def _real_node_start(sd: Path, bins: Path, ports: dict[str, int]) -> tuple[node.RealNode | None, str]:
    """Preflight, bridge, certificates, containerd thread; (None, reason) when there is no real node."""
    reason = node.preflight(bins, node.Paths(sd, cache_root()))
    if reason:
        log(f"real node skipped: {reason}")
        return None, reason
    try:
        node.teardown(sd, cache_root(), quiet=True)  # what a crashed run left on the host
        real = node.RealNode(sd, cache_root(), bins, ports)
        real.setup_host([SERVICE_CIDR, KWOK_POD_CIDR])
        node.add_services_guard(SERVICE_CIDR)
        node.make_pki(sd / "pki")
        real.start_runtime()
    except Exception as e:
        return None, _real_node_abandon(sd, e)
    return real, ""


def _real_node_abandon(sd: Path, err: BaseException, keep_guard: bool = False) -> str:
    """The real node failed: log why, remove its parts, return the reason (the rest goes on)."""
    reason = str(err) if isinstance(err, node.NodeError) else f"{type(err).__name__}: {err}"
    log(f"real node skipped: {reason}")
    try:
        node.teardown(sd, cache_root(), keep_guard=keep_guard, quiet=True)
    except Exception as e:
        log(f"warning: cleaning up the real node failed: {e}")
    return reason


COMPONENTS = [METRICS_ADAPTER, "kwok", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"]


def _procs_referencing(path: Path, pgids: set[int] | None = None) -> list[int]:
    """Live processes of this cluster: their command line names the state dir and they are a
    cluster component (by executable name) or belong to a process group we started.
    Never this process or its ancestors (e.g. a shell whose command line mentions the path)."""
    needle = str(path).encode()
    skip = node.ancestors()
    pgids = pgids or set()
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) in skip:
            continue
        pid = int(p.name)
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
            pgid = os.getpgid(pid)
        except (OSError, ProcessLookupError):
            continue
        if needle not in b"\0".join(argv) or not _pid_alive(pid):
            continue
        exe = os.path.basename(argv[0].decode(errors="replace"))
        if exe in COMPONENTS or exe in node.PROCESS_NAMES or pgid in pgids:
            out.append(pid)
    return out


def down(quiet: bool = False) -> None:
    """Stop every process of the cluster and remove its state directory."""
    with _state_lock():
        _shielded_down(quiet)


def _down(quiet: bool) -> None:
    """Every step runs whatever failed before it; one RuntimeError at the end names all failures.
    What is already gone counts as stopped or removed, so down is safe to repeat."""
    sd = state_dir()
    errors: list[str] = []
    # the real node first (kubelet, pods, containerd, kube-proxy, and what they did to the host);
    # also without a state dir: a crashed or interrupted run may have left its parts on the host
    try:
        node.teardown(sd, cache_root(), quiet=quiet)
    except Exception as e:  # stop the control plane anyway; report at the end
        errors.append(f"cleaning up the real node failed: {e}")
    if not sd.exists():
        if errors:
            raise RuntimeError("; ".join(errors))
        if not quiet:
            log("cluster is not running (no state dir)")
        return
    errors += _stop_control_plane(sd)
    mounts = node.mounts_under([sd])
    if mounts:  # never rm -rf through a mount
        errors.append(f"not removing {sd}: mounts below it remain: {mounts[:10]}")
    elif (sd / MARKER).exists() or not any(sd.iterdir()):
        shutil.rmtree(sd, ignore_errors=True)
    else:
        log(f"not removing {sd}: it has no {MARKER} marker (not created by this script)")
    if errors:
        raise RuntimeError("; ".join(errors))
    if not quiet:
        log(f"cluster stopped; removed {sd}")


def down_reporting(quiet: bool = False) -> list[str]:
    """Bring the cluster down, then check ``leftovers()``: what failed or remains ([] when clean).

    For benchmarks and fixtures that print their results first: a teardown failure comes back as
    text to print beside them, never as an exception that would hide them."""
    problems: list[str] = []
    try:
        down(quiet)
    except RuntimeError as e:
        problems.append(f"down failed: {e}")
    problems += [f"left behind: {x}" for x in leftovers()]
    return problems


def _stop_control_plane(sd: Path) -> list[str]:
    """Stop the cluster's processes (clients first, then the apiserver, etcd last); what failed."""
    pids = _read_pids(sd)
    # the apiserver shuts down quickly only while etcd is still there
    waves = [
        [METRICS_ADAPTER, "kwok", "kube-scheduler", "kube-controller-manager"],
        ["kube-apiserver"],
        ["etcd"],
    ]
    waves.append([n for n in pids if n not in COMPONENTS])
    for wave in waves:
        node.terminate([pids[n] for n in wave if n in pids])
    pgids = set(pids.values())
    leftovers = _procs_referencing(sd, pgids)
    if leftovers:
        log(f"terminating leftover processes referencing {sd}: {leftovers}")
        node.terminate(leftovers, grace=5)
    leftovers = _procs_referencing(sd, pgids)
    return [f"processes still running after down: {leftovers}"] if leftovers else []


def status() -> dict[str, Any]:
    sd = state_dir()
    pids = _read_pids(sd) | _read_pids(sd / "node")
    return {
        "up": is_up(sd),
        "state_dir": str(sd),
        "kubeconfig": str(kubeconfig_path()) if (sd / "kubeconfig").exists() else None,
        "processes": {n: {"pid": p, "alive": _pid_alive(p)} for n, p in sorted(pids.items())},
        "bin_dir": str(bin_dir()),
        "binaries_built": binaries_ready(),
        "real_node": _load_meta(sd).get("real_node"),
        "metrics_write_url": metrics_write_url(),
    }


def leftovers() -> list[str]:
    """What of a cluster (this state dir) and of the real node remains on this machine."""
    sd = state_dir()
    out = [f"state dir {sd}"] if sd.exists() else []
    for pid in _procs_referencing(sd):
        with contextlib.suppress(OSError):
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            if os.path.basename(argv0) not in node.PROCESS_NAMES:  # those node.leftovers() lists
                out.append(f"process {pid} ({os.path.basename(argv0)}) referencing {sd}")
    return out + node.leftovers(sd, cache_root())


def real_node() -> tuple[dict[str, Any] | None, str]:
    """The real node of this state dir's cluster ({name, ip, pod_cidr, ...}), or None and why not."""
    sd = state_dir()
    if not (sd / "cluster.json").exists():
        return None, f"the cluster is not up (no {sd / 'cluster.json'})"
    real = _load_meta(sd).get("real_node") or {}
    if real.get("name") and real.get("ip"):
        return dict(real), ""
    return None, str(real.get("skipped") or "the local cluster has no real node")


def metrics_write_url() -> str | None:
    """The metrics adapter's write URL of this state dir's cluster (see _metrics_write_url), or None."""
    url = _load_meta(state_dir()).get("metrics", {}).get("write_url")
    return str(url) if url else None


def env_lines() -> list[str]:
    """Shell exports for the cluster of this state dir (`cluster.py env`)."""
    lines = [f"export KUBECONFIG={kubeconfig_path()}", f"export PATH={bin_dir()}:$PATH"]
    url = metrics_write_url()
    lines.append(f"export {METRICS_WRITE_URL_ENV}={url}" if url else f"unset {METRICS_WRITE_URL_ENV}")
    real, why = real_node()
    if real is not None:
        lines += [
            "unset TRITON_E2E_REAL_NODE_SKIP",
            f"export TRITON_E2E_REAL_NODE={real['name']}",
            f"export TRITON_E2E_NODE_IP={real['ip']}",
        ]
    else:
        lines += [
            "unset TRITON_E2E_REAL_NODE TRITON_E2E_NODE_IP",
            f"export TRITON_E2E_REAL_NODE_SKIP={shlex.quote(why)}",
        ]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="e2e/cluster", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build or reuse cached binaries; print the bin dir")
    b.add_argument("tools", nargs="*", metavar="TOOL", help=f"subset of {BUILD_ORDER} (default: all)")
    b.add_argument(
        "--regenerate",
        action="store_true",
        help="regenerate wrapper go.mod/go.sum even if the pins did not change",
    )
    sub.add_parser("up", help="start the cluster (idempotent); print the kubeconfig path")
    sub.add_parser("down", help="stop the cluster and remove its state")
    sub.add_parser("env", help=f"print shell exports (KUBECONFIG, PATH, {METRICS_WRITE_URL_ENV})")
    sub.add_parser("status", help="is the cluster up? (exit 0 if up, 1 if not)")
    sub.add_parser(
        "leftovers", help="list what of the cluster and its real node remains (exit 1 if anything does)"
    )
    args = ap.parse_args(argv)
    try:
        with stop_signals_interrupt():
            return _command(ap, args)
    except (RuntimeError, TimeoutError, subprocess.CalledProcessError) as e:
        log(f"error: {e}")
        return 1
    except KeyboardInterrupt as e:
        log(f"interrupted ({e or 'Ctrl-C'})")
        return 130


def _command(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Run one subcommand; its exit status."""
    if args.cmd == "build":
        unknown = set(args.tools) - set(BUILD_ORDER)
        if unknown:
            ap.error(f"unknown tools {sorted(unknown)}; choose from {BUILD_ORDER}")
        if args.regenerate:
            for n in BUILD_ORDER:
                ensure_wrapper(n, force=True)
        print(build(args.tools or None))
    elif args.cmd == "up":
        print(up())
    elif args.cmd == "down":
        down()
    elif args.cmd == "env":
        print("\n".join(env_lines()))
    elif args.cmd == "leftovers":
        left = leftovers()
        for line in left:
            print(line)
        print(f"{len(left)} leftovers" if left else "no leftovers", file=sys.stderr)
        return 1 if left else 0
    elif args.cmd == "status":
        st = status()
        print(json.dumps(st, indent=2))
        print("cluster is " + ("up" if st["up"] else "down"), file=sys.stderr)
        return 0 if st["up"] else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
