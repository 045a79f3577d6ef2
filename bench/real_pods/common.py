"""What the real-pod benchmarks share: the cluster around a run, one session (seaweedfs on the pod
bridge's gateway, the CRD, a namespace with the store's Secret, the operator on this machine) and the
polling of pods, Services and the agent.

run.py, inplace.py and realsize.py import it as ``bench.real_pods.common`` (each puts the repository root
on sys.path); importing it puts e2e/, tests/support and operator/src there. ``ref_tree``: another git
ref's checkout and operator image, for a run that measures it beside this tree.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for extra in (ROOT / "e2e", ROOT / "tests" / "support", ROOT / "operator" / "src"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import cluster  # noqa: E402
import node as real_node_setup  # noqa: E402
from real_pods import real_node  # noqa: E402
from triton_operator.adapters.agent.runner import FILLED  # noqa: E402
from triton_operator.core.objects.names import LABEL_SERVICE  # noqa: E402
from triton_operator.core.observed.observation import sync_container_status  # noqa: E402
from triton_operator.core.pod.startup import SyncSummary, parse_summary  # noqa: E402


def say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def get_json(url: str, timeout: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def triton_ready(ip: str) -> bool:
    """Triton's own /v2/health/ready on the pod's IP answers 200 (every model loaded)."""
    try:
        with urllib.request.urlopen(f"http://{ip}:8000/v2/health/ready", timeout=0.5) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def wait(probe: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> Any:
    """``probe()``'s first truthy answer; TimeoutError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout:.0f} s")
        time.sleep(interval)


def sync_summary(pod: Any) -> SyncSummary | None:
    """What the pod's `triton-operator sync` init container said it did (its termination message,
    the figure status.timeToServe[].bytesFetched is read from); None before it finished."""
    status = pod.to_dict().get("status") or {}
    if not status.get("initContainerStatuses"):
        # One pod shape: the model agent fetched and loaded beside tritonserver; its status has the
        # same summary once its first fill is done.
        ip = status.get("podIP")
        agent = agent_status(str(ip)) if ip else None
        return parse_summary((agent or {}).get("summary"))
    terminated = (sync_container_status(status).get("state") or {}).get("terminated") or {}
    return parse_summary(terminated.get("message"))


def agent_fetched(ip: str) -> bool:
    """Whether the model agent of a pod of the one shape has every model's bytes in (its loads may go
    on: they overlap the download), by its status."""
    status = agent_status(ip) or {}
    return bool(status.get("summary")) or FILLED in str(status.get("message") or "")


def run_with_cluster(
    measure: Callable[[dict[str, Any]], None], report: Callable[[], None], *, measured: Callable[[], int]
) -> int:
    """Start the local cluster when it is not up, ``measure(node)`` on its real node, ``report()``,
    then bring down a cluster started here. The report comes first, whatever happens after (an
    interrupt, a failed run, a failed teardown): a teardown failure is reported after the figures,
    which stand (exit status 3). SIGTERM and SIGHUP stop it as Ctrl-C does."""
    with cluster.stop_signals_interrupt():
        started = False
        rc = 0
        problems: list[str] = []
        try:
            if not cluster.is_up():
                started = True  # before up: an interrupted up is brought down too
                cluster.up()
            node, why = real_node()
            if node is None:
                say(f"no real node: {why}")
                rc = 2
            else:
                measure(node)
        except KeyboardInterrupt as e:
            say(f"interrupted ({e or 'Ctrl-C'}) after {measured()} measured runs")
            rc = 130
        finally:
            with cluster.signals_deferred():  # a second Ctrl-C does not cut this short
                if measured():
                    report()
                if started:
                    problems = cluster.down_reporting()
            for line in problems:
                say(line)
            if problems:
                say("the figures above stand; bringing the local cluster down FAILED (see above)")
        return rc or (3 if problems else 0)


class Session:
    """One cluster session of a benchmark: seaweedfs on the real node's bridge address (the pods and
    the operator reach it), the CRD, a fresh namespace with the store's Secret ``store``, and
    `triton-operator run` on this machine watching that namespace, pinning repositories."""

    def __init__(
        self,
        node: Mapping[str, Any],
        workdir: Path,
        prefix: str,
        operator_env: Mapping[str, str] | None = None,
        operator_args: tuple[str, ...] = ("--no-metrics",),
        *,
        tree: Path = ROOT,
    ) -> None:
        """``tree``: the checkout whose CRD is applied and whose operator/src runs the operator (another
        ref's, for a run against it: its pods' image is then named in ``operator_env``)."""
        import httpx2  # noqa: PLC0415
        from lightkube import Client, KubeConfig  # noqa: PLC0415
        from lightkube.generic_resource import create_namespaced_resource  # noqa: PLC0415

        self.node = dict(node)
        self.workdir = workdir
        self.kubeconfig = str(cluster.kubeconfig_path())
        self.kube = Client(
            config=KubeConfig.from_file(self.kubeconfig), field_manager="bench", timeout=httpx2.Timeout(30)
        )
        self.ts = create_namespaced_resource(
            "triton-operator.io", "v1alpha1", "TritonService", "tritonservices"
        )
        self.namespace = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.operator_env = dict(operator_env or {})
        self.operator_args = operator_args
        self.tree = tree
        self.server: Any = None
        self.s3: Any = None
        self.operator: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------------ set-up and tear-down
    def start_store(self) -> None:
        import storage_servers  # noqa: PLC0415

        self.server = storage_servers.start_seaweedfs(
            self.workdir / "weed", self.workdir / "weed.log", host=self.node["ip"]
        )
        self.s3 = storage_servers.s3_client(self.server.endpoint)

    def tree_pythonpath(self) -> str:
        """PYTHONPATH for a process that runs the measured tree's code (the operator, the node cache)."""
        own = str(self.tree / "operator" / "src")
        return os.pathsep.join(filter(None, [own, os.environ.get("PYTHONPATH")]))

    def start(self) -> None:
        """The CRD, the namespace, its Secret and the operator (the store first, when not started)."""
        from lightkube.models.meta_v1 import ObjectMeta  # noqa: PLC0415
        from lightkube.resources.core_v1 import Namespace, Secret  # noqa: PLC0415

        import storage_servers  # noqa: PLC0415

        if self.server is None:
            self.start_store()
        subprocess.run(
            [
                str(cluster.bin_dir() / "kubectl"),
                f"--kubeconfig={self.kubeconfig}",
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                str(self.tree / "crds" / "tritonservices.yaml"),
            ],
            check=True,
            capture_output=True,
        )
        self.kube.create(Namespace(metadata=ObjectMeta(name=self.namespace)))
        self.kube.create(
            Secret(
                metadata=ObjectMeta(name="store", namespace=self.namespace),
                stringData={
                    "AWS_ACCESS_KEY_ID": storage_servers.S3_ACCESS_KEY,
                    "AWS_SECRET_ACCESS_KEY": storage_servers.S3_SECRET_KEY,
                },
            )
        )
        log = (self.workdir / "operator.log").open("wb")
        self.operator = subprocess.Popen(
            [sys.executable, "-m", "triton_operator.cli", "run", "-n", self.namespace, *self.operator_args],
            env={
                **os.environ,
                "PYTHONPATH": self.tree_pythonpath(),
                "KUBECONFIG": self.kubeconfig,
                "TRITON_OPERATOR_PIN_REPOSITORIES": "true",
                "TRITON_OPERATOR_TRITON_READ_CIDRS": real_node_setup.POD_CIDR,
                "TRITON_OPERATOR_TRITON_READ_SECONDS": "5",
                **self.operator_env,
            },
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        time.sleep(3)

    def stop(self) -> None:
        from lightkube.resources.core_v1 import Namespace  # noqa: PLC0415

        with cluster.signals_deferred():  # each step whatever the one before did
            if self.operator is not None:
                cluster.stop_group(self.operator)
            with contextlib.suppress(Exception):
                self.kube.delete(Namespace, self.namespace)
            if self.server is not None:
                self.server.stop()

    # ------------------------------------------------------------------ the cluster's view
    def apply(self, doc: dict[str, Any]) -> None:
        from lightkube.types import PatchType  # noqa: PLC0415

        self.kube.patch(
            self.ts,
            doc["metadata"]["name"],
            doc,
            namespace=self.namespace,
            patch_type=PatchType.APPLY,
            field_manager="bench",
            force=True,
        )

    def status(self, name: str) -> dict[str, Any]:
        obj = self.kube.get(self.ts, name, namespace=self.namespace)
        return dict(obj.get("status") or {})  # a generic resource is a dict

    def all_pods(self, name: str | None = None) -> list[Any]:
        """The namespace's pods (of the TritonService ``name`` when given), being deleted or not."""
        from lightkube.resources.core_v1 import Pod  # noqa: PLC0415

        labels: dict[str, Any] | None = {LABEL_SERVICE: name} if name else None
        return list(self.kube.list(Pod, namespace=self.namespace, labels=labels))

    def pods(self, name: str) -> list[Any]:
        """The TritonService's pods not being deleted."""
        return [
            p for p in self.all_pods(name) if p.metadata is not None and p.metadata.deletionTimestamp is None
        ]

    def cluster_ip(self, name: str) -> str:
        from lightkube.resources.core_v1 import Service  # noqa: PLC0415

        def probe() -> str:
            with contextlib.suppress(Exception):
                spec = self.kube.get(Service, name, namespace=self.namespace).spec
                return str(spec.clusterIP or "") if spec else ""
            return ""

        return str(wait(probe, 60, f"Service {name}", interval=0.02))

    def gone(self, name: str, timeout: float = 180) -> None:
        """Delete the TritonService and wait until none of its pods is left."""
        with contextlib.suppress(Exception):
            self.kube.delete(self.ts, name, namespace=self.namespace)
        wait(lambda: not self.all_pods(name), timeout, f"pods of {name} gone")

    def logs(self, pod: str, container: str) -> str:
        """A container's log (kubectl logs), '' when it cannot be read."""
        proc = subprocess.run(
            [
                str(cluster.bin_dir() / "kubectl"),
                f"--kubeconfig={self.kubeconfig}",
                "logs",
                "-n",
                self.namespace,
                pod,
                "-c",
                container,
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        return proc.stdout if proc.returncode == 0 else ""


def agent_status(ip: str) -> dict[str, Any] | None:
    """The pod's model agent's GET :8009/v1/inplace, or None when it does not answer."""
    with contextlib.suppress(OSError, ValueError):
        got: dict[str, Any] = get_json(f"http://{ip}:8009/v1/inplace")
        return got
    return None


def agent_applied(ip: str, old_revision: str | None, timeout: float = 60) -> dict[str, Any]:
    """The agent's status once it reports a revision other than ``old_revision`` Applied."""

    def probe() -> dict[str, Any] | None:
        got = agent_status(ip)
        if got and got.get("state") == "Applied" and got.get("revision") not in (None, old_revision):
            return got
        return None

    return dict(wait(probe, timeout, f"the agent of {ip} Applied"))


# ---------------------------------------------------------------- another ref's tree, side by side


@dataclass(frozen=True)
class Tree:
    """A tree a bench measures: ``label`` in its tables; ``root`` its checkout (its CRD and its
    operator/src, which runs the operator); ``env`` what the operator gets besides (another ref's pods'
    image, TRITON_OPERATOR_SYNC_IMAGE)."""

    label: str
    root: Path = ROOT
    env: Mapping[str, str] = field(default_factory=dict)


REF_IMAGE = "localhost/triton-operator/triton-operator-ref"
"""The repository of the operator images of other refs (tagged by their commit), next to this tree's."""


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def ref_image(commit: str, tree: Path) -> str:
    """The operator image of ``tree`` (a checkout of ``commit``), built from its own Dockerfile as
    e2e/images.py builds this tree's but tagged ``REF_IMAGE:<commit>`` (this tree's image is left as
    it is); built once per commit (podman keeps it)."""
    import images  # noqa: PLC0415  (e2e/images.py)

    tag = f"{REF_IMAGE}:{commit[:12]}"
    if tag not in images.podman_images():
        images.build(["base"], log=say)
        build_args = {"PYTHON_IMAGE": images.BASE_REF, "VERSION": images.VERSION}
        args = ["build", "--pull=never", "--layers=false", "--quiet", "-f", str(tree / "Dockerfile")]
        args += ["-t", tag, "--label", f"{images.LABEL}=ref-{commit}"]
        args += [f"--build-arg={k}={v}" for k, v in build_args.items()]
        if os.environ.get("TRITON_OPERATOR_BUILD_NETWORK"):
            args.append("--network=" + os.environ["TRITON_OPERATOR_BUILD_NETWORK"])
        images.podman(*args, str(tree))
    return tag


@contextlib.contextmanager
def ref_tree(ref: str, node: Mapping[str, Any] | None) -> Iterator[Tree]:
    """The tree of git ref ``ref`` for the bench's run against it: a temporary `git worktree` of its
    commit (removed after), its operator image (``ref_image``) imported into the real node's
    containerd (pinned, as images.py pins its images; ``node`` None: built only) and named as its
    pods' image."""
    import images  # noqa: PLC0415  (e2e/images.py)

    commit = git("rev-parse", "--verify", f"{ref}^{{commit}}")
    folder = Path(tempfile.mkdtemp(prefix="bench-ref-"))
    tree = folder / "tree"
    git("worktree", "add", "--detach", str(tree), commit)
    try:
        t0 = time.monotonic()
        tag = ref_image(commit, tree)
        if node is not None:
            ctr = ["ctr", "--address", str(node["containerd_socket"]), "-n", "k8s.io", "images"]
            if tag not in images.run([*ctr, "ls", "-q"]).stdout.split():
                archive = folder / "image.tar"
                images.podman("save", "--quiet", "--format", "docker-archive", "-o", str(archive), tag)
                images.run([*ctr, "import", str(archive)])
                archive.unlink()
                images.run([*ctr, "label", tag, "io.cri-containerd.pinned=pinned"])
        say(f"{ref} ({commit[:12]}): image {tag} ready in {time.monotonic() - t0:.1f} s")
        label = commit[:12] if commit.startswith(ref) else f"{ref} ({commit[:7]})"
        yield Tree(label, tree, {"TRITON_OPERATOR_SYNC_IMAGE": tag})
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            git("worktree", "remove", "--force", str(tree))
        shutil.rmtree(folder, ignore_errors=True)
