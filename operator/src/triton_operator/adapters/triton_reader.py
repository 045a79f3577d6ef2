"""Bounded background reads of Triton's own view of each pod: its repository index and its metrics."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
import time
from collections.abc import Callable, Mapping, Sequence

import httpx2
from prometheus_client.parser import text_string_to_metric_families

from triton_operator.core.analysis import Counters
from triton_operator.core.traffic import HTTP_PORT, METRICS_PORT
from triton_operator.core.triton_state import ModelVersionState, index_json, parse_index

logger = logging.getLogger(__name__)

# The bounds (a reconcile never waits on a pod):
#   * reads run in this reader's own task, never in a reconcile: a reconcile hands over the pods
#     it saw (`watch`) and takes the readings it finds (`readings`);
#   * one index request per pod per `period`, one metrics request per pod per metrics interval
#     (only for pods under canary analysis), each with `timeout`;
#   * at most `concurrency` requests at once over the whole operator;
#   * only pod IPs in `cidrs` (when set) are ever contacted.
# A reading whose index differs from the last one calls `on_change(owner)`: the owner is reconciled
# so that status.models follows Triton without waiting for a pod event.

Owner = tuple[str, str]
"""(namespace, name) of a TritonService."""

TICK_SECONDS = 1.0
MAX_METRICS_BYTES = 4 * 1024 * 1024
"""A metrics page larger than this is not parsed (a model repository of thousands of models)."""

# Triton's metric families (as prometheus_client names counters: without the _total suffix).
_FAMILIES = {
    "nv_inference_request_success": "success",
    "nv_inference_request_failure": "failure",
    "nv_inference_request_duration_us": "request_us",
    "nv_inference_queue_duration_us": "queue_us",
    "nv_inference_compute_infer_duration_us": "compute_us",
}


@dataclasses.dataclass(frozen=True)
class PodTarget:
    """A pod to read: who owns it, where it is, and whether its metrics are wanted."""

    uid: str
    ip: str
    revision: str
    restarts: int = 0
    """The tritonserver container's restart count: a new count is a new process (counters from 0)."""


@dataclasses.dataclass(frozen=True)
class PodReading:
    """The last reading of a pod (of its current tritonserver process)."""

    uid: str
    revision: str
    restarts: int
    read_at: float
    """time.monotonic() of the index read."""
    index: tuple[ModelVersionState, ...] | None = None
    error: str | None = None
    """Why the index could not be read (None when it was)."""
    counters: Mapping[str, Counters] | None = None
    """Triton's counters by model, from the last metrics read (None: not read)."""
    counters_at: float = 0.0

    @property
    def key(self) -> str:
        """The pod's process: uid and restart count (Triton's counters start again at a restart)."""
        return f"{self.uid}/{self.restarts}"


def parse_metrics(text: str) -> dict[str, Counters]:
    """Triton's per-model counters from its metrics page (Prometheus text), summed over versions
    and failure reasons, with prometheus_client's parser."""
    sums: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        field = _FAMILIES.get(family.name)
        if field is None:
            continue
        for sample in family.samples:
            if sample.name not in (family.name, f"{family.name}_total"):
                continue  # _created samples
            model = sample.labels.get("model")
            if model:
                per = sums.setdefault(model, {})
                per[field] = per.get(field, 0.0) + float(sample.value)
    return {model: Counters(**fields) for model, fields in sums.items()}


class TritonReader:
    """Reads every watched pod's repository index each ``period`` and, for the pods of a canary
    under analysis, its metrics each analysis interval; keeps the last reading of each pod."""

    def __init__(
        self,
        *,
        period: float = 30.0,
        timeout: float = 2.0,
        concurrency: int = 32,
        cidrs: Sequence[str] = (),
        on_change: Callable[[Owner], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        ports: tuple[int, int] = (HTTP_PORT, METRICS_PORT),
    ) -> None:
        self.period = period
        self.http_port, self.metrics_port = ports
        self.timeout = timeout
        self.on_change = on_change
        self.clock = clock
        self._networks = [ipaddress.ip_network(c, strict=False) for c in cidrs]
        self._limit = asyncio.Semaphore(concurrency)
        self._targets: dict[Owner, dict[str, PodTarget]] = {}
        self._metrics: dict[Owner, float] = {}
        """Owners whose pods' metrics are wanted, and how often (seconds)."""
        self._readings: dict[str, PodReading] = {}
        self._inflight: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.Task[None] | None = None
        self._client: httpx2.AsyncClient | None = None
        self.requests = 0
        """Requests sent so far (index and metrics), for the benchmark."""

    # ------------------------------------------------------------- what the reconcile calls

    def allowed(self, ip: str | None) -> bool:
        if not ip:
            return False
        if not self._networks:
            return True
        try:
            address = ipaddress.ip_address(ip)
        except ValueError:
            return False
        return any(address in network for network in self._networks)

    def watch(self, owner: Owner, targets: Sequence[PodTarget], metrics_every: float | None = None) -> None:
        """Read these pods of ``owner`` from now on (replacing the ones it had); ``metrics_every``:
        also their metrics, that often. Starts the reading task if it is not running."""
        kept = {t.uid: t for t in targets if self.allowed(t.ip)}
        self._targets[owner] = kept
        if metrics_every is None:
            self._metrics.pop(owner, None)
        else:
            self._metrics[owner] = metrics_every
        self._start()

    def readings(self, owner: Owner) -> dict[str, PodReading]:
        """The last reading of each watched pod of ``owner`` (of its current process), by uid."""
        out = {}
        for uid, target in self._targets.get(owner, {}).items():
            reading = self._current(target)
            if reading is not None:
                out[uid] = reading
        return out

    def _current(self, target: PodTarget) -> PodReading | None:
        """The last reading of the pod's current tritonserver process (None: none yet)."""
        reading = self._readings.get(target.uid)
        return reading if reading is not None and reading.restarts == target.restarts else None

    def forget(self, owner: Owner) -> None:
        for uid in self._targets.pop(owner, {}):
            self._readings.pop(uid, None)
        self._metrics.pop(owner, None)

    def clear(self) -> None:
        """Read nothing more until pods are watched again (a paused replica)."""
        self._targets.clear()
        self._metrics.clear()
        self._readings.clear()

    async def close(self) -> None:
        tasks = [t for t in (self._loop, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._loop = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # ------------------------------------------------------------- the reading task

    def _start(self) -> None:
        if self._loop is None or self._loop.done():
            self._loop = asyncio.create_task(self._run(), name="triton-reader")

    async def _run(self) -> None:
        while True:
            self.tick()
            await asyncio.sleep(TICK_SECONDS)

    def tick(self) -> None:
        """Start a read of every pod whose last one is older than its period (and none is running)."""
        now = self.clock()
        for owner, targets in list(self._targets.items()):
            metrics_every = self._metrics.get(owner)
            for uid, target in targets.items():
                if uid in self._inflight:
                    continue
                last = self._current(target)
                index_due = last is None or now - last.read_at >= self.period
                metrics_due = metrics_every is not None and (
                    last is None or last.counters is None or now - last.counters_at >= metrics_every
                )
                if index_due or metrics_due:
                    self._inflight.add(uid)
                    task = asyncio.create_task(self._read(owner, target, metrics_due))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)

    def client(self) -> httpx2.AsyncClient:
        if self._client is None:
            self._client = httpx2.AsyncClient(timeout=httpx2.Timeout(self.timeout), trust_env=False)
        return self._client

    async def _read(self, owner: Owner, target: PodTarget, metrics: bool) -> None:
        try:
            async with self._limit:
                reading = await self.read_pod(target, metrics=metrics, previous=self._current(target))
        except asyncio.CancelledError:
            raise
        except Exception:  # a reading never stops the reader
            logger.exception("reading Triton on pod %s failed", target.uid)
            return
        finally:
            self._inflight.discard(target.uid)
        if target.uid not in self._targets.get(owner, {}):
            return  # forgotten meanwhile
        before = self._readings.get(target.uid)
        self._readings[target.uid] = reading
        changed = before is None or (before.index, before.error) != (reading.index, reading.error)
        if changed and self.on_change is not None:
            self.on_change(owner)

    async def read_pod(self, target: PodTarget, *, metrics: bool, previous: PodReading | None) -> PodReading:
        """One index read (and a metrics read when asked) of one pod, each bounded by ``timeout``;
        ``previous``: the last reading of the same process, whose counters are kept when not read."""
        client = self.client()
        now = self.clock()
        index: tuple[ModelVersionState, ...] | None = None
        error = None
        self.requests += 1
        try:
            url = f"http://{_host(target.ip)}:{self.http_port}/v2/repository/index"
            response = await client.post(url, json={})
            payload = index_json(response.content) if response.status_code == 200 else None
            if payload is None:
                error = f"repository index: HTTP {response.status_code}"
            else:
                index = parse_index(payload)
        except httpx2.HTTPError as exc:
            error = f"repository index: {type(exc).__name__}"
        counters = previous.counters if previous is not None else None
        counters_at = previous.counters_at if previous is not None else 0.0
        if metrics:
            self.requests += 1
            with contextlib.suppress(httpx2.HTTPError, ValueError):
                response = await client.get(f"http://{_host(target.ip)}:{self.metrics_port}/metrics")
                if response.status_code == 200 and len(response.content) <= MAX_METRICS_BYTES:
                    counters = parse_metrics(response.text)
                    counters_at = self.clock()
        return PodReading(
            uid=target.uid,
            revision=target.revision,
            restarts=target.restarts,
            read_at=now,
            index=index,
            error=error,
            counters=counters,
            counters_at=counters_at,
        )


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip
