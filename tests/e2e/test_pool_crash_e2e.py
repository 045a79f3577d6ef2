"""A pool pod's tritonserver crashing on the real node (SIGKILL, as an OOM kill or a segfault ends it),
once and then in a loop, with clients counting every answer (the pool of test_pool_e2e.py: six models,
two copies each, three pods).

The pool first completes an in-place update of m0 (its entries then name the served revision, not the
pod's own), then on a pod holding m0:
(a) its tritonserver killed once: the pod leaves its models' endpoints (its readiness fails while
    tritonserver is down), the kubelet restarts tritonserver, the pod's agent loads its assignment
    again (m0 at its updated version) and the pod serves its models again, READY and labelled, without
    anyone deleting anything; no request through a model's Service (raw HTTP) fails once the pod's
    address is out of kube-proxy's rules (every model here has another copy), and none through the
    pooled TritonClient (gRPC) fails at all: it sends again what the dead pod's address refused (and
    asks again once the one its crash cut);
(b) killed twice more (a crash loop, the kubelet backing off): as soon as the new tritonserver runs,
    then while the agent loads its models back into the next one: the operator keeps the placement (no
    model moved off and back), the load tritonserver died under is no failed load (no PoolLoadFailed),
    the pod serves its models again once tritonserver stays up, and no request through a Service fails
    outside the moments between each kill and the pod's address leaving kube-proxy's rules, none
    through the TritonClient at all.

Needs the real node of e2e/cluster.py and the images built from this tree (e2e/images.py); without them
every test here skips, saying why.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Pod
from test_pool_e2e import (  # type: ignore[import-not-found,unused-ignore]
    KEY,
    NAME,
    OFFSETS,
    PoolLoad,
    bucket,  # noqa: F401  (the fixture)
    describe,
    held,
    loaded,
    placed,
    pool_pods,
    pooled,
    settled,
    versioned_source,
    wait_settled,
)

from e2e_helpers import apply, events, get_ts
from inference import infer_add_sub, offset_of
from real_pods import proxied_to
from testkit import wait_for

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.operator_env(TRITON_OPERATOR_PIN_REPOSITORIES="true"),
]

M0 = "m0"


def in_place(namespace: str, bucket_name: str, store: Any, extra: float) -> dict[str, Any]:
    """The pool of test_pool_e2e.pooled in place (no steps), m0 adding ``extra`` to its offset."""
    body: dict[str, Any] = pooled(namespace, bucket_name, store, in_place=True)
    (m0,) = [m for m in body["spec"]["models"] if m["name"] == M0]
    if extra:
        m0["config"]["parameters"] = {"offset": {"stringValue": f"{extra:g}"}}
    return body


@pytest.fixture
def crash_load(kube: Client, namespace: str, operator: Any, store: Any, bucket: str) -> Iterator[PoolLoad]:  # noqa: F811
    store.extra["s3"].put_object(Bucket=bucket, Key=KEY.format(model=M0), Body=versioned_source())
    apply(kube, in_place(namespace, bucket, store, 0))
    yield from loaded(kube, namespace, store, bucket, copies=2)


def triton_container(kube: Client, namespace: str, pod: str) -> tuple[str, int, bool]:
    """The pod's tritonserver container: its containerd id, restart count and whether it runs."""
    got = kube.get(Pod, pod, namespace=namespace)
    assert got.status is not None
    for status in got.status.containerStatuses or []:
        if status.name == "tritonserver":
            cid = (status.containerID or "").rpartition("//")[2]
            return cid, int(status.restartCount or 0), bool(status.state and status.state.running)
    raise AssertionError(f"{pod}: no tritonserver container")


def host_pid(container: str) -> int | None:
    """The host pid of the tritonserver process of containerd container ``container`` (None: none)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            if comm == "tritonserver" and container in Path(f"/proc/{pid}/cgroup").read_text():
                return int(pid)
        except OSError:
            continue
    return None


def kill_triton(kube: Client, namespace: str, pod: str) -> int:
    """SIGKILL to the pod's tritonserver (from the host: in its container it is pid 1, which a signal
    from inside cannot kill); the restart count it had."""
    cid, restarts, _ = triton_container(kube, namespace, pod)
    pid = wait_for(lambda: host_pid(cid), timeout=60, interval=0.2, what=f"{pod}'s tritonserver process")
    os.kill(pid, signal.SIGKILL)
    return restarts


def serves_again(kube: Client, namespace: str, pod: str, *, ip: str, holds: set[str], restarts: int) -> bool:
    """The pod's tritonserver restarted past ``restarts``, its agent reports ``holds`` READY, each
    answers on the pod, and the pod is Ready and labelled for each."""
    _, now, running = triton_container(kube, namespace, pod)
    if now <= restarts or not running:
        return False
    try:
        states = held(ip)
    except OSError:
        return False
    if {m for m, s in states.items() if s == "READY"} != holds:
        return False
    got = kube.get(Pod, pod, namespace=namespace)
    assert got.status is not None and got.metadata is not None
    ready = [c.status for c in got.status.conditions or [] if c.type == "Ready"]
    labels = got.metadata.labels or {}
    return ready == ["True"] and all(labels.get(f"model.triton-operator.io/{m}") == "ready" for m in holds)


def failures_between(load: PoolLoad, windows: list[tuple[float, float]]) -> tuple[list[Any], list[Any]]:
    """The load's failures inside any of ``windows`` (client seconds) and outside all of them."""
    inside = [f for f in load.failures if any(a <= f[0] <= b for a, b in windows)]
    outside = [f for f in load.failures if f not in inside]
    return inside, outside


def through_client(failures: list[Any]) -> list[Any]:
    """The failures of the pooled TritonClient's requests (the others went through a Service, raw HTTP)."""
    return [f for f in failures if f[1].startswith("TritonClient ")]


def per_window(load: PoolLoad, windows: list[tuple[float, float]]) -> str:
    """Each window's failures per path (Service, TritonClient) and their distinct errors, counted."""
    lines = []
    for i, (a, b) in enumerate(windows):
        inside = [f for f in load.failures if a <= f[0] <= b]
        by_path = Counter(f[1].split()[0] for f in inside)
        errors = Counter((f[1].split()[0], f[2][:200]) for f in inside)
        lines.append(f"window {i} ({a:.2f}-{b:.2f}s): {dict(by_path)}")
        lines.extend(f"    {n} x {path}: {error}" for (path, error), n in errors.most_common())
    return "\n".join(lines)


def test_a_pool_pods_tritonserver_crashing_and_crash_looping_is_served_through(
    kube: Client, namespace: str, operator: Any, crash_load: PoolLoad, cluster: Path
) -> None:
    load = crash_load
    base = OFFSETS[M0]
    # an in-place update of m0 completed: the pods' m0 entries name the served revision
    generation = apply(kube, in_place(namespace, load.bucket, load.store, 100))["metadata"]["generation"]

    def updated() -> dict[str, set[str]] | None:
        status = get_ts(kube, namespace, NAME).get("status") or {}
        if status.get("observedGeneration") != generation or (status.get("inPlace") or {}).get("next"):
            return None
        if not status.get("servedRevision") or status.get("servedRevision") == status.get("stableRevision"):
            return None
        where = settled(kube, namespace)
        if where is None:
            return None
        pods = {p.metadata.name: p.status.podIP for p in pool_pods(kube, namespace)}
        m0 = {offset_of(infer_add_sub(pods[n], model=M0)) for n in where[M0]}
        return where if m0 == {base + 100} else None

    where = wait_for(updated, timeout=240, interval=1, what="m0's update in place served")
    pods = {p.metadata.name: p.status.podIP for p in pool_pods(kube, namespace)}
    victim = sorted(where[M0])[0]
    ip = pods[victim]
    holds = {m for m, names in where.items() if victim in names}
    print(f"\nupdated; {victim} holds {sorted(holds)}: {load.summary()}")
    assert not load.failures, load.failures[:5]

    windows: list[tuple[float, float]] = []
    placements: list[dict[str, set[str]]] = [where]
    watching = True

    said: list[tuple[str, str, str]] = []
    """Each condition of the TritonService as it changed meanwhile (type, status, reason)."""

    def watch_placement() -> None:
        while watching:
            now = placed(kube, namespace)
            if now and now != placements[-1]:
                placements.append(now)
            for c in get_ts(kube, namespace, NAME).get("status", {}).get("conditions") or []:
                seen = (c["type"], c["status"], c.get("reason") or "")
                if seen not in said:
                    said.append(seen)
            time.sleep(0.5)

    watcher = threading.Thread(target=watch_placement, daemon=True)
    watcher.start()

    def crash() -> int:
        """Kill the victim's tritonserver; the window until its address left kube-proxy's rules."""
        started = time.monotonic() - load._t0
        restarts = kill_triton(kube, namespace, victim)
        wait_for(
            lambda: not proxied_to(ip), timeout=60, interval=0.1, what=f"{victim} out of kube-proxy's rules"
        )
        windows.append((started, time.monotonic() - load._t0 + 1))
        return restarts

    # (a) killed once
    killed_at = time.monotonic()
    restarts = crash()
    out_after = time.monotonic() - killed_at
    wait_for(
        lambda: serves_again(kube, namespace, victim, ip=ip, holds=holds, restarts=restarts),
        timeout=120,
        interval=0.5,
        what=f"{victim} serving {sorted(holds)} again after tritonserver's restart",
    )
    back_after = time.monotonic() - killed_at
    assert {offset_of(infer_add_sub(ip, model=M0)) for _ in range(3)} == {base + 100}
    for model in holds - {M0}:
        assert offset_of(infer_add_sub(ip, model=model)) == OFFSETS[model]
    assert wait_settled(kube, namespace, timeout=30) == where
    time.sleep(3)
    inside, outside = failures_between(load, windows)
    print(
        f"\n(a) killed once: out of kube-proxy's rules after {out_after:.1f}s, serving again after "
        f"{back_after:.1f}s; {load.summary()}; {len(inside)} failed inside the crash window: {inside[:3]}"
    )
    print("failures per crash window and path:\n" + per_window(load, windows))
    if outside or through_client(inside):
        print(describe(kube, namespace))
    assert not outside, outside[:5]
    assert not through_client(inside), through_client(inside)[:5]  # the TritonClient rode through

    # (b) a crash loop: killed again as soon as each new tritonserver runs, twice
    wait_for(
        lambda: triton_container(kube, namespace, victim)[2],
        timeout=120,
        interval=0.2,
        what=f"{victim}'s tritonserver running again",
    )
    restarts = crash()

    def loading_again() -> set[str]:
        """The models the victim's agent reports LOADING (it loads them back into the new one)."""
        try:
            return {m for m, state in held(ip).items() if state == "LOADING"}
        except OSError:
            return set()

    # the third kill while the agent loads its models back into the restarted tritonserver
    under = wait_for(loading_again, timeout=120, interval=0.02, what=f"{victim}'s agent loading its models")
    restarts = crash()
    looped_at = time.monotonic()
    wait_for(
        lambda: serves_again(kube, namespace, victim, ip=ip, holds=holds, restarts=restarts),
        timeout=180,
        interval=0.5,
        what=f"{victim} serving {sorted(holds)} again after the crash loop",
    )
    back_after = time.monotonic() - looped_at
    assert {offset_of(infer_add_sub(ip, model=M0)) for _ in range(3)} == {base + 100}
    assert wait_settled(kube, namespace, timeout=30) == where
    time.sleep(3)
    load.stop()
    watching = False
    watcher.join(timeout=5)
    status = get_ts(kube, namespace, NAME)["status"]
    inside, outside = failures_between(load, windows)
    conditions = [(c["type"], c["status"], c.get("reason")) for c in status.get("conditions") or []]
    print(
        f"\n(b) crash loop: serving again {back_after:.1f}s after the last kill; placements seen: "
        f"{len(placements)}; {load.summary()}; {len(inside)} failed inside the crash windows {windows}: "
        f"{inside[:3]}; conditions {conditions}"
    )
    by_window = [sum(1 for f in inside if a <= f[0] <= b) for a, b in windows]
    print(f"failed per crash window: {by_window}; conditions seen meanwhile: {said}")
    print("failures per crash window and path:\n" + per_window(load, windows))
    agent = [
        line
        for line in kube.log(victim, namespace=namespace, container="model-agent")
        if "pool: model" in line and ("again" in line or "went away" in line or "version" in line)
    ]
    print("the victim's agent said:\n" + "".join(agent[-20:]))
    if outside or through_client(inside):
        print(describe(kube, namespace))
    assert not outside, outside[:5]
    assert not through_client(inside), through_client(inside)[:5]  # the TritonClient rode through
    assert placements == [where], placements  # the operator moved no model off the crashing pod
    assert ("Ready", "True") in {(t, st) for t, st, _ in conditions}, conditions  # recovered: Ready again
    # tritonserver dying under the agent's loads is no failed load (the agent loads them once it is back)
    failed = [m for _, r, m in events(kube, namespace, NAME) if r == "PoolLoadFailed"]
    print(f"killed while {sorted(under)} loaded; PoolLoadFailed Events: {failed}")
    assert not failed, failed
