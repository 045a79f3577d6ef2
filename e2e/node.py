"""The real node of the e2e cluster: kubelet + containerd + runc + a CNI bridge + kube-proxy.

Stdlib only, driven by e2e/cluster.py (``up`` / ``down`` / ``leftovers``). As a command it only
runs the node's cluster DNS server (``python3 e2e/node.py dns ...``, started by cluster.py).

Besides the kwok fake nodes, ``cluster.py up`` adds node ``real-node-1`` where real pods run:

- bridge ``triton0`` with 10.77.0.1/24 (made before the API server starts, so test servers can
  bind 10.77.0.1 early), pods get 10.77.0.0/24 from the CNI bridge plugin (host-local IPAM);
- containerd (the system one, 1.6+) with a private config: image content and snapshots under
  ``<cache>/containerd/root`` (kept across up/down, so images load once), state, socket, runc
  root, CNI config, network namespaces under ``<state dir>/node``;
- kubelet (built from the pinned k8s.io/kubernetes) registering ``real-node-1`` with InternalIP
  10.77.0.1, label ``triton-operator.io/real-node=true`` and taint
  ``triton-operator.io/real-node=true:NoSchedule``;
- kube-proxy (iptables mode) so ClusterIP Services route from this host and from pods;
- a small cluster DNS server on 10.77.0.1:53 (the pods' nameserver): ``<svc>.<ns>.svc.cluster.local``
  (ClusterIP, or the ready endpoints of a headless Service), ``<hostname>.<svc>.<ns>.svc...`` and
  ``a-b-c-d.<ns>.pod...``, answered from the API server; every other name is NXDOMAIN, so pods
  never send a query off this machine. (kopf in a pod logs in at https://kubernetes.default.svc.)

Everything it changes on the host is listed in a record (``/run/triton-e2e/real-node.json``)
and undone by :func:`teardown`; :func:`leftovers` lists what would remain.

Only one real node can exist per machine (the bridge name and subnet are fixed): a second
cluster (another state dir) runs without one.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import re
import resource
import shlex
import shutil
import signal
import socket
import socketserver
import ssl
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

T = TypeVar("T")

NODE_NAME = "real-node-1"
NODE_IP = "10.77.0.1"
POD_CIDR = "10.77.0.0/24"
BRIDGE = "triton0"
# This VM's eth0 MTU; pods only talk to this machine, so a smaller MTU than the host's costs nothing.
MTU = 1400
LABEL = "triton-operator.io/real-node"
TAINT = {"key": LABEL, "value": "true", "effect": "NoSchedule"}


def placement() -> dict[str, Any]:
    """Pod spec fields that put a pod on the real node: its label selected, its taint tolerated."""
    return {
        "nodeSelector": {LABEL: TAINT["value"]},
        "tolerations": [{"key": LABEL, "operator": "Exists", "effect": TAINT["effect"]}],
    }


PAUSE_IMAGE = "localhost/triton-operator/pause:3.10"
CNI_NETWORK = "triton-e2e"
CNI_BIN_DIR = Path("/usr/lib/cni")
CNI_PLUGINS = ("bridge", "host-local", "loopback")
CTR_NAMESPACE = "k8s.io"
ENV_SWITCH = "TRITON_E2E_REAL_NODE"
# comma-separated names of e2e/images.py images to build and load (default: all; "pause" is always in)
ENV_IMAGES = "TRITON_E2E_IMAGES"
NODE_BINARIES = ("kubelet", "kube-proxy")
HOST_TOOLS = (
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "runc",
    "ip",
    "iptables",
    "iptables-save",
    "iptables-restore",
    "umount",
    "openssl",
)
# processes of the node, by executable name (cluster.py uses this to find leftovers); the DNS
# server is `python3 <this file> dns ...`
PROCESS_NAMES = ("kubelet", "kube-proxy", "containerd", "containerd-shim-runc-v2")
DNS_DOMAIN = "cluster.local"
NODE_PY = str(Path(__file__).resolve())

RECORD = Path("/run/triton-e2e/real-node.json")
GUARD_CHAIN = "TRITON-E2E-APISERVER"
# new connections to the Service range that no kube-proxy rule translated are dropped here
# (add_services_guard); swept by teardown like kube-proxy's chains
SERVICES_CHAIN = "TRITON-E2E-SERVICES"
# kubelet's cgroupRoot: its kubepods/ tree (every pod and container) goes below this top-level
# folder, made in every cgroup hierarchy by setup_host, so teardown knows exactly what is ours
CGROUP_ROOT = "triton-e2e"
# Host sysctls kubelet sets (setupKernelTunables: it changes them unless protectKernelDefaults,
# which instead refuses to start when they differ) and the ones the node may need to turn on.
# Their old values are recorded and put back by teardown.
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
NET_SYSCTLS = {"net/ipv4/ip_forward": "1", "net/bridge/bridge-nf-call-iptables": "1"}
# host folders the node's parts may create, deepest first; removed again when they did not exist
# before and are empty
HOST_DIRS = (
    "/var/log/containers",
    "/var/lib/cni/results",
    "/var/lib/cni",
    "/run/containerd/s",
    "/run/containerd",
    "/var/lib/kubelet/device-plugins",
    "/var/lib/kubelet",
)
# kubelet's device-plugin socket: hard-coded, whatever --root-dir says
DEVICE_PLUGIN_SOCKET = Path("/var/lib/kubelet/device-plugins/kubelet.sock")
VAR_LOG_CONTAINERS = Path("/var/log/containers")  # hard-coded in kubelet
CNI_CACHE = Path("/var/lib/cni/results")  # libcni's cache, not configurable in containerd 1.6
# containerd 1.6 shims put their sockets here, whatever containerd's state dir
SHIM_SOCKETS = Path("/run/containerd/s")


def log(msg: str) -> None:
    print(f"[cluster] real node: {msg}", file=sys.stderr, flush=True)


class NodeError(RuntimeError):
    """The real node could not come up; the message is the reason recorded in cluster.json."""


# --------------------------------------------------------------------------
# Paths
# --------------------------------------------------------------------------
class Paths:
    """Where the node's parts live for one cluster state dir (and the shared image cache)."""

    def __init__(self, sd: Path, cache: Path):
        self.sd = sd
        self.cache = cache
        self.dir = sd / "node"
        self.pids = self.dir / "pids"
        self.logs = sd / "logs"
        self.pki = sd / "pki"
        self.ctr_root = cache / "containerd" / "root"  # image content + snapshots: survives down
        self.ctr_state = self.dir / "containerd"
        self.sock = self.dir / "containerd.sock"
        self.ctr_config = self.dir / "containerd.toml"
        self.runc_root = self.dir / "runc"
        self.cni_conf = self.dir / "cni"
        self.cni_ipam = self.dir / "cni-ipam"
        self.kubelet_root = self.dir / "kubelet"
        self.pod_logs = self.dir / "pod-logs"

    def ctr(self) -> list[str]:
        """`ctr` command prefix for this node's containerd."""
        return ["ctr", "--address", str(self.sock), "--namespace", CTR_NAMESPACE]

    def mount_roots(self) -> list[Path]:
        return [self.dir, self.ctr_root]


# --------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------
def _sh(cmd: list[str], check: bool = False, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(c) for c in cmd],
        capture_output=True,
        text=True,
        check=check,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (zombies count as dead; our own exited children are reaped)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def read_pids(d: Path) -> dict[str, int]:
    """name -> pid of the *.pid files in ``d``."""
    out = {}
    if d.is_dir():
        for f in d.glob("*.pid"):
            with contextlib.suppress(ValueError, OSError):
                out[f.stem] = int(f.read_text().strip())
    return out


def pids_alive(sd: Path) -> bool:
    """True when every process the node started for this state dir still runs (or none was started)."""
    return all(pid_alive(p) for p in read_pids(sd / "node" / "pids").values())


def ancestors() -> set[int]:
    """This process and its ancestors (never to be signalled by a clean-up)."""
    out, pid = set(), os.getpid()
    while pid > 1:
        out.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def _processes() -> list[tuple[int, list[str]]]:
    skip = ancestors()
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) in skip:
            continue
        try:
            argv = [a.decode(errors="replace") for a in (p / "cmdline").read_bytes().split(b"\0") if a]
        except OSError:
            continue
        if argv and pid_alive(int(p.name)):
            out.append((int(p.name), argv))
    return out


def is_node_process(argv: list[str], node_dir: Path, names: tuple[str, ...] = PROCESS_NAMES) -> bool:
    """A process of the node in node_dir: a node executable (or our DNS server) naming node_dir."""
    if not argv or not any(str(node_dir) in a for a in argv):
        return False
    dns = len(argv) > 2 and argv[1] == NODE_PY and argv[2] == "dns"
    return os.path.basename(argv[0]) in names or (dns and "dns" in names)


def _node_processes(p: Paths, names: tuple[str, ...] = (*PROCESS_NAMES, "dns")) -> list[int]:
    """Live processes of this node."""
    return [pid for pid, argv in _processes() if is_node_process(argv, p.dir, names)]


def _kill(pid: int, sig: int, group: bool = True) -> None:
    """Signal pid, or the process group it leads (processes started with start_new_session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group and os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def terminate(pids: list[int], grace: float = 10.0, group: bool = True) -> None:
    """SIGTERM (to each process group), up to ``grace`` seconds, then SIGKILL; wait until they are gone."""
    pids = [p for p in pids if pid_alive(p)]
    if not pids:
        return
    for pid in pids:
        _kill(pid, signal.SIGTERM, group)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.05)
    for pid in pids:
        if pid_alive(pid):
            log(f"pid {pid} ignored SIGTERM; sending SIGKILL")
            _kill(pid, signal.SIGKILL, group)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.05)


def spawn(
    cwd: Path, pids: Path, logs: Path, name: str, argv: list[str], *, env: dict[str, str] | None = None
) -> int:
    """Start ``argv`` in a session of its own, logging to logs/NAME.log; its pid in pids/NAME.pid."""
    pids.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"{name}.log", "ab") as logf:
        proc = subprocess.Popen(
            argv,
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    (pids / f"{name}.pid").write_text(f"{proc.pid}\n")
    (logs / f"{name}.cmd").write_text(shlex.join(argv) + "\n")
    return proc.pid


def _spawn(p: Paths, name: str, argv: list[str], env: dict[str, str] | None = None) -> int:
    return spawn(p.dir, p.pids, p.logs, name, argv, env=env)


def _log_tail(p: Paths, name: str, lines: int = 25) -> str:
    lf = p.logs / f"{name}.log"
    try:
        return "\n".join(lf.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _wait(p: Paths, what: str, cond: Callable[[], object], timeout: float, procs: tuple[str, ...]) -> None:
    """Wait for cond(); fail early (NodeError; the log's tail goes to stderr) when one of procs exits."""
    deadline = time.monotonic() + timeout
    pids = read_pids(p.pids)
    while time.monotonic() < deadline:
        for name in procs:
            if name in pids and not pid_alive(pids[name]):
                tail = _log_tail(p, name)
                log(f"{name} exited while waiting for {what}; the end of {p.logs / name}.log:\n{tail}")
                last = next((ln for ln in reversed(tail.splitlines()) if ln.strip()), "")
                raise NodeError(f"{name} exited while waiting for {what}: {last.strip()[:300]}")
        try:
            if cond():
                return
        except (OSError, ValueError, ssl.SSLError, urllib.error.URLError, subprocess.SubprocessError):
            pass
        time.sleep(0.1)
    raise NodeError(f"timed out after {timeout:.0f}s waiting for {what}")


def _nofile_hard_limit() -> int:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return 1000000 if hard == resource.RLIM_INFINITY else min(hard, 1000000)


def _read_sysctl(name: str) -> str | None:
    try:
        return Path("/proc/sys", name).read_text().strip()
    except OSError:
        return None


def _write_sysctl(name: str, value: str) -> bool:
    try:
        Path("/proc/sys", name).write_text(value + "\n")
        return True
    except OSError:
        return False


# --------------------------------------------------------------------------
# Removal: what is already gone counts as removed; real failures are kept for the end
# --------------------------------------------------------------------------
# errno of a thing that is not there (any more): a file or folder (cgroup), a process
GONE_ERRNOS = frozenset({errno.ENOENT, errno.ESRCH})
# what ip, iptables, umount and ctr print when the thing to remove is not there (any more)
GONE_MESSAGES = re.compile(
    r"no such (file or directory|process|device)|not mounted|cannot find device|does not exist"
    r"|no chain/target/match by that name|does a matching rule exist|not found",
    re.IGNORECASE,
)


def is_gone(err: BaseException | str) -> bool:
    """Whether an error (an OSError, or a command's stderr) only says the thing was already gone."""
    if isinstance(err, OSError):
        return err.errno in GONE_ERRNOS
    return isinstance(err, str) and bool(GONE_MESSAGES.search(err))


class TeardownError(RuntimeError):
    """Teardown finished every step, and these failed (or these things remain)."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        more = f" (and {len(errors) - 10} more)" if len(errors) > 10 else ""
        super().__init__(f"{len(errors)} failed: " + "; ".join(errors[:10]) + more)


class Removal:
    """The bookkeeping of one teardown: every step runs, 'already gone' is done, and what really
    failed is collected (``errors``) to be reported once at the end (:meth:`check`)."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def call(self, what: str, fn: Callable[..., T], *args: Any, default: T) -> T:
        """fn(*args), or ``default`` when it raised (recorded unless the error says 'gone')."""
        try:
            return fn(*args)
        except Exception as e:  # any step: note it and go on with the rest
            if not is_gone(e):
                self.errors.append(f"{what}: {type(e).__name__}: {e}")
            return default

    def sh(self, cmd: list[str], timeout: float = 60, fatal: bool = True) -> bool:
        """Run a removing command; True when it worked or what it removes was already gone.
        A real failure is recorded (fatal) or only logged (not fatal: a later check sees the result)."""
        try:
            r = _sh(cmd, timeout=timeout)
        except (OSError, subprocess.SubprocessError) as e:
            msg = f"{type(e).__name__}: {e}"
        else:
            if r.returncode == 0 or is_gone(r.stderr):
                return True
            msg = r.stderr.strip()[:300] or f"exit status {r.returncode}"
        if fatal:
            self.errors.append(f"{shlex.join(str(c) for c in cmd)}: {msg}")
        else:
            log(f"{shlex.join(str(c) for c in cmd)}: {msg}")
        return False

    def check(self) -> None:
        if self.errors:
            raise TeardownError(self.errors)


def walk_dirs(top: Path) -> list[Path]:
    """top and every folder below it, deepest first; folders that vanish while being listed
    (a pod's cgroup kubelet removes meanwhile) are skipped, never an error."""
    if not top.is_dir():
        return []
    out = [Path(d) for d, _, _ in os.walk(top, topdown=False)]  # os.walk skips unreadable folders
    return sorted(out, key=lambda d: -len(d.parts))


# --------------------------------------------------------------------------
# The host record: what this machine's real node changed, for teardown after a crash
# --------------------------------------------------------------------------
def _load_record() -> dict[str, Any] | None:
    try:
        rec: dict[str, Any] = json.loads(RECORD.read_text())
        return rec
    except (OSError, ValueError):
        return None


def _save_record(rec: dict[str, Any]) -> None:
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    tmp = RECORD.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, indent=2) + "\n")
    os.replace(tmp, RECORD)


def _drop_record() -> None:
    RECORD.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        RECORD.parent.rmdir()


def _record_owner_alive(rec: dict[str, Any]) -> bool:
    """Is the cluster that owns the record still running (or still starting: its node's processes
    start some seconds after the record is written)?"""
    sd = Path(rec["state_dir"])
    pids = [*read_pids(sd / "pids").values(), *read_pids(sd / "node" / "pids").values()]
    if any(pid_alive(pid) for pid in pids):
        return True
    return sd.is_dir() and time.time() - float(rec.get("created", 0)) < 120


# --------------------------------------------------------------------------
# Preflight
# --------------------------------------------------------------------------
def disabled_reason() -> str | None:
    val = os.environ.get(ENV_SWITCH, "").strip()
    if val.lower() in ("0", "false", "no", "off"):
        return f"disabled by {ENV_SWITCH}={val}"
    return None


def _images_module() -> ModuleType:
    e2e = str(Path(__file__).resolve().parent)
    if e2e not in sys.path:
        sys.path.insert(0, e2e)
    import images  # noqa: PLC0415  (e2e/images.py; imported late: only the real node needs it)

    return images


def preflight(bins: Path, p: Paths) -> str | None:
    """Why this machine cannot run the real node (None: it can, as far as we can tell up front)."""
    reason = disabled_reason()
    if reason:
        return reason
    if not sys.platform.startswith("linux"):
        return f"not Linux ({sys.platform})"
    if os.geteuid() != 0:
        return "not root (containerd, kubelet, iptables, mounts and cgroups need root)"
    missing = [t for t in HOST_TOOLS if shutil.which(t) is None]
    missing += [str(CNI_BIN_DIR / c) for c in CNI_PLUGINS if not (CNI_BIN_DIR / c).exists()]
    missing += [str(bins / b) for b in NODE_BINARIES if not (bins / b).exists()]
    if missing:
        return "missing: " + ", ".join(missing)
    if len(str(p.sock)) + len(".ttrpc") > 100:
        return f"state dir path too long for a unix socket ({p.sock})"
    try:
        _images_module()
    except Exception as e:  # a broken or missing module only costs the real node
        return f"cannot import e2e/images.py: {e}"
    rec = _load_record()
    if rec and rec.get("state_dir") != str(p.sd) and _record_owner_alive(rec):
        return f"this machine's real node belongs to another running cluster ({rec['state_dir']})"
    return None


# --------------------------------------------------------------------------
# PKI
# --------------------------------------------------------------------------
def _openssl(pki: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=pki, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def sign(pki: Path, name: str, subj: str, ext: str) -> None:
    """Key pair + certificate `name`.{key,crt} signed by the cluster CA (pki/ca.{crt,key})."""
    _openssl(
        pki,
        "req",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        subj,
    )
    (pki / f"{name}.ext").write_text(ext)
    _openssl(
        pki,
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        f"{name}.crt",
        "-days",
        "3650",
        "-extfile",
        f"{name}.ext",
    )
    for suffix in ("key", "crt", "csr", "ext"):
        (pki / f"{name}.{suffix}").chmod(0o600)


CLIENT_EXT = "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature\n"


def make_pki(pki: Path) -> None:
    """Certificates of the node's parts, signed by the cluster CA."""
    sign(pki, "kubelet-client", f"/O=system:nodes/CN=system:node:{NODE_NAME}", CLIENT_EXT)
    sign(
        pki,
        "kubelet-server",
        f"/CN={NODE_NAME}",
        f"subjectAltName=IP:{NODE_IP},DNS:{NODE_NAME}\n"
        "extendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n",
    )
    sign(pki, "kube-proxy", "/CN=system:kube-proxy", CLIENT_EXT)  # bound to system:node-proxier
    sign(pki, "apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client", CLIENT_EXT)


def apiserver_flags(pki: Path) -> list[str]:
    """kube-apiserver flags that differ when the real node runs (see cluster.py for the bind address)."""
    return [
        f"--advertise-address={NODE_IP}",  # the `kubernetes` Service's endpoint, reachable from pods
        "--kubelet-preferred-address-types=InternalIP,Hostname",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        f"--kubelet-certificate-authority={pki / 'ca.crt'}",
    ]


def _kubeconfig(path: Path, server: str, pki: Path, cert: str, user: str) -> None:
    """A kubeconfig authenticating with pki/<cert>.{crt,key}."""
    client = {"client-certificate": str(pki / f"{cert}.crt"), "client-key": str(pki / f"{cert}.key")}
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "triton-e2e",
                "cluster": {"server": server, "certificate-authority": str(pki / "ca.crt")},
            }
        ],
        "users": [{"name": user, "user": client}],
        "contexts": [{"name": "triton-e2e", "context": {"cluster": "triton-e2e", "user": user}}],
        "current-context": "triton-e2e",
    }
    path.write_text(json.dumps(cfg, indent=2) + "\n")
    path.chmod(0o600)


# --------------------------------------------------------------------------
# Host network: bridge, routes, sysctls, API server guard
# --------------------------------------------------------------------------
def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _ip(*args: str) -> None:
    r = _sh(["ip", *args])
    if r.returncode != 0:
        raise NodeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


def _iptables_families() -> list[str]:
    return [f for f in ("iptables", "ip6tables") if shutil.which(f) and shutil.which(f + "-save")]


def add_apiserver_guard(port: int) -> None:
    """The API server listens on all addresses (see cluster.py): accept its port only on loopback
    and on the bridge (pods, through the `kubernetes` Service), drop it on every other interface."""
    for fam in _iptables_families():
        rules = [["-i", "lo", "-j", "RETURN"]]
        if fam == "iptables":
            rules.append(["-i", BRIDGE, "-j", "RETURN"])
        rules.append(["-j", "DROP"])
        cmds = [[fam, "-w", "-N", GUARD_CHAIN]]
        cmds += [[fam, "-w", "-A", GUARD_CHAIN, *r] for r in rules]
        cmds.append([fam, "-w", "-I", "INPUT", "-p", "tcp", "--dport", str(port), "-j", GUARD_CHAIN])
        for c in cmds:
            r = _sh(c)
            if r.returncode != 0:
                raise NodeError(f"{shlex.join(c)}: {r.stderr.strip()}")


def add_services_guard(service_cidr: str) -> None:
    """Drop a new connection to an address of the Service range that no Service rule of kube-proxy
    translated: a Service kube-proxy has not synced yet (or no Service at all), as kube-proxy's nftables
    mode does ("Drop traffic to unallocated ClusterIPs"); its iptables mode, ours, has no such rule.

    Without it, such a SYN leaves for the ClusterIP itself (routed onto the bridge, see setup_host),
    fails 'No route to host' once ARP gives up (3 s), and its conntrack entry (SYN_SENT, no NAT, 120 s)
    stays: every later connection from the same source port to that ClusterIP matches it and goes past
    kube-proxy's rules to the same failure, for as long as it keeps the entry alive. A client churning
    connections comes back to that port within seconds (docs/benchmarks.md, "A pool on the real
    node"). Dropped here (filter OUTPUT and FORWARD, after nat's DNAT and after kube-proxy's own
    filter rules, so a Service with no endpoints is still refused by kube-proxy), the SYN leaves no
    entry, and the client's next SYN a second later finds the Service's rules."""
    cmds = [
        ["iptables", "-w", "-N", SERVICES_CHAIN],
        [
            "iptables", "-w", "-A", SERVICES_CHAIN, "-d", service_cidr, "-m", "conntrack", "--ctstate", "NEW",
            "-m", "comment", "--comment", "a Service address no kube-proxy rule translated", "-j", "DROP",
        ],
    ]  # fmt: skip
    cmds += [["iptables", "-w", "-A", hook, "-j", SERVICES_CHAIN] for hook in ("OUTPUT", "FORWARD")]
    for c in cmds:
        r = _sh(c)
        if r.returncode != 0:
            raise NodeError(f"{shlex.join(c)}: {r.stderr.strip()}")


def setup_host(p: Paths, bins: Path, blackhole_cidrs: list[str]) -> None:
    """Record what we change, then make the bridge with the gateway address, the routes and our
    cgroup root.

    blackhole_cidrs (the Service range, kwok's fake pod range) are routed onto the bridge so that
    traffic to addresses no pod has never leaves this machine through the default route."""
    rec = _load_record()
    if rec is not None and rec.get("state_dir") != str(p.sd):
        raise NodeError(f"host record {RECORD} names another cluster ({rec['state_dir']})")
    if rec is None:
        rec = {
            "state_dir": str(p.sd),
            "cache": str(p.cache),
            "kube_proxy": str(bins / "kube-proxy"),
            "created": time.time(),
            "sysctls": {},
            "dirs_existed": {d: os.path.isdir(d) for d in HOST_DIRS},
        }
        for name in (*KUBELET_SYSCTLS, *NET_SYSCTLS):
            val = _read_sysctl(name)
            if val is not None:
                rec["sysctls"][name] = val
        _save_record(rec)
    if not Path("/proc/sys/net/bridge/bridge-nf-call-iptables").exists():
        # Service traffic between pods on the same bridge must pass iptables (kube-proxy's DNAT).
        _sh(["modprobe", "br_netfilter"])
        if not Path("/proc/sys/net/bridge/bridge-nf-call-iptables").exists():
            raise NodeError("br_netfilter is not loaded and `modprobe br_netfilter` failed")
    for name, want in NET_SYSCTLS.items():
        if _read_sysctl(name) != want and not _write_sysctl(name, want):
            raise NodeError(f"cannot set {name}={want}")
    if _link_exists(BRIDGE):
        _ip("link", "del", BRIDGE)
    _ip("link", "add", BRIDGE, "mtu", str(MTU), "type", "bridge")
    _ip("addr", "add", f"{NODE_IP}/{POD_CIDR.split('/')[1]}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    for cidr in blackhole_cidrs:
        _ip("route", "replace", cidr, "dev", BRIDGE, "src", NODE_IP)
    _make_cgroup_root()


# --------------------------------------------------------------------------
# containerd
# --------------------------------------------------------------------------
def _toml_str(s: str | Path) -> str:
    return json.dumps(str(s))


def containerd_config(p: Paths) -> str:
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""\
# generated by e2e/node.py
version = 2
root = {_toml_str(p.ctr_root)}
state = {_toml_str(p.ctr_state)}
oom_score = 0
# Not needed here; the opt plugin would also create /opt/containerd.
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.internal.v1.opt",
]

[grpc]
  address = {_toml_str(p.sock)}

[debug]
  level = "info"

[metrics]
  address = ""

[{cri}]
  sandbox_image = {_toml_str(PAUSE_IMAGE)}
  # root here has no CAP_SYS_RESOURCE: a negative oom_score_adj makes runc fail
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  max_concurrent_downloads = 3

[{cri}.cni]
  bin_dir = {_toml_str(CNI_BIN_DIR)}
  conf_dir = {_toml_str(p.cni_conf)}
  max_conf_num = 1

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
  discard_unpacked_layers = false

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  BinaryName = {_toml_str(shutil.which("runc") or "runc")}
  Root = {_toml_str(p.runc_root)}
  SystemdCgroup = false
"""


def cni_config(p: Paths) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": CNI_NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,  # made by setup_host; the plugin reuses it
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,  # a pod reaching itself through its own Service
                "mtu": MTU,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR, "gateway": NODE_IP}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(p.cni_ipam),
                },
            }
        ],
    }


def _containerd_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "no_proxy")}
    # Pods on this node run local images only: any registry pull goes to a closed local port and
    # fails at once instead of leaving the machine.
    env["HTTP_PROXY"] = env["HTTPS_PROXY"] = "http://127.0.0.1:9"
    return env


def _ctr_ok(p: Paths) -> bool:
    return _sh([*p.ctr(), "version"], timeout=5).returncode == 0


def _ctr_ids(p: Paths, what: str) -> list[str]:
    r = _sh([*p.ctr(), what, "ls", "-q"], timeout=30)
    return r.stdout.split() if r.returncode == 0 else []


def _remove_containers(p: Paths) -> list[str]:
    """Kill and delete every task and container in our namespace; returns the container ids.

    Failures are only logged: containerd is stopped next, and what its containers leave (processes,
    mounts, cgroups) is removed and checked by the steps after it."""
    ids = _ctr_ids(p, "containers")
    r = Removal()
    for tid in _ctr_ids(p, "tasks"):
        r.sh([*p.ctr(), "tasks", "kill", "--signal", "SIGKILL", "--all", tid], timeout=30, fatal=False)
    for tid in _ctr_ids(p, "tasks"):
        r.sh([*p.ctr(), "tasks", "delete", "--force", tid], timeout=30, fatal=False)
    for cid in ids:
        r.sh([*p.ctr(), "containers", "delete", cid], timeout=30, fatal=False)
    return ids


# --------------------------------------------------------------------------
# The node
# --------------------------------------------------------------------------
class RealNode:
    """One start of the real node. Use: plan checks -> start_runtime() (thread) -> start_kubelet()
    -> wait_ready(); on any NodeError the caller runs teardown()."""

    def __init__(self, sd: Path, cache: Path, bins: Path, ports: dict[str, int]):
        self.p = Paths(sd, cache)
        self.bins = bins
        self.ports = ports  # kubelet, kubelet_healthz, proxy_healthz, proxy_metrics
        self.timings: dict[str, float] = {}
        self.images: dict[str, str] = {}
        self._runtime_ready = threading.Event()
        self._images_done = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._t0 = self._t_kubelet = time.monotonic()

    def setup_host(self, blackhole_cidrs: list[str]) -> None:
        setup_host(self.p, self.bins, blackhole_cidrs)

    # ---- containerd + images (a thread, overlapping the control plane start) -------------
    def start_runtime(self) -> None:
        self._thread = threading.Thread(target=self._runtime, name="real-node-runtime", daemon=True)
        self._thread.start()

    def _runtime(self) -> None:
        try:
            t0 = time.monotonic()
            why = _images_module().can_run_containers()
            if why:
                raise NodeError(why)
            self.timings["can_run_containers"] = round(time.monotonic() - t0, 1)
            self._start_containerd()
            self._runtime_ready.set()
            self._load_images()
        except BaseException as e:
            self._error = e
        finally:
            self._runtime_ready.set()
            self._images_done.set()

    def _start_containerd(self) -> None:
        p = self.p
        t0 = time.monotonic()
        for d in (p.dir, p.ctr_root, p.ctr_state, p.runc_root, p.cni_conf, p.cni_ipam, p.pod_logs):
            d.mkdir(parents=True, exist_ok=True)
        p.ctr_config.write_text(containerd_config(p))
        (p.cni_conf / f"10-{CNI_NETWORK}.conflist").write_text(json.dumps(cni_config(p), indent=2) + "\n")
        _spawn(p, "containerd", ["containerd", f"--config={p.ctr_config}"], env=_containerd_env())
        _wait(p, "containerd", lambda: _ctr_ok(p), 30, ("containerd",))
        # containers a crashed run left in the persistent root
        stale = _remove_containers(p)
        if stale:
            _clean_cni_cache(stale)
            log(f"removed {len(stale)} containers left by an earlier run")
        self.timings["containerd"] = round(time.monotonic() - t0, 1)
        log(f"containerd ready in {self.timings['containerd']}s")

    def _load_images(self) -> None:
        t0 = time.monotonic()
        images = _images_module()
        names = [n.strip() for n in os.environ.get(ENV_IMAGES, "").split(",") if n.strip()] or None
        if names and "pause" not in names:
            names.insert(0, "pause")
        try:
            self.images = dict(images.build(names, log=log))
        except Exception as e:
            raise NodeError(f"building the e2e images failed: {e}") from e
        t1 = time.monotonic()
        loadable = [n for n in names if images.IMAGES[n]["load"]] if names else None
        try:
            images.load([*self.p.ctr()[:3]], namespace=CTR_NAMESPACE, names=loadable, log=log)
        except Exception as e:
            raise NodeError(f"loading the e2e images into containerd failed: {e}") from e
        self.timings["images_build"] = round(t1 - t0, 1)
        self.timings["images_load"] = round(time.monotonic() - t1, 1)
        r = _sh([*self.p.ctr(), "images", "ls", "-q"], timeout=30)
        if PAUSE_IMAGE not in r.stdout.split():
            raise NodeError(f"pause image {PAUSE_IMAGE} is not in containerd after images.load()")
        log(
            f"images ready ({len(self.images)}: build/check {self.timings['images_build']}s, "
            f"load {self.timings['images_load']}s)"
        )

    def wait_runtime(self, timeout: float = 60) -> None:
        if not self._runtime_ready.wait(timeout):
            raise NodeError(f"containerd not ready after {timeout:.0f}s")
        if self._error is not None and "containerd" not in self.timings:
            raise self._as_node_error(self._error)

    @staticmethod
    def _as_node_error(e: BaseException) -> NodeError:
        return e if isinstance(e, NodeError) else NodeError(f"{type(e).__name__}: {e}")

    # ---- kubelet + kube-proxy ------------------------------------------------------------------
    def kubelet_config(self) -> dict[str, Any]:
        p, pki = self.p, self.p.pki
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": NODE_IP,
            "port": self.ports["kubelet"],
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.ports["kubelet_healthz"],
            "tlsCertFile": str(pki / "kubelet-server.crt"),
            "tlsPrivateKeyFile": str(pki / "kubelet-server.key"),
            "serverTLSBootstrap": False,
            "rotateCertificates": False,
            # Only holders of a certificate from the cluster CA reach the kubelet API (the API
            # server for logs/exec/port-forward); they may do anything there.
            "authentication": {
                "x509": {"clientCAFile": str(pki / "ca.crt")},
                "webhook": {"enabled": False},
                "anonymous": {"enabled": False},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",  # no systemd
            "failCgroupV1": False,  # 1.35+ refuses cgroup v1 (hybrid here) otherwise
            "failSwapOn": False,
            "oomScoreAdj": 0,  # no CAP_SYS_RESOURCE: no negative scores
            "containerRuntimeEndpoint": f"unix://{p.sock}",
            "podLogsDir": str(p.pod_logs),
            "volumePluginDir": str(p.dir / "volume-plugins"),
            "registerNode": True,
            "registerWithTaints": [TAINT],
            # tiny thresholds: a test machine's disk or memory pressure must not evict test pods
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
                "imagefs.inodesFree": "1%",
            },
            "evictionPressureTransitionPeriod": "10s",
            # 100 disables image GC: the imported images cannot be pulled again
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "resolvConf": "/etc/resolv.conf",  # pods with dnsPolicy Default
            "clusterDNS": [NODE_IP],  # our DNS server (dns_main)
            "clusterDomain": DNS_DOMAIN,
            "maxPods": 110,
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "4s",
            "nodeStatusReportFrequency": "1m",
            "syncFrequency": "10s",
            "cgroupsPerQOS": True,
            "cgroupRoot": f"/{CGROUP_ROOT}",
            "enforceNodeAllocatable": ["pods"],
            "localStorageCapacityIsolation": True,
            "protectKernelDefaults": False,  # it sets a few kernel sysctls; teardown puts them back
            "makeIPTablesUtilChains": False,  # no KUBE-FIREWALL / hint chains: we set no route_localnet
            "containerLogMaxSize": "10Mi",
            "containerLogMaxFiles": 2,
            "shutdownGracePeriod": "0s",
            # kubelet raises its open-files limit to this; above the hard limit it only logs an error
            "maxOpenFiles": _nofile_hard_limit(),
        }

    def kube_proxy_config(self, kubeconfig: Path) -> dict[str, Any]:
        return {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "hostnameOverride": NODE_NAME,
            "healthzBindAddress": f"127.0.0.1:{self.ports['proxy_healthz']}",
            "metricsBindAddress": f"127.0.0.1:{self.ports['proxy_metrics']}",
            "mode": "iptables",
            "clusterCIDR": POD_CIDR,
            "detectLocalMode": "ClusterCIDR",  # traffic from outside the pod range gets masqueraded
            "nodePortAddresses": [POD_CIDR],  # NodePorts on 10.77.0.1 only (no route_localnet)
            "oomScoreAdj": 0,
            # all zero: kube-proxy leaves the host's conntrack sysctls alone
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
                "udpTimeout": "0s",
                "udpStreamTimeout": "0s",
            },
            "iptables": {"localhostNodePorts": False, "masqueradeAll": False},
        }

    def start_kubelet(self, server: str) -> None:
        """Start kubelet and kube-proxy (after containerd is up)."""
        self.wait_runtime()
        p, pki = self.p, self.p.pki
        self._t_kubelet = time.monotonic()
        p.kubelet_root.mkdir(parents=True, exist_ok=True)
        _spawn(
            p,
            "cluster-dns",
            [
                sys.executable,
                NODE_PY,
                "dns",
                f"--listen={NODE_IP}",
                f"--server={server}",
                f"--token-file={p.sd / 'admin.token'}",
                f"--ca={pki / 'ca.crt'}",
                f"--node-dir={p.dir}",
            ],
        )
        kc = p.dir / "kubelet.kubeconfig"
        _kubeconfig(kc, server, pki, "kubelet-client", NODE_NAME)
        cfg = p.dir / "kubelet.yaml"
        cfg.write_text(json.dumps(self.kubelet_config(), indent=2) + "\n")
        _spawn(
            p,
            "kubelet",
            [
                str(self.bins / "kubelet"),
                f"--config={cfg}",
                f"--kubeconfig={kc}",
                f"--root-dir={p.kubelet_root}",
                f"--cert-dir={p.kubelet_root / 'pki'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={NODE_IP}",
                f"--node-labels={LABEL}=true",
                "--v=1",
            ],
        )
        pkc = p.dir / "kube-proxy.kubeconfig"
        _kubeconfig(pkc, server, pki, "kube-proxy", "kube-proxy")
        pcfg = p.dir / "kube-proxy.yaml"
        pcfg.write_text(json.dumps(self.kube_proxy_config(pkc), indent=2) + "\n")
        _spawn(p, "kube-proxy", [str(self.bins / "kube-proxy"), f"--config={pcfg}", "--v=1"])

    def wait_ready(self, node_ready: Callable[[], bool], timeout: float = 120) -> None:
        """Images loaded, node Ready, kube-proxy synced."""
        p = self.p
        procs = ("containerd", "kubelet", "kube-proxy", "cluster-dns")
        _wait(p, f"node {NODE_NAME} Ready", node_ready, timeout, procs)
        name = f"kubernetes.default.svc.{DNS_DOMAIN}"
        _wait(p, "cluster DNS", lambda: bool(dns_query(NODE_IP, name)), 30, procs)
        self.timings["kubelet_ready"] = round(time.monotonic() - self._t_kubelet, 1)
        log(f"node {NODE_NAME} Ready {self.timings['kubelet_ready']}s after kubelet start")
        url = f"http://127.0.0.1:{self.ports['proxy_healthz']}/healthz"
        _wait(
            p, "kube-proxy healthz", lambda: urllib.request.urlopen(url, timeout=1).status == 200, 60, procs
        )
        _wait(p, "e2e images", self._images_done.is_set, 1800, procs)
        if self._error is not None:
            raise self._as_node_error(self._error)
        self.timings["total"] = round(time.monotonic() - self._t0, 1)

    def meta(self) -> dict[str, Any]:
        return {
            "name": NODE_NAME,
            "ip": NODE_IP,
            "pod_cidr": POD_CIDR,
            "bridge": BRIDGE,
            "containerd_socket": str(self.p.sock),
            "images": self.images,
            "timings": self.timings,
        }


# --------------------------------------------------------------------------
# Teardown
# --------------------------------------------------------------------------
def _mounts() -> list[str]:
    out: list[str] = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        mp = line.split()[4]
        out.append(mp.encode().decode("unicode_escape") if "\\" in mp else mp)
    return out


def mounts_under(roots: list[Path]) -> list[str]:
    prefixes = [str(r).rstrip("/") + "/" for r in roots]
    return [m for m in _mounts() if any(m.startswith(pre) or m + "/" == pre for pre in prefixes)]


def _unmount_all(roots: list[Path]) -> None:
    """Unmount everything below roots, deepest first (lazily when busy); what is left after five
    rounds the caller finds with mounts_under."""
    for _ in range(5):
        mps = mounts_under(roots)
        if not mps:
            return
        r = Removal()  # 'not mounted' (gone meanwhile) is fine; the rest is seen by the next round
        for mp in sorted(set(mps), key=lambda m: (-m.count("/"), m)):
            if not r.sh(["umount", mp], fatal=False):
                r.sh(["umount", "-l", mp], fatal=False)


def _cgroup_mounts() -> list[Path]:
    out = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            pre, _, post = line.partition(" - ")
            if post.split()[:1] and post.split()[0] in ("cgroup", "cgroup2"):
                out.append(Path(pre.split()[4]))
    return out


def _make_cgroup_root() -> None:
    for mp in _cgroup_mounts():
        d = mp / CGROUP_ROOT
        try:
            d.mkdir(exist_ok=True)
            for f in ("cpuset.cpus", "cpuset.mems"):  # cgroup v1 cpuset: a new folder starts empty
                if (mp / f).exists() and not (d / f).read_text().strip():
                    (d / f).write_text((mp / f).read_text())
            if (d / "cgroup.subtree_control").exists():  # cgroup v2: hand our controllers down
                for c in (d / "cgroup.controllers").read_text().split():
                    with contextlib.suppress(OSError):
                        (d / "cgroup.subtree_control").write_text(f"+{c}")
        except OSError as e:
            raise NodeError(f"cannot make cgroup {d}: {e}") from e


def _our_cgroups() -> list[Path]:
    """Our cgroup folders, deepest first (pods kubelet removes meanwhile are simply not listed)."""
    dirs = [d for mp in _cgroup_mounts() for d in walk_dirs(mp / CGROUP_ROOT)]
    return sorted(dirs, key=lambda d: -len(d.parts))


def _cgroup_pids() -> set[int]:
    pids = set()
    for d in _our_cgroups():
        with contextlib.suppress(OSError, ValueError):
            pids |= {int(x) for x in (d / "cgroup.procs").read_text().split()}
    return pids


def _kill_cgroups() -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = _cgroup_pids()
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def _remove_cgroups(r: Removal) -> None:
    """Remove our cgroup folders (killing what still runs in them), retrying for up to 10 s."""
    deadline = time.monotonic() + 10
    while True:
        attempt = Removal()
        for d in _our_cgroups():
            attempt.call(f"rmdir {d}", d.rmdir, default=None)  # gone already: done
        if not attempt.errors or time.monotonic() > deadline:
            r.errors += attempt.errors
            return
        _kill_cgroups()
        time.sleep(0.2)


def _iptables_rules(fam: str, table: str) -> list[str] | None:
    r = _sh([fam, "-w", "-t", table, "-S"], timeout=30)
    return r.stdout.splitlines() if r.returncode == 0 else None


def _our_iptables(fam: str, table: str, keep_guard: bool = False) -> tuple[list[list[str]], list[str]]:
    """(rules in other chains to delete, our chains) of one table."""
    lines = _iptables_rules(fam, table) or []
    chains = [ln.split()[1] for ln in lines if ln.startswith("-N ")]
    cni_comment = f'name: "{CNI_NETWORK}"'
    ours = {c for c in chains if c.startswith("KUBE-")}
    if not keep_guard and GUARD_CHAIN in chains:
        ours.add(GUARD_CHAIN)
    if SERVICES_CHAIN in chains:
        ours.add(SERVICES_CHAIN)
    parsed = []
    for ln in lines:
        if not ln.startswith("-A "):
            continue
        try:
            args = shlex.split(ln)
        except ValueError:
            continue
        parsed.append(args)
        if args[1].startswith("CNI-") and any(cni_comment in a for a in args):
            ours.add(args[1])  # a chain the bridge plugin made for one of our pods (ipMasq)
    for args in parsed:
        target = next((args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-j", "-g")), "")
        if target.startswith("CNI-") and any(cni_comment in a for a in args):
            ours.add(target)
    drop = [
        args[1:]
        for args in parsed
        if args[1] not in ours
        and (
            any(a in ("-j", "-g") and args[i + 1] in ours for i, a in enumerate(args[:-1]))
            or any(cni_comment in a for a in args)
        )
    ]
    return drop, sorted(ours)


IPTABLES_TABLES = ("filter", "nat", "mangle", "raw")


def _sweep_iptables(r: Removal, keep_guard: bool = False) -> None:
    for fam in _iptables_families():
        for table in IPTABLES_TABLES:
            drop, chains = _our_iptables(fam, table, keep_guard)
            for rule in drop:
                r.sh([fam, "-w", "-t", table, "-D", *rule])
            for c in chains:
                r.sh([fam, "-w", "-t", table, "-F", c])
            for c in chains:
                r.sh([fam, "-w", "-t", table, "-X", c])


def _listening_unix_sockets() -> set[str]:
    out = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 8:
                out.add(parts[7].lstrip("@"))
    return out


def _clean_cni_cache(container_ids: list[str]) -> None:
    """libcni's result cache of our network and of CRI's loopback network for our sandboxes
    (pods killed without a CNI DEL leave them)."""
    for f in _entries(CNI_CACHE):
        if f.name.startswith(f"{CNI_NETWORK}-"):
            f.unlink(missing_ok=True)
    for cid in container_ids:
        (CNI_CACHE / f"cni-loopback-{cid}-lo").unlink(missing_ok=True)


def _entries(d: Path) -> list[Path]:
    """The entries of folder d; none when d is not there (any more)."""
    try:
        return list(d.iterdir())
    except OSError as e:
        if is_gone(e) or e.errno == errno.ENOTDIR:
            return []
        raise


def _our_log_links(p: Paths) -> list[Path]:
    """kubelet's /var/log/containers symlinks into our pod log dir."""
    out = []
    for link in _entries(VAR_LOG_CONTAINERS):
        with contextlib.suppress(OSError):
            if link.is_symlink() and os.readlink(link).startswith(str(p.dir) + "/"):
                out.append(link)
    return out


def _clean_host_files(p: Paths, rec: dict[str, Any] | None, container_ids: list[str]) -> None:
    for link in _our_log_links(p):
        link.unlink(missing_ok=True)
    _clean_cni_cache(container_ids)
    listening = _listening_unix_sockets()
    if DEVICE_PLUGIN_SOCKET.exists() and str(DEVICE_PLUGIN_SOCKET) not in listening:
        DEVICE_PLUGIN_SOCKET.unlink(missing_ok=True)
    # every dead shim socket, not only those of the containers listed: a container created while
    # down ran (kubelet still starting pods) leaves one too
    for sock in _entries(SHIM_SOCKETS):
        if str(sock) not in listening:
            sock.unlink(missing_ok=True)
    if rec:
        for d, existed in rec.get("dirs_existed", {}).items():
            if not existed:
                with contextlib.suppress(OSError):
                    os.rmdir(d)  # only when empty


def _restore_sysctls(r: Removal, rec: dict[str, Any] | None) -> None:
    if not rec:
        return
    for name, val in rec.get("sysctls", {}).items():
        if _read_sysctl(name) != val and not _write_sysctl(name, val):
            r.errors.append(f"could not restore sysctl {name}={val}")


def teardown(sd: Path, cache: Path, keep_guard: bool = False, quiet: bool = False) -> None:
    """Stop the node of state dir sd and undo every host change it made.

    Safe to repeat, and to run while kubelet is still starting or removing pods: whatever is
    already gone (a process, a cgroup, a mount, a chain, a link) counts as removed. Every step runs
    whatever failed before it; then a TeardownError names what failed and what of the node remains
    (see leftovers()).

    keep_guard: leave the API server's iptables guard (the control plane keeps running)."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return
    p = Paths(sd, cache)
    rec = _load_record()
    r = Removal()
    if rec is not None and rec.get("state_dir") != str(sd):
        if _record_owner_alive(rec):
            # the machine's real node belongs to another running cluster: stop only what we started
            terminate(_node_processes(p), grace=5)
            _unmount_all(p.mount_roots())
            if not mounts_under(p.mount_roots()):
                shutil.rmtree(p.dir, ignore_errors=True)
            return
        log(f"cleaning up the real node of a dead cluster ({rec['state_dir']})")
        _teardown(r, Paths(Path(rec["state_dir"]), Path(rec["cache"])), rec, False)
        rec = None
    t0 = time.monotonic()
    started = bool(read_pids(p.pids)) or rec is not None
    _teardown(r, p, rec, keep_guard)
    if not keep_guard:  # (with the guard kept, the record and the guard chain remain on purpose)
        r.errors += [f"left behind: {x}" for x in leftovers(sd, cache)]
    if r.errors:
        log(f"teardown finished with {len(r.errors)} failures")
    elif not quiet and started:
        log(f"stopped and cleaned up in {time.monotonic() - t0:.1f}s")
    r.check()


def _stop_node(r: Removal, p: Paths) -> list[str]:
    """Stop kubelet, kube-proxy, DNS, every pod process, containerd and its shims; the container ids."""
    pids = read_pids(p.pids)
    # 1. kubelet and kube-proxy first: they would restart pods and rewrite rules
    r.call(
        "stopping kubelet",
        terminate,
        [pids[n] for n in ("kubelet", "kube-proxy", "cluster-dns") if n in pids],
        default=None,
    )
    r.call("stopping kubelet", terminate, _node_processes(p, ("kubelet", "kube-proxy")), 5, default=None)
    # 2. every pod process (all live below our cgroup root), then tasks and containers
    r.call("killing the pods' processes", _kill_cgroups, default=None)
    container_ids: list[str] = []
    if "containerd" in pids and pid_alive(pids["containerd"]) and p.sock.exists():
        container_ids = r.call("removing containers", _remove_containers, p, default=[])
    # 3. containerd and any shim still serving our socket
    r.call(
        "stopping containerd", terminate, [pids["containerd"]] if "containerd" in pids else [], default=None
    )
    r.call("stopping the node's processes", terminate, _node_processes(p), 5, False, default=None)
    return container_ids


def _teardown(r: Removal, p: Paths, rec: dict[str, Any] | None, keep_guard: bool) -> None:
    """Every step of a teardown, each one whatever happened in the ones before (r has the failures)."""
    container_ids = _stop_node(r, p)
    # 4. kube-proxy's, CNI's and our iptables rules (both families, all tables)
    kube_proxy = (rec or {}).get("kube_proxy")
    if kube_proxy and Path(kube_proxy).exists() and p.pids.joinpath("kube-proxy.pid").exists():
        r.sh([kube_proxy, "--cleanup"], timeout=60, fatal=False)  # the sweep below checks the rules
    r.call("removing iptables rules", _sweep_iptables, r, keep_guard, default=None)
    # 5. mounts (rootfs, shm, netns, kubelet volumes and its rshared root bind), bridge, cgroups
    r.call("unmounting", _unmount_all, p.mount_roots(), default=None)
    if _link_exists(BRIDGE):
        r.sh(["ip", "link", "del", BRIDGE])
    r.call("removing cgroups", _remove_cgroups, r, default=None)
    # 6. host files and settings
    _restore_sysctls(r, rec)
    r.call("removing host files", _clean_host_files, p, rec, container_ids, default=None)
    for sub in ("sandboxes", "containers"):  # CRI's files of the containers deleted above
        shutil.rmtree(p.ctr_root / "io.containerd.grpc.v1.cri" / sub, ignore_errors=True)
    left = mounts_under(p.mount_roots())
    if left:  # never rm -rf through a mount
        r.errors.append(f"mounts left under the node dirs after teardown: {left[:10]}")
    else:
        shutil.rmtree(p.dir, ignore_errors=True)
    if rec is not None and keep_guard:
        rec["node_stopped"] = True
        _save_record(rec)
    elif rec is not None and not r.errors:  # else kept, so that the next down or up finishes the job
        _drop_record()


# --------------------------------------------------------------------------
# Leftovers
# --------------------------------------------------------------------------
def _bridge_ports() -> list[str]:
    """Links whose master is our bridge (pods' veth ends)."""
    out = []
    for link in _entries(Path("/sys/class/net")):
        with contextlib.suppress(OSError):  # a link deleted meanwhile
            if os.path.basename(os.readlink(link / "master")) == BRIDGE:
                out.append(link.name)
    return out


def leftovers(sd: Path, cache: Path) -> list[str]:
    """Everything of a real node that is still on this machine (empty after a clean down)."""
    out: list[str] = []
    p = Paths(sd, cache)
    rec = _load_record()
    if rec is not None:
        out.append(f"host record {RECORD} (owner {rec.get('state_dir')})")
    for pid, argv in _processes():
        if is_node_process(argv, p.dir, (*PROCESS_NAMES, "dns")):
            out.append(f"process {pid}: {shlex.join(argv)[:200]}")
    for pid in sorted(_cgroup_pids()):
        out.append(f"process {pid} in a pod cgroup")
    out += [f"mount {m}" for m in mounts_under(p.mount_roots())]
    out += [f"netns mount {m}" for m in _mounts() if m.startswith(("/run/netns/cni-", "/var/run/netns/cni-"))]
    for fam in _iptables_families():
        for table in IPTABLES_TABLES:
            drop, chains = _our_iptables(fam, table)
            out += [f"{fam} -t {table} chain {c}" for c in chains]
            out += [f"{fam} -t {table} rule -A {shlex.join(r)}" for r in drop]
    if _link_exists(BRIDGE):
        out.append(f"link {BRIDGE}")
    out += [f"link {name} (port of {BRIDGE})" for name in _bridge_ports()]
    for d in _our_cgroups():
        out.append(f"cgroup {d}")
    out += [f"log link {link}" for link in _our_log_links(p)]
    out += [f"CNI cache {f}" for f in _entries(CNI_CACHE) if f.name.startswith(f"{CNI_NETWORK}-")]
    listening = _listening_unix_sockets()
    if DEVICE_PLUGIN_SOCKET.exists() and str(DEVICE_PLUGIN_SOCKET) not in listening:
        out.append(f"stale kubelet device-plugin socket {DEVICE_PLUGIN_SOCKET}")
    out += [f"stale shim socket {s}" for s in _entries(SHIM_SOCKETS) if str(s) not in listening]
    if p.dir.exists():
        out.append(f"node dir {p.dir}")
    return out


# --------------------------------------------------------------------------
# Cluster DNS (`python3 e2e/node.py dns`): A records of Services and pods, from the API server
# --------------------------------------------------------------------------
DNS_TTL = 5
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
QTYPE_A = 1
RCODE_SERVFAIL, RCODE_NXDOMAIN = 2, 3


def _dns_question(data: bytes) -> tuple[str, int, int]:
    """(name, qtype, end of the question) of a DNS query's first question."""
    labels, i = [], 12
    while data[i]:
        n = data[i]
        if n & 0xC0:
            raise ValueError("compressed name in a question")
        labels.append(data[i + 1 : i + 1 + n].decode("ascii").lower())
        i += 1 + n
    qtype = struct.unpack("!H", data[i + 1 : i + 3])[0]
    return ".".join(labels), qtype, i + 5


def _dns_answer(query: bytes, end: int, rcode: int, addrs: list[str]) -> bytes:
    qid, qflags = struct.unpack("!HH", query[:4])
    flags = 0x8000 | (qflags & 0x7900) | 0x0400 | 0x0080 | rcode  # QR, opcode+RD, AA, RA
    out = struct.pack("!HHHHHH", qid, flags, 1, len(addrs), 0, 0) + query[12:end]
    for a in addrs:
        out += struct.pack("!HHHIH", 0xC00C, QTYPE_A, 1, DNS_TTL, 4) + socket.inet_aton(a)
    return out


def dns_query(server: str, name: str, port: int = 53, timeout: float = 1.0) -> list[str]:
    """A records of name from server (a tiny client for checks); [] when none."""
    qid = int.from_bytes(os.urandom(2), "big")
    q = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(lb)]) + lb.encode() for lb in name.split(".")) + b"\0"
    q += struct.pack("!HH", QTYPE_A, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.sendto(q, (server, port))
        data = s.recv(4096)
    _, _, _, ancount = struct.unpack("!HHHH", data[:8])
    i = len(q)
    out = []
    for _ in range(ancount):
        rtype, _, _, rdlen = struct.unpack("!HHIH", data[i + 2 : i + 12])
        if rtype == QTYPE_A:
            out.append(socket.inet_ntoa(data[i + 12 : i + 12 + rdlen]))
        i += 12 + rdlen
    return out


class ClusterDNS:
    """Answers <svc>.<ns>.svc, <hostname>.<svc>.<ns>.svc and a-b-c-d.<ns>.pod under the cluster
    domain from the API server; anything else is NXDOMAIN (nothing is forwarded off this machine)."""

    def __init__(self, server: str, token: str, cafile: str, domain: str = DNS_DOMAIN):
        self.server = server.rstrip("/")
        self.token = token
        self.ctx = ssl.create_default_context(cafile=cafile)
        self.suffix = "." + domain

    def _get(self, path: str) -> dict[str, Any] | None:
        req = urllib.request.Request(self.server + path, headers={"Authorization": f"Bearer {self.token}"})
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=3) as r:
                doc: dict[str, Any] = json.loads(r.read())
                return doc
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise

    def _endpoints(self, ns: str, svc: str, hostname: str | None = None) -> list[str]:
        slices = self._get(
            f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices?labelSelector="
            f"kubernetes.io/service-name%3D{svc}"
        )
        out: list[str] = []
        for sl in (slices or {}).get("items", []):
            if sl.get("addressType") != "IPv4":
                continue
            for ep in sl.get("endpoints") or []:
                if (ep.get("conditions") or {}).get("ready") is False:
                    continue
                if hostname is None or ep.get("hostname") == hostname:
                    out += ep.get("addresses") or []
        return sorted(set(out))

    def resolve(self, name: str) -> list[str] | None:
        """IPv4 addresses of name; [] when the name exists without any; None when it does not."""
        if not name.endswith(self.suffix):
            return None
        labels = name[: -len(self.suffix)].split(".")
        if not all(_LABEL.match(lb) for lb in labels):
            return None
        if len(labels) == 3 and labels[2] == "pod":
            ip = labels[0].replace("-", ".")
            try:
                socket.inet_aton(ip)
            except OSError:
                return None
            return [ip] if ip.count(".") == 3 else None
        if len(labels) == 3 and labels[2] == "svc":
            svc, ns = labels[0], labels[1]
            obj = self._get(f"/api/v1/namespaces/{ns}/services/{svc}")
            if obj is None:
                return None
            ip = obj.get("spec", {}).get("clusterIP")
            if ip and ip != "None":
                return [ip]
            return self._endpoints(ns, svc)  # headless: the ready pods
        if len(labels) == 4 and labels[3] == "svc":
            host, svc, ns = labels[0], labels[1], labels[2]
            found = self._endpoints(ns, svc, hostname=host)
            return found or None
        return None

    def answer(self, query: bytes) -> bytes | None:
        try:
            name, qtype, end = _dns_question(query)
        except (ValueError, IndexError, UnicodeDecodeError, struct.error):
            return None
        try:
            addrs = self.resolve(name)
        except (OSError, ValueError, ssl.SSLError, urllib.error.URLError):
            return _dns_answer(query, end, RCODE_SERVFAIL, [])
        if addrs is None:
            return _dns_answer(query, end, RCODE_NXDOMAIN, [])
        return _dns_answer(query, end, 0, addrs if qtype == QTYPE_A else [])


def dns_main(args: argparse.Namespace) -> int:
    token = Path(args.token_file).read_text().strip()
    dns = ClusterDNS(args.server, token, args.ca)

    class Udp(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            data, sock = self.request
            reply = dns.answer(data)
            if reply is not None:
                sock.sendto(reply, self.client_address)

    class Tcp(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            while True:
                head = self.rfile.read(2)
                if len(head) < 2:
                    return
                data = self.rfile.read(struct.unpack("!H", head)[0])
                reply = dns.answer(data)
                if reply is None:
                    return
                self.wfile.write(struct.pack("!H", len(reply)) + reply)

    socketserver.ThreadingUDPServer.allow_reuse_address = True
    socketserver.ThreadingTCPServer.allow_reuse_address = True
    udp = socketserver.ThreadingUDPServer((args.listen, args.port), Udp)
    tcp = socketserver.ThreadingTCPServer((args.listen, args.port), Tcp)
    udp.daemon_threads = tcp.daemon_threads = True
    threading.Thread(target=tcp.serve_forever, daemon=True).start()
    print(f"cluster DNS for {DNS_DOMAIN} on {args.listen}:{args.port} (udp, tcp)", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    udp.serve_forever()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="e2e/node.py", description="the real node's cluster DNS server")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dns", help="serve cluster DNS (started by e2e/cluster.py up)")
    d.add_argument("--listen", default=NODE_IP)
    d.add_argument("--port", type=int, default=53)
    d.add_argument("--server", required=True, help="API server URL")
    d.add_argument("--token-file", required=True)
    d.add_argument("--ca", required=True)
    d.add_argument("--node-dir", help="the node's folder (lets teardown find this process)")
    args = ap.parse_args(argv)
    return dns_main(args)


if __name__ == "__main__":
    sys.exit(main())
