"""Triton's view in a pass: which pods to read, the per-model status, and the canary's analysis window."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from triton_operator.adapters.agent_reader import AgentReader
from triton_operator.adapters.triton_reader import Owner, PodReading, PodTarget, TritonReader
from triton_operator.core.observed.observation import PodState
from triton_operator.core.pool.copies import Figures
from triton_operator.core.rollout.canary_analysis import (
    AnalysisResult,
    Counters,
    PodCounters,
    increase,
    judge,
    judged_models,
)
from triton_operator.core.rollout.clock import format_time
from triton_operator.core.rollout.inplace import AgentStatus, AnalysisSides, InPlaceState
from triton_operator.core.rollout.state import RolloutStatus, under_analysis
from triton_operator.core.vocabulary.triton_state import ModelVersionState, merge, model_statuses
from triton_operator.models import Analysis, AnalysisWindow, TritonService


@dataclasses.dataclass(frozen=True)
class _Window:
    """The baseline of one canary weight's window: each pod's counters at its first reading in it.

    A pod first read after the window started (a canary pod added for the weight, a restarted
    process) gets its baseline then: what it counted before it was seen is never judged, so a
    stable pod's requests of the past hours never stand for this window's.
    """

    revision: str
    weight: int
    started: datetime
    canary: dict[str, PodCounters]
    stable: dict[str, PodCounters]


@dataclasses.dataclass(frozen=True)
class Judged:
    """A verdict in its analysis window, and the window as it stands after it (TritonView.keep records it)."""

    result: AnalysisResult
    window: _Window
    pods: tuple[str, ...] = ()
    """The in-place step's window: the pods it judges as updated (a new set starts a new window)."""

    @property
    def started(self) -> datetime:
        return self.window.started


POOL_METRICS_SECONDS = 10.0
"""How often a pool's pods' metrics are read (its copies follow the figures over its window)."""

PoolSamples = Mapping[str, tuple[tuple[float, PodCounters], ...]]
"""A pool's window: per pod process (PodReading.key), its metrics readings in the window (when each
was read, time.monotonic(); Triton's counters by model), oldest first; the first is the baseline."""


def pool_window(
    before: PoolSamples, readings: Mapping[str, PodReading], window: float
) -> dict[str, tuple[tuple[float, PodCounters], ...]]:
    """The window after ``readings``: each pod process's new metrics reading added, those older than
    ``window`` seconds before its latest dropped but one (the baseline its increase is counted from).
    A pod no longer read (gone, restarted: a new process) leaves the window."""
    out: dict[str, tuple[tuple[float, PodCounters], ...]] = {}
    for reading in readings.values():
        if reading.counters is None:
            continue
        kept = [s for s in before.get(reading.key, ()) if s[0] < reading.counters_at]
        kept.append((reading.counters_at, reading.counters))
        while len(kept) > 1 and kept[1][0] <= reading.counters_at - window:
            kept.pop(0)
        out[reading.key] = tuple(kept)
    return out


def pool_figures(samples: PoolSamples) -> dict[str, Figures] | None:
    """Each model's figures over the window, all pods together: inferences per second (each pod's
    increase over its own span, summed), queue time per request (the queue time's increase over the
    requests'), requests; None while no pod has two readings (nothing to count from yet)."""
    totals: dict[str, tuple[float, float, float, float]] = {}
    spans = 0
    for series in samples.values():
        if len(series) < 2:
            continue
        (first_at, first), (last_at, last) = series[0], series[-1]
        span = last_at - first_at
        if span <= 0:
            continue
        spans += 1
        for model, counters in last.items():
            grown = counters.increase_since(first.get(model, Counters()))
            rate, queue, success, requests = totals.get(model, (0.0, 0.0, 0.0, 0.0))
            totals[model] = (
                rate + grown.success / span,
                queue + grown.queue_us,
                success + grown.success,
                requests + grown.requests,
            )
    if not spans:
        return None
    return {
        model: Figures(rate, queue / success if success > 0 else None, requests)
        for model, (rate, queue, success, requests) in totals.items()
    }


@dataclasses.dataclass(frozen=True)
class TritonSeen:
    """What a pass read of Triton for one spec it may carry out (TritonView.read): the readings of its
    pods, the verdicts of the canary's and the in-place step's windows (None: nothing judged, the
    window goes), and the pods to read from now on (TritonView.keep hands them to the reader)."""

    targets: tuple[PodTarget, ...] = ()
    metrics_every: float | None = None
    """How often the pods' metrics are read (None: not read, nothing is analysed)."""
    readings: Mapping[str, PodReading] = dataclasses.field(default_factory=dict)
    canary: Judged | None = None
    in_place: Judged | None = None
    pool_samples: PoolSamples | None = None
    """spec.pool's window after this pass's readings (None: no pool, the window goes)."""

    @property
    def pool_load(self) -> dict[str, Figures] | None:
        """Each pooled model's figures over its window (None: no pool, or not two readings yet)."""
        return pool_figures(self.pool_samples) if self.pool_samples is not None else None

    @property
    def analysis(self) -> AnalysisResult | None:
        return self.canary.result if self.canary is not None else None

    @property
    def in_place_analysis(self) -> AnalysisResult | None:
        return self.in_place.result if self.in_place is not None else None


class TritonView:
    """What one operator knows of Triton in its pods: the reader's readings, and the analysis windows.

    A pass reads (``read``: the readings there are and each window's verdict, changing nothing) before
    it decides, and records what it carries out after (``keep``: the pods to read, the windows), so
    a spec refused by the API server leaves no trace and the last valid one goes on from the same read.
    A window starts at the first pass that judges the canary at its weight, whether a reading is
    there yet or not: a canary pod whose metrics stay missing (never read, or its reads fail)
    keeps the verdict Inconclusive, and onInconclusive applies once the window has run
    inconclusiveAfterSeconds, so no rollout waits for ever on a pod that never answers.
    The windows live in memory: an operator restart starts the current window again (the canary
    is judged on traffic after the restart; nothing is judged twice).
    """

    def __init__(self, reader: TritonReader, agents: AgentReader | None = None) -> None:
        self.reader = reader
        self.agents = agents
        """The in-place agents' reader (None: in-place updates read no agent and never complete)."""
        self._windows: dict[Owner, _Window] = {}
        self._in_place: dict[Owner, tuple[tuple[str, ...], _Window]] = {}
        """The in-place step's window (the pods it judges as updated, and their baselines)."""
        self._pool: dict[Owner, PoolSamples] = {}
        """Each pool's window of metrics readings (spec.pool: copies follow load)."""

    def forget(self, namespace: str, name: str) -> None:
        self._windows.pop((namespace, name), None)
        self._in_place.pop((namespace, name), None)
        self._pool.pop((namespace, name), None)
        self.reader.forget((namespace, name))

    def read(
        self,
        owner: Owner,
        ts: TritonService,
        status: RolloutStatus,
        desired: str,
        pods: Sequence[PodState],
        *,
        now: datetime,
        in_place: bool = False,
        sides: AnalysisSides | None = None,
    ) -> TritonSeen:
        """The readings of the pods of the stable, the canary and the ``desired`` revision (those the
        reader has: never waiting for one), and the verdicts of the canary's window and of the
        in-place step's (``sides``: the pods it moved, and the others) at ``now``. ``in_place``: an
        in-place update moves (its pods' metrics are read at the analysis' interval, as a canary's).
        Changes nothing: ``keep`` records what the pass carries out."""
        revisions = {r for r in (status.stable_revision, status.canary_revision, desired) if r}
        targets = tuple(
            PodTarget(uid=p.uid, ip=p.ip, revision=p.revision, restarts=p.triton_restarts, name=p.name)
            for p in pods
            if p.revision in revisions and p.ip and p.uid and not p.terminating
        )
        analysis = ts.spec.rollout.analysis
        judged = analysis is not None and (in_place or under_analysis(ts.spec.rollout, status))
        every = float(analysis.interval_seconds) if analysis is not None and judged else None
        pool = ts.spec.pool
        if pool is not None:  # a pool's copies follow its figures: its metrics are always read
            every = min(every, POOL_METRICS_SECONDS) if every is not None else POOL_METRICS_SECONDS
        readings = self._held(owner, targets)
        samples = (
            pool_window(self._pool.get(owner, {}), readings, float(pool.scaling.window_seconds))
            if pool is not None
            else None
        )
        return TritonSeen(
            targets=targets,
            metrics_every=every,
            readings=readings,
            pool_samples=samples,
            canary=self._judge(owner, ts, status, readings, targets=targets, now=now),
            in_place=self._judge_in_place(owner, ts, sides, readings, targets=targets, now=now),
        )

    def keep(self, owner: Owner, seen: TritonSeen) -> None:
        """Record what the pass carries out: its pods are read from now on (metrics too while
        analysed), and its windows stand (a window not judged goes)."""
        self.reader.watch(owner, seen.targets, seen.metrics_every)
        if seen.canary is None:
            self._windows.pop(owner, None)
        else:
            self._windows[owner] = seen.canary.window
        if seen.in_place is None:
            self._in_place.pop(owner, None)
        else:
            self._in_place[owner] = (seen.in_place.pods, seen.in_place.window)
        if seen.pool_samples is None:
            self._pool.pop(owner, None)
        else:
            self._pool[owner] = seen.pool_samples

    def _held(self, owner: Owner, targets: Sequence[PodTarget]) -> dict[str, PodReading]:
        """The reader's last reading of each of ``targets`` (of its current process), by uid."""
        wanted = {t.uid: t for t in targets if self.reader.allowed(t.ip)}
        return {
            uid: reading
            for uid, reading in self.reader.readings(owner).items()
            if uid in wanted and reading.restarts == wanted[uid].restarts
        }

    def _judge(
        self,
        owner: Owner,
        ts: TritonService,
        status: RolloutStatus,
        readings: Mapping[str, PodReading],
        *,
        targets: Sequence[PodTarget],
        now: datetime,
    ) -> Judged | None:
        """The canary's verdict in the window of its current weight (Inconclusive while a canary
        pod's metrics are missing); None when nothing is analysed (the window goes)."""
        spec = ts.spec.rollout.analysis
        if spec is None or not under_analysis(ts.spec.rollout, status):
            return None
        canary, stable = status.canary_revision or "", status.stable_revision or ""
        weight = status.canary_weight or 0
        sides = {canary: _counters(readings, canary), stable: _counters(readings, stable)}
        window = self._windows.get(owner)
        if window is None or (window.revision, window.weight) != (canary, weight):
            window = _Window(canary, weight, now, {}, {})
        # Each pod's baseline is its first reading in the window.
        window = dataclasses.replace(
            window, canary={**sides[canary], **window.canary}, stable={**sides[stable], **window.stable}
        )
        result = judge(
            spec,
            judged_models(spec, [m.name for m in ts.spec.models]),
            increase(window.canary, sides[canary]),
            increase(window.stable, sides[stable]),
            revision=canary,
            weight=weight,
            window_seconds=(now - window.started).total_seconds(),
            missing=self._missing_of([t for t in targets if t.revision == canary], readings),
        )
        return Judged(result, window)

    def _judge_in_place(
        self,
        owner: Owner,
        ts: TritonService,
        sides: AnalysisSides | None,
        readings: Mapping[str, PodReading],
        *,
        targets: Sequence[PodTarget],
        now: datetime,
    ) -> Judged | None:
        """The in-place step's verdict: the pods it moved to the next revision (``sides.updated``, the
        canary side) against the pods not asked yet (the stable side), in a window that starts when
        these pods were first judged together, with spec.rollout.analysis' metrics and thresholds
        as for a canary (a pool's: the models the update changes, on the pods that hold them:
        ``sides.models``); None when nothing is judged (the window goes)."""
        spec = ts.spec.rollout.analysis
        if spec is None or sides is None:
            return None
        held = self._in_place.get(owner)
        if held is None or held[0] != sides.updated or held[1].revision != sides.revision:
            window = _Window(sides.revision, sides.weight, now, {}, {})
        else:
            window = held[1]
        by_name = {t.name: t for t in targets}

        def counters(names: Sequence[str]) -> dict[str, PodCounters]:
            out: dict[str, PodCounters] = {}
            for name in names:
                target = by_name.get(name)
                reading = readings.get(target.uid) if target is not None else None
                if reading is not None and reading.counters is not None:
                    out[reading.key] = reading.counters
            return out

        updated, baseline = counters(sides.updated), counters(sides.baseline)
        window = dataclasses.replace(
            window, canary={**updated, **window.canary}, stable={**baseline, **window.stable}
        )
        result = judge(
            spec,
            _in_place_models(spec, [m.name for m in ts.spec.models], sides.models),
            increase(window.canary, updated),
            increase(window.stable, baseline),
            revision=sides.revision,
            weight=sides.weight,
            window_seconds=(now - window.started).total_seconds(),
            missing=self._missing_of(
                [by_name.get(n) or PodTarget(uid="", ip="", revision="", name=n) for n in sides.updated],
                readings,
            ),
        )
        return Judged(result, window, sides.updated)

    def _missing_of(self, targets: Sequence[PodTarget], readings: Mapping[str, PodReading]) -> list[str]:
        """The pods of ``targets`` without counters in ``readings``, each as "name (why)"."""
        out = []
        for target in targets:
            reading = readings.get(target.uid)
            if reading is not None and reading.counters is not None:
                continue
            if not self.reader.allowed(target.ip):
                why = "its IP is outside the operator's triton read CIDRs"
            elif reading is None or reading.metrics_error is None:
                why = "not read yet"
            else:
                why = reading.metrics_error
            out.append(f"{target.name or target.uid} ({why})")
        return out

    async def read_agents(
        self, status: Mapping[str, Any], pods: Sequence[PodState]
    ) -> dict[str, AgentStatus]:
        """The agents of the host pods while an in-place update moves (status.inPlace.next), by pod
        name; nothing otherwise (each read bounded: adapters.agent_reader)."""
        state = InPlaceState.from_status(status)
        if self.agents is None or state is None or state.next is None:
            return {}
        host = {p.name: p.ip for p in pods if p.revision == state.host and p.live}
        return await self.agents.read(host)


def _in_place_models(spec: Analysis, models: Sequence[str], changed: Sequence[str]) -> list[str]:
    """The models an in-place step judges: spec.rollout.analysis.models, else every model; in a pool
    (``changed``: the models its update changes, nothing else moves) those of them it changes, or
    every changed one when the analysis names none of them."""
    judged = judged_models(spec, models)
    if not changed:
        return judged
    return [m for m in judged if m in changed] or list(changed)


def _counters(readings: Mapping[str, PodReading], revision: str) -> dict[str, PodCounters]:
    return {r.key: r.counters for r in readings.values() if r.revision == revision and r.counters is not None}


def views(readings: Mapping[str, PodReading]) -> dict[str, dict[str, list[ModelVersionState]]]:
    """Triton's index per revision, the pods' views merged (core.vocabulary.triton_state.merge)."""
    by_revision: dict[str, list[tuple[ModelVersionState, ...]]] = {}
    for reading in readings.values():
        if reading.index is not None:
            by_revision.setdefault(reading.revision, []).append(reading.index)
    return {revision: merge(indexes) for revision, indexes in by_revision.items()}


def models_status(
    ts: TritonService, status: RolloutStatus, readings: Mapping[str, PodReading]
) -> list[dict[str, Any]]:
    """status.models from the spec and Triton's index of the serving and the canary revision."""
    return model_statuses(
        ts, stable=status.stable_revision, canary=status.canary_revision, views=views(readings)
    )


def analysis_status(result: AnalysisResult | None, started: datetime | None) -> dict[str, Any] | None:
    """status.analysis: the canary's current window, its verdict and each judged model's figures."""
    if result is None:
        return None
    return AnalysisWindow(
        revision=result.revision,
        weight=result.weight,
        verdict=result.verdict,
        window_started_at=None if started is None else format_time(started),
        models=[m.to_status() for m in result.models],
    ).to_api()
