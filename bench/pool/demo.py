#!/usr/bin/env python3
"""Issue 41's demonstration on the real node: 40 Python models of ~120 MiB in a pool of 4 pods of 1400Mi,
with clients counting every answer, side by side with every model everywhere on the same models.

Each model holds ``--hold`` MiB once loaded (touched; a Python stub's own memory comes on top: the
agents measured 117 to 120 MiB a model at ``--hold`` 80) and declares ``--memory`` (120Mi: what it
measures; placement counts the larger of the two, so a model declared smaller takes its measured
figure anyway); its answer says which model gave it (an offset) and when it was loaded (OUTPUT1:
a number drawn at its load). Both layouts use spec.rollout.modelUpdates InPlace (a new model and a
model's new version load in place) and talk to Triton through the pooled Python client over gRPC
(``TritonClient.from_tritonservice``: in the pool, each model's requests to its own Service; one kept
connection a model and a client thread).

**Every model everywhere** (no spec.pool), ``--every-pods`` pods (what safely fits this machine's memory:
each pod holds every model): the seconds from the apply to every model answering; the tritonserver
containers' working set; a new model added to the spec, seconds to its first answer; p50/p99 under the
skewed load (``--clients`` threads for ``--seconds`` s, ``--interval`` s between a thread's requests,
``--hot-percent`` % of them to the ``--hot`` first models, the rest spread over the others).

**The pool** (``--pods`` pods of ``--budget``, spec.autoscaling minReplicas ``--pods`` and maxReplicas
``--max-pods``: the pool's pods follow the copies' sum), every model minCopies 1; the hot models
maxCopies 4, the warm one (the model after them) maxCopies 2. A counting client asks every model in
turn, about once a second each, from the first answer to the end; each step below also counts its own
load's answers:

1. the apply: seconds to every model answering, the working set;
2. a new model: seconds from adding it to the spec to its first answer;
3. a busy model's second copy: the ``--clients`` threads on the warm model alone, seconds until
   status.pool gives it 2 READY copies and its Service's EndpointSlices 2 ready endpoints;
4. its new version in place (its config changed), under that load: seconds until served on the pods
   that hold it; every other model on every pod still answers with the number it drew at its load
   (not loaded again);
5. the skewed load on the hot models: each grows to 4 copies while the warm model, idle now, drops
   back to 1 (seconds to each); the pods the pool runs (status.pool.podsNeeded, the Deployment);
   then p50/p99 over ``--seconds`` s with new client threads (their connections spread over the
   copies there are then);
6. a pod deleted under the skewed load: seconds until every model is placed and READY again; the load
   goes on until the pod is gone (its drain, spec.drainSeconds ``--drain``, and its exit);
7. the load stopped: the hot models' copies drop and the pool's pods follow (seconds, within
   ``--settle`` s).

0 failed requests is the aim; 'No route to host' (EHOSTUNREACH) failures are counted apart.

Needs the local cluster's real node (e2e/cluster.py up; started and stopped here when not up) and the
images built from this tree (e2e/images.py), through the project's e2e lock:

  .venv/bin/python bench/pool/demo.py                        # 40 models, 4 pods of 1400Mi
  .venv/bin/python bench/pool/demo.py --models 8 --pods 2 --budget 600Mi --memory 60Mi --hold 20
  .venv/bin/python bench/pool/demo.py --plan                 # the pods the pool needs, nothing run

Before anything runs, the operator's own placement (core.pool.placement.pods_needed) says how many pods
of ``--budget`` the models need at their declared memory: at rest (every model once, the new one
included) and at the peak (the hot models at their most copies, the warm one at its most): a peak above
``--max-pods`` or a rest above ``--pods`` stops the script naming the settings (the copies would be
held back with MemoryShort and the steps would wait in vain).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.pool.live import Bench, mib_of
from bench.real_pods.common import Session, run_with_cluster, say, wait

from inference import INPUT0, INPUT1, InferenceError, infer_add_sub, offset_of
from real_pods import ADD_SUB_CONFIG, on_real_node, stamped_holding_source
from triton_operator.client import TritonClient
from triton_operator.core.pool.placement import PoolModel, pods_needed
from triton_operator.quantities import quantity_bytes

SCALING: dict[str, Any] = {
    "busyInferencesPerSecond": "20",
    "idleInferencesPerSecond": "5",
    "windowSeconds": 10,
    "scaleUpStabilizationSeconds": 0,
    "scaleDownStabilizationSeconds": 20,
}
"""The demo pool's spec.pool.scaling: busy above 20 inferences a second per copy, idle when one copy
fewer would each see under 5 (the counting client asks each model about once a second, the skewed
load's cold share a few times), averaged over the shortest window; a copy added at once, dropped after
20 s idle."""
HOT_MAX_COPIES = 4
WARM_MAX_COPIES = 2


def unreachable(error: str) -> bool:
    return "Errno 113" in error or "No route to host" in error


@dataclass
class Counts:
    """One load's requests: sent, failed (of which 'No route to host'), latencies and the first errors."""

    sent: int = 0
    failed: int = 0
    unreachable: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, took_ms: float, error: str, what: str) -> None:
        with self.lock:
            self.sent += 1
            if not error:
                self.latencies_ms.append(took_ms)
                return
            self.failed += 1
            self.unreachable += unreachable(error)
            if len(self.errors) < 5:
                self.errors.append(f"{what}: {error[:300]}")

    def p(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def said(self) -> str:
        return f"{self.sent} / {self.failed} ({self.unreachable} EHOSTUNREACH)"


class Load:
    """Client threads, each with its own pooled TritonClient over gRPC, asking the model ``pick`` names
    ``interval`` s apart until stopped; every answer checked (its model's offset) and counted."""

    def __init__(
        self,
        make_client: Callable[[], TritonClient],
        pick: Callable[[random.Random, int], str],
        threads: int,
        interval: float,
        offsets: dict[str, float],
    ) -> None:
        self.make_client = make_client
        self.pick = pick
        self.interval = interval
        self.offsets = offsets
        self.counts = Counts()
        self.stopped = threading.Event()
        self.t0 = time.monotonic()
        self.threads = [threading.Thread(target=self.client, args=(i,), daemon=True) for i in range(threads)]
        for thread in self.threads:
            thread.start()

    def client(self, seed: int) -> None:
        rng = random.Random(seed)
        a = INPUT0_ARRAY()
        b = INPUT1_ARRAY()
        client = self.make_client()
        turn = 0
        try:
            while not self.stopped.is_set():
                model = self.pick(rng, turn)
                turn += 1
                started = time.perf_counter()
                error = ""
                try:
                    out = client.model(model).run(a, b).as_numpy("OUTPUT0")
                    got = offset_of({"OUTPUT0": [float(x) for x in out[0]]})
                    error = "" if got == self.offsets[model] else f"offset {got:g}"
                except Exception as exc:  # every failure is counted, none ends the client
                    error = f"{type(exc).__name__}: {exc}"
                took = (time.perf_counter() - started) * 1000
                self.counts.add(took, error, f"{model} at {time.monotonic() - self.t0:.1f} s")
                self.stopped.wait(self.interval)
        finally:
            client.close()

    def stop(self) -> Counts:
        self.stopped.set()
        for thread in self.threads:
            thread.join(60)
        return self.counts


def INPUT0_ARRAY() -> Any:  # noqa: N802 - numpy only where a client runs
    import numpy as np  # noqa: PLC0415

    return np.array([INPUT0], np.float32)


def INPUT1_ARRAY() -> Any:  # noqa: N802
    import numpy as np  # noqa: PLC0415

    return np.array([INPUT1], np.float32)


@dataclass
class Layout:
    """One layout's figures (None: not measured; a step that did not end within its timeout says so in
    ``notes``)."""

    name: str
    pods: int
    pod_mib: int
    measured_mib: float | None = None
    all_answer_s: float | None = None
    new_model_s: float | None = None
    second_copy_s: float | None = None
    skewed: Counts = field(default_factory=Counts)
    notes: list[str] = field(default_factory=list)
    steps: dict[str, Any] = field(default_factory=dict)
    """The pool's steps: what each measured, and each load's counts."""

    def row(self) -> list[str]:
        def s(value: float | None) -> str:
            return "-" if value is None else f"{value:.1f}"

        second = "- (every pod holds every model)" if self.name != "pool" else s(self.second_copy_s)
        return [
            self.name,
            str(self.pods),
            f"{self.pod_mib:,}",
            f"{self.pods * self.pod_mib:,}",
            "not read" if self.measured_mib is None else f"{self.measured_mib:,.0f}",
            s(self.all_answer_s),
            s(self.new_model_s),
            second,
            self.skewed.said(),
            f"{self.skewed.p(0.50):.1f}",
            f"{self.skewed.p(0.99):.1f}",
        ]


HEADER = [
    "layout",
    "pods",
    "MiB a pod needs (declared)",
    "MiB in all",
    "measured MiB (working set)",
    "apply to every model answering, s",
    "a new model answers, s",
    "a busy model's second copy, s",
    "skewed load: requests / failed",
    "p50 ms",
    "p99 ms",
]


class Demo(Bench):
    """The demonstration's steps on one session (Bench: the models' names, the working set, the pool's
    status and a model's copies READY in its Service's endpoints)."""

    def __init__(self, session: Session, args: argparse.Namespace) -> None:
        super().__init__(session, args)
        self.hot = self.models[: args.hot]
        self.warm = self.models[args.hot]
        self.offsets = {m: self.offset(m) for m in [*self.models, self.new_model]}
        self.layouts: list[Layout] = []
        self.timeline: list[str] = []
        self.note_v = ""

    # ------------------------------------------------------------------ bodies

    def spec_models(self, models: Sequence[str], *, pool: bool) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = []
        for model in models:
            config = copy.deepcopy(ADD_SUB_CONFIG)
            if model == self.warm and self.note_v:
                config["parameters"] = {"note": {"stringValue": self.note_v}}
            entry: dict[str, Any] = {"name": model, "config": config}
            if pool:
                entry.update({"memory": self.args.memory, "minCopies": 1})
                if model in self.hot:
                    entry["maxCopies"] = HOT_MAX_COPIES
                elif model == self.warm:
                    entry["maxCopies"] = WARM_MAX_COPIES
            entries.append(entry)
        return entries

    def demo_body(self, name: str, models: Sequence[str], *, pool: bool) -> dict[str, Any]:
        args = self.args
        per_pod = len(models) if not pool else mib_of(args.budget) // mib_of(args.memory)
        # the container's limit: its models' stubs and what they hold, and tritonserver itself
        limit = per_pod * (args.hold + 60) + 512
        spec: dict[str, Any] = {
            "resources": {"cpu": "100m", "memory": f"{limit}Mi"},
            "shmSize": "256Mi",
            "models": self.spec_models(models, pool=pool),
            "startupTimeoutSeconds": 900,
            "drainSeconds": args.drain,
            "rollout": {"modelUpdates": "InPlace"},
        }
        replicas = args.every_pods
        if pool:
            replicas = args.pods
            spec["pool"] = {"memoryPerPod": args.budget, "scaling": SCALING}
            # an HPA the operator owns: the pool runs spec.replicas pods raised to what the copies need,
            # up to maxReplicas (its CPU metric has no metrics server here: the HPA itself moves nothing)
            spec["autoscaling"] = {
                "minReplicas": args.pods,
                "maxReplicas": args.max_pods,
                "metrics": [{"cpu": {"averageUtilization": 1000}}],
            }
        return on_real_node(
            name,
            self.session.namespace,
            bucket=self.bucket,
            endpoint=self.session.server.endpoint,
            replicas=replicas,
            **spec,
        )

    # ------------------------------------------------------------------ clients

    def client_factory(self, name: str, models: Sequence[str], *, pool: bool) -> Callable[[], TritonClient]:
        obj = self.session.kube.get(self.session.ts, name, namespace=self.session.namespace)
        main = self.session.cluster_ip(name)
        host: str | dict[str, str] = f"{main}:8001"
        if pool:
            host = {m: f"{self.session.cluster_ip(f'{name}-m-{m}')}:8001" for m in models}
            host[""] = f"{main}:8001"
        body = dict(obj)

        def make() -> TritonClient:
            return TritonClient.from_tritonservice(body, protocol="grpc", host=host)

        return make

    def start_load(
        self, make: Callable[[], TritonClient], pick: Callable[[random.Random, int], str], threads: int
    ) -> Load:
        return Load(make, pick, threads, self.args.interval, self.offsets)

    def skewed_pick(self, cold: Sequence[str]) -> Callable[[random.Random, int], str]:
        hot, share = self.hot, self.args.hot_percent

        def pick(rng: random.Random, _turn: int) -> str:
            return rng.choice(hot) if rng.random() * 100 < share else rng.choice(cold)

        return pick

    def counting(self, make: Callable[[], TritonClient], models: Sequence[str]) -> Load:
        """One thread asking every model in turn, the round spread over about a second."""
        ordered = list(models)
        load = Load(
            make, lambda _rng, turn: ordered[turn % len(ordered)], 1, 1.0 / len(ordered), self.offsets
        )
        return load

    # ------------------------------------------------------------------ reading the pool

    def pool_models(self, name: str) -> dict[str, dict[str, Any]]:
        entries = (self.session.status(name).get("pool") or {}).get("models") or []
        return {str(e.get("name")): e for e in entries}

    def measured_at_load(self, name: str) -> str:
        """The least and largest measuredMemory in status.pool, and how many models it names above their
        declared ``--memory`` (placement counts those at the measured figure)."""
        figures = [
            quantity_bytes(str(e["measuredMemory"])) / (1 << 20)
            for e in self.pool_models(name).values()
            if e.get("measuredMemory")
        ]
        if not figures:
            return "none measured"
        above = sum(1 for f in figures if f > mib_of(self.args.memory))
        return (
            f"{min(figures):.0f} to {max(figures):.0f} over {len(figures)} models;"
            f" {above} above the declared {self.args.memory}"
        )

    def pods_running(self, name: str) -> int:
        return len(self.session.pods(name))

    def sample(self, name: str, t0: float, stop: threading.Event) -> None:
        """Every 2 s, a line when the pool's pods or the hot and warm models' READY copies change."""
        last = ""
        while not stop.wait(2):
            with contextlib.suppress(Exception):
                status = self.session.status(name)
                entries = {e.get("name"): e for e in (status.get("pool") or {}).get("models") or []}
                copies = " ".join(self.copies_of(m, entries.get(m) or {}) for m in [*self.hot, self.warm])
                needed = (status.get("pool") or {}).get("podsNeeded")
                line = f"pods {self.pods_running(name)} (podsNeeded {needed}); READY copies {copies}"
                if line != last:
                    self.timeline.append(f"{time.monotonic() - t0:7.1f} s  {line}")
                    last = line

    @staticmethod
    def copies_of(model: str, entry: Mapping[str, Any]) -> str:
        """``model:READY copies``; where they differ from its placed copies or its wanted copies, also
        ``/placed/wanted`` and the reasons (status.pool's copiesReason, then placement's reason), so a
        copy that comes and goes in the timeline says why."""
        ready, placed, wanted = entry.get("readyCopies"), entry.get("copies"), entry.get("wantedCopies")
        if ready == placed == wanted:
            return f"{model}:{ready}"
        return f"{model}:{ready}/{placed}/{wanted}({entry.get('copiesReason')},{entry.get('reason')})"

    def placed_ready(self, name: str, models: Sequence[str]) -> bool:
        """Every model has at least one READY copy on its routes, and nothing moves."""
        entries = self.pool_models(name)
        return all((entries.get(m) or {}).get("readyCopies", 0) >= 1 for m in models) and self.at_rest(
            name, True
        )

    def stamps(self, name: str) -> dict[tuple[str, str], float]:
        """Per (pod, model it holds READY), the number the model drew at its load there."""
        out: dict[tuple[str, str], float] = {}
        for pod in self.session.pods(name):
            ip = pod.status.podIP if pod.status else None
            labels = (pod.metadata.labels or {}) if pod.metadata else {}
            for key in labels:
                if not key.startswith("model.triton-operator.io/"):
                    continue
                model = key.split("/", 1)[1]
                if model not in self.offsets or not ip:
                    continue
                with contextlib.suppress(InferenceError):
                    out[pod.metadata.name, model] = infer_add_sub(ip, model=model, timeout=5)["OUTPUT1"][0]
        return out

    def served_note(self, name: str, model: str) -> set[str]:
        """The ``note`` parameter ``model``'s config has on each pod labelled for it."""
        import urllib.request  # noqa: PLC0415

        notes = set()
        for pod in self.session.pods(name):
            labels = (pod.metadata.labels or {}) if pod.metadata else {}
            ip = pod.status.podIP if pod.status else None
            if f"model.triton-operator.io/{model}" not in labels or not ip:
                continue
            try:
                with urllib.request.urlopen(f"http://{ip}:8000/v2/models/{model}/config", timeout=5) as r:
                    config = json.loads(r.read())
            except (OSError, ValueError) as exc:
                notes.add(f"not read: {exc}")
                continue
            notes.add(str(config.get("parameters", {}).get("note", {}).get("string_value", "")))
        return notes

    @staticmethod
    def counted(steps: dict[str, Any], what: str, load: Load) -> None:
        """``load`` stopped: its counts under ``what``, and its first failed requests' errors."""
        counts = load.stop()
        steps[what] = counts.said()
        if counts.errors:
            steps[f"{what}: first errors"] = counts.errors

    # ------------------------------------------------------------------ a step, timed

    def timed(self, layout: Layout, what: str, probe: Callable[[], Any], timeout: float) -> float | None:
        started = time.monotonic()
        try:
            wait(probe, timeout, what, 1.0)
        except TimeoutError as exc:
            layout.notes.append(str(exc))
            say(str(exc))
            return None
        took = time.monotonic() - started
        say(f"{layout.name}: {what} in {took:.1f} s")
        return took

    # ------------------------------------------------------------------ every model everywhere

    def every(self) -> Layout:
        args = self.args
        name = "every"
        layout = Layout("every model everywhere", args.every_pods, len(self.models) * mib_of(args.memory))
        self.layouts.append(layout)
        say(f"{layout.name}: {len(self.models)} models on {args.every_pods} pods")
        started = time.monotonic()
        self.session.apply(self.demo_body(name, self.models, pool=False))
        host = self.session.cluster_ip(name)
        for model in self.models:
            wait(functools.partial(self.answers, host, model), args.timeout, f"{model} answering", 0.5)
        layout.all_answer_s = time.monotonic() - started
        wait(lambda: self.at_rest(name, False), args.timeout, "every: at rest", 1.0)
        time.sleep(3)
        layout.measured_mib = self.working_set_mib(name)
        make = self.client_factory(name, self.models, pool=False)
        load = self.start_load(make, self.skewed_pick(self.models[args.hot :]), args.clients)
        time.sleep(args.seconds)
        layout.skewed = load.stop()
        say(f"{layout.name}: skewed load {layout.skewed.said()}, p99 {layout.skewed.p(0.99):.1f} ms")
        started = time.monotonic()
        self.session.apply(self.demo_body(name, [*self.models, self.new_model], pool=False))
        layout.new_model_s = self.timed(
            layout, "the new model answering", lambda: self.answers(host, self.new_model), args.timeout
        )
        if layout.new_model_s is not None:
            layout.new_model_s = time.monotonic() - started
        self.session.gone(name, timeout=args.timeout)
        return layout

    # ------------------------------------------------------------------ the pool

    def pool(self) -> Layout:
        args = self.args
        name = "pool"
        layout = Layout("pool", args.pods, mib_of(args.budget))
        self.layouts.append(layout)
        steps = layout.steps
        say(f"pool: {len(self.models)} models on {args.pods} pods of {args.budget} (at most {args.max_pods})")
        t0 = started = time.monotonic()
        self.session.apply(self.demo_body(name, self.models, pool=True))
        hosts = {m: self.host_of(name, m, True) for m in self.models}
        for model in self.models:
            wait(
                functools.partial(self.answers, hosts[model], model), args.timeout, f"{model} answering", 0.5
            )
        layout.all_answer_s = time.monotonic() - started
        wait(lambda: self.at_rest(name, True), args.timeout, "pool: at rest", 1.0)
        time.sleep(3)
        layout.measured_mib = self.working_set_mib(name)
        steps["models' memory measured at their load (status.pool), MiB"] = self.measured_at_load(name)
        stop_sampling = threading.Event()
        sampler = threading.Thread(target=self.sample, args=(name, t0, stop_sampling), daemon=True)
        sampler.start()
        counting = self.counting(self.client_factory(name, self.models, pool=True), self.models)
        everyone = [*self.models, self.new_model]
        try:
            # 2. a new model
            started = time.monotonic()
            self.session.apply(self.demo_body(name, everyone, pool=True))
            host = self.host_of(name, self.new_model, True)
            if self.timed(layout, "the new model answering", lambda: self.answers(host, self.new_model), 300):
                layout.new_model_s = time.monotonic() - started
            self.timed(layout, "at rest with the new model", lambda: self.at_rest(name, True), 300)
            counting_all = self.counting(self.client_factory(name, everyone, pool=True), everyone)
            self.counted(steps, "counting client, before the new model", counting)
            counting = counting_all
            make = self.client_factory(name, everyone, pool=True)

            # 3. a busy model's second copy
            warm = self.start_load(make, lambda _rng, _turn: self.warm, args.clients)
            layout.second_copy_s = self.timed(
                layout,
                f"a second copy of {self.warm}",
                lambda: self.copies_ready(name, self.warm, 2),
                args.settle,
            )

            # 4. the warm model's new version in place, under its load
            before = self.stamps(name)
            self.note_v = "v2"
            self.session.apply(self.demo_body(name, everyone, pool=True))
            generation = self.session.kube.get(self.session.ts, name, namespace=self.session.namespace)[
                "metadata"
            ]["generation"]

            def in_place() -> bool:
                status = self.session.status(name)
                if status.get("observedGeneration") != generation or (status.get("inPlace") or {}).get(
                    "next"
                ):
                    return False
                return bool(status.get("servedRevision")) and self.served_note(name, self.warm) == {"v2"}

            steps["in place, s"] = self.timed(
                layout, f"{self.warm}'s new version in place", in_place, args.settle
            )
            self.timed(layout, "at rest after the in-place step", lambda: self.at_rest(name, True), 300)
            after = self.stamps(name)
            others = {k: v for k, v in before.items() if k[1] != self.warm}
            steps["in place: copies of other models loaded again"] = sum(
                1 for k, v in others.items() if k in after and after[k] != v
            )
            steps["in place: copies of other models compared"] = sum(1 for k in others if k in after)
            steps[f"in place: {self.warm}'s copies loaded again"] = sum(
                1 for k, v in before.items() if k[1] == self.warm and k in after and after[k] != v
            )
            self.counted(steps, "busy model's load (second copy, in place)", warm)

            # 5. the skewed load: the hot models grow, the warm one drops back
            growth = self.start_load(make, self.skewed_pick(everyone[args.hot :]), args.clients)
            started = time.monotonic()
            for model in self.hot:
                took = self.timed(
                    layout,
                    f"{model} at {HOT_MAX_COPIES} copies",
                    functools.partial(self.copies_ready, name, model, HOT_MAX_COPIES),
                    args.settle,
                )
                steps[f"{model}: {HOT_MAX_COPIES} copies, s"] = (
                    None if took is None else time.monotonic() - started
                )
            took = self.timed(
                layout,
                f"{self.warm} back to 1 copy",
                lambda: self.copies_ready(name, self.warm, 1),
                args.settle,
            )
            steps[f"{self.warm}: back to 1 copy, s"] = None if took is None else time.monotonic() - started
            steps["pool pods under the skewed load"] = self.pods_running(name)
            steps["podsNeeded under the skewed load"] = (self.session.status(name).get("pool") or {}).get(
                "podsNeeded"
            )
            measured = self.start_load(make, self.skewed_pick(everyone[args.hot :]), args.clients)
            self.counted(steps, "skewed load while copies grew", growth)
            time.sleep(args.seconds)
            layout.skewed = measured.stop()
            say(f"pool: skewed load {layout.skewed.said()}, p99 {layout.skewed.p(0.99):.1f} ms")

            # 6. a pod deleted under the skewed load
            from lightkube.resources.core_v1 import Pod  # noqa: PLC0415

            during = self.start_load(make, self.skewed_pick(everyone[args.hot :]), args.clients)
            victim = sorted(p.metadata.name for p in self.session.pods(name))[0]
            self.session.kube.delete(Pod, victim, namespace=self.session.namespace)
            time.sleep(5)
            steps["a pod deleted: every model READY again, s"] = self.timed(
                layout,
                "every model placed and READY again",
                lambda: self.placed_ready(name, everyone),
                args.settle,
            )
            self.timed(
                layout,
                f"{victim} gone (its drain and exit under the load)",
                lambda: victim not in {p.metadata.name for p in self.session.all_pods(name)},
                args.settle,
            )
            self.counted(steps, f"skewed load while a pod ({victim}) was deleted", during)

            # 7. the load stopped: copies drop, the pool follows
            steps["pods before the load stopped"] = self.pods_running(name)
            steps["the load stopped: the pool back to its least pods, s"] = self.timed(
                layout,
                f"the pool back to {args.pods} pods",
                lambda: self.pods_running(name) == args.pods and self.at_rest(name, True),
                args.settle,
            )
            steps["hot models' READY copies at the end"] = {
                m: (self.pool_models(name).get(m) or {}).get("readyCopies") for m in self.hot
            }
        finally:
            self.counted(steps, "counting client, every model throughout", counting)
            stop_sampling.set()
            sampler.join(10)
        self.session.gone(name, timeout=args.timeout)
        return layout

    # ------------------------------------------------------------------ the whole

    def run(self) -> None:
        self.bucket = f"pooldemo-{random.randrange(1 << 30):x}"
        self.session.s3.create_bucket(Bucket=self.bucket)
        for model in [*self.models, self.new_model]:
            body = stamped_holding_source(self.offsets[model], self.args.hold)
            self.session.s3.put_object(Bucket=self.bucket, Key=f"models/{model}/1/model.py", Body=body)
        if self.args.every_pods > 0:
            try:
                self.every()
            except TimeoutError as exc:
                self.layouts[-1].notes.append(str(exc))
                say(f"every model everywhere: {exc}")
                with contextlib.suppress(Exception):
                    self.session.gone("every", timeout=self.args.timeout)
        self.pool()

    def print_report(self) -> None:
        args = self.args
        print(
            f"{args.models} Python models holding {args.hold} MiB each, declaring {args.memory}; the pool: "
            f"{args.pods} pods of {args.budget} (at most {args.max_pods}); every model everywhere: "
            f"{args.every_pods} pods; skewed load: {args.clients} client threads, "
            f"{args.interval * 1000:g} ms between a thread's requests, {args.hot_percent}% to {args.hot} "
            f"models; p99 over {args.seconds:g} s"
        )
        if args.every_pods == 0:
            every_mib = len(self.models) * mib_of(args.memory)
            print(f"every model everywhere not run here: each pod would need {every_mib:,} MiB (declared)")
        print("| " + " | ".join(HEADER) + " |")
        print("|" + "---|" * len(HEADER))
        for layout in self.layouts:
            print("| " + " | ".join(layout.row()) + " |")
        for layout in self.layouts:
            for note in layout.notes:
                print(f"{layout.name}: {note}")
            for error in layout.skewed.errors:
                print(f"{layout.name}: a failed request: {error}")
            for key, value in layout.steps.items():
                print(
                    f"{layout.name}: {key}: {value:.1f}"
                    if isinstance(value, float)
                    else f"{layout.name}: {key}: {value}"
                )
        if self.timeline:
            print("The pool over time (s from its apply):")
            for line in self.timeline:
                print(f"  {line}")
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {
                        "layouts": [
                            {
                                "layout": x.name,
                                "pods": x.pods,
                                "podMiB": x.pod_mib,
                                "measuredMiB": x.measured_mib,
                                "allAnswerSeconds": x.all_answer_s,
                                "newModelSeconds": x.new_model_s,
                                "secondCopySeconds": x.second_copy_s,
                                "sent": x.skewed.sent,
                                "failed": x.skewed.failed,
                                "unreachable": x.skewed.unreachable,
                                "p50Ms": x.skewed.p(0.5),
                                "p99Ms": x.skewed.p(0.99),
                                "steps": x.steps,
                                "notes": x.notes,
                            }
                            for x in self.layouts
                        ],
                        "timeline": self.timeline,
                    },
                    indent=2,
                    default=str,
                )
            )


@dataclass(frozen=True)
class Plan:
    """The pods of ``--budget`` the operator's placement needs for the demo's models at their declared
    memory: every model once (the new one included), and at the peak of the skewed load."""

    at_rest: int
    at_peak: int

    def problems(self, args: argparse.Namespace) -> list[str]:
        found = []
        if self.at_rest > args.pods:
            found.append(
                f"--pods: {args.models + 1} models of {args.memory} need {self.at_rest} pods of"
                f" {args.budget}, not {args.pods}: raise --pods or --budget (the pool would never be"
                " back to --pods)"
            )
        if self.at_peak > args.max_pods:
            found.append(
                f"--max-pods: the hot models' {HOT_MAX_COPIES} copies and the warm one's {WARM_MAX_COPIES}"
                f" need {self.at_peak} pods of {args.budget} at {args.memory} a model (the operator's"
                f" placement), more than {args.max_pods}: raise --max-pods or --budget (the copies would"
                " be held back, MemoryShort)"
            )
        return found


def plan(args: argparse.Namespace) -> Plan:
    """The pods ``args``' models need (declared memory, the operator's placement)."""
    memory = mib_of(args.memory) << 20
    budget = mib_of(args.budget) << 20
    names = [f"m{i}" for i in range(args.models + 1)]

    def models(hot: int, warm: int) -> list[PoolModel]:
        return [
            PoolModel(name, memory, 1, None, hot if i < args.hot else warm if i == args.hot else 1)
            for i, name in enumerate(names)
        ]

    peak = models(HOT_MAX_COPIES, WARM_MAX_COPIES)
    return Plan(pods_needed(models(1, 1), budget), pods_needed(peak, budget))


def every_pods_that_fit(args: argparse.Namespace) -> int:
    """As many every-model-everywhere pods as this machine's available memory holds with ``--reserve``
    MiB left to the rest, each needing its container's memory limit (each model's ``--hold`` plus 60 MiB,
    and 512 MiB); at most ``--pods``."""
    available = 0
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) // 1024
    need = int(args.models) * (int(args.hold) + 60) + 512
    return max(0, min(int(args.pods), (available - int(args.reserve)) // need))


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", type=int, default=40)
    parser.add_argument("--hold", type=int, default=80, help="MiB each model holds once loaded")
    parser.add_argument(
        "--memory", default="120Mi", help="each model's declared memory (what one measures at --hold 80)"
    )
    parser.add_argument("--pods", type=int, default=4, help="the pool's pods (its least)")
    parser.add_argument("--max-pods", type=int, default=6, help="the pool's most pods (maxReplicas)")
    parser.add_argument("--budget", default="1400Mi", help="spec.pool.memoryPerPod")
    parser.add_argument(
        "--every-pods", type=int, default=-1, help="every model everywhere's pods (-1: as many as fit)"
    )
    parser.add_argument("--reserve", type=int, default=8000, help="MiB left to the rest of the machine")
    parser.add_argument("--hot", type=int, default=3, help="the hot models (the first ones)")
    parser.add_argument("--hot-percent", type=int, default=80)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--interval", type=float, default=0.01)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--drain", type=int, default=30, help="spec.drainSeconds")
    parser.add_argument("--settle", type=float, default=300.0, help="seconds each pool step may take")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for every model")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--plan", action="store_true", help="print the pods the pool needs and stop")
    args = parser.parse_args()
    if args.models < args.hot + 2:
        raise SystemExit("--models must be at least --hot + 2")
    needs = plan(args)
    print(
        f"the pool's pods of {args.budget} for {args.models + 1} models of {args.memory} (the operator's"
        f" placement): {needs.at_rest} at rest (--pods {args.pods}), {needs.at_peak} at the peak"
        f" (--max-pods {args.max_pods})",
        flush=True,
    )
    problems = needs.problems(args)
    if problems:
        raise SystemExit("\n".join(problems))
    if args.plan:
        return 0
    if args.every_pods < 0:
        args.every_pods = every_pods_that_fit(args)
        say(f"every model everywhere: {args.every_pods} pods fit this machine's available memory")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    with tempfile.TemporaryDirectory(prefix="pool-demo-") as tmp:
        demo: Demo | None = None

        def measure(node: dict[str, Any]) -> None:
            nonlocal demo
            session = Session(node, Path(tmp), "pooldemo")
            demo = Demo(session, args)
            session.start()
            try:
                demo.run()
            finally:
                session.stop()

        return run_with_cluster(
            measure,
            lambda: demo.print_report() if demo is not None else None,
            measured=lambda: len(demo.layouts) if demo is not None else 0,
        )


if __name__ == "__main__":
    sys.exit(main())
