"""The node cache's shared files on the real node: `helm install` with nodeCache.sharedFiles makes the
cache the CSI driver files.node-cache.triton-operator.io, registered with the real kubelet; a
TritonService in a namespace enforcing Pod Security `restricted` serves, and a scale-up pod on the
now warm node links to the cache's own file (checked against the BLAKE3 the cache signed) instead of
copying it, through a read-only view the kubelet mounted, while a client counting answers through
the Service gets every one. The node cache restarting under serving pods costs no answer, and a pod
made after it gets its view; a pod's view ends with the pod.

Needs the real node of e2e/cluster.py and the images built from the project's files; without them
every test here skips, saying why.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod, Service

from e2e_helpers import agent_summary, apply, wait_condition
from inference import LoadClient
from real_pods import ADDER_KEY, adder_source, answering, on_real_node, placement, restricted_with_adder
from testkit import load_chartlib, wait_for
from triton_operator.adapters.nodecache.views import mount_points
from triton_operator.core.objects.names import AGENT_CONTAINER
from triton_operator.core.repository.shared_files import DRIVER, MOUNT_PATH, VOLUME

ROOT = Path(__file__).resolve().parents[2]

SERVICE = "shared"

pytestmark = [pytest.mark.cluster]


def pods_of(kube: Client, namespace: str) -> list[Any]:
    return list(kube.list(Pod, namespace=namespace, labels={"triton-operator.io/service": SERVICE}))


def view_target(kubelet: Path, uid: str) -> str:
    return str(kubelet / "pods" / uid / "volumes" / "kubernetes.io~csi" / VOLUME / "mount")


def model_file(kubelet: Path, pod: Any) -> Path:
    """The pod's model file in its /models emptyDir, as the node sees it (a symlink into the pod's
    view dangles here: the view is at its own path in the pod)."""
    path = kubelet / "pods" / str(pod.metadata.uid) / "volumes" / "kubernetes.io~empty-dir" / "models"
    path = path / ADDER_KEY.removeprefix("models/")
    assert os.path.lexists(path), path
    return path


def test_a_warm_pod_links_to_the_caches_file_through_its_read_only_view(  # noqa: PLR0917 (fixtures)
    kube: Client,
    namespace: str,
    store: Any,
    cluster: Path,
    kubectl: str | None,
    tmp_path: Path,
) -> None:
    helm = load_chartlib().find_tool("helm")
    if helm is None or kubectl is None:
        pytest.skip("no helm or kubectl binary (python3 e2e/cluster.py build provides them)")
    kubelet = cluster.parent / "node" / "kubelet"  # the real node's --root-dir (e2e/node.py)
    if not kubelet.is_dir():
        pytest.skip(f"no real node's kubelet folder at {kubelet}")
    # The Triton pods' namespace enforces `restricted`; the operator and its cache live elsewhere.
    bucket = restricted_with_adder(kube, namespace, store, "ncf")
    system = f"ncf-op-{uuid.uuid4().hex[:6]}"
    kube.create(Namespace(metadata=ObjectMeta(name=system)))
    cache_dir = tmp_path / "node-cache"  # the real node is this machine: its hostPath is here
    values = {
        "watchNamespaces": [namespace],
        **placement(),
        "nodeCache": {
            "enabled": True,
            "hostNetwork": True,
            "hostPath": str(cache_dir),
            "sharedFiles": {"enabled": True, "kubeletRoot": str(kubelet)},
            **placement(),
        },
    }
    (tmp_path / "values.json").write_text(json.dumps(values))

    def run(tool: str, *args: str) -> str:
        proc = subprocess.run(
            [tool, f"--kubeconfig={cluster}", *args], capture_output=True, text=True, timeout=240, check=False
        )
        assert proc.returncode == 0, f"{tool} {' '.join(args)}: {proc.stdout}\n{proc.stderr}"
        return proc.stdout

    def cache_pod() -> Any:
        found = list(
            kube.list(Pod, namespace=system, labels={"app.kubernetes.io/name": "triton-operator-node-cache"})
        )
        ready = [
            p for p in found
            if p.metadata is not None and p.metadata.deletionTimestamp is None and p.status is not None
            and any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))
        ]  # fmt: skip
        return ready[0] if ready else None

    release = f"ncf-{uuid.uuid4().hex[:6]}"
    chart = str(ROOT / "charts" / "triton-operator")
    run(str(helm), "install", release, chart, "-n", system, "-f", str(tmp_path / "values.json"), "--wait")
    client: LoadClient | None = None
    try:
        apply(kube, on_real_node(SERVICE, namespace, bucket=bucket, endpoint=store.endpoint))
        wait_condition(kube, namespace, SERVICE, "Ready", "True", timeout=180)
        (first,) = pods_of(kube, namespace)
        # The pod: the CSI volume, read-only, and still no hostPath (restricted admitted it).
        volumes = {v.name: v for v in first.spec.volumes or []}
        assert volumes[VOLUME].csi is not None and volumes[VOLUME].csi.driver == DRIVER
        assert volumes[VOLUME].csi.readOnly is True
        assert not [v for v in volumes.values() if v.hostPath is not None]
        # The kubelet registered the driver and mounted the first pod's view (empty: a cold node).
        assert view_target(kubelet, first.metadata.uid) in mount_points()
        cold = agent_summary(first)
        assert cold is not None and (cold.node_cache_misses, cold.node_cache_shared) == (1, 0)
        assert not model_file(kubelet, first).is_symlink()

        service = kube.get(Service, SERVICE, namespace=namespace)
        assert service.spec is not None and service.spec.clusterIP
        host = str(service.spec.clusterIP)
        answering(host, 0)
        client = LoadClient(host, max_seconds=600).start()

        def new_pod(known: set[str]) -> Any:
            def found() -> Any:
                now = [p for p in pods_of(kube, namespace) if p.metadata.uid not in known]
                done = [p for p in now if agent_summary(p) is not None]
                return done[0] if done else None

            return wait_for(found, timeout=180, what="a new pod's fill")

        run(kubectl, "scale", "tritonservice", SERVICE, "-n", namespace, "--replicas=2")
        second = new_pod({first.metadata.uid})
        warm = agent_summary(second)
        assert warm is not None
        assert (warm.fetched, warm.node_cache_hits, warm.node_cache_vouched, warm.node_cache_shared) == (
            0,
            1,
            1,
            1,
        )
        # Its model file: a symlink into its view, which holds a hard link to the cache's own blob.
        placed = model_file(kubelet, second)
        link = os.readlink(placed)
        blob = Path(link).name
        assert link == f"{MOUNT_PATH}/{blob}"
        viewed = cache_dir / "views" / second.metadata.uid / blob
        assert viewed.stat().st_ino == (cache_dir / "blobs" / blob).stat().st_ino
        assert (Path(view_target(kubelet, second.metadata.uid)) / blob).read_bytes() == adder_source(0)
        # Read-only inside the pod: no write, no unlink, no new file.
        script = (
            "import errno,os\n"
            f"p='{MOUNT_PATH}/{blob}'\n"
            "for f in (lambda: open(p,'ab'), lambda: os.unlink(p), lambda: open(p+'.x','wb')):\n"
            "    try: f(); print('WROTE')\n"
            "    except OSError as e: print(errno.errorcode[e.errno])\n"
        )
        said = run(kubectl, "exec", "-n", namespace, second.metadata.name, "-c", AGENT_CONTAINER, "--",
                   "python3", "-c", script)  # fmt: skip
        # (the file's mode refuses the agent's user first; root is refused by the mount: the storage test)
        assert said.split() in (["EROFS"] * 3, ["EACCES", "EROFS", "EROFS"]), said
        wait_condition(kube, namespace, SERVICE, "Ready", "True", timeout=180)

        # The node cache restarts under the serving pods: their views stay mounted, nothing fails.
        old_cache = cache_pod()
        assert old_cache is not None
        run(kubectl, "delete", "pod", "-n", system, old_cache.metadata.name, "--wait=true")
        wait_for(lambda: (p := cache_pod()) is not None and p.metadata.uid != old_cache.metadata.uid,
                 timeout=120, what="the node cache back")  # fmt: skip
        assert view_target(kubelet, second.metadata.uid) in mount_points()
        assert (Path(view_target(kubelet, second.metadata.uid)) / blob).read_bytes() == adder_source(0)
        # A pod made after it gets its view and links; the pod it replaced loses its own.
        run(kubectl, "delete", "pod", "-n", namespace, second.metadata.name, "--wait=false")
        third = new_pod({first.metadata.uid, second.metadata.uid})
        again = agent_summary(third)
        assert again is not None and (again.fetched, again.node_cache_shared) == (0, 1)
        assert model_file(kubelet, third).is_symlink()
        wait_for(
            lambda: (
                not (cache_dir / "views" / second.metadata.uid).exists()
                and view_target(kubelet, second.metadata.uid) not in mount_points()
            ),
            timeout=120,
            what="the deleted pod's view removed",
        )
        wait_condition(kube, namespace, SERVICE, "Ready", "True", timeout=180)
        client.stop()
        assert client.sent > 0 and not client.failures, client.summary()
        assert set(client.answers) == {0.0}, client.summary()
    finally:
        if client is not None:
            client.stop()
        # The pods go before the cache: their views are unmounted by it (the kubelet waits for it).
        run(kubectl, "delete", "tritonservice", SERVICE, "-n", namespace, "--ignore-not-found", "--wait=true")
        wait_for(lambda: not pods_of(kube, namespace), timeout=180, what="the pods gone")
        run(str(helm), "uninstall", release, "-n", system, "--wait", "--timeout", "120s")
        kube.delete(Namespace, system)
    assert not [m for m in mount_points() if f"kubernetes.io~csi/{VOLUME}" in m]
