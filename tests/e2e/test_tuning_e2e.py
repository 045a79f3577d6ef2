"""`kubectl triton tune` on the real node: a small sweep end to end, and Ctrl-C in the middle of one.

The model is the adder with a 20 ms overhead per execute() call, whatever the batch (as a Python
model that sets up a GPU call or a remote lookup per batch has): without dynamic batching each
request pays it alone; with it, requests queued while one batch runs go together. Its own config
(maxBatchSize 8, one instance, no dynamic batching) is the sweep's candidate c0.

(a) `kubectl triton tune --queue-delay-us 0,2000 --latency-bound-ms 100 --apply`: each candidate on a
    tuning pod of its own (the TritonService's Service never has a tuning pod among its endpoints),
    perf_analyzer as a Job from the perf-analyzer image; the record shows a candidate other than c0
    chosen, within the bound and the most throughput of the rows within it, with more throughput
    than c0 had in the same table, and c0 at concurrency 8 over the bound (the table's own figures:
    nothing is timed here); nothing of the sweep is left but its record; `kubectl triton status`
    shows it; --apply made it the spec, the new stable revision was rendered from it, and the
    Service's Triton serves that config.
(b) SIGINT while the sweep measures: exit 130, nothing left, the record says Interrupted.

Needs the real node of e2e/cluster.py and the images built from this tree (e2e/images.py; the Jobs
run perf_analyzer 2.51.0 from its perf-analyzer image); without them every test here skips, saying why.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import ConfigMap, Endpoints, Service

import images  # e2e/images.py: the perf Jobs' image is the perf-analyzer image, by default
from e2e_helpers import apply, create_store_secret, get_ts, kubectl_triton, wait_condition
from real_pods import ADD_SUB_CONFIG, behaving_source, on_real_node
from testkit import wait_for
from triton_operator.adapters.tuning_cluster import KubeTuning
from triton_operator.core import tuning

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.operator_env(TRITON_OPERATOR_PIN_REPOSITORIES="true"),
]
KEY = "models/add_sub/1/model.py"
SWEEP_FLAGS = [
    *["--model", "add_sub", "--queue-delay-us", "0,2000", "--concurrency", "1,8"],
    *["--measurement-ms", "1500", "--max-trials", "6", "--stability-percentage", "50"],
    *["--candidate-seconds", "240", "--max-seconds", "900"],
]
BOUND_MS = 100
"""Between c0 at concurrency 8 (no batching: 8 requests take turns on a 20 ms execute(), so its p95 is
about 8 x 20 ms whatever the machine; 172 ms on the real node) and a batching candidate there (45 ms)."""


@pytest.fixture
def bucket(store: Any, kube: Client, namespace: str) -> str:
    """A fresh bucket holding add_sub version 1: the adder with 20 ms of overhead per execute()."""
    import storage_servers  # noqa: PLC0415

    name = f"tune-{uuid.uuid4().hex[:8]}"
    s3 = store.extra["s3"]
    s3.create_bucket(Bucket=name)
    s3.put_object(Bucket=name, Key=KEY, Body=behaving_source(delay=0.02))
    create_store_secret(kube, namespace, storage_servers.S3_ACCESS_KEY, storage_servers.S3_SECRET_KEY)
    return name


def serve(kube: Client, namespace: str, bucket: str, store: Any, name: str = "tuned") -> dict[str, Any]:
    body = on_real_node(name, namespace, bucket=bucket, endpoint=store.endpoint)
    body["spec"]["models"] = [{"name": "add_sub", "config": copy.deepcopy(ADD_SUB_CONFIG)}]
    apply(kube, body)
    return wait_condition(kube, namespace, name, "Ready", "True", timeout=180)


def plugin(cluster: Path, *args: str) -> subprocess.Popen[str]:
    script = shutil.which("kubectl-triton", path=str(Path(sys.executable).parent))
    command = [script] if script else [sys.executable, "-m", "triton_operator.kubectl_plugin"]
    return subprocess.Popen(
        [*command, *args],
        env={**os.environ, "KUBECONFIG": str(cluster)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def records(kube: Client, namespace: str, name: str) -> list[dict[str, Any]]:
    labels: dict[str, Any] = {tuning.LABEL_TUNING: name, tuning.LABEL_RESULTS: "true"}
    found = [
        tuning.read_record(c.to_dict()) for c in kube.list(ConfigMap, namespace=namespace, labels=labels)
    ]
    return [r for r in found if r is not None]


def served_config(kube: Client, namespace: str, name: str, model: str, having: str) -> dict[str, Any] | None:
    """The config Triton serves for ``model`` behind Service ``name`` (its ClusterIP, as clients reach
    it) once it has the field ``having``; None until then (or while nothing answers)."""
    spec = kube.get(Service, name, namespace=namespace).spec
    assert spec is not None and spec.clusterIP
    url = f"http://{spec.clusterIP}:8000/v2/models/{model}/config"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            config: dict[str, Any] = json.loads(response.read())
    except (OSError, ValueError):
        return None
    return config if having in config else None


def nothing_left(kube: Client, namespace: str, name: str) -> None:
    tuner = KubeTuning(kube)
    labels = {tuning.LABEL_TUNING: name}
    wait_for(
        lambda: not tuner.leftovers(namespace, labels),
        timeout=120,
        interval=1,
        what="the sweep's objects gone",
    )


class EndpointWatch:
    """Every pod Service `<name>`'s Endpoints named, ready or not, while the sweep ran (every 0.5 s)."""

    def __init__(self, kube: Client, namespace: str, name: str) -> None:
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(kube, namespace, name), daemon=True)
        self._thread.start()

    def _run(self, kube: Client, namespace: str, name: str) -> None:
        while not self._stop.wait(0.5):
            try:
                endpoints = kube.get(Endpoints, name, namespace=namespace)
            except Exception:
                continue
            for subset in endpoints.subsets or []:
                for address in [*(subset.addresses or []), *(subset.notReadyAddresses or [])]:
                    if address.targetRef is not None and address.targetRef.name:
                        self.seen.add(address.targetRef.name)

    def stop(self) -> set[str]:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.seen


def test_a_sweep_finds_a_better_config_than_the_models_own_applies_it_and_leaves_nothing(  # noqa: PLR0917
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str, cluster: Path
) -> None:
    before = serve(kube, namespace, bucket, store)
    stable = before["status"]["stableRevision"]
    watch = EndpointWatch(kube, namespace, "tuned")
    command = ["tune", "tuned", "-n", namespace, *SWEEP_FLAGS, "--latency-bound-ms", str(BOUND_MS), "--apply"]
    proc = plugin(cluster, *command)
    out, err = proc.communicate(timeout=1200)
    seen = watch.stop()
    print(f"\n$ kubectl triton {' '.join(command)}\n{out}\n--- stderr ---\n{err}")
    assert proc.returncode == 0, err
    assert f"perf_analyzer from {images.IMAGES['perf-analyzer']['ref']}" in err

    (data,) = records(kube, namespace, "tuned")
    assert data["state"] == tuning.SUCCEEDED, data["message"]
    table = {c["name"]: c for c in data["candidates"]}
    assert sorted(table) == ["c0", "c1", "c2"]
    assert all(c["measurements"] and not c["error"] for c in table.values()), data
    choice = data["choice"]
    assert choice["candidate"] != "c0" and not choice["default"]
    # The bound, from the record's own rows: the choice is within it and the most throughput of the
    # rows within it; c0 at concurrency 8 (no batching) is over it, so the bound decided something.
    bound = data["latencyBoundMicroseconds"]
    assert bound == BOUND_MS * 1000 and data["percentile"] == 95
    rows = [(c["name"], m) for c in data["candidates"] for m in c["measurements"]]
    within = [(name, m) for name, m in rows if m["p95_us"] <= bound]
    assert choice["measurement"]["p95_us"] <= bound, data
    assert choice["measurement"]["throughput"] == max(m["throughput"] for _, m in within), data
    assert any(name == "c0" and m["concurrency"] == 8 and m["p95_us"] > bound for name, m in rows), data
    # More throughput than the model's own config had in the same table, at any concurrency, bound or not.
    own_best = max(m["throughput"] for m in table["c0"]["measurements"])
    assert choice["measurement"]["throughput"] > own_best, data
    assert choice["baseline"]["throughput"] == max(m["throughput"] for name, m in within if name == "c0")

    # The Service never had a tuning pod among its endpoints (its own pod was there all along).
    assert len(re.findall(r"pod Ready at ([0-9.]+)", err)) == 3, err
    prefix = tuning.object_prefix("tuned", data["run"])
    assert any(name.startswith(f"tuned-{stable}-") for name in seen), seen
    assert not [name for name in seen if name.startswith(prefix)], seen

    nothing_left(kube, namespace, "tuned")
    status = kubectl_triton(cluster, "status", "tuned", "-n", namespace)
    assert "Tuning (kubectl triton tune; latest last):" in status
    assert f"best under p95 <= {BOUND_MS:.1f} ms: {choice['candidate']}" in status

    # --apply: a normal spec change; the rollout serves the winner from a new revision.
    config = get_ts(kube, namespace, "tuned")["spec"]["models"][0]["config"]
    assert "dynamicBatching" in config
    chosen = next(c for c in data["candidates"] if c["name"] == choice["candidate"])
    assert json.dumps(config, sort_keys=True) == json.dumps(chosen["config"], sort_keys=True)
    after = wait_condition(kube, namespace, "tuned", "Ready", "True", timeout=240)
    wait_for(
        lambda: get_ts(kube, namespace, "tuned")["status"].get("stableRevision") not in (None, stable),
        timeout=240,
        what="the applied config served by a new stable revision",
    )
    new_stable = get_ts(kube, namespace, "tuned")["status"]["stableRevision"]
    print(f"applied: stable {stable} -> {new_stable}")
    assert after["spec"]["models"][0]["config"] == config
    # The new stable revision was rendered from the chosen config, and the Service's Triton serves it.
    recorded = tuning.stable_spec(KubeTuning(kube).revision_configmaps("tuned", namespace, new_stable))
    assert json.dumps(recorded["models"][0]["config"], sort_keys=True) == json.dumps(
        chosen["config"], sort_keys=True
    )
    served = wait_for(
        lambda: served_config(kube, namespace, "tuned", "add_sub", having="dynamic_batching"),
        timeout=120,
        interval=1,
        what="the Service's Triton serving add_sub with dynamic batching",
    )
    delay = int(chosen["config"]["dynamicBatching"].get("maxQueueDelayMicroseconds") or 0)
    served_delay = (served["dynamic_batching"] or {}).get("max_queue_delay_microseconds") or 0
    assert int(served_delay) == delay, served


def test_ctrl_c_in_the_middle_of_a_sweep_deletes_its_pods_and_records_interrupted(  # noqa: PLR0917
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str, cluster: Path
) -> None:
    serve(kube, namespace, bucket, store, name="cut")
    proc = plugin(cluster, "tune", "cut", "-n", namespace, *SWEEP_FLAGS)
    tuner = KubeTuning(kube)
    # Wait until the first perf Job runs: a tuning pod and a Job exist.
    wait_for(
        lambda: any(k.startswith("Job/") for k in tuner.leftovers(namespace, {tuning.LABEL_TUNING: "cut"})),
        timeout=240,
        interval=0.5,
        what="the sweep's first perf Job",
    )
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    print(f"\n{out}\n--- stderr ---\n{err}")
    assert proc.returncode == 130, err
    assert "interrupted" in err
    nothing_left(kube, namespace, "cut")
    (data,) = records(kube, namespace, "cut")
    assert data["state"] == tuning.INTERRUPTED
    assert data["finishedAt"]
