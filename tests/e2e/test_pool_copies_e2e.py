"""Copies follow load on the real node (spec.pool.scaling): load concentrated on one model of a small pool
gives it a second copy, read from Triton's own per-model metrics, with a client counting every answer.

Three Python models of 100Mi declared, one least copy each, in three pods of 400Mi; m0 answers in 50 ms
a request and one Python instance serves it, so eight clients at once make its requests wait in Triton's
queue. Busy (over 20 ms in the queue) for 10 s, it gets a second copy: the operator writes it into a
second pod's assignment, the agent loads it, and once READY the pod is labelled and m0's Service takes it
in. The calm models keep their one copy. Once the busy clients stop, m0 (asked about once a second, under
the 2 inferences a second that say idle) is idle for 5 s and its extra copy is dropped: taken off its
Service, then unloaded. A calm client asks every model about once a second throughout; no request fails.

A pod holding a model's only copy deleted at the default drainSeconds: the model loads on another pod
and is labelled there before the leaving pod stops serving; a client asking it back to back sees no
request fail. Likewise a pod holding the only copies of several models: their memory measured, they
load two at once on the pods that stay.

A pool grown while its node is cordoned: the new pod stays Pending and is given nothing, the model left
short names it in status.pool, and once the node is uncordoned the pod takes the short copy; no request
fails.

Needs the real node of e2e/cluster.py and the images built from this tree (e2e/images.py); without them
every test here skips, saying why.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod, Service

from e2e_helpers import apply, create_store_secret, get_ts
from inference import infer_add_sub, offset_of
from real_pods import ADD_SUB_CONFIG, adder_source, behaving_source, on_real_node
from testkit import wait_for
from triton_operator.core.pool.assignment import (
    ASSIGNMENT_ANNOTATION,
    AssignmentError,
    parse_assignment,
    parse_report,
)
from triton_operator.quantities import quantity_bytes

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.operator_env(TRITON_OPERATOR_PIN_REPOSITORIES="true"),
]

NAME = "copies"
MODELS = ("m0", "m1", "m2")
OFFSETS = {m: float(10 * (i + 1)) for i, m in enumerate(MODELS)}
KEY = "models/{model}/1/model.py"
MODEL_LABEL = "model.triton-operator.io/{model}"


@pytest.fixture
def bucket(store: Any, kube: Client, namespace: str) -> str:
    """A fresh bucket: m0 slow (50 ms a request), m1 and m2 quick; each adds its own offset."""
    import storage_servers  # noqa: PLC0415

    name = f"copies-{uuid.uuid4().hex[:8]}"
    s3 = store.extra["s3"]
    s3.create_bucket(Bucket=name)
    for model, offset in OFFSETS.items():
        source = behaving_source(offset, delay=0.05) if model == "m0" else adder_source(offset)
        s3.put_object(Bucket=name, Key=KEY.format(model=model), Body=source)
    create_store_secret(kube, namespace, storage_servers.S3_ACCESS_KEY, storage_servers.S3_SECRET_KEY)
    return name


def pooled(namespace: str, bucket: str, store: Any) -> dict[str, Any]:
    models: list[dict[str, Any]] = [
        {"name": m, "config": copy.deepcopy(ADD_SUB_CONFIG), "memory": "100Mi", "minCopies": 1}
        for m in MODELS
    ]
    models[0]["maxCopies"] = 2
    return on_real_node(
        NAME,
        namespace,
        bucket=bucket,
        endpoint=store.endpoint,
        replicas=3,
        resources={"cpu": "100m", "memory": "1Gi"},
        pool={
            "memoryPerPod": "400Mi",
            "scaling": {
                "busyQueueMicroseconds": 20_000,
                "idleInferencesPerSecond": "2",
                "scaleUpStabilizationSeconds": 10,
                "scaleDownStabilizationSeconds": 5,
                "windowSeconds": 10,
            },
        },
        models=models,
        startupTimeoutSeconds=240,
    )


def pool_status(kube: Client, namespace: str) -> dict[str, dict[str, Any]]:
    pool = get_ts(kube, namespace, NAME).get("status", {}).get("pool") or {}
    return {m["name"]: m for m in pool.get("models") or []}


def queue_microseconds(operator: Any, namespace: str, model: str) -> float | None:
    """A model's queue time over the window as the operator's own /metrics publishes it (status.pool does
    not carry the window's figures); None when it has none (no request in the window) or cannot be read."""
    ports = re.findall(
        r"metrics on http://0\.0\.0\.0:(\d+)/metrics", operator.log_path.read_text(errors="replace")
    )
    if not ports:
        return None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ports[-1]}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    labels = (f'namespace="{namespace}"', f'name="{NAME}"', f'model="{model}"')
    found = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("triton_operator_pool_model_queue_microseconds{")
        and all(x in line for x in labels)
    ]
    return found[0] if found else None


def labelled(kube: Client, namespace: str, model: str) -> set[str]:
    """The live pods labelled ready for ``model`` (its Service's endpoints)."""
    return {
        str(p.metadata.name)
        for p in kube.list(Pod, namespace=namespace, labels={"triton-operator.io/service": NAME})
        if p.metadata is not None
        and p.metadata.deletionTimestamp is None
        and (p.metadata.labels or {}).get(MODEL_LABEL.format(model=model)) == "ready"
    }


def service_ip(kube: Client, namespace: str, name: str) -> str:
    svc = kube.get(Service, name, namespace=namespace)
    assert svc.spec is not None and svc.spec.clusterIP
    return str(svc.spec.clusterIP)


class Held:
    """Samples, twice a second, what each pool pod holds or is asked to load: the copies its agent reports
    READY or LOADING (GET <pod IP>:8009/v1/pool) and its assignment's entries, each at placement's figure
    (the larger of its declared memory and the memory the agent measured); keeps each pod's peak."""

    def __init__(self, kube: Client, namespace: str, declared: int) -> None:
        self.kube, self.namespace, self.declared = kube, namespace, declared
        self.peaks: dict[str, tuple[int, list[str]]] = {}
        self.samples = 0
        self.unread = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _read(self, pod: Pod) -> None:
        assert pod.metadata is not None and pod.status is not None
        annotation = (pod.metadata.annotations or {}).get(ASSIGNMENT_ANNOTATION)
        try:
            with urllib.request.urlopen(f"http://{pod.status.podIP}:8009/v1/pool", timeout=2) as reply:
                copies = parse_report(json.loads(reply.read()))
            entries = parse_assignment(annotation).models
        except (OSError, ValueError, AssignmentError):
            self.unread += 1
            return
        memory = {m: c.memory or 0 for m, c in copies.items()}
        holding = set(entries) | {m for m, c in copies.items() if c.state in ("READY", "LOADING")}
        held = sum(max(self.declared, memory.get(m, 0)) for m in holding)
        name = str(pod.metadata.name)
        self.samples += 1
        if held > self.peaks.get(name, (-1, []))[0]:
            self.peaks[name] = (held, sorted(holding))

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                labels: dict[str, Any] = {"triton-operator.io/service": NAME}
                for pod in self.kube.list(Pod, namespace=self.namespace, labels=labels):
                    if pod.status is not None and pod.status.podIP:
                        self._read(pod)
            except Exception:  # an API read that failed: the next sample reads again
                self.unread += 1
            self._stop.wait(0.5)

    def start(self) -> Held:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


class Clients:
    """``busy`` threads sending m0 requests back to back, one calm thread asking m0, m1 and m2 in turn
    about once a second, each through the model's own Service; answers counted per model and offset,
    every failure kept. The busy threads stop on their own (``calm``)."""

    def __init__(self, services: dict[str, str], busy: int = 8) -> None:
        self.services = services
        self.answers: Counter[tuple[str, float]] = Counter()
        self.failures: list[str] = []
        self.sent = 0
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._calm = threading.Event()
        self._busy = [
            threading.Thread(target=self._loop, args=(["m0"], 0.0, self._calm), daemon=True)
            for _ in range(busy)
        ]
        self._threads = [
            *self._busy,
            threading.Thread(target=self._loop, args=(list(MODELS), 1.0, self._stop), daemon=True),
        ]

    def _loop(self, models: list[str], pause: float, stop: threading.Event) -> None:
        deadline = time.monotonic() + 600
        while not stop.is_set() and not self._stop.is_set() and time.monotonic() < deadline:
            for model in models:
                try:
                    answer = offset_of(infer_add_sub(self.services[model], model=model, timeout=10))
                    with self._lock:
                        self.sent += 1
                        self.answers[model, answer] += 1
                except Exception as exc:  # every failure is counted, none ends the client
                    with self._lock:
                        self.sent += 1
                        at = time.monotonic() - self.started
                        self.failures.append(f"{model} at {at:.1f}s: {type(exc).__name__}: {exc}")
            stop.wait(pause)

    def start(self) -> Clients:
        self.started = time.monotonic()
        for thread in self._threads:
            thread.start()
        return self

    def calm(self) -> None:
        """Only the calm thread asks from now on."""
        self._calm.set()
        for thread in self._busy:
            thread.join(timeout=15)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=15)

    def summary(self) -> str:
        answers = ", ".join(f"{m}@{o:g}: {n}" for (m, o), n in sorted(self.answers.items()))
        return f"{self.sent} requests sent, {len(self.failures)} failed; answers: {answers}"


def test_a_busy_model_gets_a_second_copy_and_loses_it_once_idle(
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str
) -> None:
    apply(kube, pooled(namespace, bucket, store))

    def one_copy_each() -> dict[str, dict[str, Any]] | None:
        status = pool_status(kube, namespace)
        if set(status) != set(MODELS) or any(s.get("readyCopies") != 1 for s in status.values()):
            return None
        if any(len(labelled(kube, namespace, m)) != 1 for m in MODELS):
            return None
        return status

    wait_for(one_copy_each, timeout=300, interval=2, what="one READY copy of each model")
    services = {m: service_ip(kube, namespace, f"{NAME}-m-{m}") for m in MODELS}

    def answering() -> bool:
        """Every model answers through its Service (its endpoints reached the node's proxy rules)."""
        try:
            answers = {m: offset_of(infer_add_sub(services[m], model=m, timeout=3)) for m in MODELS}
            return answers == OFFSETS
        except Exception:
            return False

    wait_for(answering, timeout=60, interval=0.5, what="every model answering through its Service")

    def measured() -> dict[str, int] | None:
        """Each model's memory as the agents measured it at its load (status.pool keeps it)."""
        status = pool_status(kube, namespace)
        found = {m: quantity_bytes(s["measuredMemory"]) for m, s in status.items() if s.get("measuredMemory")}
        return found if set(found) == set(MODELS) else None

    sizes = wait_for(measured, timeout=30, interval=1, what="each model's memory measured at its load")
    print(f"\nmeasured at their loads (bytes): {sizes}")
    assert all(size >= 1 << 20 for size in sizes.values()), sizes  # at least its Python stub's MiBs
    clients = Clients(services).start()
    held = Held(kube, namespace, quantity_bytes("100Mi")).start()
    seen: set[str] = set()
    queues: list[float] = []
    try:

        def second_copy() -> dict[str, dict[str, Any]] | None:
            status = pool_status(kube, namespace)
            seen.update(str(s.get("copiesReason")) for s in status.values())
            queue = queue_microseconds(operator, namespace, "m0")
            queues.append(queue if queue is not None else 0.0)
            m0 = status["m0"]
            if m0.get("readyCopies") == 2 and len(labelled(kube, namespace, "m0")) == 2:
                return status
            return None

        started = time.monotonic()
        status = wait_for(second_copy, timeout=180, interval=1, what="a second READY copy of m0")
        took = time.monotonic() - started
        print(f"\nm0 got its second copy {took:.0f}s into the load; reasons seen: {sorted(seen)}")
        print(f"m0: {status['m0'].get('copiesMessage')}")
        time.sleep(5)  # both copies answer
        assert {"BusyWaiting", "Busy"} & seen or status["m0"]["copiesReason"] in {"Busy", "MaxCopies"}, seen
        assert status["m0"]["wantedCopies"] == 2 and len(status["m0"]["pods"]) == 2
        assert max(queues, default=0.0) > 20_000 or status["m0"]["copiesReason"] == "MaxCopies", queues
        for model in ("m1", "m2"):
            assert status[model]["wantedCopies"] == 1 and status[model]["readyCopies"] == 1, status[model]
        # Each of m0's copies answers on its own pod.
        pods = {
            str(p.metadata.name): str(p.status.podIP)
            for p in kube.list(Pod, namespace=namespace)
            if p.metadata is not None and p.status is not None
        }
        for name in status["m0"]["pods"]:
            assert offset_of(infer_add_sub(pods[name], model="m0")) == OFFSETS["m0"]

        # The load stops; the calm client goes on asking every model, m0 included.
        print(f"the busy clients stop {time.monotonic() - clients.started:.1f}s into the load")
        clients.calm()
        seen_down: set[str] = set()

        def back_to_one() -> dict[str, dict[str, Any]] | None:
            status = pool_status(kube, namespace)
            seen_down.add(str(status["m0"].get("copiesReason")))
            m0 = status["m0"]
            print(
                f"{time.monotonic() - clients.started:.1f}s: m0 {m0.get('copiesReason')} "
                f"wanted {m0.get('wantedCopies')} ready {m0.get('readyCopies')} pods {m0.get('pods')} "
                f"labelled {sorted(labelled(kube, namespace, 'm0'))}"
            )
            if m0.get("wantedCopies") == m0.get("readyCopies") == 1 and len(m0.get("pods") or []) == 1:
                return status if len(labelled(kube, namespace, "m0")) == 1 else None
            return None

        started = time.monotonic()
        down = wait_for(back_to_one, timeout=120, interval=1, what="m0 back to one copy")
        took = time.monotonic() - started
        print(f"m0 back to one copy {took:.0f}s after the load; reasons: {sorted(seen_down)}")
        time.sleep(5)  # the one copy left answers
    finally:
        clients.stop()
        held.stop()
    print(clients.summary())
    print(f"each pod's peak held or loading (bytes, models): {held.peaks}; {held.samples} samples")
    when = sorted({f.split(":")[0] for f in clients.failures})
    assert not clients.failures, (when[:20], clients.failures[:5])
    # No pod ever held or loaded more than spec.pool.memoryPerPod while m0's copies grew and shrank.
    assert held.samples > 0 and held.peaks, held.unread
    budget = quantity_bytes("400Mi")
    assert all(peak <= budget for peak, _ in held.peaks.values()), held.peaks
    assert {"Idle", "IdleWaiting"} & seen_down, seen_down
    assert down["m0"]["pods"][0] in status["m0"]["pods"]
    for model in ("m1", "m2"):
        assert down[model]["readyCopies"] == 1, down[model]
    for model in MODELS:
        assert clients.answers[model, OFFSETS[model]] > 0, clients.summary()
    assert all(o == OFFSETS[m] for m, o in clients.answers), clients.summary()


class BackToBack:
    """A client per model of ``models`` asking it back to back (0.05 s apart) through its Service
    (``services``: its address) until stopped; answers counted per model and offset, every failure kept
    with its second from ``started`` (set again to count from a later moment, e.g. a delete)."""

    def __init__(self, services: dict[str, str], models: list[str]) -> None:
        self.services = services
        self.answers: Counter[tuple[str, float]] = Counter()
        self.failures: list[str] = []
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._ask, args=(m,), daemon=True) for m in models]

    def _ask(self, model: str) -> None:
        while not self._stop.is_set():
            try:
                answer = offset_of(infer_add_sub(self.services[model], model=model, timeout=10))
                self.answers[model, answer] += 1
            except Exception as exc:  # every failure is counted, none ends the client
                at = time.monotonic() - self.started
                self.failures.append(f"{model} at {at:+.1f}s: {type(exc).__name__}: {exc}")
            self._stop.wait(0.05)

    def start(self) -> BackToBack:
        self.started = time.monotonic()
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> BackToBack:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=15)
        return self


@dataclass
class Moved:
    """What a client per moved model saw while their pod was deleted (delete_under_load)."""

    answers: Counter[tuple[str, float]]
    failures: list[str]
    routed: dict[str, float]
    """Seconds from the delete until each model was labelled on a live pod."""
    landed: dict[str, list[str]]
    gone: float
    """Seconds from the delete until the pod was gone."""

    def summary(self) -> str:
        return ", ".join(f"{m}@{o:g}: {n}" for (m, o), n in sorted(self.answers.items()))


def delete_under_load(
    kube: Client, namespace: str, victim: str, moving: list[str], services: dict[str, str]
) -> Moved:
    """A client per model of ``moving`` asks it back to back through its Service (``services``: its
    address) while ``victim`` is deleted with its node cordoned, as a node drain does before it evicts
    (the ReplicaSet's new pod stays Pending, and no event of a starting pod hands the operator a pass:
    it looks again on its own timers only); until each model is labelled on a live pod, the victim is
    gone and the new copies have answered alone for 5 s. Every failure is counted, none ends a client."""
    clients = BackToBack(services, moving).start()
    node = str(kube.get(Pod, victim, namespace=namespace).spec.nodeName)  # type: ignore[union-attr]
    time.sleep(2)
    try:
        kube.patch(Node, node, {"spec": {"unschedulable": True}})
        deleted = clients.started = time.monotonic()  # failures are timed from the delete
        kube.delete(Pod, victim, namespace=namespace)
        routed: dict[str, float] = {}

        def all_routed() -> bool:
            for model in moving:
                if model not in routed and labelled(kube, namespace, model) - {victim}:
                    routed[model] = round(time.monotonic() - deleted, 1)
            return set(routed) == set(moving)

        wait_for(all_routed, timeout=120, interval=0.2, what="each moved model labelled on a live pod")
        landed = {m: sorted(labelled(kube, namespace, m) - {victim}) for m in moving}

        def gone() -> bool:
            names = {p.metadata.name for p in kube.list(Pod, namespace=namespace) if p.metadata is not None}
            return victim not in names

        wait_for(gone, timeout=120, interval=0.5, what=f"{victim} gone")
        left = time.monotonic() - deleted
        time.sleep(5)  # the new copies answer alone
    finally:
        kube.patch(Node, node, {"spec": {"unschedulable": False}})
        clients.stop()
    answers, failures = clients.answers, clients.failures
    moved = Moved(answers, failures, routed, landed, left)
    print(f"\ndeleted {victim} holding {moving}; labelled elsewhere after (s): {routed}; on {landed}")
    print(f"{victim} gone after {left:.1f} s")
    print(f"{sum(answers.values())} answers ({moved.summary()}), {len(failures)} failed")
    return moved


def two_moving(kube: Client, namespace: str, body: dict[str, Any], moving: list[str]) -> list[str]:
    """Two of ``moving``: an agent loads two models at once, so a third only-copy would load after one
    of the first two (docs/pool.md). The last of three gets a second copy first (minCopies 2: no new
    revision), so that exactly two only-copies move, loaded together."""
    if len(moving) <= 2:
        return moving
    kept = moving[-1]
    for model in body["spec"]["models"]:
        if model["name"] == kept:
            model["minCopies"] = model["maxCopies"] = 2
    apply(kube, body)
    wait_for(
        lambda: len(labelled(kube, namespace, kept)) == 2,
        timeout=120,
        interval=1,
        what=f"{kept}'s second copy labelled",
    )
    return moving[:-1]


@pytest.mark.parametrize(
    ("replicas", "memory"),
    [pytest.param(4, "300Mi", id="one-model"), pytest.param(2, "100Mi", id="several-models")],
)
def test_a_deleted_pods_only_copies_answer_elsewhere_within_the_default_drain(
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str, *, replicas: int, memory: str
) -> None:
    """The pod holding a model's only copy deleted, at the default drainSeconds (5 s): the model is placed
    on a live pod, loads there, and is labelled within about a second of its load (the operator looks
    again every POOL_LOADING_SECONDS while a copy loads), before the leaving pod's preStop ends: a client
    asking the model back to back through its Service sees no request fail. The node is cordoned first,
    as a node drain does before it evicts: the replacement pod stays Pending, and its start's events do
    not hand the operator passes (on main its next look came up to 5 s after the load: too late). Each
    ``one-model``: each model declares 300Mi, so each of four pods of 400Mi holds one at most: the
    deleted pod holds one model, and the pod left empty takes it. ``several-models``: 100Mi each on two
    pods, so one pod holds the only copies of two or three models (the victim: the pod holding the most;
    of three, the last gets a second copy first: two move); their memory measured at their first loads
    (status.pool), the pod that stays loads them together (docs/pool.md), and each answers there before
    the drain ends."""
    body = pooled(namespace, bucket, store)
    body["spec"]["replicas"] = replicas
    for model in body["spec"]["models"]:
        model["memory"] = memory

    apply(kube, body)

    def one_copy_each() -> dict[str, dict[str, Any]] | None:
        status = pool_status(kube, namespace)
        if set(status) != set(MODELS) or any(s.get("readyCopies") != 1 for s in status.values()):
            return None
        if replicas == 2 and not all(s.get("measuredMemory") for s in status.values()):
            return None  # measured: their moves may load together
        return status if all(len(labelled(kube, namespace, m)) == 1 for m in MODELS) else None

    status = wait_for(one_copy_each, timeout=300, interval=2, what="one READY copy of each model")
    print("\nmeasured at their loads:", {m: s.get("measuredMemory") for m, s in status.items()})
    services = {m: service_ip(kube, namespace, f"{NAME}-m-{m}") for m in MODELS}

    def answering() -> bool:
        try:
            return {m: offset_of(infer_add_sub(services[m], model=m, timeout=3)) for m in MODELS} == OFFSETS
        except Exception:
            return False

    wait_for(answering, timeout=60, interval=0.5, what="every model answering through its Service")
    held: Counter[str] = Counter(str(s["pods"][0]) for s in status.values())
    victim = str(status["m1"]["pods"][0]) if replicas == 4 else held.most_common(1)[0][0]
    moving = sorted(m for m, s in status.items() if s["pods"] == [victim])  # their only copy is there
    if replicas == 4:
        assert moving == ["m1"], status
    else:
        assert len(moving) >= 2, status
        moving = two_moving(kube, namespace, body, moving)
        wait_for(answering, timeout=60, interval=0.5, what="every model answering through its Service")
    moved = delete_under_load(kube, namespace, victim, moving, services)
    answers, summary = moved.answers, moved.summary()
    assert not moved.failures, moved.failures[:10]
    after = pool_status(kube, namespace)
    for model in moving:
        assert answers[model, OFFSETS[model]] > 0, summary
        assert after[model]["readyCopies"] == 1 and victim not in after[model]["pods"], after[model]
        if replicas == 2:  # loaded beside another: measured nothing, status.pool's figure stands
            assert after[model].get("measuredMemory"), after[model]
    assert all(o == OFFSETS[m] for m, o in answers), summary


def slow_loading_source(offset: float, seconds: float) -> bytes:
    """The adder (plus ``offset``) whose load takes ``seconds`` more (a sleep in initialize)."""
    text = adder_source(offset).decode()
    head = "    def initialize(self, args):\n"
    assert head in text
    return text.replace(head, f"{head}        import time\n        time.sleep({seconds!r})\n").encode()


def test_a_deleted_pods_three_only_copies_answer_elsewhere_past_a_short_drain(
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str
) -> None:
    """A pod holding the only copies of three models deleted at drainSeconds 2, with one live pod left
    to take them (the node cordoned, as a drain evicts: the replacement stays Pending): that pod loads
    two at once, then the third, each load taking 2 s more than the adder's: longer than the drain.
    The leaving pod serves on (spec.pool.leaveSeconds, default 60) while a model it holds READY is
    answered through its Service by itself alone, so a client asking each model back to back through
    its Service sees no request fail. (Before a leaving pod waited on its models' Services it served
    drainSeconds only: its models were refused from then until their copies elsewhere answered.)"""
    s3 = store.extra["s3"]
    for model, offset in OFFSETS.items():
        s3.put_object(Bucket=bucket, Key=KEY.format(model=model), Body=slow_loading_source(offset, 2.0))
    body = pooled(namespace, bucket, store)
    body["spec"]["replicas"] = 1  # every model on one pod first, then a second pod beside it, empty
    body["spec"]["drainSeconds"] = 2
    apply(kube, body)

    def on_one_pod() -> dict[str, dict[str, Any]] | None:
        status = pool_status(kube, namespace)
        if set(status) != set(MODELS) or any(s.get("readyCopies") != 1 for s in status.values()):
            return None
        if not all(s.get("measuredMemory") for s in status.values()):
            return None  # measured: the pod that takes them loads two at once
        return status if all(len(labelled(kube, namespace, m)) == 1 for m in MODELS) else None

    status = wait_for(on_one_pod, timeout=300, interval=2, what="one READY copy of each model")
    victim = str(status["m0"]["pods"][0])
    body["spec"]["replicas"] = 2
    apply(kube, body)

    def two_ready() -> bool:
        pods = [
            p
            for p in kube.list(Pod, namespace=namespace, labels={"triton-operator.io/service": NAME})
            if p.metadata is not None and p.metadata.deletionTimestamp is None
        ]
        return len(pods) == 2 and all(
            any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))  # type: ignore[union-attr]
            for p in pods
        )

    wait_for(two_ready, timeout=300, interval=1, what="a second pool pod Ready")
    status = pool_status(kube, namespace)
    moving = sorted(m for m, s in status.items() if s["pods"] == [victim] and s.get("readyCopies") == 1)
    assert moving == list(MODELS), status  # placement kept them where they were
    services = {m: service_ip(kube, namespace, f"{NAME}-m-{m}") for m in MODELS}
    moved = delete_under_load(kube, namespace, victim, moving, services)
    answers, summary, routed = moved.answers, moved.summary(), moved.routed
    assert not moved.failures, (len(moved.failures), moved.failures[:10])
    assert max(routed.values()) > 2, routed  # the moves outlasted the drain: the leave wait was needed
    for model in moving:
        assert answers[model, OFFSETS[model]] > 0, summary
    assert all(o == OFFSETS[m] for m, o in answers), summary


def test_a_pool_grown_onto_a_pending_pod_serves_and_takes_it_once_scheduled(
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str
) -> None:
    """The pool grows while its node is cordoned (no room on a node, a quota: a new pod stays Pending):
    two pods of 200Mi hold three models of 100Mi, one copy each; then spec.replicas 3 and two least
    copies for m0 and m1 (five copies, room for four on the Running pods). The Pending pod is given
    nothing; the Running pods take the copy that fits; the model left short says in status.pool which
    pod it waits for and why (the scheduler's words), and PodsScheduled is False. The node uncordoned,
    the pod starts, loads the short copy and is labelled; no copy moves off a Running pod. A client
    asks each model back to back through its Service throughout: no request fails."""
    body = pooled(namespace, bucket, store)
    body["spec"]["replicas"] = 2
    body["spec"]["pool"]["memoryPerPod"] = "200Mi"
    apply(kube, body)

    def one_copy_each() -> dict[str, dict[str, Any]] | None:
        status = pool_status(kube, namespace)
        if set(status) != set(MODELS) or any(s.get("readyCopies") != 1 for s in status.values()):
            return None
        return status if all(len(labelled(kube, namespace, m)) == 1 for m in MODELS) else None

    wait_for(one_copy_each, timeout=300, interval=2, what="one READY copy of each model")
    services = {m: service_ip(kube, namespace, f"{NAME}-m-{m}") for m in MODELS}

    def answering() -> bool:
        try:
            return {m: offset_of(infer_add_sub(services[m], model=m, timeout=3)) for m in MODELS} == OFFSETS
        except Exception:
            return False

    wait_for(answering, timeout=60, interval=0.5, what="every model answering through its Service")

    def pool_pods() -> dict[str, Pod]:
        return {
            str(p.metadata.name): p
            for p in kube.list(Pod, namespace=namespace, labels={"triton-operator.io/service": NAME})
            if p.metadata is not None and p.metadata.deletionTimestamp is None
        }

    running = set(pool_pods())
    node = str(next(iter(pool_pods().values())).spec.nodeName)  # type: ignore[union-attr]
    clients = BackToBack(services, list(MODELS)).start()
    try:
        kube.patch(Node, node, {"spec": {"unschedulable": True}})
        body["spec"]["replicas"] = 3
        for model in body["spec"]["models"][:2]:
            model["minCopies"] = 2
        apply(kube, body)

        def short_and_said() -> tuple[str, dict[str, Any]] | None:
            pending = set(pool_pods()) - running
            status = pool_status(kube, namespace)
            if len(pending) != 1 or set(status) != set(MODELS):
                return None
            stuck = next(iter(pending))
            short = [s for s in status.values() if s.get("copies", 0) < s.get("wantedCopies", 0)]
            if sum(s.get("readyCopies", 0) for s in status.values()) < 4 or len(short) != 1:
                return None
            return (stuck, short[0]) if stuck in str(short[0].get("message")) else None

        stuck, short = wait_for(short_and_said, timeout=90, interval=1, what="the short model naming the pod")
        print(f"\nwhile {stuck} is Pending: {short['name']}: {short['reason']}: {short['message']}")
        assert "Pending" in short["message"] and short["reason"] == "BudgetFull", short
        pod = pool_pods()[stuck]
        assert pod.spec is not None and not pod.spec.nodeName, pod.status
        assert not (pod.metadata.annotations or {}).get("pool.triton-operator.io/models"), pod.metadata  # type: ignore[union-attr]

        def unschedulable() -> dict[str, Any] | None:
            conditions = {c["type"]: c for c in get_ts(kube, namespace, NAME)["status"].get("conditions", [])}
            scheduled = conditions.get("PodsScheduled") or {}
            return scheduled if scheduled.get("status") == "False" else None

        print("PodsScheduled:", wait_for(unschedulable, timeout=30, interval=1, what="PodsScheduled False"))
        before = {m: set(s["pods"]) for m, s in pool_status(kube, namespace).items()}
        assert all(stuck not in pods for pods in before.values()), before
        kube.patch(Node, node, {"spec": {"unschedulable": False}})
        uncordoned = time.monotonic()

        def all_copies() -> dict[str, dict[str, Any]] | None:
            status = pool_status(kube, namespace)
            done = all(s.get("readyCopies") == s.get("wantedCopies") for s in status.values())
            return status if done and labelled(kube, namespace, short["name"]) >= {stuck} else None

        after = wait_for(
            all_copies, timeout=180, interval=1, what="every wanted copy READY, on the new pod too"
        )
        print(f"{stuck} took {short['name']} {time.monotonic() - uncordoned:.1f} s after the uncordon")
        time.sleep(3)
    finally:
        kube.patch(Node, node, {"spec": {"unschedulable": False}})
        clients.stop()
    answers, failures = clients.answers, clients.failures
    summary = ", ".join(f"{m}@{o:g}: {n}" for (m, o), n in sorted(answers.items()))
    print(f"{sum(answers.values())} answers ({summary}), {len(failures)} failed")
    assert not failures, (len(failures), failures[:10])
    for model in MODELS:
        assert answers[model, OFFSETS[model]] > 0, summary
        assert before[model] <= set(after[model]["pods"]), (model, before, after)  # nothing moved off
    assert after[short["name"]]["pods"] and stuck in after[short["name"]]["pods"], after
    assert all(o == OFFSETS[m] for m, o in answers), summary


def test_a_copy_placed_in_the_room_of_one_leaving_loads_only_once_it_is_unloaded(
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str
) -> None:
    """Two pods of 250Mi, two copies of 100Mi each: m0 on both (minCopies = maxCopies = 2), m1 and m2
    one each. Then m0 one copy and m1 two: placement drops an m0 copy and gives its room (or another
    leaving copy's) to a new copy at once; the pod loads that copy only once the copy leaving it is off
    its routes, drained and unloaded. Each pod's agent report and assignment are sampled twice a second:
    no pod ever holds or loads more than 250Mi. A client asks each model back to back through its
    Service throughout: no request fails."""
    body = pooled(namespace, bucket, store)
    body["spec"]["replicas"] = 2
    body["spec"]["pool"]["memoryPerPod"] = "250Mi"
    least = {"m0": 2, "m1": 1, "m2": 1}
    for model in body["spec"]["models"]:
        model["minCopies"] = model["maxCopies"] = least[model["name"]]
    apply(kube, body)

    def copies(want: dict[str, int]) -> dict[str, dict[str, Any]] | None:
        status = pool_status(kube, namespace)
        if set(status) != set(MODELS) or any(status[m].get("readyCopies") != n for m, n in want.items()):
            return None
        if any(len(status[m].get("pods") or []) != n for m, n in want.items()):
            return None
        return status if all(len(labelled(kube, namespace, m)) == n for m, n in want.items()) else None

    wait_for(lambda: copies(least), timeout=300, interval=2, what="m0 on both pods, m1 and m2 on one")
    services = {m: service_ip(kube, namespace, f"{NAME}-m-{m}") for m in MODELS}

    def answering() -> bool:
        try:
            return {m: offset_of(infer_add_sub(services[m], model=m, timeout=3)) for m in MODELS} == OFFSETS
        except Exception:
            return False

    wait_for(answering, timeout=60, interval=0.5, what="every model answering through its Service")
    held = Held(kube, namespace, quantity_bytes("100Mi")).start()
    clients = BackToBack(services, list(MODELS)).start()
    try:
        time.sleep(3)  # the sampler sees the pods as they were
        after = {"m0": 1, "m1": 2, "m2": 1}
        for model in body["spec"]["models"]:
            model["minCopies"] = model["maxCopies"] = after[model["name"]]
        apply(kube, body)
        moved = time.monotonic()
        status = wait_for(lambda: copies(after), timeout=180, interval=1, what="m0 on one pod, m1 on both")
        print(f"\nmoved in {time.monotonic() - moved:.0f}s: { ({m: s['pods'] for m, s in status.items()}) }")
        time.sleep(5)  # the copy that left is unloaded; the sampler sees it
    finally:
        clients.stop()
        held.stop()
    answers, failures = clients.answers, clients.failures
    print(f"answers: {dict(answers)}; failures: {len(failures)}")
    print(f"each pod's peak held or loading (bytes, models): {held.peaks}; {held.samples} samples")
    assert not failures, failures[:5]
    assert all(answers[m, OFFSETS[m]] > 0 for m in MODELS), answers
    assert held.samples > 0 and len(held.peaks) == 2, (held.peaks, held.unread)
    budget = quantity_bytes("250Mi")
    assert all(peak <= budget for peak, _ in held.peaks.values()), held.peaks
