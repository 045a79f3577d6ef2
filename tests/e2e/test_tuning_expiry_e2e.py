"""`kubectl triton tune` leaves nothing behind, whoever runs it and however it ends (kwok's nodes).

On the real API server, with the fake nodes of e2e/cluster.py (kwok: pods become Ready at once, their
fake GPUs are counted by the scheduler; a perf Job's pod never finishes there, so each candidate runs
out of --candidate-seconds and is recorded as not measured, which is all these tests need):

(a) A user whose Role may do all a sweep does but delete pods (a real ServiceAccount's token): the
    sweep's cleanup deletes owners only (their pods go by cascade), nothing is left, and the record
    is saved as finished with no cleanup failure.
(b) A client SIGKILLed mid-sweep (its tuning Deployment and perf Job made) leaves them; the operator
    deletes them once the run's deadline has passed (a deadline 30 s away: the client's
    clock is set back) and marks the record Abandoned.
(c) spec.rollout.gpuBudget counts tuning pods: with the stable pod and one tuning pod holding the
    budget of 2 GPUs, a second sweep is refused and a canary started meanwhile waits (its status
    names the tuning pods) without the pods ever holding more than 2 GPUs; once the sweep ends
    (Ctrl-C) the canary gets its GPU.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from lightkube import Client, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import ConfigMap, Pod, ServiceAccount
from lightkube.resources.rbac_authorization_v1 import Role, RoleBinding

from e2e_helpers import apply, get_ts, small_tritonservice, wait_condition, write_token_kubeconfig
from testkit import wait_for
from triton_operator.adapters.tuning_cluster import KubeTuning
from triton_operator.client.tuning_runner import tune
from triton_operator.core import tuning
from triton_operator.core.rollout.clock import parse_time, utcnow

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]

FORBIDDEN = 403
TUNER_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["triton-operator.io"], "resources": ["tritonservices"], "verbs": ["get", "patch"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "create", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["services"], "verbs": ["list", "delete"]},
    # pods: read and logs only; no delete (a user the cleanup must not need it from)
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {
        "apiGroups": ["apps"],
        "resources": ["deployments"],
        "verbs": ["get", "list", "create", "patch", "delete"],
    },
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "create", "patch", "delete"]},
]
QUICK = tuning.Sweep(model="add", concurrencies=(1,), max_seconds=30, candidate_seconds=20)


def serving(kube: Client, namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    apply(kube, small_tritonservice(name, namespace, **{"replicas": 1, **spec}))
    return wait_condition(kube, namespace, name, "Ready", "True", timeout=120)


def records(kube: Client, namespace: str, name: str) -> list[dict[str, Any]]:
    labels: dict[str, Any] = {tuning.LABEL_TUNING: name, tuning.LABEL_RESULTS: "true"}
    found = [
        tuning.read_record(c.to_dict()) for c in kube.list(ConfigMap, namespace=namespace, labels=labels)
    ]
    return [r for r in found if r is not None]


def tuning_objects(kube: Client, namespace: str, name: str, kind: Any) -> list[Any]:
    return list(kube.list(kind, namespace=namespace, labels={tuning.LABEL_TUNING: name}))


def nothing_left(kube: Client, namespace: str, name: str, timeout: float) -> None:
    tuner = KubeTuning(kube)
    wait_for(
        lambda: not tuner.leftovers(namespace, {tuning.LABEL_TUNING: name}),
        timeout=timeout,
        interval=1,
        what="the sweep's objects (and their pods) gone",
    )


@pytest.fixture
def tuner(
    kube: Client, namespace: str, cluster: Path, kubectl: str | None, tmp_path: Path
) -> Iterator[Client]:
    """A client authenticated as ServiceAccount `tuner`, whose Role allows a sweep but deleting pods."""
    if kubectl is None:
        pytest.skip("no kubectl binary (python3 e2e/cluster.py build provides one)")
    kube.create(ServiceAccount(metadata=ObjectMeta(name="tuner", namespace=namespace)))
    role = {"metadata": {"name": "tuner", "namespace": namespace}, "rules": TUNER_RULES}
    kube.create(cast(Role, Role.from_dict(role)))
    binding = {
        "metadata": {"name": "tuner", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tuner"},
        "subjects": [{"kind": "ServiceAccount", "name": "tuner", "namespace": namespace}],
    }
    kube.create(cast(RoleBinding, RoleBinding.from_dict(binding)))
    token = subprocess.run(
        [kubectl, f"--kubeconfig={cluster}", "create", "token", "tuner", "-n", namespace],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    config = write_token_kubeconfig(cluster, token, tmp_path / "tuner.kubeconfig")
    yield Client(config=KubeConfig.from_file(str(config)), field_manager="kubectl-triton")


# ----------------------------------------------------------------- (a) no right to delete pods


def test_a_user_who_may_not_delete_pods_gets_a_complete_cleanup_and_a_saved_record(
    kube: Client, namespace: str, operator: Any, tuner: Client
) -> None:
    serving(kube, namespace, "rbac")
    with pytest.raises(ApiError) as refused:  # the Role really lacks it
        tuner.delete(Pod, "any", namespace=namespace)
    assert refused.value.status.code == FORBIDDEN
    lines: list[str] = []
    data = tune("rbac", namespace, QUICK, cluster=KubeTuning(tuner), log=lines.append)
    # kwok never runs perf_analyzer: the candidate is not measured, and the run ends Failed, saved
    assert data["state"] == tuning.FAILED and data["finishedAt"] is not None
    assert data["cleanup"] == [] and not [line for line in lines if line.startswith("cleanup:")]
    (saved,) = records(kube, namespace, "rbac")
    assert saved["state"] == tuning.FAILED and saved["cleanup"] == []
    nothing_left(kube, namespace, "rbac", timeout=90)


# ----------------------------------------------------------------- (b) SIGKILL: the operator's end

SWEEP_SCRIPT = """
import sys
from datetime import timedelta
from triton_operator.client.tuning_runner import tune
from triton_operator.core import tuning
from triton_operator.core.rollout.clock import utcnow
sweep = tuning.Sweep(model="add", concurrencies=(1,), max_seconds=30, candidate_seconds=int(sys.argv[4]))
back = timedelta(seconds=float(sys.argv[3]))  # the client's clock, set back: its run's deadline is near
tune(sys.argv[1], sys.argv[2], sweep, now=lambda: utcnow() - back, log=lambda line: print(line, flush=True))
"""


def sweep_process(
    cluster: Path, name: str, namespace: str, back: float, candidate: int
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", SWEEP_SCRIPT, name, namespace, str(back), str(candidate)],
        env={**os.environ, "KUBECONFIG": str(cluster)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_a_client_killed_mid_sweep_leaves_objects_the_operator_removes_after_their_deadline(
    kube: Client, namespace: str, operator: Any, cluster: Path
) -> None:
    serving(kube, namespace, "killed")
    # deadline = start + 30 + 2 x 20 + 60 s; the start is set 100 s back: 30 s from now
    back = 30 + 2 * QUICK.candidate_seconds + tuning.DEADLINE_GRACE_SECONDS - 30
    client = sweep_process(cluster, "killed", namespace, back, QUICK.candidate_seconds)
    try:
        wait_for(lambda: tuning_objects(kube, namespace, "killed", Job), timeout=60, what="the perf Job")
    finally:
        client.send_signal(signal.SIGKILL)
        output, _ = client.communicate(timeout=30)
    assert client.returncode == -signal.SIGKILL, output
    (deployment,) = tuning_objects(kube, namespace, "killed", Deployment)
    deadline = parse_time((deployment.metadata.annotations or {})[tuning.ANNOTATION_DEADLINE])
    assert deadline is not None and deadline > utcnow()  # still there: nobody removed it early
    assert tuning_objects(kube, namespace, "killed", Job)
    (record,) = records(kube, namespace, "killed")
    assert record["state"] == tuning.RUNNING  # the client could not finish it
    nothing_left(kube, namespace, "killed", timeout=120)
    assert utcnow() >= deadline
    (record,) = records(kube, namespace, "killed")
    assert record["state"] == tuning.ABANDONED and record["finishedAt"] is not None
    assert "the operator deleted the objects it left" in record["message"]


# ----------------------------------------------------------------- (c) the GPU budget counts tuning pods


def gpus_held(kube: Client, namespace: str) -> int:
    total = 0
    for pod in kube.list(Pod, namespace=namespace):
        if (
            pod.metadata is None
            or pod.spec is None
            or (pod.status and pod.status.phase in ("Succeeded", "Failed"))
        ):
            continue
        for container in pod.spec.containers:
            limits = (container.resources.limits if container.resources else None) or {}
            total += int(limits.get("nvidia.com/gpu", 0))
    return total


def test_tuning_pods_count_against_the_gpu_budget_of_canaries_and_other_sweeps(
    kube: Client, namespace: str, operator: Any, cluster: Path
) -> None:
    resources = {"cpu": "100m", "memory": "256Mi", "gpus": 1}
    rollout = {"steps": [{"setWeight": 50}, {"pause": {}}], "gpuBudget": 2}
    serving(kube, namespace, "budget", resources=resources, rollout=rollout)
    client = sweep_process(cluster, "budget", namespace, 0, 120)  # its candidate holds its pod 120 s
    try:
        wait_for(
            lambda: [
                p for p in tuning_objects(kube, namespace, "budget", Pod) if p.status and p.status.podIP
            ],
            timeout=60,
            what="the tuning pod",
        )
        assert gpus_held(kube, namespace) == 2
        with pytest.raises(tuning.TuningError, match="gpuBudget: 2 GPUs; the service's pods"):
            tune("budget", namespace, QUICK, cluster=KubeTuning(kube))  # a second sweep: no GPU left
        body = small_tritonservice("budget", namespace, replicas=1, resources=resources, rollout=rollout)
        body["spec"]["serverArgs"] = ["--log-verbose=1"]
        apply(kube, body)  # a new revision: its canary wants 1 pod, 1 GPU

        def waiting() -> dict[str, Any] | None:
            ts = get_ts(kube, namespace, "budget")
            message = next(
                (
                    c.get("message", "")
                    for c in ts.get("status", {}).get("conditions") or []
                    if c["type"] == "Progressing"
                ),
                "",
            )
            return ts if "tuning pod(s) (kubectl triton tune) hold GPUs" in message else None

        ts = wait_for(waiting, timeout=60, what="the canary waiting for the tuning pod's GPU")
        canary = ts["status"]["canaryRevision"]
        until = time.monotonic() + 10
        while time.monotonic() < until:  # the canary stays at 0: never 3 GPUs
            assert gpus_held(kube, namespace) <= 2
            time.sleep(0.5)
        assert ts["status"].get("abortedRevision") is None
    finally:
        client.send_signal(signal.SIGINT)  # the sweep ends: its cleanup frees the GPU
        output, _ = client.communicate(timeout=60)
    nothing_left(kube, namespace, "budget", timeout=90)

    def canary_pod() -> bool:
        labels: dict[str, Any] = {"triton-operator.io/revision": canary}
        return any(
            p.status and p.status.phase == "Running"
            for p in kube.list(Pod, namespace=namespace, labels=labels)
        )

    wait_for(canary_pod, timeout=90, what="the canary's pod once the tuning pod is gone")
    assert gpus_held(kube, namespace) <= 2, output
