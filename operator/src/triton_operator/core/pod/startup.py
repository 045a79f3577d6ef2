"""A pod's start, phase by phase, from its own status; and the sync container's one-line summary.

A pod's status holds the times of its start, as the API server and the kubelet wrote them (whole
seconds, RFC 3339): created (metadata.creationTimestamp) -> scheduled (the PodScheduled condition)
-> the sync init container started and finished (its state.terminated) -> tritonserver started
(its state.running) -> Ready (the Ready condition). The gaps between them are the phases:

- scheduling: created -> scheduled;
- imageAndSandbox: scheduled -> sync started (the pod's sandbox and network, the sync image);
- sync: sync started -> finished (`triton-operator sync`: the download, and its Python start-up;
  at least the seconds its own summary says it ran);
- tritonserverStart: sync finished -> tritonserver started (the tritonserver image, the container);
- tritonserverLoad: tritonserver started -> Ready (Triton loads the models, then the startup and
  readiness probes pass).

In a pod of the one shape (core.objects.builders.fills_itself: no sync init container), the model agent
stands for the sync container (core.observed.observation.sync_container_status) and tritonserver starts
empty beside it; the agent fills /models with one sync of the revision and loads each model as soon as
its own files are in, so the download and the loads overlap. The pod's status has no time for the
last byte; the agent's own record of its fill has (FillTimeline, its status's ``fill``: read once
per new Ready pod, reconcile.observe.observe_starts). With it, the phases are those of the bench
(bench/real_pods/realsize.py: sync = bound -> every model's bytes in; load = what is left until Ready):

- scheduling, imageAndSandbox: as above, imageAndSandbox ending when the agent's container starts;
- sync: the agent's container started -> the last byte of the revision in and verified (the agent's
  clock, the node's, as the kubelet's; at least the seconds the agent measured from its fill's start);
  the models loaded meanwhile (all but the last ones) are in it;
- no tritonserverStart: tritonserver starts during the sync, and its start is in it;
- tritonserverLoad: the last byte in -> Ready: what is left of the loads after the last byte (the
  models fetched last), then the readiness probe.

The bytes are the fill's: from the store (bytesFetched) and already present or from the node cache
(bytesPresent). Without the agent's record (its agent did not answer, or predates it) such a pod
has no sync and no tritonserverStart phase, and tritonserverLoad (tritonserver started -> Ready) holds
the download and the loads together. The phases keep their names and order.

`triton-operator sync` leaves a summary as its termination message when it exits 0 (format_summary);
Kubernetes keeps it in the init container's state.terminated.message, and parse_summary reads back
the bytes it fetched from the store and found already present.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from triton_operator.core.rollout.clock import format_time, parse_time, to_utc

PHASES = ("scheduling", "imageAndSandbox", "sync", "tritonserverStart", "tritonserverLoad")
"""The phases of a pod's start, in order (status.timeToServe[].phases and the metric's phase label)."""

PHASE_WORDS = {
    "scheduling": "scheduling",
    "imageAndSandbox": "image and sandbox",
    "sync": "sync",
    "drain": "drain",
    "tritonserverStart": "tritonserver start",
    "tritonserverLoad": "tritonserver load",
}
"""Each phase of a pod's start (PHASES) or of an in-place update (IN_PLACE_PHASES), in their order, as
the Event and `kubectl triton status` name it."""

TERMINATION_MESSAGE_MAX = 4096
"""Kubernetes keeps at most this many bytes of a container's termination message."""

# ----------------------------------------------------------------- the sync container's summary


@dataclasses.dataclass(frozen=True)
class SyncSummary:
    """What a successful `triton-operator sync` says it did."""

    objects: int
    """Objects of the pinned manifest the repository holds (fetched or already present)."""
    fetched: int
    """Bytes read from the store."""
    present: int
    """Bytes already there: in the destination from an earlier run, or placed from a cache."""
    seconds: float
    """How long the sync ran, by its own clock (without the Python start-up before it)."""
    node_cache_hits: int | None = None
    """Objects read from the node cache (counted in ``present``); None when the cache was off."""
    node_cache_misses: int | None = None
    """Objects read from the store while the node cache was on."""
    node_cache_vouched: int = 0
    """Objects of the node cache checked by the SHA-256 it signed (its public key given), not the pin."""
    node_cache_shared: int = 0
    """Of those, the files the pod links to in its view of the node cache's files (none copied)."""


_SUMMARY = re.compile(
    r"^synced (?P<objects>\d+) objects?, (?P<fetched>\d+) bytes fetched from the store, "
    r"(?P<present>\d+) bytes already present, in (?P<seconds>\d+(?:\.\d+)?) s\b"
    r"(?:, node cache: (?P<hits>\d+) hits?, (?P<misses>\d+) miss(?:es)?\b"
    r"(?:, (?P<vouched>\d+) vouched\b)?(?:, (?P<shared>\d+) shared\b)?)?"
)


def format_summary(
    objects: int,
    fetched: int,
    present: int,
    seconds: float,
    node_cache: tuple[int, int] | None = None,
    *,
    vouched: int = 0,
    shared: int = 0,
) -> str:
    """The one line `triton-operator sync` writes as its termination message when it exits 0;
    ``node_cache``: (hits, misses) when the node cache was on, appended after the seconds, with the
    hits checked by the cache's signed SHA-256 (``vouched``) when there are any, and of those the
    files linked in the pod's view of the cache's files (``shared``).

    >>> format_summary(3, 536870912, 0, 1.234)
    'synced 3 objects, 536870912 bytes fetched from the store, 0 bytes already present, in 1.23 s'
    >>> format_summary(3, 0, 536870912, 1.234, node_cache=(1, 0)).partition(" s, ")[2]
    'node cache: 1 hit, 0 misses'
    >>> format_summary(3, 0, 536870912, 1.234, node_cache=(3, 0), vouched=3).partition(" s, ")[2]
    'node cache: 3 hits, 0 misses, 3 vouched'
    >>> format_summary(3, 0, 536870912, 1.2, node_cache=(3, 0), vouched=3, shared=2).partition(" s, ")[2]
    'node cache: 3 hits, 0 misses, 3 vouched, 2 shared'
    """
    line = (
        f"synced {objects} object{'' if objects == 1 else 's'}, {fetched} bytes fetched from the store, "
        f"{present} bytes already present, in {max(seconds, 0.0):.2f} s"
    )
    if node_cache is not None:
        hits, misses = node_cache
        line += (
            f", node cache: {hits} hit{'' if hits == 1 else 's'}, {misses} miss{'' if misses == 1 else 'es'}"
        )
        if vouched:
            line += f", {vouched} vouched"
            if shared:
                line += f", {shared} shared"
    return line


def parse_summary(message: Any) -> SyncSummary | None:
    """A termination message back to its SyncSummary; None for anything else (a failure's reason,
    an older sync image that wrote nothing, a message cut short)."""
    if not isinstance(message, str):
        return None
    match = _SUMMARY.match(message.strip())
    if match is None:
        return None
    return SyncSummary(
        objects=int(match["objects"]),
        fetched=int(match["fetched"]),
        present=int(match["present"]),
        seconds=float(match["seconds"]),
        node_cache_hits=int(match["hits"]) if match["hits"] is not None else None,
        node_cache_misses=int(match["misses"]) if match["misses"] is not None else None,
        node_cache_vouched=int(match["vouched"] or 0),
        node_cache_shared=int(match["shared"] or 0),
    )


# ----------------------------------------------------------------- the agent's record of a revision it placed


def format_instant(moment: datetime) -> str:
    """RFC 3339 in UTC to the millisecond (the agent's own times: finer than Kubernetes' seconds).

    >>> from datetime import UTC
    >>> format_instant(datetime(2026, 1, 1, 0, 0, 3, 250000, tzinfo=UTC))
    '2026-01-01T00:00:03.250Z'
    """
    return to_utc(moment).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclasses.dataclass(frozen=True)
class FillTimeline:
    """The model agent's record of one revision it placed into /models and loaded (its first fill, in
    a pod of the one shape; or a change in place): when it began, when the revision's last byte was in
    and verified, when every model was loaded, and where the bytes came from. Small and bounded: nine
    fields, whatever the revision's size (its status's ``fill`` and ``inPlace``, to_json)."""

    revision: str
    started: datetime
    """The agent began the revision (the first fill: before its sync; in place: before the drain)."""
    fetched: datetime | None = None
    """The revision's last byte in and verified (None: not yet)."""
    drained: datetime | None = None
    """In place: the pod out of its Service, before the first unload or load (None: a first fill,
    which serves nothing yet, or not yet)."""
    loaded: datetime | None = None
    """Every model of the revision loaded (None: not yet)."""
    objects: int = 0
    fetched_bytes: int = 0
    """Bytes read from the store."""
    node_cache_bytes: int = 0
    """Bytes read from the node cache (each checked against the pin)."""
    present_bytes: int = 0
    """Bytes already in /models (or the local cache): neither read from the store nor the node cache."""

    def to_json(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "startedAt": format_instant(self.started),
            "fetchedAt": format_instant(self.fetched) if self.fetched is not None else None,
            "drainedAt": format_instant(self.drained) if self.drained is not None else None,
            "loadedAt": format_instant(self.loaded) if self.loaded is not None else None,
            "objects": self.objects,
            "fetchedBytes": self.fetched_bytes,
            "nodeCacheBytes": self.node_cache_bytes,
            "presentBytes": self.present_bytes,
        }

    @property
    def fetch_seconds(self) -> float | None:
        """Its start -> its last byte, by the agent's clock."""
        return _gap(self.started, self.fetched)


IN_PLACE_PHASES = ("sync", "drain", "tritonserverLoad")
"""The phases of a revision applied in place by a pod's agent, in their order (the metric's phase label):

- sync: the agent began the revision -> its last byte in and verified (only what changed is fetched;
  the pod serves the revision before it meanwhile);
- drain: the last byte -> the pod out of its Service (readiness false, the kubelet's probe failed,
  the endpoints caught up), before any model is unloaded or loaded;
- tritonserverLoad: out of the Service -> every changed model unloaded and loaded (Triton's model
  control); the pod is Ready again at the agent's next readiness check.

The same words as a pod's start: the bench's in-place case measures sync and load the same way (its
agent's log, 'applying revision' -> 'loading model' -> 'applied revision')."""


def in_place_phases(timeline: FillTimeline) -> dict[str, float]:
    """Seconds of each in-place phase whose two ends ``timeline`` has (IN_PLACE_PHASES' order), and
    ``total`` (began -> loaded) once every model is loaded; {} until then (nothing to record yet).

    >>> from datetime import UTC
    >>> from datetime import timedelta
    >>> t0 = datetime(2026, 1, 1, tzinfo=UTC)
    >>> at = [t0 + timedelta(seconds=s) for s in (1.5, 3, 4)]
    >>> in_place_phases(FillTimeline("r2", t0, fetched=at[0], drained=at[1], loaded=at[2]))
    {'sync': 1.5, 'drain': 1.5, 'tritonserverLoad': 1.0, 'total': 4.0}
    """
    if timeline.loaded is None:
        return {}
    bounds = (timeline.started, timeline.fetched, timeline.drained, timeline.loaded)
    out: dict[str, float] = {}
    for i, phase in enumerate(IN_PLACE_PHASES):
        seconds = _gap(bounds[i], bounds[i + 1])
        if seconds is not None:
            out[phase] = seconds
    out["total"] = _gap(timeline.started, timeline.loaded) or 0.0
    return out


@dataclasses.dataclass(frozen=True)
class InPlaceRecords:
    """What status.timeToServe reads of an in-place update: the revision whose pods load models in place
    (``host``), the revisions they serve or load (status.servedRevision, status.inPlace.next), and each
    host pod's agent's record of the last revision it applied in place, by pod name."""

    host: str
    revisions: tuple[str, ...] = ()
    timelines: Mapping[str, FillTimeline] = dataclasses.field(default_factory=dict)

    def entry(self, revision: str) -> dict[str, Any] | None:
        """``revision``'s status.timeToServe entry from the first pod whose agent loaded it in place
        (the earliest ``loaded``; by name on a tie); None while none has."""
        done = sorted(
            (t.loaded, pod)
            for pod, t in self.timelines.items()
            if t.revision == revision and t.loaded is not None
        )
        if not done:
            return None
        pod = done[0][1]
        return in_place_entry(self.host, pod, self.timelines[pod])


def in_place_entry(host: str, pod: str, timeline: FillTimeline) -> dict[str, Any] | None:
    """A status.timeToServe entry for the revision a pod's agent applied in place (``timeline``), in
    tenths of seconds: its phases are the in-place update's (IN_PLACE_PHASES, the metric's), its seconds
    the agent's whole change (began -> every changed model loaded); None until it is loaded.

    >>> from datetime import UTC
    >>> from datetime import timedelta
    >>> t0 = datetime(2026, 1, 1, tzinfo=UTC)
    >>> at = [t0 + timedelta(seconds=s) for s in (1.52, 1.6, 4.04)]
    >>> e = in_place_entry("h1", "p-0", FillTimeline("r2", t0, at[0], at[1], at[2], 3, 7, 5, 1))
    >>> e["seconds"], e["phases"], e["bytesFetched"], e["bytesPresent"]
    (4.0, {'sync': 1.5, 'drain': 0.1, 'tritonserverLoad': 2.4}, 7, 6)
    """
    phases = in_place_phases(timeline)
    if not phases or timeline.loaded is None:
        return None
    total = phases.pop("total")
    return {
        "revision": timeline.revision,
        "pod": pod,
        "host": host,
        "readyAt": format_time(timeline.loaded),
        "seconds": round(total, 1),
        "phases": {phase: round(seconds, 1) for phase, seconds in phases.items()},
        "objects": timeline.objects,
        "bytesFetched": timeline.fetched_bytes,
        "bytesPresent": timeline.node_cache_bytes + timeline.present_bytes,
    }


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def parse_timeline(data: Any) -> FillTimeline | None:
    """An agent's ``fill`` (or ``inPlace``) back to its FillTimeline; None for anything else (an
    agent that predates it, a value cut short).

    >>> t = parse_timeline({"revision": "r1", "startedAt": "2026-01-01T00:00:03.250Z", "fetchedBytes": 7})
    >>> (t.revision, t.started.second, t.fetched, t.fetched_bytes)
    ('r1', 3, None, 7)
    >>> parse_timeline({"revision": "r1"}) is None
    True
    """
    if not isinstance(data, Mapping):
        return None
    revision, started = data.get("revision"), parse_time(data.get("startedAt"))
    if not isinstance(revision, str) or not revision or started is None:
        return None
    return FillTimeline(
        revision=revision,
        started=started,
        fetched=parse_time(data.get("fetchedAt")),
        drained=parse_time(data.get("drainedAt")),
        loaded=parse_time(data.get("loadedAt")),
        objects=_count(data.get("objects")),
        fetched_bytes=_count(data.get("fetchedBytes")),
        node_cache_bytes=_count(data.get("nodeCacheBytes")),
        present_bytes=_count(data.get("presentBytes")),
    )


# ----------------------------------------------------------------- a pod's start


@dataclasses.dataclass(frozen=True)
class PodStart:
    """The times of one pod's start, read from its status (None where the status has none yet)."""

    created: datetime | None = None
    scheduled: datetime | None = None
    sync_started: datetime | None = None
    sync_finished: datetime | None = None
    triton_started: datetime | None = None
    ready: datetime | None = None
    """When the pod last became Ready (None while it is not Ready)."""
    sync: SyncSummary | None = None
    restarts: int = 0
    """Restarts of the sync and tritonserver containers: a phase that ends with a restarted
    container's latest start includes its earlier attempts and their back-off."""
    fills: bool = False
    """A pod of the one shape: ``sync_started`` is its model agent's start, and it never finishes."""
    fill: FillTimeline | None = None
    """Its agent's record of its first fill (one shape; read from the agent: reconcile.observe)."""

    @property
    def last_byte(self) -> datetime | None:
        """One shape: when the last byte of its revision was in, by its agent's record (None: unknown)."""
        return self.fill.fetched if self.fills and self.fill is not None else None

    @property
    def total(self) -> float | None:
        """Seconds from created to Ready; None while either is unknown."""
        return _gap(self.created, self.ready)

    def phases(self) -> dict[str, float]:
        """Seconds of each phase whose two ends the status has (PHASES' order; a gap a clock skew
        made negative counts as 0). The sync takes at least what its summary says it ran: whole
        seconds apart, its container's times can show 0 s for a sync of 0.8 s."""
        chain: tuple[tuple[str, datetime | None, datetime | None], ...]
        if self.last_byte is not None:
            # One shape, the agent's record read: sync = the agent's start -> the last byte; the loads
            # overlap the download, and tritonserver starts during it (no tritonserverStart).
            chain = (
                ("scheduling", self.created, self.scheduled),
                ("imageAndSandbox", self.scheduled, self.sync_started),
                ("sync", self.sync_started, self.last_byte),
                ("tritonserverLoad", self.last_byte, self.ready),
            )
        else:
            bounds = (
                self.created,
                self.scheduled,
                self.sync_started,
                self.sync_finished,
                self.triton_started,
                self.ready,
            )
            chain = tuple((phase, bounds[i], bounds[i + 1]) for i, phase in enumerate(PHASES))
        out: dict[str, float] = {}
        for phase, start, end in chain:
            seconds = _gap(start, end)
            if seconds is not None:
                out[phase] = seconds
        own = self.sync.seconds if self.sync is not None else None
        if self.last_byte is not None and self.fill is not None:
            own = self.fill.fetch_seconds
        if "sync" in out and own is not None:
            out["sync"] = max(out["sync"], own)
        return out

    def bytes(self) -> tuple[int, int, int] | None:
        """(objects, bytes fetched from the store, bytes already present or from a cache) of its
        sync's summary or, one shape, its agent's fill; None when neither is known."""
        if self.sync is not None:
            return self.sync.objects, self.sync.fetched, self.sync.present
        if self.last_byte is not None and self.fill is not None:
            f = self.fill
            return f.objects, f.fetched_bytes, f.node_cache_bytes + f.present_bytes
        return None


def _gap(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return max((end - start).total_seconds(), 0.0)


def _transition(conditions: Mapping[str, Mapping[str, Any]], kind: str) -> datetime | None:
    """When a True condition last became True (None when it is not True)."""
    condition = conditions.get(kind) or {}
    return parse_time(condition.get("lastTransitionTime")) if condition.get("status") == "True" else None


def pod_start(
    metadata: Mapping[str, Any],
    status: Mapping[str, Any],
    sync: Mapping[str, Any],
    triton: Mapping[str, Any],
    *,
    fills: bool = False,
) -> PodStart:
    """A pod's start from its metadata and status, and the statuses of its sync init container and
    its tritonserver container ({} when the pod has none by that name); ``fills``: a pod of the one
    shape, whose ``sync`` is its model agent's (the agent's record joins later: PodStart.fill)."""
    conditions = {str(c.get("type")): c for c in status.get("conditions") or []}
    state = sync.get("state") or {}
    terminated = state.get("terminated") or {}
    succeeded = bool(terminated) and int(terminated.get("exitCode") or 0) == 0
    # A sync that runs has started; one that failed and waits to run again has not (yet) for good.
    began = terminated if succeeded else state.get("running") or {}
    running = (triton.get("state") or {}).get("running") or {}
    return PodStart(
        created=parse_time(metadata.get("creationTimestamp")),
        scheduled=_transition(conditions, "PodScheduled"),
        sync_started=parse_time(began.get("startedAt")),
        sync_finished=parse_time(terminated.get("finishedAt")) if succeeded else None,
        triton_started=parse_time(running.get("startedAt")),
        ready=_transition(conditions, "Ready"),
        sync=parse_summary(terminated.get("message")) if succeeded else None,
        restarts=int(sync.get("restartCount") or 0) + int(triton.get("restartCount") or 0),
        fills=fills,
    )


# ----------------------------------------------------------------- what the status keeps


def served_entry(revision: str, pod: str, start: PodStart) -> dict[str, Any] | None:
    """A revision's status.timeToServe entry from one Ready pod's start, in tenths of seconds (they
    are whole seconds apart: Kubernetes' times are); None without its creation and Ready times."""
    if start.created is None or start.ready is None:
        return None
    entry: dict[str, Any] = {
        "revision": revision,
        "pod": pod,
        "readyAt": format_time(start.ready),
        "seconds": round(start.total or 0.0, 1),
        "phases": {phase: round(seconds, 1) for phase, seconds in start.phases().items()},
    }
    counts = start.bytes()
    if counts is not None:
        entry["objects"], entry["bytesFetched"], entry["bytesPresent"] = counts
    if start.restarts:
        entry["restarts"] = start.restarts
    return entry


# ----------------------------------------------------------------- what people read


def seconds_text(seconds: float) -> str:
    """``7.4 s``, ``12 s``, ``0 s``: tenths below a minute, whole seconds above.

    >>> seconds_text(7.44), seconds_text(12.0), seconds_text(95.3)
    ('7.4 s', '12 s', '95 s')
    """
    if seconds >= 60:
        return f"{seconds:.0f} s"
    return f"{seconds:.1f}".removesuffix(".0") + " s"


def bytes_text(n: int) -> str:
    """Bytes for a person: ``512 MiB``, ``1.5 GiB``, ``17 B``.

    >>> bytes_text(536870912), bytes_text(1610612736), bytes_text(17), bytes_text(0)
    ('512 MiB', '1.5 GiB', '17 B', '0 B')
    """
    value, unit = float(n), "B"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.1f}".removesuffix(".0") + f" {unit}"


def describe_phases(entry: Mapping[str, Any]) -> str:
    """One status.timeToServe entry in words: ``7.4 s: scheduling 0.1 s, image and sandbox 0.9 s,
    sync 1.2 s (512 MiB fetched), tritonserver start 0 s, tritonserver load 4.8 s``."""
    phases = entry.get("phases") or {}
    parts = []
    for phase, words in PHASE_WORDS.items():
        if phases.get(phase) is None:
            continue
        text = f"{words} {seconds_text(float(phases[phase]))}"
        if phase == "sync" and entry.get("bytesFetched") is not None:
            text += f" ({bytes_text(int(entry['bytesFetched']))} fetched"
            present = int(entry.get("bytesPresent") or 0)
            text += f", {bytes_text(present)} already present)" if present else ")"
        parts.append(text)
    total = entry.get("seconds")
    head = seconds_text(float(total)) if total is not None else "an unknown time"
    restarts = int(entry.get("restarts") or 0)
    tail = f" (after {restarts} container restart{'s' if restarts != 1 else ''})" if restarts else ""
    return f"{head}: {', '.join(parts) or 'no phase known'}{tail}"
