"""Bounded background reads of Triton's own view of each pod: its repository index and its metrics."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence

import httpx2
from prometheus_client.parser import text_string_to_metric_families

from triton_operator.core.objects.names import HTTP_PORT, METRICS_PORT
from triton_operator.core.rollout.canary_analysis import Counters
from triton_operator.core.vocabulary.triton_state import ModelVersionState, index_json, parse_index
from triton_operator.settings import may_read, read_networks

logger = logging.getLogger(__name__)

# The bounds (a reconcile never waits on a pod):
#   * reads run in this reader's own task, never in a reconcile: a reconcile hands over the pods
#     it saw (`watch`) and takes the readings it finds (`readings`);
#   * one index request per pod per `period`, one metrics request per pod per metrics interval
#     (only for pods under canary analysis), a failed one included;
#   * each request, its whole body included, ends within `timeout` seconds (a total, not a limit
#     per socket read: a pod sending a byte a second is cut off like a silent one) and reads at most
#     `max_bytes` of body (a longer one, announced or streamed, is dropped at that point, never held
#     whole); either way the reading is missing (`PodReading.error`, `PodReading.metrics_error`),
#     and a missing metrics reading is what the canary analysis judges as such (reconcile.analysis);
#   * at most `concurrency` requests at once over the whole operator, so a slow pod holds a slot
#     for at most 2 x `timeout` per read;
#   * only pod IPs in `cidrs` (when set) are ever contacted;
#   * only the pods watched now are kept: a pod no longer handed over is forgotten with its reading.
# A reading whose index differs from the last one calls `on_change(owner)`: the owner is reconciled
# so that status.models follows Triton without waiting for a pod event.

Owner = tuple[str, str]
"""(namespace, name) of a TritonService."""

TICK_SECONDS = 1.0
MAX_RESPONSE_BYTES = 4 * 1024 * 1024
"""The most body read of one response (a repository index or a metrics page); a longer one is cut
off there and its reading is missing (a metrics page of thousands of models fits)."""
_IDENTITY = {"Accept-Encoding": "identity"}
"""No compressed body: the bytes counted against the bound are the bytes held."""

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
    name: str = ""
    """The pod's name, for messages."""


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
    """Triton's counters by model, from the last metrics read (None: not read, or the last read
    failed: a missing reading, see ``metrics_error``)."""
    counters_at: float = 0.0
    """time.monotonic() of the metrics read that gave ``counters``."""
    metrics_at: float = 0.0
    """time.monotonic() of the last metrics read, failed or not (the next one is due an interval later)."""
    metrics_error: str | None = None
    """Why the last metrics read gave no counters (None when it gave them, or none was made)."""

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
        max_bytes: int = MAX_RESPONSE_BYTES,
    ) -> None:
        self.period = period
        self.http_port, self.metrics_port = ports
        self.timeout = timeout
        self.on_change = on_change
        self.clock = clock
        self._networks = read_networks(cidrs)
        self._limit = asyncio.Semaphore(concurrency)
        self._targets: dict[Owner, dict[str, PodTarget]] = {}
        self._metrics: dict[Owner, float] = {}
        """Owners whose pods' metrics are wanted, and how often (seconds)."""
        self._readings: dict[str, PodReading] = {}
        self._inflight: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.Task[None] | None = None
        self._client: httpx2.AsyncClient | None = None
        self.max_bytes = max_bytes
        self.requests = 0
        """Requests sent so far (index and metrics), for the benchmark."""
        self.bytes_read = 0
        """Response body bytes received so far (index and metrics), for the benchmark and tests."""

    # ------------------------------------------------------------- what the reconcile calls

    def allowed(self, ip: str | None) -> bool:
        return may_read(ip, self._networks)

    def watch(self, owner: Owner, targets: Sequence[PodTarget], metrics_every: float | None = None) -> None:
        """Read these pods of ``owner`` from now on (replacing the ones it had); ``metrics_every``:
        also their metrics, that often. Starts the reading task if it is not running. The readings
        of the pods it had and has no more are forgotten (pod churn never grows the reader)."""
        kept = {t.uid: t for t in targets if self.allowed(t.ip)}
        for gone in self._targets.get(owner, {}).keys() - kept.keys():
            self._readings.pop(gone, None)
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

    @property
    def held(self) -> int:
        """How many pods' readings are kept (never more than the pods watched)."""
        return len(self._readings)

    def forget(self, owner: Owner) -> None:
        for uid in self._targets.pop(owner, {}):
            self._readings.pop(uid, None)
        self._metrics.pop(owner, None)

    def clear(self) -> None:
        """Read nothing more until pods are watched again (a paused replica)."""
        self._targets.clear()
        self._metrics.clear()
        self._readings.clear()

    async def wait_reads(self) -> None:
        """Wait for the reads in flight (tests, benchmarks)."""
        await asyncio.gather(*list(self._tasks), return_exceptions=True)

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
                # A failed metrics read waits its interval too: a pod that never answers in time
                # costs one bounded read an interval, never a read a tick.
                metrics_due = metrics_every is not None and (
                    last is None or last.metrics_at <= 0 or now - last.metrics_at >= metrics_every
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
        """One index read (and a metrics read when asked) of one pod, each bounded by ``timeout``
        in all and by ``max_bytes`` of body; ``previous``: the last reading of the same process,
        whose counters are kept when the metrics are not read (a failed read drops them)."""
        base = f"http://{_host(target.ip)}"
        now = self.clock()
        index: tuple[ModelVersionState, ...] | None = None
        self.requests += 1
        status, body, error = await self.fetch("POST", f"{base}:{self.http_port}/v2/repository/index")
        if error is None:
            payload = index_json(body) if status == 200 else None
            if payload is None:
                error = f"HTTP {status}" if status != 200 else "not a repository index"
            else:
                index = parse_index(payload)
        counters = previous.counters if previous is not None else None
        counters_at = previous.counters_at if previous is not None else 0.0
        metrics_at = previous.metrics_at if previous is not None else 0.0
        metrics_error = previous.metrics_error if previous is not None else None
        if metrics:
            self.requests += 1
            counters, metrics_error = None, None
            status, body, metrics_error = await self.fetch("GET", f"{base}:{self.metrics_port}/metrics")
            metrics_at = self.clock()
            if metrics_error is None and status != 200:
                metrics_error = f"HTTP {status}"
            if metrics_error is None:
                try:
                    counters = parse_metrics(body.decode("utf-8", "replace"))
                    counters_at = metrics_at
                except ValueError as exc:
                    metrics_error = f"not Prometheus text: {exc}"[:200]
        return PodReading(
            uid=target.uid,
            revision=target.revision,
            restarts=target.restarts,
            read_at=now,
            index=index,
            error=f"repository index: {error}" if error is not None else None,
            counters=counters,
            counters_at=counters_at,
            metrics_at=metrics_at,
            metrics_error=f"metrics: {metrics_error}" if metrics_error is not None else None,
        )

    async def fetch(self, method: str, url: str) -> tuple[int, bytes, str | None]:
        """One request: its status, its body (read only on a 200), and why it failed (None: it did
        not). The whole exchange ends within ``timeout``; a body longer than ``max_bytes`` (as
        announced, or as it streams) is dropped as soon as that is known."""
        try:
            async with asyncio.timeout(self.timeout):
                async with self.client().stream(method, url, headers=_IDENTITY) as response:
                    if response.status_code != 200:
                        return response.status_code, b"", None
                    return 200, await self._body(response), None
        except TimeoutError:
            return 0, b"", f"no complete answer within {self.timeout:g}s"
        except _TooLargeError:
            return 0, b"", f"answer larger than {self.max_bytes} bytes"
        except httpx2.HTTPError as exc:
            return 0, b"", type(exc).__name__

    async def _body(self, response: httpx2.Response) -> bytes:
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise httpx2.DecodingError(f"unasked content-encoding {encoding!r}")
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            raise _TooLargeError
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_raw():
            size += len(chunk)
            self.bytes_read += len(chunk)
            if size > self.max_bytes:
                raise _TooLargeError
            chunks.append(chunk)
        return b"".join(chunks)


class _TooLargeError(Exception):
    """A response body went past the reader's ``max_bytes``."""


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip
