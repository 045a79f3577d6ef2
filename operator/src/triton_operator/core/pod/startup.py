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
stands for the sync container (core.observed.observation.sync_container_status): imageAndSandbox ends when
the agent starts; the download and the loads overlap from then on, so the pod's status has no time
for the last byte: there is no sync or tritonserverStart phase, and tritonserverLoad (tritonserver
started -> Ready) holds the download and the loads together, i.e. what is left of the download once
tritonserver runs plus the load of the model fetched last. Nor is there a summary (the agent does not
exit): the bytes fetched are the agent's status (fetchedBytes). The phases keep their names and order.

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

from triton_operator.core.rollout.clock import format_time, parse_time

PHASES = ("scheduling", "imageAndSandbox", "sync", "tritonserverStart", "tritonserverLoad")
"""The phases of a pod's start, in order (status.timeToServe[].phases and the metric's phase label)."""

PHASE_WORDS = {
    "scheduling": "scheduling",
    "imageAndSandbox": "image and sandbox",
    "sync": "sync",
    "tritonserverStart": "tritonserver start",
    "tritonserverLoad": "tritonserver load",
}
"""Each phase as the Event and `kubectl triton status` name it."""

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


_SUMMARY = re.compile(
    r"^synced (?P<objects>\d+) objects?, (?P<fetched>\d+) bytes fetched from the store, "
    r"(?P<present>\d+) bytes already present, in (?P<seconds>\d+(?:\.\d+)?) s\b"
    r"(?:, node cache: (?P<hits>\d+) hits?, (?P<misses>\d+) miss(?:es)?\b"
    r"(?:, (?P<vouched>\d+) vouched\b)?)?"
)


def format_summary(
    objects: int,
    fetched: int,
    present: int,
    seconds: float,
    node_cache: tuple[int, int] | None = None,
    *,
    vouched: int = 0,
) -> str:
    """The one line `triton-operator sync` writes as its termination message when it exits 0;
    ``node_cache``: (hits, misses) when the node cache was on, appended after the seconds, with the
    hits checked by the cache's signed SHA-256 (``vouched``) when there are any.

    >>> format_summary(3, 536870912, 0, 1.234)
    'synced 3 objects, 536870912 bytes fetched from the store, 0 bytes already present, in 1.23 s'
    >>> format_summary(3, 0, 536870912, 1.234, node_cache=(1, 0)).partition(" s, ")[2]
    'node cache: 1 hit, 0 misses'
    >>> format_summary(3, 0, 536870912, 1.234, node_cache=(3, 0), vouched=3).partition(" s, ")[2]
    'node cache: 3 hits, 0 misses, 3 vouched'
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

    @property
    def total(self) -> float | None:
        """Seconds from created to Ready; None while either is unknown."""
        return _gap(self.created, self.ready)

    def phases(self) -> dict[str, float]:
        """Seconds of each phase whose two ends the status has (PHASES' order; a gap a clock skew
        made negative counts as 0). The sync takes at least what its summary says it ran: whole
        seconds apart, its container's times can show 0 s for a sync of 0.8 s."""
        bounds = (
            self.created,
            self.scheduled,
            self.sync_started,
            self.sync_finished,
            self.triton_started,
            self.ready,
        )
        out: dict[str, float] = {}
        for i, phase in enumerate(PHASES):
            seconds = _gap(bounds[i], bounds[i + 1])
            if seconds is not None:
                out[phase] = seconds
        if "sync" in out and self.sync is not None:
            out["sync"] = max(out["sync"], self.sync.seconds)
        return out


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
) -> PodStart:
    """A pod's start from its metadata and status, and the statuses of its sync init container and
    its tritonserver container ({} when the pod has none by that name)."""
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
    if start.sync is not None:
        entry["objects"] = start.sync.objects
        entry["bytesFetched"] = start.sync.fetched
        entry["bytesPresent"] = start.sync.present
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
    for phase in PHASES:
        if phases.get(phase) is None:
            continue
        text = f"{PHASE_WORDS[phase]} {seconds_text(float(phases[phase]))}"
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
