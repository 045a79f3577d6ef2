"""Helpers of the real-pod tests: the local cluster's real node, a store its pods reach, model sources.

The real node (e2e/cluster.py: kubelet, containerd, runc, a CNI bridge, kube-proxy) is tainted
so that only pods meant for it land there; `on_real_node` adds the toleration and node selector.
Imported by basename: ``from real_pods import ...``.
"""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path
from typing import Any

import images  # e2e/images.py (e2e/ is on sys.path: pytest's pythonpath, or the bench script's)
import node  # e2e/node.py
from inference import infer_add_sub, offset_of  # e2e/inference.py
from testkit import wait_for

ROOT = Path(__file__).resolve().parents[2]

REAL_NODE_LABEL = node.LABEL
placement = node.placement
"""Pod spec fields (nodeSelector, tolerations) that put a pod on the real node."""
TRITON_CPU_IMAGE = images.IMAGES["tritonserver"]["ref"]
ADDER = ROOT / "tests" / "data" / "triton_models" / "adder" / "1" / "model.py"

ADD_SUB_CONFIG: dict[str, Any] = {
    "backend": "python",
    "maxBatchSize": 8,
    "input": [
        {"name": "INPUT0", "dataType": "TYPE_FP32", "dims": ["4"]},
        {"name": "INPUT1", "dataType": "TYPE_FP32", "dims": ["4"]},
    ],
    "output": [
        {"name": "OUTPUT0", "dataType": "TYPE_FP32", "dims": ["4"]},
        {"name": "OUTPUT1", "dataType": "TYPE_FP32", "dims": ["4"]},
    ],
    "instanceGroup": [{"kind": "KIND_CPU", "count": 1}],
}


def real_node() -> tuple[dict[str, Any] | None, str]:
    """The local cluster's real node ({name, ip, ...}) or None and why there is none."""
    skip = os.environ.get("TRITON_E2E_REAL_NODE_SKIP")
    try:
        import cluster  # noqa: PLC0415  (e2e/cluster.py, optional: the tests skip without it)
    except ImportError as exc:
        return None, skip or f"e2e/cluster.py cannot be imported ({exc})"
    node, why = cluster.real_node()
    return node, "" if node is not None else (why or skip or "")


def adder_source(offset: float = 0) -> bytes:
    """The adder test model (OUTPUT0 = INPUT0 + INPUT1), plus ``offset`` to tell revisions apart."""
    text = ADDER.read_text()
    if offset:
        assert "(a + b)" in text
        text = text.replace("(a + b)", f"(a + b + {offset!r})")
    return text.encode()


def stamped_holding_source(offset: float, mib: int) -> bytes:
    """The adder (plus ``offset``) holding ``mib`` MiB, touched, from its load to its unload, and
    answering OUTPUT1 = a number drawn at its load (the same until it is loaded again)."""
    text = adder_source(offset).decode()
    head = "    def initialize(self, args):\n"
    out1 = '(a - b).astype(self.dtypes["OUTPUT1"])'
    assert head in text and out1 in text
    load = f"{head}        import random\n        self.hold = b'\\x01' * ({mib} << 20)\n"
    load += "        self.loaded = float(random.randrange(1, 1 << 20))\n"
    text = text.replace(head, load)
    return text.replace(out1, '(a * 0 + self.loaded).astype(self.dtypes["OUTPUT1"])').encode()


def behaving_source(offset: float = 0, *, delay: float = 0.0, fail_in_ten: int = 0) -> bytes:
    """The adder (plus ``offset``) that sleeps ``delay`` seconds a request and raises in execute for
    ``fail_in_ten`` of every ten requests: Triton counts those in nv_inference_request_failure.

    (An error *response* from a Python model counts as a success in Triton's counters, as of 2.51:
    only a raised execute is a failed request there.)
    """
    text = adder_source(offset).decode()
    head = "    def execute(self, requests):\n"
    assert head in text
    behave = (
        "    def execute(self, requests):\n"
        "        import time\n"
        "        self.seen = getattr(self, 'seen', 0) + 1\n"
        f"        if self.seen % 10 < {fail_in_ten}:\n"
        "            raise pb_utils.TritonModelException('failing on purpose (real-pod analysis test)')\n"
        f"        time.sleep({delay!r})\n"
    )
    return text.replace(head, behave).encode()


def raising_source() -> bytes:
    """A model.py that raises when the Python backend imports it."""
    return b'raise RuntimeError("this model.py fails at import (real-pod test)")\n' + adder_source()


def on_real_node(
    name: str,
    namespace: str,
    *,
    bucket: str,
    endpoint: str,
    secret: str = "store",
    replicas: int = 1,
    **spec: Any,
) -> dict[str, Any]:
    """A TritonService serving `add_sub` from s3://BUCKET/models on the real node; ``spec`` overrides."""
    body: dict[str, Any] = {
        "apiVersion": "triton-operator.io/v1alpha1",
        "kind": "TritonService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "image": TRITON_CPU_IMAGE,
            "resources": {"cpu": "100m", "memory": "256Mi"},
            "shmSize": "64Mi",
            "serverArgs": ["--log-verbose=0", "--exit-timeout-secs=5"],
            # drainSeconds: the default (5 s). With 2 s a loaded 2-core machine once let kube-proxy
            # route a request to a blue pod already gone after the BlueGreen switch.
            "startupTimeoutSeconds": 120,
            "repository": {
                "uri": f"s3://{bucket}/models",
                "endpoint": endpoint,
                "credentialsSecret": secret,
                "pollIntervalSeconds": 2,
                "s3": {"addressingStyle": "path"},
            },
            "models": [{"name": "add_sub", "config": copy.deepcopy(ADD_SUB_CONFIG)}],
            **node.placement(),
        },
    }
    body["spec"].update(copy.deepcopy(spec))
    return body


def proxied_to(pod_ip: str) -> bool:
    """Whether kube-proxy's NAT rules on this host still send a Service's connections to ``pod_ip``.

    An EndpointSlice dropping a pod is not the moment the node stops routing to it: kube-proxy
    rewrites its rules from the slice a moment later (over 2 s on a loaded 2-core machine).
    """
    out = subprocess.run(
        ["iptables", "-w", "-t", "nat", "-S"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    return f"--to-destination {pod_ip}:" in out


def answering(host: str, offset: float, timeout: float = 60) -> None:
    """Wait until requests through the Service at ``host`` come back with ``offset`` (only): a
    TritonService Ready does not mean kube-proxy on this node has its Service's endpoints yet (until
    then a connection to the ClusterIP is refused)."""

    def probe() -> bool:
        try:
            return all(offset_of(infer_add_sub(host, timeout=3)) == offset for _ in range(5))
        except Exception:
            return False

    wait_for(probe, timeout=timeout, interval=0.5, what=f"answers with offset {offset:g} from {host}")


ADDER_KEY = "models/add_sub/1/model.py"
"""Where on_real_node's repository (s3://BUCKET/models) holds the adder."""


def restricted_with_adder(kube: Any, namespace: str, store: Any, prefix: str) -> str:
    """A new bucket ``<prefix>-<random>`` of ``store`` holding the adder, the namespace's store
    Secret for it, and the namespace labelled to enforce Pod Security `restricted`; the bucket."""
    import uuid  # noqa: PLC0415

    from lightkube.resources.core_v1 import Namespace  # noqa: PLC0415

    import storage_servers  # noqa: PLC0415
    from e2e_helpers import create_store_secret  # noqa: PLC0415

    bucket = f"{prefix}-{uuid.uuid4().hex[:8]}"
    store.extra["s3"].create_bucket(Bucket=bucket)
    store.extra["s3"].put_object(Bucket=bucket, Key=ADDER_KEY, Body=adder_source(0))
    create_store_secret(kube, namespace, storage_servers.S3_ACCESS_KEY, storage_servers.S3_SECRET_KEY)
    labels = {"pod-security.kubernetes.io/enforce": "restricted"}
    kube.patch(Namespace, namespace, {"metadata": {"labels": labels}})
    return bucket
