"""Prometheus metrics of the operator itself: reconciles, rollouts, repository listings, pods' time to
serve, pooled models' load; the HTTP server."""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
    start_http_server,
)

from triton_operator import __version__
from triton_operator.core.observed.observation import PodState
from triton_operator.core.pod.startup import IN_PLACE_PHASES, PHASES, in_place_phases, parse_timeline
from triton_operator.core.pool.copies import Figures
from triton_operator.core.rollout.hostpods import AgentStatus
from triton_operator.settings import SettingsError

PREFIX = "triton_operator"
DEFAULT_PORT = 8080
"""Port of `/metrics`; the chart's metrics Service targets it."""
PORT_ENV = "TRITON_OPERATOR_METRICS_PORT"
"""Environment variable that overrides DEFAULT_PORT (set by the Helm chart)."""

# Reconciles are API round trips: from a few milliseconds to a bucket listing of minutes.
RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
LISTING_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
# A pod's start: from a second (a warm node, a small repository) to the better part of an hour (a
# multi-GB repository from a slow store, a large tritonserver image).
START_BUCKETS = (0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0)
MiB = 1024 * 1024
# Bytes a pod's sync read from the store: 0 (everything already on the node) up to a large model.
FETCHED_BUCKETS = (0.0, MiB, 16 * MiB, 128 * MiB, 512 * MiB, 1024 * MiB, 4096 * MiB, 16384 * MiB, 65536 * MiB)
TOTAL_PHASE = "total"
"""The time_to_serve_seconds phase label of a pod's whole start, created -> Ready."""
POD_STARTS_KEPT = 10_000
"""Pods whose start was observed, remembered so that each is observed once (the oldest forgotten)."""

SUCCESS = "success"
ERROR = "error"
SUPERSEDED = "superseded"
"""A pass whose status write found the TritonService changed since it read it (no error)."""


@dataclass
class ReconcileOutcome:
    """What one timed reconcile ended as; `reconcile_timer` yields it to the caller."""

    outcome: str = SUCCESS
    reasons: list[str] = field(default_factory=list)

    def fail(self, reason: str, outcome: str = ERROR) -> None:
        """Mark the reconcile as failed for ``reason`` (counted once in the errors counter)."""
        self.outcome = outcome
        self.reasons.append(reason)


class OperatorMetrics:
    """Every metric the operator exposes, bound to one registry (tests build their own)."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        process: bool = False,
        since: datetime | None = None,
    ) -> None:
        self.since = since if since is not None else datetime.now(UTC)
        """Pods Ready before this (the process's start) are not starts it saw: never observed."""
        self._pod_starts: OrderedDict[str, None] = OrderedDict()
        self._in_place: OrderedDict[tuple[str, str], None] = OrderedDict()
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        if process:
            ProcessCollector(registry=self.registry)
            PlatformCollector(registry=self.registry)
        reg = self.registry
        self.info = Gauge(
            f"{PREFIX}_info", "Build information of the running operator.", ["version"], registry=reg
        )
        self.info.labels(version=__version__).set(1)
        self.reconcile_duration = Histogram(
            f"{PREFIX}_reconcile_duration_seconds",
            "Duration of one reconcile of a TritonService, by outcome.",
            ["outcome"],
            buckets=RECONCILE_BUCKETS,
            registry=reg,
        )
        self.reconcile_errors = Counter(
            f"{PREFIX}_reconcile_errors",
            "Reconciles that failed, by reason.",
            ["reason"],
            registry=reg,
        )
        self._per_service: list[Gauge] = []
        self.rollout_step_index = self._service_gauge(
            "rollout_step_index",
            "Index of the current canary step of a TritonService (status.currentStepIndex).",
        )
        self.canary_weight = self._service_gauge(
            "canary_weight_percent",
            "Share of traffic (0-100) sent to the canary revision of a TritonService.",
        )
        self.repository_list_duration = Histogram(
            f"{PREFIX}_repository_list_duration_seconds",
            "Duration of listing a model repository to pin its manifest, by URI scheme.",
            ["scheme"],
            buckets=LISTING_BUCKETS,
            registry=reg,
        )
        self.repository_objects = self._service_gauge(
            "repository_objects", "Objects in the pinned repository manifest of a TritonService."
        )
        self.repository_bytes = self._service_gauge(
            "repository_bytes",
            "Total size in bytes of the pinned repository manifest (what the sync init container downloads).",
        )

        self._pool_models: dict[tuple[str, str], set[str]] = {}
        self.pool_model_rate = Gauge(
            f"{PREFIX}_pool_model_inferences_per_second",
            "A pooled model's inferences per second over spec.pool.scaling.windowSeconds, all its copies "
            "together (Triton's per-model counters, as the copies decision reads them).",
            ["namespace", "name", "model"],
            registry=reg,
        )
        self.pool_model_queue = Gauge(
            f"{PREFIX}_pool_model_queue_microseconds",
            "A pooled model's requests' average time in Triton's queue over the window (no series: no "
            "request in the window).",
            ["namespace", "name", "model"],
            registry=reg,
        )

        self.time_to_serve = Histogram(
            f"{PREFIX}_time_to_serve_seconds",
            "A pod's start, by phase (core.pod.startup: scheduling, imageAndSandbox, sync, "
            "tritonserverStart, tritonserverLoad; total: created -> Ready), read from its status; once per "
            "pod, when it is first seen Ready.",
            ["phase"],
            buckets=START_BUCKETS,
            registry=reg,
        )
        for phase in (*PHASES, TOTAL_PHASE):
            self.time_to_serve.labels(phase=phase)  # every phase listed from the start, at 0
        self.time_to_serve_fetched = Histogram(
            f"{PREFIX}_time_to_serve_fetched_bytes",
            "Bytes a pod's sync read from the store (its sync init container's termination message, or its "
            "model agent's first fill), once per pod.",
            buckets=FETCHED_BUCKETS,
            registry=reg,
        )
        self.in_place_update = Histogram(
            f"{PREFIX}_in_place_update_seconds",
            "A revision applied in place by one pod's model agent, by phase (core.pod.startup: sync, "
            "drain, tritonserverLoad; total: the agent began -> every model loaded), from the agent's own "
            "record; once per pod and revision.",
            ["phase"],
            buckets=START_BUCKETS,
            registry=reg,
        )
        for phase in (*IN_PLACE_PHASES, TOTAL_PHASE):
            self.in_place_update.labels(phase=phase)
        self.in_place_update_fetched = Histogram(
            f"{PREFIX}_in_place_update_fetched_bytes",
            "Bytes a pod's model agent read from the store for a revision applied in place (what changed).",
            buckets=FETCHED_BUCKETS,
            registry=reg,
        )

    def _service_gauge(self, name: str, documentation: str) -> Gauge:
        """A gauge with one series per TritonService (labels namespace, name); ``forget`` drops them."""
        gauge = Gauge(f"{PREFIX}_{name}", documentation, ["namespace", "name"], registry=self.registry)
        self._per_service.append(gauge)
        return gauge

    @contextmanager
    def reconcile_timer(self) -> Iterator[ReconcileOutcome]:
        """Time a reconcile; an exception (re-raised) counts as an error with its class name as reason."""
        result = ReconcileOutcome()
        started = time.perf_counter()
        try:
            yield result
        except BaseException as exc:
            if not result.reasons:
                result.fail(type(exc).__name__)
            raise
        finally:
            self.record_reconcile(time.perf_counter() - started, result)

    def record_reconcile(self, seconds: float, result: ReconcileOutcome) -> None:
        """Record a reconcile that took ``seconds`` and ended as ``result``."""
        self.reconcile_duration.labels(outcome=result.outcome).observe(max(seconds, 0.0))
        for reason in result.reasons:
            self.reconcile_errors.labels(reason=reason).inc()

    def set_rollout(self, namespace: str, name: str, *, step_index: int | None, canary_weight: int) -> None:
        """Publish the rollout position of one TritonService; no step (no rollout) reads as -1."""
        self.rollout_step_index.labels(namespace=namespace, name=name).set(
            -1 if step_index is None else step_index
        )
        self.canary_weight.labels(namespace=namespace, name=name).set(canary_weight)

    def set_pool_load(self, namespace: str, name: str, load: Mapping[str, Figures] | None) -> None:
        """Publish each pooled model's figures over its window as the pass read them (None: not read over
        a window yet, or no pool: its series go). They are metrics, not status: they move every window."""
        key = (namespace, name)
        before = self._pool_models.pop(key, set())
        now = dict(load or {})
        for model in before - set(now):
            self._drop_pool_model(namespace, name, model)
        for model, figures in now.items():
            labels = {"namespace": namespace, "name": name, "model": model}
            self.pool_model_rate.labels(**labels).set(figures.inferences_per_second)
            if figures.queue_us is not None:
                self.pool_model_queue.labels(**labels).set(figures.queue_us)
            else:
                with suppress(KeyError):
                    self.pool_model_queue.remove(namespace, name, model)
        if now:
            self._pool_models[key] = set(now)

    def _drop_pool_model(self, namespace: str, name: str, model: str) -> None:
        for gauge in (self.pool_model_rate, self.pool_model_queue):
            with suppress(KeyError):
                gauge.remove(namespace, name, model)

    def record_repository_listing(
        self, namespace: str, name: str, *, scheme: str, seconds: float, objects: int, total_bytes: int
    ) -> None:
        """Record one listing of a TritonService's repository and the manifest it pinned."""
        self.repository_list_duration.labels(scheme=scheme).observe(max(seconds, 0.0))
        self.repository_objects.labels(namespace=namespace, name=name).set(objects)
        self.repository_bytes.labels(namespace=namespace, name=name).set(total_bytes)

    def record_pod_starts(self, pods: Iterable[PodState]) -> int:
        """Observe the start of each pod first seen Ready (by uid) that became Ready since ``since``:
        its phases, its whole start and the bytes its sync fetched. Returns how many were observed."""
        observed = 0
        for pod in pods:
            start = pod.start
            if not pod.ready or not pod.uid or pod.uid in self._pod_starts:
                continue
            if start.ready is None or start.created is None or start.ready < self.since:
                continue
            self._pod_starts[pod.uid] = None
            while len(self._pod_starts) > POD_STARTS_KEPT:
                self._pod_starts.popitem(last=False)
            for phase, seconds in start.phases().items():
                self.time_to_serve.labels(phase=phase).observe(seconds)
            self.time_to_serve.labels(phase=TOTAL_PHASE).observe(start.total or 0.0)
            counts = start.bytes()  # its sync's summary, or (one shape) its agent's fill
            if counts is not None:
                self.time_to_serve_fetched.observe(counts[1])
            observed += 1
        return observed

    def record_in_place(self, pods: Iterable[PodState], agents: Mapping[str, AgentStatus]) -> int:
        """Observe each revision a pod's agent applied in place (its ``inPlace`` record, read while an
        in-place update moves: reconcile.observe.observe_agents) once every model of it is loaded and
        since ``since``: its phases and the bytes it fetched, once per pod and revision. Returns how
        many were observed."""
        uids = {p.name: p.uid for p in pods}
        observed = 0
        for name, agent in sorted(agents.items()):
            timeline = parse_timeline(agent.in_place)
            if timeline is None or timeline.loaded is None or timeline.loaded < self.since:
                continue
            key = (uids.get(name) or name, timeline.revision)
            if key in self._in_place:
                continue
            self._in_place[key] = None
            while len(self._in_place) > POD_STARTS_KEPT:
                self._in_place.popitem(last=False)
            for phase, seconds in in_place_phases(timeline).items():
                self.in_place_update.labels(phase=phase).observe(seconds)
            self.in_place_update_fetched.observe(timeline.fetched_bytes)
            observed += 1
        return observed

    def forget(self, namespace: str, name: str) -> None:
        """Drop the per-TritonService series of a deleted resource, so no stale series remain."""
        for gauge in self._per_service:
            with suppress(KeyError):
                gauge.remove(namespace, name)
        for model in self._pool_models.pop((namespace, name), set()):
            self._drop_pool_model(namespace, name, model)

    def render(self) -> bytes:
        """The registry in the Prometheus text exposition format."""
        return generate_latest(self.registry)


METRICS = OperatorMetrics(process=True)
"""The process-wide metrics; the operator's code records into this one."""


def port_from_env(environ: Mapping[str, str] | None = None) -> int:
    """The metrics port: $TRITON_OPERATOR_METRICS_PORT, else DEFAULT_PORT."""
    env = os.environ if environ is None else environ
    value = env.get(PORT_ENV, "").strip()
    if not value:
        return DEFAULT_PORT
    port = int(value) if value.isdigit() else -1
    if not 0 <= port <= 65535:
        raise SettingsError(f"{PORT_ENV}={value!r}: accepts a port, 0 to 65535 (0 picks a free one)")
    return port


def start_metrics_server(
    port: int = DEFAULT_PORT, addr: str = "0.0.0.0", metrics: OperatorMetrics = METRICS
) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``metrics`` on http://addr:port/metrics in a daemon thread; port 0 picks a free port."""
    server, thread = start_http_server(port, addr=addr, registry=metrics.registry)
    return server, thread
