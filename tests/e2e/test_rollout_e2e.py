"""Rollouts against a real API server: canary steps, readiness gate, rollback, control, restarts, traffic.

Every test follows the rollout with a Trail: it polls the TritonService, its Deployments, pods and
routes, checks invariants on every snapshot (the stable revision is never touched, a GPU budget
is never exceeded, Recreate never runs both revisions) and waits for each resting point of the
rollout, where it checks the objects and the conditions. Events are checked at the end: each
step completes exactly once, in order.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import ConfigMap, Event, Pod, Service

from e2e_helpers import (
    CRASH,
    ENSEMBLE_OF_A_MISSING_MODEL,
    NEVER_READY,
    PYTHON_MODEL,
    REVISION_LABEL,
    SERVICE_LABEL,
    TS,
    apply,
    as_dict,
    events,
    kubectl_triton,
)
from e2e_helpers import small_tritonservice as tritonservice
from tritonservice_bodies import fetcher

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

HTTPROUTE = create_namespaced_resource("gateway.networking.k8s.io", "v1", "HTTPRoute", "httproutes")
GRPCROUTE = create_namespaced_resource("gateway.networking.k8s.io", "v1", "GRPCRoute", "grpcroutes")
HEADER_RULES = "triton-operator.io/header-route-rules"


# ----------------------------------------------------------------- objects


def revised(body: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """The same TritonService with spec fields changed (a new revision when they shape the pods)."""
    out = copy.deepcopy(body)
    out["spec"].update(copy.deepcopy(spec))
    return out


def revision_of(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["labels"][REVISION_LABEL])


def route(kind: str, name: str, namespace: str, service: str) -> dict[str, Any]:
    """A user's route: a parentRef to a Gateway (no controller needed) and one rule to `<svc>-stable`."""
    port = 8000 if kind == "HTTPRoute" else 8001
    rule: dict[str, Any] = {"backendRefs": [{"name": f"{service}-stable", "port": port}]}
    if kind == "HTTPRoute":
        rule["matches"] = [{"path": {"type": "PathPrefix", "value": "/v2"}}]
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"parentRefs": [{"name": "inference-gateway"}], "rules": [rule]},
    }


def create_route(kube: Client, body: dict[str, Any]) -> None:
    resource = HTTPROUTE if body["kind"] == "HTTPRoute" else GRPCROUTE
    kube.create(resource.from_dict(body))


# ----------------------------------------------------------------- kubectl triton


# ----------------------------------------------------------------- observing a rollout


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in status.get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return {}


@dataclass
class Snap:
    """One look at a TritonService and everything it owns."""

    ts: dict[str, Any]
    deployments: dict[str, dict[str, Any]]
    pods: dict[str, list[dict[str, Any]]]
    routes: dict[str, dict[str, Any]]
    at: float

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.ts.get("status") or {})

    def cond(self, kind: str) -> tuple[str | None, str | None]:
        c = condition(self.status, kind)
        return c.get("status"), c.get("reason")

    def message(self, kind: str) -> str:
        return str(condition(self.status, kind).get("message", ""))

    def replicas(self, revision: str) -> int | None:
        dep = self.deployments.get(revision)
        return None if dep is None else int(dep["spec"]["replicas"])

    def ready(self, revision: str) -> int:
        dep = self.deployments.get(revision) or {}
        return int((dep.get("status") or {}).get("readyReplicas") or 0)

    def settled(self, revision: str, replicas: int) -> bool:
        """The revision's Deployment asks for and has ``replicas`` Ready pods, and no others."""
        dep = self.deployments.get(revision)
        if dep is None:
            return replicas == 0
        status = dep.get("status") or {}
        return (
            dep["spec"]["replicas"] == replicas
            and int(status.get("readyReplicas") or 0) == replicas
            and int(status.get("replicas") or 0) == replicas
            and len(self.pods.get(revision, [])) == replicas
        )

    def observed(self) -> bool:
        return bool(self.status.get("observedGeneration") == self.ts["metadata"]["generation"])

    def weights(self, kind: str) -> list[tuple[str, int]]:
        """(service, weight) of the route's weighted rule (the one that is not an A/B rule)."""
        rules = self.routes[kind]["spec"]["rules"]
        return [(r["name"], int(r.get("weight", 1))) for r in rules[-1]["backendRefs"]]


Check = Callable[[Snap], None]


@dataclass
class Trail:
    """Polls a TritonService's world, runs every invariant on every snapshot, waits for states."""

    kube: Client
    namespace: str
    name: str
    routes: dict[str, str] = field(default_factory=dict)
    invariants: list[Check] = field(default_factory=list)
    snaps: int = 0

    def snap(self) -> Snap:
        # Deployments and pods first, the TritonService last: the operator writes its status before
        # it scales other revisions, so a scale-down seen here comes with the status that made it.
        labels: dict[str, Any] = {SERVICE_LABEL: self.name}
        found = self.kube.list(Deployment, namespace=self.namespace, labels=labels)
        deployments = {revision_of(d): d for d in map(as_dict, found)}
        pods: dict[str, list[dict[str, Any]]] = {}
        for p in map(as_dict, self.kube.list(Pod, namespace=self.namespace, labels=labels)):
            pods.setdefault(revision_of(p), []).append(p)
        ts = as_dict(self.kube.get(TS, self.name, namespace=self.namespace))
        routes = {}
        for kind, route_name in self.routes.items():
            resource = HTTPROUTE if kind == "HTTPRoute" else GRPCROUTE
            routes[kind] = as_dict(self.kube.get(resource, route_name, namespace=self.namespace))
        snap = Snap(ts=ts, deployments=deployments, pods=pods, routes=routes, at=time.monotonic())
        for check in self.invariants:
            check(snap)
        self.snaps += 1
        return snap

    def until(self, probe: Callable[[Snap], bool], what: str, timeout: float = 60) -> Snap:
        deadline = time.monotonic() + timeout
        last = None
        while True:
            last = self.snap()
            if probe(last):
                return last
            if time.monotonic() > deadline:
                pytest.fail(
                    f"timed out after {timeout:.0f}s waiting for {what}; last status: {last.status}; "
                    f"deployments: { {r: (self.replicas_of(last, r)) for r in last.deployments} }"
                )
            time.sleep(0.1)

    @staticmethod
    def replicas_of(snap: Snap, revision: str) -> tuple[int | None, int]:
        return snap.replicas(revision), snap.ready(revision)

    def hold(self, seconds: float) -> Snap:
        """Keep checking the invariants for a while (nothing may break while the rollout rests)."""
        deadline = time.monotonic() + seconds
        snap = self.snap()
        while time.monotonic() < deadline:
            time.sleep(0.2)
            snap = self.snap()
        return snap

    def steady(self, revision: str | None = None, replicas: int | None = None) -> Snap:
        """Wait until the TritonService is Ready with no rollout in progress."""

        def done(s: Snap) -> bool:
            st = s.status
            return (
                s.observed()
                and s.cond("Ready") == ("True", "Available")
                and s.cond("Progressing") == ("False", "RolloutCompleted")
                and not st.get("canaryRevision")
                and (revision is None or st.get("stableRevision") == revision)
                and (replicas is None or s.settled(st["stableRevision"], replicas))
            )

        return self.until(done, f"{self.name} steady at {revision or 'its revision'}")

    def at_step(self, index: int, reason: str = "StepPaused", settled: bool = True) -> Snap:
        """Wait for the canary to rest at step ``index`` with Progressing ``reason``."""

        def there(s: Snap) -> bool:
            st = s.status
            canary = st.get("canaryRevision")
            return (
                s.observed()
                and bool(canary)
                and st.get("currentStepIndex") == index
                and not st.get("promoting")
                and s.cond("Progressing")[1] == reason
                and (not settled or at_rest(s, str(canary)))
            )

        def at_rest(s: Snap, canary: str) -> bool:
            # The operator writes the status before it creates or scales Deployments, and a snapshot
            # reads the Deployments before the status: a canary whose Deployment is not listed yet
            # is not at rest, it is about to be created.
            replicas = s.replicas(canary)
            return replicas is not None and s.settled(canary, replicas)

        return self.until(there, f"{self.name} at step {index} ({reason})")


def stable_untouched(revision: str, replicas: int, resource_version: str, generation: int) -> Check:
    """Until the promotion the stable revision's Deployment is as it was: resourceVersion, replicas."""

    def check(s: Snap) -> None:
        if s.status.get("stableRevision") != revision or s.status.get("promoting"):
            return  # promoted (or promoting: the flip scales the old stable down in one go)
        dep = s.deployments.get(revision)
        assert dep is not None, f"the stable Deployment of {revision} is gone"
        assert dep["spec"]["replicas"] == replicas, f"stable {revision} scaled to {dep['spec']['replicas']}"
        assert dep["metadata"]["generation"] == generation, "the stable Deployment's spec was changed"
        assert dep["metadata"]["resourceVersion"] == resource_version, "the stable Deployment was written"
        assert len(s.pods.get(revision, [])) == replicas, "a stable pod went away"

    return check


def untouched(snap: Snap, revision: str) -> Check:
    dep = snap.deployments[revision]
    return stable_untouched(
        revision,
        int(dep["spec"]["replicas"]),
        dep["metadata"]["resourceVersion"],
        int(dep["metadata"]["generation"]),
    )


def event_time(kube: Client, namespace: str, name: str, reason: str, contains: str = "") -> datetime:
    """When the operator posted the (only) Event with ``reason`` whose message has ``contains``."""
    deadline = time.monotonic() + 10
    while True:
        found = [
            e
            for e in kube.list(Event, namespace=namespace)
            if e.involvedObject.name == name and e.reason == reason and contains in str(e.message)
        ]
        if found or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(found) == 1, [e.message for e in found]
    moment = found[0].lastTimestamp
    assert isinstance(moment, datetime)
    return moment


def eventually(probe: Callable[[], Any], expected: Any, timeout: float = 10) -> None:
    """``probe()`` comes to equal ``expected`` (Events are posted just after the status is written)."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got == expected or time.monotonic() > deadline:
            assert got == expected
            return
        time.sleep(0.1)


def reasons(kube: Client, namespace: str, name: str) -> list[str]:
    """The reasons of the operator's Events about the rollout, oldest first: RevisionServed (a
    revision's first Ready pod's start, posted whenever kwok makes it Ready) is about pods, left out."""
    return [reason for _, reason, _ in events(kube, namespace, name) if reason != "RevisionServed"]


def step_events(kube: Client, namespace: str, name: str) -> list[str]:
    """'step i/n (...)' of every StepCompleted Event, oldest first."""
    out = []
    for _, reason, message in events(kube, namespace, name):
        if reason == "StepCompleted":
            out.append(message.split(": ", 1)[1].split(" completed")[0])
    return out


def start(
    kube: Client, namespace: str, body: dict[str, Any], replicas: int, **routes: str
) -> tuple[Trail, Snap]:
    apply(kube, body)
    trail = Trail(kube, namespace, body["metadata"]["name"], routes=dict(routes))
    first = trail.steady(replicas=replicas)
    return trail, first


# ----------------------------------------------------------------- (a) canary 10 -> pause{} -> 50 -> 100


def test_canary_steps_wait_for_ready_pods_and_promote(
    kube: Client, namespace: str, operator: Any, cluster: Path
) -> None:
    steps = [{"setWeight": 10}, {"pause": {}}, {"setWeight": 50}, {"pause": {"durationSeconds": 2}}]
    body = tritonservice("canary", namespace, replicas=4, rollout={"steps": steps})
    trail, first = start(kube, namespace, body, replicas=4)
    a = first.status["stableRevision"]
    assert first.cond("Degraded") == ("False", "AsExpected")
    assert reasons(kube, namespace, "canary") == []  # the first revision replaces nothing: no Event

    apply(kube, revised(body, serverArgs=["--log-verbose=1"]))
    trail.invariants.append(untouched(first, a))

    # step 0 (setWeight 10) completes once ceil(4 * 10%) = 1 canary pod is Ready; pause{} holds
    s = trail.at_step(1)
    b = s.status["canaryRevision"]
    assert b != a
    assert (s.status["stableRevision"], s.status["canaryWeight"]) == (a, 10)
    assert s.settled(b, 1) and s.settled(a, 4)
    assert s.cond("Progressing") == ("False", "StepPaused")
    assert "paused until promoted" in s.message("Progressing")
    assert s.cond("Degraded") == ("False", "AsExpected")
    assert s.cond("Ready") == ("False", "RolloutInProgress")
    eventually(lambda: step_events(kube, namespace, "canary"), ["step 0/4 (setWeight 10)"])

    # an indefinite pause holds, however long
    s = trail.hold(2.5)
    assert (s.status["currentStepIndex"], s.status["canaryWeight"]) == (1, 10)

    # `kubectl triton get` and `status` show the rollout where it is
    table = kubectl_triton(cluster, "get", "-n", namespace)
    row = next(line.split() for line in table.splitlines() if line.startswith("canary "))
    assert row[1:6] == ["4/4", a, b, "10%", "1/4"], table
    text = kubectl_triton(cluster, "status", "canary", "-n", namespace)
    assert f"Stable:    {a}" in text and f"Canary:    {b} (weight 10%)" in text, text
    assert "->  1  pause (until promoted)" in text and "current" in text, text
    assert "StepPaused" in text

    out = kubectl_triton(cluster, "promote", "canary", "-n", namespace)
    assert f"tritonservice {namespace}/canary: promote requested" in out

    # step 2 (setWeight 50): 2 canary pods Ready, then the 2 s pause of step 3
    s = trail.at_step(3)
    assert (s.status["stableRevision"], s.status["canaryRevision"], s.status["canaryWeight"]) == (a, b, 50)
    assert s.settled(b, 2) and s.settled(a, 4)
    assert s.cond("Progressing") == ("True", "StepPaused")
    assert "paused until" in s.message("Progressing")

    # the pause ends on time (a timer, not a poll), the canary goes to full replicas, then the flip
    done = trail.steady(b, replicas=4)
    # by the operator's own clock (whole seconds): the pause ended when due, not at some later poll
    paused = event_time(kube, namespace, "canary", "StepCompleted", "step 2/4")
    ended = event_time(kube, namespace, "canary", "StepCompleted", "step 3/4")
    assert 2 <= (ended - paused).total_seconds() <= 3, (paused, ended)
    trail.invariants.clear()  # the old stable is scaled down now
    done = trail.until(lambda s: s.settled(a, 0), f"the pods of {a} to go")
    status = done.status
    assert status["stableRevision"] == b
    for gone in ("canaryRevision", "canaryWeight", "currentStepIndex", "promoting", "waitingSince"):
        assert gone not in status, gone
    assert [h["revision"] for h in status["history"]] == [a]
    assert done.replicas(a) == 0
    assert {
        as_dict(c)["metadata"]["name"]
        for c in kube.list(ConfigMap, namespace=namespace, labels={SERVICE_LABEL: "canary"})
    } == {
        f"canary-{a}",
        f"canary-{b}",
    }
    assert done.cond("Ready") == ("True", "Available")
    assert done.cond("Degraded") == ("False", "AsExpected")

    # every step completed once, in order; one start, one promotion, one completion
    eventually(
        lambda: step_events(kube, namespace, "canary"),
        [
            "step 0/4 (setWeight 10)",
            "step 1/4 (pause (until promoted))",
            "step 2/4 (setWeight 50)",
            "step 3/4 (pause 2s)",
        ],
    )
    eventually(
        lambda: [r for r in reasons(kube, namespace, "canary") if r != "StepCompleted"],
        [
            "RolloutStarted",
            "RolloutPromoting",
            "RolloutCompleted",
        ],
    )
    promote_event = next(m for _, r, m in events(kube, namespace, "canary") if "step 1/4" in m)
    assert "by promote request" in promote_event


# ----------------------------------------------------------------- (b) automatic rollback


def test_canary_never_ready_rolls_back_at_the_progress_deadline(
    kube: Client, namespace: str, operator: Any, cluster: Path
) -> None:
    steps = [{"setWeight": 50}, {"pause": {}}]
    body = tritonservice("doomed", namespace, replicas=2, rollout={"steps": steps})
    trail, first = start(kube, namespace, body, replicas=2)
    a = first.status["stableRevision"]
    trail.invariants.append(untouched(first, a))

    bad = revised(
        body,
        podAnnotations={NEVER_READY: "true"},
        rollout={"steps": steps, "progressDeadlineSeconds": 5},
    )
    apply(kube, bad)
    began = time.monotonic()

    # waiting at step 0: one canary pod, not Ready; the stable revision serves untouched
    s = trail.until(
        lambda s: (
            s.observed()
            and bool(s.status.get("canaryRevision"))
            and len(s.pods.get(s.status["canaryRevision"], [])) == 1
        ),
        "the canary pod",
    )
    b = s.status["canaryRevision"]
    assert s.status["currentStepIndex"] == 0
    assert s.status.get("canaryWeight", 0) == 0  # no traffic share before its pods are Ready
    assert s.cond("Progressing") == ("True", "NewRevision")
    assert f"canary {b}: 0/1 Ready" in s.message("Progressing")
    assert s.cond("Degraded") == ("False", "AsExpected")

    # the deadline passes: rolled back by the operator's own timer, nothing else happens meanwhile
    s = trail.until(
        lambda s: s.cond("Degraded") == ("True", "ProgressDeadlineExceeded"), "the rollback", timeout=30
    )
    assert time.monotonic() - began < 30
    # by the operator's own clock (whole seconds): rolled back when the deadline passed
    started = event_time(kube, namespace, "doomed", "RolloutStarted")
    aborted = event_time(kube, namespace, "doomed", "RolloutAborted")
    assert 5 <= (aborted - started).total_seconds() <= 6, (started, aborted)
    message = s.message("Degraded")
    assert f"rollout of revision {b} aborted at step 0" in message, message
    assert "not fully Ready within 5s" in message and f"stable revision {a} serves" in message
    st = s.status
    assert (st["abortedRevision"], st["abortedReason"], st["abortedStepIndex"]) == (
        b,
        "ProgressDeadlineExceeded",
        0,
    )
    assert st["stableRevision"] == a and "canaryRevision" not in st
    assert s.cond("Progressing") == ("False", "RolloutAborted")
    assert s.cond("Ready") == ("False", "RolloutAborted")
    s = trail.until(lambda s: s.settled(b, 0), "the canary to be scaled to 0")
    assert s.replicas(b) == 0  # kept at 0 (held aborted), not retried

    eventually(
        lambda: [r for t, r, _ in events(kube, namespace, "doomed") if t == "Warning"], ["RolloutAborted"]
    )
    warnings = [(r, m) for t, r, m in events(kube, namespace, "doomed") if t == "Warning"]
    assert f"{b} aborted at step 0: canary not fully Ready within 5s" in warnings[0][1]

    # nothing is retried by itself: the aborted revision stays down, the stable untouched
    s = trail.hold(3)
    assert s.status["abortedRevision"] == b and s.replicas(b) == 0
    assert reasons(kube, namespace, "doomed").count("RolloutAborted") == 1
    assert "Degraded - ProgressDeadlineExceeded" in kubectl_triton(
        cluster, "status", "doomed", "-n", namespace
    )


def test_crash_looping_canary_rolls_back_before_the_deadline(
    kube: Client, namespace: str, operator: Any
) -> None:
    body = tritonservice(
        "crashy", namespace, replicas=2, rollout={"steps": [{"setWeight": 50}, {"pause": {}}]}
    )
    trail, first = start(kube, namespace, body, replicas=2)
    a = first.status["stableRevision"]
    trail.invariants.append(untouched(first, a))
    apply(kube, revised(body, podAnnotations={CRASH: "true"}))  # the default deadline: 600 s
    s = trail.until(
        lambda s: s.cond("Degraded") == ("True", "CanaryCrashLooping"), "the rollback", timeout=90
    )
    b = s.status["abortedRevision"]
    assert "canary pods are crash-looping" in s.message("Degraded")
    assert s.status["stableRevision"] == a
    s = trail.until(lambda s: s.settled(b, 0), "the canary to be scaled to 0")
    eventually(
        lambda: [r for t, r, _ in events(kube, namespace, "crashy") if t == "Warning"], ["RolloutAborted"]
    )


# ----------------------------------------------------------------- (c) abort, then retry


def test_pause_resume_abort_in_the_middle_then_retry(
    kube: Client, namespace: str, operator: Any, cluster: Path
) -> None:
    steps = [{"setWeight": 25}, {"pause": {}}, {"setWeight": 75}, {"pause": {}}]
    body = tritonservice("halted", namespace, replicas=4, rollout={"steps": steps})
    trail, first = start(kube, namespace, body, replicas=4)
    a = first.status["stableRevision"]
    trail.invariants.append(untouched(first, a))
    apply(kube, revised(body, serverArgs=["--log-verbose=1"]))

    s = trail.at_step(1)
    b = s.status["canaryRevision"]
    assert s.settled(b, 1) and s.status["canaryWeight"] == 25

    # pause and resume by request: the rollout holds, says so, and carries on where it was
    kubectl_triton(cluster, "pause", "halted", "-n", namespace)
    s = trail.at_step(1, reason="RolloutPaused")
    assert s.status["pausedByUser"] is True
    assert "pause request; kubectl triton resume" in s.message("Progressing")
    assert "Paused:    yes (kubectl triton pause)" in kubectl_triton(
        cluster, "status", "halted", "-n", namespace
    )
    kubectl_triton(cluster, "resume", "halted", "-n", namespace)
    s = trail.at_step(1)
    assert "pausedByUser" not in s.status and s.status["canaryWeight"] == 25
    kubectl_triton(cluster, "promote", "halted", "-n", namespace)
    s = trail.at_step(3)
    assert s.settled(b, 3) and s.status["canaryWeight"] == 75

    out = kubectl_triton(cluster, "abort", "halted", "-n", namespace)
    assert "abort requested" in out
    s = trail.until(lambda s: s.cond("Degraded") == ("True", "Aborted") and s.settled(b, 0), "the abort")
    assert s.status["abortedRevision"] == b and s.status["abortedStepIndex"] == 3
    assert "aborted at step 3: aborted by request" in s.message("Degraded")
    assert s.cond("Progressing") == ("False", "RolloutAborted")
    assert "canaryRevision" not in s.status
    assert s.status["handledRequests"].keys() == {"pause", "resume", "promote", "abort"}
    table = kubectl_triton(cluster, "get", "halted", "-n", namespace)
    assert f"{b} (aborted)" in table, table

    # retry: the same revision from step 0, the stable one still untouched
    kubectl_triton(cluster, "retry", "halted", "-n", namespace)
    s = trail.at_step(1)
    assert s.status["canaryRevision"] == b and s.settled(b, 1)
    assert s.cond("Degraded") == ("False", "AsExpected")
    assert "abortedRevision" not in s.status
    eventually(
        lambda: step_events(kube, namespace, "halted"),
        [
            "step 0/4 (setWeight 25)",
            "step 1/4 (pause (until promoted))",
            "step 2/4 (setWeight 75)",
            "step 0/4 (setWeight 25)",  # the retry starts over, once
        ],
    )
    eventually(
        lambda: [r for r in reasons(kube, namespace, "halted") if r != "StepCompleted"],
        [
            "RolloutStarted",
            "RolloutPaused",
            "RolloutResumed",
            "RolloutAborted",
            "RolloutRetried",
            "RolloutStarted",
        ],
    )


# ----------------------------------------------------------------- (d) operator restarts between steps


def test_operator_restart_resumes_at_the_same_step(
    kube: Client, namespace: str, operator: Any, cluster: Path
) -> None:
    steps = [{"setWeight": 25}, {"pause": {}}, {"setWeight": 50}, {"pause": {"durationSeconds": 3}}]
    body = tritonservice("sturdy", namespace, replicas=4, rollout={"steps": steps})
    trail, first = start(kube, namespace, body, replicas=4)
    a = first.status["stableRevision"]
    trail.invariants.append(untouched(first, a))
    apply(kube, revised(body, serverArgs=["--log-verbose=1"]))

    at_pause = trail.at_step(1)
    b = at_pause.status["canaryRevision"]
    before = ["step 0/4 (setWeight 25)"]
    eventually(lambda: step_events(kube, namespace, "sturdy"), before)

    # a crash (SIGKILL) at an indefinite pause, a new process: same step, same clocks, no new event
    assert operator.process is not None
    operator.process.kill()
    operator.process.wait(timeout=10)
    operator.start()
    s = trail.hold(3)
    for key in ("currentStepIndex", "canaryWeight", "stepStartedAt", "canaryStartedAt", "canaryRevision"):
        assert s.status.get(key) == at_pause.status.get(key), key
    assert condition(s.status, "Progressing") == condition(at_pause.status, "Progressing")
    assert step_events(kube, namespace, "sturdy") == before

    kubectl_triton(cluster, "promote", "sturdy", "-n", namespace)
    timed = trail.at_step(3)
    assert timed.settled(b, 2) and timed.status["canaryWeight"] == 50
    # The Event of step 2 is posted just after the status that records it: a kill in between would
    # lose it by design (an Event is lost rather than repeated), which is not what this test is about.
    eventually(
        lambda: step_events(kube, namespace, "sturdy"),
        [*before, "step 1/4 (pause (until promoted))", "step 2/4 (setWeight 50)"],
    )

    # killed during the 3 s pause and down past its end: the new process completes the step at
    # once (the pause's start is in the status) instead of pausing again
    operator.process.kill()
    operator.process.wait(timeout=10)
    time.sleep(4)
    s = trail.snap()
    assert s.status["currentStepIndex"] == 3 and s.status["stepStartedAt"] == timed.status["stepStartedAt"]
    restarted = time.monotonic()
    operator.start()
    done = trail.steady(b, replicas=4)
    assert done.at - restarted < 30
    eventually(
        lambda: step_events(kube, namespace, "sturdy"),
        [
            "step 0/4 (setWeight 25)",
            "step 1/4 (pause (until promoted))",
            "step 2/4 (setWeight 50)",
            "step 3/4 (pause 3s)",
        ],
    )
    eventually(
        lambda: [r for r in reasons(kube, namespace, "sturdy") if r != "StepCompleted"],
        [
            "RolloutStarted",
            "RolloutPromoting",
            "RolloutCompleted",
        ],
    )


# ----------------------------------------------------------------- (e) Gateway API weights


def gateway_spec(steps: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "steps": steps,
        "trafficRouting": {"gatewayAPI": {"httpRoute": "web", "grpcRoute": "rpc"}},
    }


def test_gateway_api_route_weights_follow_the_steps(
    kube: Client, namespace: str, operator: Any, cluster: Path
) -> None:
    create_route(kube, route("HTTPRoute", "web", namespace, "split"))
    create_route(kube, route("GRPCRoute", "rpc", namespace, "split"))
    steps: list[dict[str, Any]] = [{"setWeight": 20}, {"pause": {}}, {"setWeight": 60}, {"pause": {}}]
    body = tritonservice("split", namespace, replicas=4, rollout=gateway_spec(steps))
    trail, first = start(kube, namespace, body, replicas=4, HTTPRoute="web", GRPCRoute="rpc")
    a = first.status["stableRevision"]

    def services(s: Snap) -> dict[str, str]:
        out = {}
        for role in ("stable", "canary"):
            svc = as_dict(kube.get(Service, f"split-{role}", namespace=namespace))
            out[role] = svc["spec"]["selector"][REVISION_LABEL]
        return out

    def expect(s: Snap, stable: int, canary: int) -> None:
        assert s.weights("HTTPRoute") == [("split-stable", stable), ("split-canary", canary)]
        assert s.weights("GRPCRoute") == [("split-stable", stable), ("split-canary", canary)]
        http = s.routes["HTTPRoute"]["spec"]
        assert http["rules"][0]["matches"][0]["path"] == {"type": "PathPrefix", "value": "/v2"}
        assert [p["name"] for p in http["parentRefs"]] == ["inference-gateway"]  # the user's, kept
        assert [r["port"] for r in http["rules"][0]["backendRefs"]] == [8000, 8000]
        grpc_refs = s.routes["GRPCRoute"]["spec"]["rules"][0]["backendRefs"]
        assert [r["port"] for r in grpc_refs] == [8001, 8001]
        assert s.cond("TrafficRouted") == ("True", "WeightsSet")
        assert f"stable {stable}% / canary {canary}%" in s.message("TrafficRouted")

    # steady: everything to stable; the canary Service selects the stable revision too
    s = trail.until(
        lambda s: s.weights("HTTPRoute") == [("split-stable", 100), ("split-canary", 0)], "weights 100/0"
    )
    expect(s, 100, 0)
    assert services(s) == {"stable": a, "canary": a}

    apply(kube, revised(body, serverArgs=["--log-verbose=1"]))
    trail.invariants.append(untouched(first, a))
    s = trail.at_step(1)
    b = s.status["canaryRevision"]
    expect(s, 80, 20)
    assert services(s) == {"stable": a, "canary": b}
    assert s.settled(b, 1)

    kubectl_triton(cluster, "promote", "split", "-n", namespace)
    s = trail.at_step(3)
    expect(s, 40, 60)
    assert s.settled(b, 3)

    kubectl_triton(cluster, "promote", "split", "-n", namespace)
    s = trail.steady(b, replicas=4)
    trail.invariants.clear()
    expect(s, 100, 0)
    assert services(s) == {"stable": b, "canary": b}

    # a route that goes missing is named in a condition; the other one still gets its weights
    kube.delete(GRPCROUTE, "rpc", namespace=namespace)
    trail.routes.pop("GRPCRoute")
    apply(kube, revised(body, serverArgs=["--log-verbose=2"]))
    s = trail.until(lambda s: s.cond("TrafficRouted") == ("False", "RouteNotFound"), "TrafficRouted=False")
    assert f"GRPCRoute {namespace}/rpc does not exist" in s.message("TrafficRouted")
    assert f"weights set on HTTPRoute {namespace}/web" in s.message("TrafficRouted")
    assert s.routes["HTTPRoute"]["spec"]["rules"][-1]["backendRefs"][0]["name"] == "split-stable"


# ----------------------------------------------------------------- (f) A/B header route


def test_set_header_route_sends_matching_requests_to_the_canary(
    kube: Client, namespace: str, operator: Any, cluster: Path
) -> None:
    create_route(kube, route("HTTPRoute", "web", namespace, "ab"))
    create_route(kube, route("GRPCRoute", "rpc", namespace, "ab"))
    header = {"name": "beta", "match": [{"headerName": "x-canary", "headerValue": {"exact": "yes"}}]}
    steps: list[dict[str, Any]] = [{"setWeight": 10}, {"setHeaderRoute": header}, {"pause": {}}]
    body = tritonservice("ab", namespace, replicas=2, rollout=gateway_spec(steps))
    trail, first = start(kube, namespace, body, replicas=2, HTTPRoute="web", GRPCRoute="rpc")
    a = first.status["stableRevision"]
    assert len(first.routes["HTTPRoute"]["spec"]["rules"]) == 1

    apply(kube, revised(body, serverArgs=["--log-verbose=1"]))
    trail.invariants.append(untouched(first, a))
    s = trail.at_step(2)
    for kind in ("HTTPRoute", "GRPCRoute"):
        obj = s.routes[kind]
        rules = obj["spec"]["rules"]
        assert len(rules) == 2, rules
        ab = rules[0]
        assert [r["name"] for r in ab["backendRefs"]] == ["ab-canary"]
        for match in ab["matches"]:
            assert {"name": "x-canary", "type": "Exact", "value": "yes"} in match["headers"]
        if kind == "HTTPRoute":  # the user's own match is kept under the header
            assert ab["matches"][0]["path"] == {"type": "PathPrefix", "value": "/v2"}
        assert obj["metadata"]["annotations"][HEADER_RULES] == "1"
        assert s.weights(kind) == [("ab-stable", 90), ("ab-canary", 10)]
    assert "header route beta to the canary" in s.message("TrafficRouted")
    eventually(
        lambda: step_events(kube, namespace, "ab"),
        ["step 0/3 (setWeight 10)", "step 1/3 (setHeaderRoute beta)"],
    )

    kubectl_triton(cluster, "promote", "ab", "-n", namespace)
    b = s.status["canaryRevision"]
    s = trail.steady(b, replicas=2)
    trail.invariants.clear()
    s = trail.until(lambda s: len(s.routes["HTTPRoute"]["spec"]["rules"]) == 1, "the A/B rule to go")
    for kind in ("HTTPRoute", "GRPCRoute"):
        obj = s.routes[kind]
        assert len(obj["spec"]["rules"]) == 1
        assert HEADER_RULES not in (obj["metadata"].get("annotations") or {})
        assert s.weights(kind) == [("ab-stable", 100), ("ab-canary", 0)]


# ----------------------------------------------------------------- (g) BlueGreen and Recreate


def test_blue_green_runs_the_new_revision_in_full_beside_the_old_until_promoted(
    kube: Client, namespace: str, operator: Any, cluster: Path
) -> None:
    body = tritonservice(
        "bluegreen", namespace, replicas=2, rollout={"strategy": "BlueGreen", "steps": [{"pause": {}}]}
    )
    trail, first = start(kube, namespace, body, replicas=2)
    a = first.status["stableRevision"]
    trail.invariants.append(untouched(first, a))
    apply(kube, revised(body, serverArgs=["--log-verbose=1"]))

    s = trail.at_step(0)
    b = s.status["canaryRevision"]
    assert s.settled(b, 2) and s.settled(a, 2)  # green at full size beside blue
    assert s.status["canaryWeight"] == 0
    assert s.cond("Progressing") == ("False", "StepPaused")
    assert "Strategy:  BlueGreen" in kubectl_triton(cluster, "status", "bluegreen", "-n", namespace)

    kubectl_triton(cluster, "promote", "bluegreen", "-n", namespace)
    s = trail.steady(b, replicas=2)
    trail.invariants.clear()
    s = trail.until(lambda s: s.settled(a, 0), f"the pods of {a} to go")
    assert [h["revision"] for h in s.status["history"]] == [a]


def test_recreate_stops_the_old_revision_before_the_new_one_starts(
    kube: Client, namespace: str, operator: Any
) -> None:
    body = tritonservice("recreate", namespace, replicas=2, rollout={"strategy": "Recreate"})
    trail, first = start(kube, namespace, body, replicas=2)
    a = first.status["stableRevision"]

    def never_both(s: Snap) -> None:
        revisions = [r for r, pods in s.pods.items() if pods]
        assert len(revisions) <= 1, f"pods of {revisions} run at once"

    trail.invariants.append(never_both)
    apply(kube, revised(body, serverArgs=["--log-verbose=1"]))
    s = trail.until(lambda s: s.status.get("promoting") is True, "the Recreate rollout")
    b = s.status["canaryRevision"]
    assert s.cond("Progressing")[1] == "Promoting"
    # the old revision goes to 0 first; the new one is created at 0 and grows once those pods are gone
    s = trail.until(lambda s: s.replicas(a) == 0, f"{a} scaled to 0")
    assert s.replicas(b) == 0 or not s.pods.get(a)
    s = trail.steady(b, replicas=2)
    assert s.replicas(a) == 0 and [h["revision"] for h in s.status["history"]] == [a]
    eventually(lambda: reasons(kube, namespace, "recreate")[-1], "RolloutCompleted")


# ----------------------------------------------------------------- GPU budget


def test_gpu_budget_is_never_exceeded(kube: Client, namespace: str, operator: Any, cluster: Path) -> None:
    rollout = {"steps": [{"setWeight": 50}, {"pause": {}}], "gpuBudget": 4}
    body = tritonservice("budget", namespace, replicas=3, resources={"gpus": 1}, rollout=rollout)
    trail, first = start(kube, namespace, body, replicas=3)
    a = first.status["stableRevision"]
    most: list[int] = []

    def within_budget(s: Snap) -> None:
        gpus = sum(
            # The model agent beside tritonserver (every pod of the one shape) asks for no GPU.
            int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
            for pods in s.pods.values()
            for p in pods
            for c in p["spec"]["containers"]
        )
        most.append(gpus)
        assert gpus <= 4, f"{gpus} GPUs held by pods with a budget of 4"

    trail.invariants.append(within_budget)
    apply(kube, revised(body, serverArgs=["--log-verbose=1"]))
    # 3 + ceil(3 * 50%) = 5 pods do not fit 4 GPUs: stable goes to 2 first, the canary grows to 2
    s = trail.at_step(1)
    b = s.status["canaryRevision"]
    assert s.settled(a, 2) and s.settled(b, 2)
    kubectl_triton(cluster, "promote", "budget", "-n", namespace)
    s = trail.steady(b, replicas=3)
    s = trail.until(lambda s: s.settled(a, 0), f"the pods of {a} to go")
    assert max(most) == 4  # the budget was used, never exceeded


# ----------------------------------------------------------------- (h) undo and a GitOps revert


def test_undo_and_gitops_revert_restore_the_exact_earlier_revision(
    kube: Client, namespace: str, operator: Any, cluster: Path
) -> None:
    steps = [{"setWeight": 50}, {"pause": {}}]
    body = tritonservice("undo", namespace, replicas=2, rollout={"steps": steps})
    trail, first = start(kube, namespace, body, replicas=2)
    a = first.status["stableRevision"]
    cm_a = kube.get(ConfigMap, f"undo-{a}", namespace=namespace).to_dict()

    new_body = revised(body, models=[{"name": "add", "config": {**PYTHON_MODEL, "maxBatchSize": 4}}])
    apply(kube, new_body)
    s = trail.at_step(1)
    b = s.status["canaryRevision"]
    kubectl_triton(cluster, "promote", "undo", "-n", namespace)
    s = trail.steady(b, replicas=2)
    assert [h["revision"] for h in s.status["history"]] == [a]
    assert (
        "max_batch_size: 4"
        in as_dict(kube.get(ConfigMap, f"undo-{b}", namespace=namespace))["data"]["add.config.pbtxt"]
    )

    # kubectl triton undo: back to a, exactly: no steps, the same ConfigMap, never rewritten
    stepped = ["step 0/2 (setWeight 50)", "step 1/2 (pause (until promoted))"]
    eventually(lambda: step_events(kube, namespace, "undo"), stepped)
    out = kubectl_triton(cluster, "undo", "undo", "--to-revision", a, "-n", namespace)
    assert f"undo to {a} requested" in out
    s = trail.steady(a, replicas=2)
    assert (s.status["pinnedRevision"], s.status["pinnedFor"]) == (a, b)
    assert [h["revision"] for h in s.status["history"]] == [b]
    cm_now = kube.get(ConfigMap, f"undo-{a}", namespace=namespace).to_dict()
    assert cm_now["data"] == cm_a["data"]
    assert cm_now["metadata"]["resourceVersion"] == cm_a["metadata"]["resourceVersion"]
    assert "max_batch_size: 8" in cm_now["data"]["add.config.pbtxt"]
    text = kubectl_triton(cluster, "status", "undo", "-n", namespace)
    assert f"Undo:      serving {a} while the spec still asks for {b}" in text, text
    eventually(lambda: reasons(kube, namespace, "undo").count("RolloutRollback"), 1)

    # retry rolls the spec forward again: b is in history, so it comes back without steps
    kubectl_triton(cluster, "retry", "undo", "-n", namespace)
    s = trail.steady(b, replicas=2)
    assert "pinnedRevision" not in s.status

    # a GitOps revert of the spec: its hash is a's again, recognised as the history revision
    eventually(lambda: reasons(kube, namespace, "undo").count("RolloutRollback"), 2)  # undo, retry
    apply(kube, body)
    s = trail.until(
        lambda s: s.status.get("canaryRevision") == a or s.status.get("stableRevision") == a, "the revert"
    )
    assert s.status.get("currentStepIndex", len(steps)) == len(steps)  # no canary steps
    s = trail.steady(a, replicas=2)
    eventually(lambda: reasons(kube, namespace, "undo").count("RolloutRollback"), 3)
    assert kube.get(ConfigMap, f"undo-{a}", namespace=namespace).data == cm_a["data"]
    assert [h["revision"] for h in s.status["history"]] == [b]
    assert step_events(kube, namespace, "undo") == stepped  # undo, retry and revert took no step


# ----------------------------------------------------------------- kubectl triton without a rollout


def test_kubectl_triton_get_lists_and_reports_errors(
    kube: Client, namespace: str, operator: Any, cluster: Path
) -> None:
    trail, first = start(kube, namespace, tritonservice("plain", namespace, replicas=1), replicas=1)
    rev = first.status["stableRevision"]
    table = kubectl_triton(cluster, "get", "-A")
    row = next(line.split() for line in table.splitlines() if line.startswith(f"{namespace} "))
    assert row[:6] == [namespace, "plain", "1/1", rev, "-", "-"], table
    text = kubectl_triton(cluster, "status", "plain", "-n", namespace)
    assert text.startswith("Name:      plain\n") and "Status:    Healthy" in text, text
    assert "Steps:     none" in text
    # a promote with no rollout in progress is recorded, and skips nothing of the next rollout
    kubectl_triton(cluster, "promote", "plain", "-n", namespace)
    s = trail.until(
        lambda s: "promote" in (s.status.get("handledRequests") or {}), "the request to be handled"
    )
    assert s.cond("Progressing") == ("False", "RolloutCompleted")
    proc = subprocess.run(
        [sys.executable, "-m", "triton_operator.kubectl_plugin", "status", "missing", "-n", namespace],
        env={**os.environ, "KUBECONFIG": str(cluster)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert "missing" in proc.stderr


# ----------------------------------------------------------------- operator upgrades


def test_an_operator_upgrade_starts_no_rollout_and_keeps_an_undo(
    kube: Client, namespace: str, operator: Any, cluster: Path
) -> None:
    """A new sync image (what `helm upgrade` to a new operator version sets) makes no new revision:
    no canary, no pod restarted, an `undo` pin kept; the next spec change gets the new image."""
    steps = [{"setWeight": 50}, {"pause": {}}]
    body = tritonservice("upgraded", namespace, replicas=2, rollout={"steps": steps})
    trail, first = start(kube, namespace, body, replicas=2)
    a = first.status["stableRevision"]
    apply(kube, revised(body, serverArgs=["--log-verbose=1"]))
    trail.at_step(1)
    kubectl_triton(cluster, "promote", "upgraded", "-n", namespace)
    b = trail.steady(replicas=2).status["stableRevision"]
    kubectl_triton(cluster, "undo", "upgraded", "-n", namespace)  # back to a, pinned by the undo
    s = trail.steady(a, replicas=2)
    trail.invariants.append(untouched(s, a))

    operator.stop()
    operator.env["TRITON_OPERATOR_SYNC_IMAGE"] = "reg.local/triton-operator:next"
    operator.env["TRITON_OPERATOR_SYNC_IMAGE_PULL_POLICY"] = "Always"
    operator.start()
    s = trail.hold(5)
    assert s.status["stableRevision"] == a and not s.status.get("canaryRevision")
    assert set(s.deployments) == {a, b}

    # the next change of the spec is a new revision with the new sync image
    apply(kube, revised(body, serverArgs=["--log-verbose=2"]))
    trail.invariants.clear()
    s = trail.at_step(1)
    c = s.status["canaryRevision"]
    init = fetcher(s.deployments[c]["spec"]["template"]["spec"])
    assert (init["image"], init["imagePullPolicy"]) == ("reg.local/triton-operator:next", "Always")
    old_init = fetcher(s.deployments[a]["spec"]["template"]["spec"])
    assert old_init["image"] != "reg.local/triton-operator:next"


def test_an_unschedulable_canary_rolls_back_after_the_spec_grace(
    kube: Client, namespace: str, operator: Any
) -> None:
    """A canary asking for more GPUs than any node has stays Pending; after
    rollout.unschedulableGraceSeconds (not a hard-coded time) it is rolled back."""
    rollout = {"steps": [{"setWeight": 50}, {"pause": {}}], "unschedulableGraceSeconds": 4}
    body = tritonservice("pending", namespace, replicas=2, rollout=rollout)
    trail, first = start(kube, namespace, body, replicas=2)
    a = first.status["stableRevision"]
    trail.invariants.append(untouched(first, a))
    apply(kube, revised(body, resources={"gpus": 8}))
    began = time.monotonic()
    s = trail.until(
        lambda s: s.cond("Degraded") == ("True", "CanaryUnschedulable"), "the rollback", timeout=60
    )
    assert 3 <= time.monotonic() - began < 30  # condition times are whole seconds
    assert "unschedulable for more than 4s" in s.message("Degraded")
    assert s.status["stableRevision"] == a
    b = s.status["abortedRevision"]
    trail.until(lambda s: s.settled(b, 0), "the canary to be scaled to 0")


# ----------------------------------------------------------------- an invalid spec mid-rollout


def invalid(body: dict[str, Any]) -> dict[str, Any]:
    """Admitted by the CRD, refused by the operator (an ensemble step names a missing model)."""
    out = copy.deepcopy(body)
    out["spec"]["models"].append(copy.deepcopy(ENSEMBLE_OF_A_MISSING_MODEL))
    return out


@dataclass
class Broken:
    """A canary resting at step 1 of a valid spec when a broken spec is pushed over it."""

    trail: Trail
    body: dict[str, Any]
    stable: str
    canary: str
    snap: Snap


def break_mid_rollout(kube: Client, namespace: str, name: str, steps: list[dict[str, Any]]) -> Broken:
    """Deploy, roll a new revision to step 1, push an invalid spec, wait for Ready=False/InvalidSpec."""
    body = tritonservice(name, namespace, replicas=2, rollout={"steps": steps})
    trail, first = start(kube, namespace, body, replicas=2)
    stable = first.status["stableRevision"]
    trail.invariants.append(untouched(first, stable))
    good = revised(body, serverArgs=["--log-verbose=1"])
    apply(kube, good)
    canary = trail.at_step(1).status["canaryRevision"]
    apply(kube, invalid(good))
    snap = trail.until(lambda s: s.cond("Ready")[1] == "InvalidSpec", "InvalidSpec")
    return Broken(trail, body, stable, canary, snap)


def test_an_invalid_spec_mid_rollout_keeps_the_deadline_and_timed_steps(
    kube: Client, namespace: str, operator: Any
) -> None:
    steps: list[dict[str, Any]] = [
        {"setWeight": 50},
        {"pause": {"durationSeconds": 8}},
        {"setWeight": 100},
        {"pause": {}},
    ]
    # a canary in a timed pause, then a broken spec: the timed step still completes
    broken = break_mid_rollout(kube, namespace, "steadfast", steps)
    trail, body, a, b, s = broken.trail, broken.body, broken.stable, broken.canary, broken.snap
    assert "spec.models[1].config.ensembleScheduling" in s.message("Ready")
    assert s.status["currentStepIndex"] == 1, "the pause ended before the spec broke: nothing tested"
    s = trail.at_step(3)  # the 8 s pause ran out under the last valid spec
    assert s.status["canaryRevision"] == b and s.settled(b, 2)
    assert s.cond("Ready")[1] == "InvalidSpec"

    # a never-Ready canary with a 5 s deadline, then a broken spec: still rolled back in time
    doomed = revised(
        body,
        podAnnotations={NEVER_READY: "true"},
        rollout={"steps": steps, "progressDeadlineSeconds": 5},
    )
    apply(kube, doomed)
    s = trail.until(
        lambda s: s.observed() and s.status.get("canaryRevision") not in (None, b), "the doomed canary"
    )
    c = s.status["canaryRevision"]
    apply(kube, invalid(doomed))
    s = trail.until(lambda s: s.cond("Ready")[1] == "InvalidSpec", "InvalidSpec")
    assert "abortedRevision" not in s.status, "aborted before the spec broke: nothing tested"
    s = trail.until(
        lambda s: s.cond("Degraded") == ("True", "ProgressDeadlineExceeded"), "the rollback", timeout=30
    )
    assert s.status["abortedRevision"] == c and s.status["stableRevision"] == a
    assert s.cond("Ready")[1] == "InvalidSpec"  # the spec still says why it is not applied
    s = trail.until(lambda s: s.settled(c, 0), "the canary to be scaled to 0")
    assert s.replicas(a) == 2


def test_an_abort_request_works_while_the_spec_is_invalid(
    kube: Client, namespace: str, operator: Any, cluster: Path
) -> None:
    broken = break_mid_rollout(kube, namespace, "abortable", [{"setWeight": 50}, {"pause": {}}])
    trail, body, a, b = broken.trail, broken.body, broken.stable, broken.canary

    assert "abort requested" in kubectl_triton(cluster, "abort", "abortable", "-n", namespace)
    s = trail.until(lambda s: s.cond("Degraded") == ("True", "Aborted") and s.settled(b, 0), "the abort")
    assert s.status["abortedRevision"] == b and "canaryRevision" not in s.status
    assert s.cond("Ready")[1] == "InvalidSpec"

    # fixing the spec applies it: the aborted revision is left alone, a new one rolls out
    apply(kube, revised(body, serverArgs=["--log-verbose=2"]))
    s = trail.at_step(1)
    assert s.status["canaryRevision"] not in (a, b)
    assert s.cond("Ready")[1] == "RolloutInProgress"


# ----------------------------------------------------------------- a stable revision gone missing


def test_a_deleted_stable_deployment_mid_canary_is_replaced_and_reported(
    kube: Client, namespace: str, operator: Any
) -> None:
    steps = [{"setWeight": 50}, {"pause": {}}]
    body = tritonservice("orphaned", namespace, replicas=2, rollout={"steps": steps})
    trail, first = start(kube, namespace, body, replicas=2)
    a = first.status["stableRevision"]
    apply(kube, revised(body, serverArgs=["--log-verbose=1"]))
    s = trail.at_step(1)
    b = s.status["canaryRevision"]

    kube.delete(Deployment, f"orphaned-{a}", namespace=namespace)
    s = trail.until(lambda s: s.status.get("stableRevision") == b, "the canary to take the stable's place")
    assert "canaryRevision" not in s.status
    s = trail.until(lambda s: s.settled(b, 2) and s.cond("Ready") == ("True", "Available"), "b at 2 Ready")
    assert s.cond("Degraded") == ("False", "AsExpected")
    assert a not in s.deployments
    warnings = [(r, m) for t, r, m in events(kube, namespace, "orphaned") if t == "Warning"]
    assert any(
        r == "StableRevisionMissing" and f"stable revision {a} has no Deployment" in m for r, m in warnings
    )
