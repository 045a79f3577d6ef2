"""A pool of tritonservers on the real node (spec.pool): more models than one pod holds, each on its own
pods, reached through its own Service, with clients counting every answer.

Six small Python models (each holds a few MiB once loaded, and declares 100Mi) with two copies each, in
three pods of 400Mi: one pod holds four of them, and every model everywhere would need 600Mi a pod.
Throughout, one client sends requests to every model through the model's own Service (its ClusterIP),
and another through the pooled Python client (TritonClient over gRPC: each model's requests to its
own Service, from status.pool; one channel a model, kept open), each model's answers told apart by
the constant its model adds.

(a) every model answers, each from exactly the pods status.pool places it on; its Service's endpoints
    are those pods;
(b) a pod deleted, then its replacement deleted while its agent loads its assignment: the models
    placed again on the next pod, no request fails (the pooled client's kept connection to the leaving
    pod meets "unknown model" as tritonserver unloads before it exits, and asks again on a new one);
(c) a model's new version (its config changed) is a new revision (spec.rollout.modelUpdates NewPods,
    the default): its pods take every model on (placement goes to the rollout's revision) and are Ready
    only once they serve them on their routes, so the old pods let go of nothing still needed; the new
    pods serve the new config, and no request fails;
(c') the same under spec.rollout.modelUpdates: InPlace, with steps (a first pod, then a pause): the
    pods stay, the update holds at its pause (m0's copy on a pod not asked keeps its old version, not
    loaded again) until `kubectl triton promote`, then m0 is at its new version on the two pods that
    hold it, one copy at a time (docs/pool.md, "Rollouts of one model"), the other models are not
    loaded again (the number each drew at its load unchanged on every pod), and no request fails;
(d) the operator restarted: it resumes the pool as the pods record it, nothing is loaded again (the
    number each model drew at its load unchanged on every pod), no request fails.

Another pool (test_an_aborted_and_a_superseded_..., m0 adding what its config's "offset" parameter says
on top of its own, so that each answer names m0's version), modelUpdates InPlace with steps (one copy of
m0's two, then a pause):
(e) m0's new version held at its pause, `kubectl triton abort`: the copy that took it loads the old one
    again, the copy not asked is not loaded again, status.inPlace says aborted, every copy answers the
    old version, the other models are not loaded again, no request fails;
(f) another new version of m0 held at its pause; the operator killed there and started again (the
    same step, the same pod, nothing loaded again); then a newer version applied over it: the newer
    version held at its pause, promoted, served by both copies; the other models are not loaded again,
    no request fails;
(g) a fourth version of m0 held at its pause, the pod that took it deleted: the update goes back
    (InPlacePodLost), the pod's replacement loads its models (the unchanged ones from its own files,
    m0 at the version served; never from the aborted revision, whose files the pods no longer have)
    and every copy answers the version served; no request fails.

Needs the real node of e2e/cluster.py and the images built from this tree (e2e/images.py); without them
every test here skips, saying why.
"""

from __future__ import annotations

import copy
import json
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Pod, Service
from lightkube.resources.discovery_v1 import EndpointSlice

from e2e_helpers import apply, create_store_secret, events, get_ts, kubectl_triton
from inference import INPUT0, INPUT1, InferenceError, infer_add_sub, offset_of
from real_pods import ADD_SUB_CONFIG, on_real_node, stamped_holding_source
from testkit import wait_for
from triton_operator.client import TritonClient

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.operator_env(TRITON_OPERATOR_PIN_REPOSITORIES="true"),
]

NAME = "pool"
MODELS = [f"m{i}" for i in range(6)]
OFFSETS = {m: float(10 * (i + 1)) for i, m in enumerate(MODELS)}
"""What each model adds to INPUT0 + INPUT1: an answer says which model gave it."""
HOLD_MIB = 16
"""What each model holds once loaded (a Python stub's own ~40 MiB come on top)."""
KEY = "models/{model}/1/model.py"
MODEL_LABEL = "model.triton-operator.io/{model}"


@pytest.fixture
def bucket(store: Any, kube: Client, namespace: str) -> str:
    """A fresh bucket: the six models, each adding its own offset."""
    import storage_servers  # noqa: PLC0415

    name = f"pool-{uuid.uuid4().hex[:8]}"
    s3 = store.extra["s3"]
    s3.create_bucket(Bucket=name)
    for model, offset in OFFSETS.items():
        s3.put_object(Bucket=name, Key=KEY.format(model=model), Body=stamped_holding_source(offset, HOLD_MIB))
    create_store_secret(kube, namespace, storage_servers.S3_ACCESS_KEY, storage_servers.S3_SECRET_KEY)
    return name


def pooled(
    namespace: str,
    bucket: str,
    store: Any,
    *,
    note: str = "",
    in_place: bool = False,
    steps: list[dict[str, Any]] | None = None,
    copies: int = 2,
    drain: int | None = None,
) -> dict[str, Any]:
    """Three pods of 400Mi for the models, six models of 100Mi with two copies each (``note``: a
    parameter of m0's config, a new version of m0 when it changes; ``in_place``: modelUpdates InPlace,
    with ``steps`` when given; ``copies``: each model's minCopies;
    ``drain``: spec.drainSeconds when given)."""
    models = []
    for model in MODELS:
        config = copy.deepcopy(ADD_SUB_CONFIG)
        if model == "m0" and note:
            config["parameters"] = {"note": {"stringValue": note}}
        models.append({"name": model, "config": config, "memory": "100Mi", "minCopies": copies})
    extra: dict[str, Any] = {"rollout": {"modelUpdates": "InPlace"}} if in_place else {}
    if drain is not None:
        extra["drainSeconds"] = drain
    if in_place and steps is not None:
        extra["rollout"]["steps"] = steps
    return on_real_node(
        NAME,
        namespace,
        bucket=bucket,
        endpoint=store.endpoint,
        replicas=3,
        resources={"cpu": "100m", "memory": "1Gi"},
        pool={"memoryPerPod": "400Mi"},
        models=models,
        startupTimeoutSeconds=240,
        **extra,
    )


# ----------------------------------------------------------------- reading the pool


def pool_pods(kube: Client, namespace: str) -> list[Any]:
    return [
        p
        for p in kube.list(Pod, namespace=namespace, labels={"triton-operator.io/service": NAME})
        if p.metadata is not None and p.metadata.deletionTimestamp is None
    ]


def placed(kube: Client, namespace: str) -> dict[str, set[str]]:
    """status.pool: each model's pods."""
    pool = get_ts(kube, namespace, NAME).get("status", {}).get("pool") or {}
    return {m["name"]: set(m.get("pods") or []) for m in pool.get("models") or []}


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def stats(ip: str, model: str) -> tuple[float, int]:
    """``model`` in one pod: the number it drew at its load (OUTPUT1), and its inferences in Triton's
    own statistics (from 0 again after a load)."""
    loaded = infer_add_sub(ip, model=model)["OUTPUT1"][0]
    reply = get_json(f"http://{ip}:8000/v2/models/{model}/stats")
    return loaded, sum(int(s.get("inference_count", 0)) for s in reply.get("model_stats") or [])


def held(ip: str) -> dict[str, str]:
    """What the pod's agent reports (GET :8009/v1/pool): each model's state."""
    report = get_json(f"http://{ip}:8009/v1/pool")
    return {m: c["state"] for m, c in (report.get("models") or {}).items()}


def service_ip(kube: Client, namespace: str, name: str) -> str:
    svc = kube.get(Service, name, namespace=namespace)
    assert svc.spec is not None and svc.spec.clusterIP
    return str(svc.spec.clusterIP)


def endpoint_ips(kube: Client, namespace: str, service: str) -> set[str]:
    """The ready addresses of ``service``'s EndpointSlices."""
    out = set()
    for eps in kube.list(EndpointSlice, namespace=namespace, labels={"kubernetes.io/service-name": service}):
        for ep in eps.endpoints or []:
            if ep.conditions is None or ep.conditions.ready is not False:
                out.update(ep.addresses)
    return out


def settled(kube: Client, namespace: str, copies: int = 2) -> dict[str, set[str]] | None:
    """status.pool once every model has its ``copies`` placed, READY and labelled on exactly those pods,
    and its Service's endpoints are those pods (None before)."""
    where = placed(kube, namespace)
    if set(where) != set(MODELS) or any(len(p) != copies for p in where.values()):
        return None
    pods = {p.metadata.name: p for p in pool_pods(kube, namespace)}
    for model, names in where.items():
        if not names <= set(pods):
            return None
        labelled = {
            n for n, p in pods.items() if (p.metadata.labels or {}).get(MODEL_LABEL.format(model=model))
        }
        if labelled != names:
            return None
        ips = {pods[n].status.podIP for n in names}
        if endpoint_ips(kube, namespace, f"{NAME}-m-{model}") != ips:
            return None
    return where


def wait_settled(kube: Client, namespace: str, timeout: float = 240, copies: int = 2) -> dict[str, set[str]]:
    return wait_for(
        lambda: settled(kube, namespace, copies), timeout=timeout, interval=1, what="the pool settled"
    )


# ----------------------------------------------------------------- clients counting answers


@dataclass
class PoolLoad:
    """Two threads sending requests to every model in turn until stopped: one through each model's own
    Service (a new connection each, so its ClusterIP balances requests over the model's pods), one
    through the pooled TritonClient (gRPC, each model to its own Service). Answers counted per model
    and offset; every failure kept."""

    services: dict[str, str]
    """Each model's Service ClusterIP."""
    client: TritonClient
    bucket: str
    store: Any
    interval: float = 0.01
    max_seconds: float = 600.0
    sent: int = 0
    answers: Counter[tuple[str, float]] = field(default_factory=Counter)
    failures: list[tuple[float, str, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _t0: float = 0.0

    def start(self) -> PoolLoad:
        self._t0 = time.monotonic()
        for target, name in ((self._through_services, "services"), (self._through_client, "client")):
            thread = threading.Thread(target=target, name=f"pool-load-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _loop(self, ask: Any, via: str) -> None:
        deadline = self._t0 + self.max_seconds
        while not self._stop.is_set() and time.monotonic() < deadline:
            for model in MODELS:
                self.sent += 1
                try:
                    self.answers[model, ask(model)] += 1
                except Exception as exc:  # every failure is counted, none ends the client
                    at = round(time.monotonic() - self._t0, 2)
                    self.failures.append((at, f"{via} {model}", f"{type(exc).__name__}: {exc}"))
            self._stop.wait(self.interval)

    def _through_services(self) -> None:
        self._loop(lambda m: offset_of(infer_add_sub(self.services[m], model=m, timeout=5)), "Service")

    def _through_client(self) -> None:
        a = np.array([INPUT0], np.float32)
        b = np.array([INPUT1], np.float32)

        def ask(model: str) -> float:
            out = self.client.model(model).run(a, b).as_numpy("OUTPUT0")
            return offset_of({"OUTPUT0": [float(x) for x in out[0]]})

        self._loop(ask, "TritonClient")

    def stop(self) -> PoolLoad:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=15)
        return self

    def summary(self) -> str:
        answers = ", ".join(f"{m}@{o:g}: {n}" for (m, o), n in sorted(self.answers.items()))
        return f"{self.sent} requests sent, {len(self.failures)} failed; answers: {answers}"


def describe(kube: Client, namespace: str) -> str:
    """Each pod of the pool as the kubelet and its agent see it (said when a request failed)."""
    lines = []
    for pod in kube.list(Pod, namespace=namespace, labels={"triton-operator.io/service": NAME}):
        body = pod.to_dict()
        status, metadata = body.get("status") or {}, body.get("metadata") or {}
        ip = status.get("podIP")
        ready = [c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"]
        containers = [
            (c.get("name"), c.get("ready"), c.get("restartCount"), c.get("lastState"))
            for c in status.get("containerStatuses") or []
        ]
        agent: Any = None
        try:
            agent = get_json(f"http://{ip}:8009/v1/ready") if ip else None
        except Exception as exc:  # said as it is
            agent = f"{type(exc).__name__}: {exc}"
        labels = sorted(k for k in metadata.get("labels") or {} if k.startswith("model."))
        deleting = metadata.get("deletionTimestamp")
        lines.append(
            f"{metadata.get('name')} {ip} Ready={ready} deleting={deleting} {labels} {containers} {agent}"
        )
    return "\n".join(lines)


def no_request_failed(load: PoolLoad, what: str, since: int, kube: Client, namespace: str) -> int:
    """Every request since ``since`` sent was answered; the count sent now."""
    print(f"\n{what}: {load.summary()}")
    if load.failures:
        print(describe(kube, namespace))
        print(load.failures[:3], load.failures[-3:])
    assert not load.failures, load.failures[:5]
    assert load.sent - since > 6 * 10, load.summary()
    return load.sent


def pooled_client(kube: Client, namespace: str) -> TritonClient:
    obj = get_ts(kube, namespace, NAME)
    hosts = {m: f"{service_ip(kube, namespace, f'{NAME}-m-{m}')}:8001" for m in MODELS}
    hosts[""] = f"{service_ip(kube, namespace, NAME)}:8001"
    return TritonClient.from_tritonservice(obj, protocol="grpc", host=hosts)


@pytest.fixture
def load(kube: Client, namespace: str, operator: Any, store: Any, bucket: str) -> Iterator[PoolLoad]:
    """The pool applied and settled, and both clients sending requests to every model."""
    yield from serving(kube, namespace, store, bucket, copies=2, drain=None)


@pytest.fixture
def only_copies(kube: Client, namespace: str, operator: Any, store: Any, bucket: str) -> Iterator[PoolLoad]:
    """The pool with one copy a model (minCopies: 1), settled, both clients sending to every model; a
    leaving pod serves for 45 s (drainSeconds): its models load elsewhere and the operator sees them READY
    within that (it took 3 to 23 s on the real node)."""
    yield from serving(kube, namespace, store, bucket, copies=1, drain=45)


def serving(
    kube: Client, namespace: str, store: Any, bucket: str, *, copies: int, drain: int | None
) -> Iterator[PoolLoad]:
    apply(kube, pooled(namespace, bucket, store, copies=copies, drain=drain))
    yield from loaded(kube, namespace, store, bucket, copies=copies)


def loaded(
    kube: Client, namespace: str, store: Any, bucket: str, *, copies: int, timeout: float = 240
) -> Iterator[PoolLoad]:
    """The pool applied settled (``copies`` a model), every model answering through its Service, then
    both clients sending to every model until the caller is done."""
    wait_settled(kube, namespace, timeout=timeout, copies=copies)
    services = {m: service_ip(kube, namespace, f"{NAME}-m-{m}") for m in MODELS}

    def answering() -> bool:  # kube-proxy has the Services' endpoints (it follows the EndpointSlices)
        try:
            return all(
                offset_of(infer_add_sub(services[m], model=m, timeout=3)) == OFFSETS[m]
                for _ in range(5)
                for m in MODELS
            )
        except InferenceError:
            return False

    wait_for(answering, timeout=60, interval=0.5, what="every model answering through its Service")
    running = PoolLoad(services, pooled_client(kube, namespace), bucket, store).start()
    try:
        yield running
    finally:
        running.stop()
        running.client.close()


# ----------------------------------------------------------------- the test


def test_a_pool_places_moves_and_reloads_models_with_no_failed_request(
    kube: Client, namespace: str, operator: Any, load: PoolLoad, cluster: Path
) -> None:
    # (a) every model answers, from exactly the pods status.pool places it on
    time.sleep(3)
    sent = no_request_failed(load, "(a) settled", 0, kube, namespace)
    where = wait_settled(kube, namespace, timeout=30)
    pods = {p.metadata.name: p.status.podIP for p in pool_pods(kube, namespace)}
    assert len(pods) == 3
    for name, ip in pods.items():
        holds = {m for m, state in held(ip).items() if state == "READY"}
        assert holds == {m for m, names in where.items() if name in names}, (name, holds, where)
        assert len(holds) == 4  # 400Mi of 100Mi models: the pod is full
        for model in MODELS:
            if name in where[model]:
                assert offset_of(infer_add_sub(ip, model=model)) == OFFSETS[model]
            else:
                with pytest.raises(InferenceError, match=r"HTTP 4\d\d"):
                    infer_add_sub(ip, model=model)
    for model in MODELS:
        assert load.answers[model, OFFSETS[model]] > 0, load.summary()
        assert load.client.model_url(model).startswith("grpc://"), load.client.model_url(model)
    assert {m for m, _ in load.answers} == set(MODELS)
    assert all(o == OFFSETS[m] for m, o in load.answers), load.summary()

    # (b) a pod deleted; its replacement deleted while its agent loads its assignment
    victim = sorted(pods)[0]
    kube.delete(Pod, victim, namespace=namespace)

    def loading() -> Any:
        for pod in pool_pods(kube, namespace):
            if pod.metadata.name in pods or not pod.status.podIP:
                continue
            try:
                states = held(pod.status.podIP)
            except OSError:
                continue
            if states and any(s != "READY" for s in states.values()):
                return pod
        return None

    replacement = wait_for(loading, timeout=180, interval=0.2, what="a replacement pod loading its models")
    print(f"\n(b) deleting {replacement.metadata.name} while it loads: {held(replacement.status.podIP)}")
    kube.delete(Pod, replacement.metadata.name, namespace=namespace)
    where = wait_settled(kube, namespace)
    assert victim not in set().union(*where.values())
    assert replacement.metadata.name not in set().union(*where.values())
    time.sleep(3)
    sent = no_request_failed(
        load, "(b) a pod deleted, its replacement deleted mid-load", sent, kube, namespace
    )

    # (c) a new version of m0 (its config changed): a new revision, whose pods take every model on
    # (placement goes to the rollout's revision) and are Ready only once they serve them on their routes,
    # before the old pods let go
    old = {p.metadata.name for p in pool_pods(kube, namespace)}
    generation = apply(kube, pooled(namespace, load.bucket, load.store, note="v2"))["metadata"]["generation"]

    def rolled() -> dict[str, set[str]] | None:
        status = get_ts(kube, namespace, NAME).get("status") or {}
        if status.get("observedGeneration") != generation or status.get("canaryRevision"):
            return None
        now = {p.metadata.name for p in pool_pods(kube, namespace)}
        return settled(kube, namespace) if len(now) == 3 and not now & old else None

    where = wait_for(rolled, timeout=300, interval=2, what="the new revision's pods serving every model")
    pods = {p.metadata.name: p.status.podIP for p in pool_pods(kube, namespace)}
    for name in where["m0"]:
        config = get_json(f"http://{pods[name]}:8000/v2/models/m0/config")
        assert config.get("parameters", {}).get("note", {}).get("string_value") == "v2", config
    time.sleep(3)
    what = "(c) a new version of m0: the new revision's pods took the models on"
    sent = no_request_failed(load, what, sent, kube, namespace)
    assert all(o == OFFSETS[m] for m, o in load.answers), load.summary()

    # (c') a new version of m0 in place: the same pods, the engine's steps (a first pod, then a pause
    # until promoted), m0 reloaded on its two pods one at a time, the other models not loaded again
    loaded = {(n, m): stats(ip, m)[0] for n, ip in pods.items() for m in MODELS if n in where[m]}
    steps: list[dict[str, Any]] = [{"setWeight": 33}, {"pause": {}}]
    body = pooled(namespace, load.bucket, load.store, note="v3", in_place=True, steps=steps)
    generation = apply(kube, body)["metadata"]["generation"]
    started = time.monotonic()

    def paused() -> dict[str, Any] | None:
        status = get_ts(kube, namespace, NAME).get("status") or {}
        moving = status.get("inPlace") or {}
        if status.get("observedGeneration") != generation or not moving.get("next"):
            return None
        progressing = [c for c in status.get("conditions") or [] if c.get("type") == "Progressing"]
        reason = progressing[0].get("reason") if progressing else None
        return status if moving.get("stepIndex") == 1 and reason == "StepPaused" else None

    status = wait_for(paused, timeout=240, interval=2, what="the in-place update held by its pause step")
    asked = set(status["inPlace"].get("pods") or [])
    print(f"\n(c') paused after its first step in {time.monotonic() - started:.0f}s: asked {sorted(asked)}")
    time.sleep(10)
    still = get_ts(kube, namespace, NAME)["status"].get("inPlace") or {}
    assert still.get("next") == status["inPlace"]["next"] and still.get("stepIndex") == 1, still
    # 33% of m0's two copies: one pod holding m0 asked, the other copy held back by the pause
    assert len(asked) == 1 and asked < where["m0"], (asked, where["m0"])
    for name in where["m0"] - asked:  # held: the old version, not loaded again
        config = get_json(f"http://{pods[name]}:8000/v2/models/m0/config")
        assert config.get("parameters", {}).get("note", {}).get("string_value") == "v2", config
        assert stats(pods[name], "m0")[0] == loaded[name, "m0"]
    kubectl_triton(cluster, "promote", NAME, "-n", namespace)

    def in_place() -> dict[str, set[str]] | None:
        status = get_ts(kube, namespace, NAME).get("status") or {}
        if status.get("observedGeneration") != generation or (status.get("inPlace") or {}).get("next"):
            return None
        if not status.get("servedRevision") or {p.metadata.name for p in pool_pods(kube, namespace)} != set(
            pods
        ):
            return None
        return settled(kube, namespace)

    where_now = wait_for(in_place, timeout=240, interval=2, what="m0's new version served in place")
    status = get_ts(kube, namespace, NAME)["status"]
    print(f"\n(c') in place in {time.monotonic() - started:.0f}s: {status.get('inPlace')}")
    assert where_now == where and status["stableRevision"] != status["servedRevision"]
    for name in where["m0"]:
        config = get_json(f"http://{pods[name]}:8000/v2/models/m0/config")
        assert config.get("parameters", {}).get("note", {}).get("string_value") == "v3", config
    now = {(n, m): stats(ip, m)[0] for n, ip in pods.items() for m in MODELS if n in where[m]}
    assert {k: v for k, v in now.items() if k[1] != "m0"} == {k: v for k, v in loaded.items() if k[1] != "m0"}
    assert all(now[n, "m0"] != loaded[n, "m0"] for n in where["m0"])  # m0 was loaded again there
    time.sleep(3)
    what = "(c') a new version of m0 in place: the same pods, the other models untouched"
    sent = no_request_failed(load, what, sent, kube, namespace)
    assert all(o == OFFSETS[m] for m, o in load.answers), load.summary()

    # (d) the operator restarted: it resumes the pool as the pods record it, nothing is loaded again
    before = {(n, m): stats(ip, m)[0] for n, ip in pods.items() for m in MODELS if n in where[m]}
    operator.restart()
    time.sleep(15)
    assert wait_settled(kube, namespace, timeout=60) == where
    after = {(n, m): stats(ip, m)[0] for n, ip in pods.items() for m in MODELS if n in where[m]}
    assert after == before
    time.sleep(2)
    load.stop()
    no_request_failed(load, "(d) the operator restarted", sent, kube, namespace)


def test_a_pod_deleted_with_its_models_only_copies_fails_no_request(
    kube: Client, namespace: str, operator: Any, only_copies: PoolLoad, cluster: Path
) -> None:
    """One copy a model: the deleted pod's copies stay on their routes, and it serves them (Ready while
    it terminates), until their copies on the other pods answer (docs/pool.md, "A pod that leaves")."""
    load = only_copies
    time.sleep(3)
    sent = no_request_failed(load, "one copy a model, settled", 0, kube, namespace)
    where = wait_settled(kube, namespace, timeout=30, copies=1)
    victim = sorted(set().union(*where.values()))[0]
    lost = sorted(m for m, names in where.items() if victim in names)
    said: list[str] = []  # the agent container's log, followed until it stops

    def follow() -> None:
        try:
            for line in kube.log(victim, namespace=namespace, container="model-agent", follow=True):
                said.append(line)
        except Exception as exc:  # the stream ends with the pod: what it had is kept
            said.append(f"(stream ended: {exc})")

    reader = threading.Thread(target=follow, name="agent-log", daemon=True)
    reader.start()
    time.sleep(2)  # the stream is open before the pod terminates
    kube.delete(Pod, victim, namespace=namespace)
    where = wait_settled(kube, namespace, copies=1)
    assert victim not in set().union(*where.values())
    time.sleep(3)
    no_request_failed(load, f"{victim} deleted, the only copy of {lost}", sent, kube, namespace)
    for model in lost:
        assert load.answers[model, OFFSETS[model]] > 0, load.summary()
    # The preStop's lines (`triton-operator leave`) are in the agent container's log, though the kubelet
    # drops a hook's own output: the wait it started, who answered its models' Services, how it ended.
    reader.join(timeout=180)
    leave = [line for line in said if "leave: " in line]
    assert any(f"leave: pod {victim} leaves: the drain (45s)" in line for line in leave), said[-40:]
    assert any(f"{lost[0]} by " in line for line in leave), leave
    assert any("done after" in line or "the bound is over" in line for line in leave), leave


# ----------------------------------------------------------------- an abort and a newer spec in place

M0_OFFSET = "offset"
"""The parameter of m0's config whose value m0 adds on top of its own offset: its answers name its version."""


def versioned_source() -> bytes:
    """m0's model.py: the stamped adder (OFFSETS["m0"], HOLD_MIB) adding its config's M0_OFFSET too."""
    text = stamped_holding_source(OFFSETS["m0"], HOLD_MIB).decode()
    config = '        config = json.loads(args["model_config"])\n'
    added = f"(a + b + {OFFSETS['m0']!r})"
    assert config in text and added in text
    parameter = f'config.get("parameters", {{}}).get("{M0_OFFSET}", {{}})'
    extra = f'        self.extra = float({parameter}.get("string_value", 0))\n'
    text = text.replace(config, config + extra)
    return text.replace(added, f"(a + b + {OFFSETS['m0']!r} + self.extra)").encode()


HELD_STEPS: list[dict[str, Any]] = [{"setWeight": 50}, {"pause": {}}]
"""Half of m0's two copies (one pod), then a pause until promoted."""


def versioned(namespace: str, bucket: str, store: Any, extra: float) -> dict[str, Any]:
    """The pool of ``pooled`` in place with HELD_STEPS, m0 adding ``extra`` (its version) to its offset."""
    body = pooled(namespace, bucket, store, in_place=True, steps=HELD_STEPS)
    (m0,) = [m for m in body["spec"]["models"] if m["name"] == "m0"]
    if extra:
        m0["config"]["parameters"] = {M0_OFFSET: {"stringValue": f"{extra:g}"}}
    return body


@pytest.fixture
def m0_versions(kube: Client, namespace: str, operator: Any, store: Any, bucket: str) -> Iterator[PoolLoad]:
    """The pool of ``versioned`` (m0 at its first version), settled, both clients sending to every model."""
    store.extra["s3"].put_object(Bucket=bucket, Key=KEY.format(model="m0"), Body=versioned_source())
    apply(kube, versioned(namespace, bucket, store, 0))
    yield from loaded(kube, namespace, store, bucket, copies=2)


def m0_answers(ip: str, times: int = 3) -> set[float]:
    return {offset_of(infer_add_sub(ip, model="m0")) for _ in range(times)}


def test_an_aborted_and_a_superseded_model_update_in_place_fail_no_request(  # noqa: PLR0915
    kube: Client, namespace: str, operator: Any, m0_versions: PoolLoad, cluster: Path
) -> None:
    """(e) an abort mid-step, (f) an operator restart and a newer spec mid-rollout, (g) a pod deleted
    mid-step, of m0's update in place in a pool."""
    load = m0_versions
    base = OFFSETS["m0"]
    where = wait_settled(kube, namespace, timeout=30)
    pods = {p.metadata.name: p.status.podIP for p in pool_pods(kube, namespace)}
    stamps = {(n, m): stats(ip, m)[0] for n, ip in pods.items() for m in MODELS if n in where[m]}
    for name in where["m0"]:
        assert m0_answers(pods[name]) == {base}
    time.sleep(3)
    sent = no_request_failed(load, "(e) settled", 0, kube, namespace)

    def paused(generation: int, after: set[str]) -> Any:
        def probe() -> dict[str, Any] | None:
            status = get_ts(kube, namespace, NAME).get("status") or {}
            moving = status.get("inPlace") or {}
            if status.get("observedGeneration") != generation or moving.get("rollingBack"):
                return None
            if not moving.get("next") or moving["next"] in after or moving.get("stepIndex") != 1:
                return None
            progressing = [c for c in status.get("conditions") or [] if c.get("type") == "Progressing"]
            return status if progressing and progressing[0].get("reason") == "StepPaused" else None

        return probe

    def untouched(what: str) -> None:
        """The other models not loaded again on any pod (the number each drew at its load unchanged)."""
        now = {(n, m): stats(pods[n], m)[0] for (n, m) in stamps if m != "m0"}
        assert now == {k: v for k, v in stamps.items() if k[1] != "m0"}, what

    # (e) m0 at base + 100 held at its pause on one copy, then aborted
    started = time.monotonic()
    generation = apply(kube, versioned(namespace, load.bucket, load.store, 100))["metadata"]["generation"]
    status = wait_for(paused(generation, set()), timeout=240, interval=1, what="m0 + 100 held at its pause")
    aborted = status["inPlace"]["next"]
    asked = set(status["inPlace"].get("pods") or [])
    print(f"\n(e) paused in {time.monotonic() - started:.0f}s: asked {sorted(asked)}")
    assert len(asked) == 1 and asked < where["m0"], (asked, where["m0"])
    (moved,) = asked
    (kept,) = where["m0"] - asked

    def at(name: str, offset: float) -> bool:
        return m0_answers(pods[name]) == {offset}

    wait_for(lambda: at(moved, base + 100), timeout=60, interval=1, what=f"m0 + 100 on {moved}")
    assert at(kept, base) and stats(pods[kept], "m0")[0] == stamps[kept, "m0"]
    time.sleep(3)  # the Service's requests to m0 reach the new version too
    kubectl_triton(cluster, "abort", NAME, "-n", namespace)

    def back() -> dict[str, Any] | None:
        status = get_ts(kube, namespace, NAME).get("status") or {}
        moving = status.get("inPlace") or {}
        if moving.get("abortedRevision") != aborted or moving.get("next") or moving.get("rollingBack"):
            return None
        return status if settled(kube, namespace) == where else None

    status = wait_for(back, timeout=240, interval=1, what="the abort to load m0's old version back")
    print(f"\n(e) aborted in {time.monotonic() - started:.0f}s: {status['inPlace']}")
    assert status["inPlace"].get("abortedReason") == "Aborted", status["inPlace"]
    warnings = [m for _, r, m in events(kube, namespace, NAME) if r == "RolloutAborted"]
    assert any(aborted in m for m in warnings), warnings
    assert at(moved, base) and at(kept, base)
    assert stats(pods[moved], "m0")[0] != stamps[moved, "m0"]  # loaded again, at the old version
    assert stats(pods[kept], "m0")[0] == stamps[kept, "m0"]  # never moved
    untouched("(e) the abort")
    assert {p.metadata.name for p in pool_pods(kube, namespace)} == set(pods)
    service = load.services["m0"]
    assert {offset_of(infer_add_sub(service, model="m0")) for _ in range(20)} == {base}
    time.sleep(3)
    sent = no_request_failed(load, "(e) m0 + 100 aborted mid-step", sent, kube, namespace)
    assert load.answers["m0", base + 100] > 0, load.summary()

    # (f) m0 at base + 200 held at its pause, then base + 300 applied over it: held, promoted, served
    generation = apply(kube, versioned(namespace, load.bucket, load.store, 200))["metadata"]["generation"]
    status = wait_for(paused(generation, {aborted}), timeout=240, interval=1, what="m0 + 200 held")
    second = status["inPlace"]["next"]
    (first,) = status["inPlace"].get("pods") or []
    wait_for(lambda: at(first, base + 200), timeout=60, interval=1, what=f"m0 + 200 on {first}")
    (other,) = where["m0"] - {first}
    unmoved = stats(pods[other], "m0")[0]  # held by the pause at the old version
    assert at(other, base)
    # the operator killed at the pause and started again: the same step, the same pod, nothing reloaded
    at_pause = {(n, m): stats(ip, m)[0] for n, ip in pods.items() for m in MODELS if n in where[m]}
    assert operator.process is not None
    operator.process.kill()
    operator.process.wait(timeout=10)
    operator.start()
    time.sleep(8)
    kept_step = get_ts(kube, namespace, NAME)["status"]
    for key in ("next", "pods", "stepIndex", "stepStartedAt"):
        assert kept_step["inPlace"].get(key) == status["inPlace"].get(key), (key, kept_step["inPlace"])
    assert wait_settled(kube, namespace, timeout=30) == where
    assert {(n, m): stats(ip, m)[0] for n, ip in pods.items() for m in MODELS if n in where[m]} == at_pause
    assert at(first, base + 200) and at(other, base)
    generation = apply(kube, versioned(namespace, load.bucket, load.store, 300))["metadata"]["generation"]
    status = wait_for(paused(generation, {aborted, second}), timeout=240, interval=1, what="m0 + 300 held")
    print(f"\n(f) the newer spec held in {time.monotonic() - started:.0f}s: {status['inPlace']}")
    (newest,) = status["inPlace"].get("pods") or []
    wait_for(lambda: at(newest, base + 300), timeout=60, interval=1, what=f"m0 + 300 on {newest}")
    if newest != first:  # the copy that took m0 + 200 holds it no more
        wait_for(lambda: at(first, base), timeout=60, interval=1, what=f"m0's old version on {first}")
    else:  # the copy not asked still at the old version, not loaded again
        assert at(other, base) and stats(pods[other], "m0")[0] == unmoved
    kubectl_triton(cluster, "promote", NAME, "-n", namespace)

    def served() -> dict[str, Any] | None:
        status = get_ts(kube, namespace, NAME).get("status") or {}
        moving = status.get("inPlace") or {}
        if status.get("observedGeneration") != generation or moving.get("next"):
            return None
        if status.get("servedRevision") is None or settled(kube, namespace) != where:
            return None
        return status

    status = wait_for(served, timeout=240, interval=1, what="m0 + 300 served in place")
    print(f"\n(f) served in {time.monotonic() - started:.0f}s: {status.get('inPlace')}")
    assert {p.metadata.name for p in pool_pods(kube, namespace)} == set(pods)
    for name in where["m0"]:
        assert at(name, base + 300), name
    untouched("(f) a newer spec mid-rollout")
    assert {offset_of(infer_add_sub(service, model="m0")) for _ in range(20)} == {base + 300}
    time.sleep(3)
    sent = no_request_failed(load, "(f) m0 + 200 superseded by m0 + 300 mid-rollout", sent, kube, namespace)
    assert load.answers["m0", base + 300] > 0, load.summary()
    third = status["inPlace"]["stable"]

    # (g) m0 at base + 400 held at its pause, the pod that took it deleted: the update goes back
    generation = apply(kube, versioned(namespace, load.bucket, load.store, 400))["metadata"]["generation"]
    status = wait_for(paused(generation, {aborted, second, third}), timeout=240, interval=1, what="m0 + 400")
    fourth = status["inPlace"]["next"]
    (lost,) = status["inPlace"].get("pods") or []
    wait_for(lambda: at(lost, base + 400), timeout=60, interval=1, what=f"m0 + 400 on {lost}")
    time.sleep(3)
    kube.delete(Pod, lost, namespace=namespace)

    def gone_back() -> dict[str, set[str]] | None:
        status = get_ts(kube, namespace, NAME).get("status") or {}
        moving = status.get("inPlace") or {}
        if moving.get("abortedRevision") != fourth or moving.get("next") or moving.get("rollingBack"):
            return None
        now = settled(kube, namespace)
        return now if now is not None and lost not in set().union(*now.values()) else None

    where = wait_for(gone_back, timeout=300, interval=1, what="m0 + 400 rolled back, its pod gone")
    status = get_ts(kube, namespace, NAME)["status"]
    print(f"\n(g) rolled back in {time.monotonic() - started:.0f}s: {status['inPlace']}")
    assert status["inPlace"].get("abortedReason") == "InPlacePodLost", status["inPlace"]
    pods = {p.metadata.name: p.status.podIP for p in pool_pods(kube, namespace)}
    for name in where["m0"]:
        assert at(name, base + 300), name
    assert {offset_of(infer_add_sub(service, model="m0")) for _ in range(20)} == {base + 300}
    time.sleep(3)
    load.stop()
    no_request_failed(load, "(g) the pod that took m0 + 400 deleted mid-step", sent, kube, namespace)
    assert {o for m, o in load.answers if m == "m0"} <= {base + 100 * i for i in range(5)}
    assert all(o == OFFSETS[m] for m, o in load.answers if m != "m0"), load.summary()
