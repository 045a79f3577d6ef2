"""A sweep's record and its end, pure: the results ConfigMap, its pods' and Jobs' verdicts, the expiry."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from triton_operator.core.observed.observation import pod_state
from triton_operator.core.rollout.clock import format_time, parse_time
from triton_operator.core.tuning.measurements import CandidateResult, choose, measurement_dict, spec_patch
from triton_operator.core.tuning.sweep import (
    ABANDONED,
    ANNOTATION_DEADLINE,
    LABEL_RESULTS,
    LABEL_TUNING,
    LONGEST_RUN_SECONDS,
    RESULTS_KEY,
    RUNNING,
    Plan,
    Sweep,
    describe_knobs,
)


def record(
    *,
    service: str,
    run: str,
    sweep: Sweep,
    plan: Plan,
    results: Sequence[CandidateResult],
    state: str,
    message: str,
    started_at: str,
    finished_at: str | None,
    spec: Mapping[str, Any] | None,
    cleanup: Sequence[str] = (),
) -> dict[str, Any]:
    """What the results ConfigMap keeps (and `kubectl triton status` shows): JSON-able data.

    ``cleanup``: the deletes that failed (the message says how many; the objects' deadline still
    ends them, core.tuning.expire)."""
    measured = {r.candidate.index: r for r in results}
    choice = choose(results, sweep.percentile, sweep.latency_bound_us)
    if cleanup:
        note = (
            f"cleanup incomplete: {len(cleanup)} delete(s) failed (see cleanup); the operator deletes what "
            "is left after the run's deadline"
        )
        message = f"{message}; {note}" if message else note
    out: dict[str, Any] = {
        "service": service,
        "model": sweep.model,
        "run": run,
        "state": state,
        "message": message,
        "cleanup": list(cleanup),
        "startedAt": started_at,
        "finishedAt": finished_at,
        "percentile": sweep.percentile,
        "latencyBoundMicroseconds": sweep.latency_bound_us,
        "concurrencies": list(sweep.concurrencies),
        "candidates": [
            {
                "name": c.name,
                "default": c.default,
                "settings": describe_knobs(c.config),
                "config": dict(c.config),
                "error": measured[c.index].error if c.index in measured else None,
                "measured": c.index in measured,
                "measurements": [measurement_dict(m) for m in measured[c.index].measurements]
                if c.index in measured
                else [],
            }
            for c in plan.candidates
        ],
        "refused": [{"settings": dict(r.settings), "problems": list(r.problems)} for r in plan.refused],
        "choice": None,
    }
    if choice is not None:
        out["choice"] = {
            "candidate": choice.candidate.name,
            "default": choice.candidate.default,
            "settings": describe_knobs(choice.candidate.config),
            "measurement": measurement_dict(choice.measurement),
            "baseline": measurement_dict(choice.baseline) if choice.baseline else None,
            "gain": round(choice.gain, 3) if choice.gain is not None else None,
            "patch": None
            if choice.candidate.default or spec is None
            else spec_patch(spec, sweep.model, choice.candidate.config),
        }
    return out


KEEP_RUNS = 5
"""Records kept per TritonService: a sweep's end deletes the older ones."""


def expired_runs(runs: Iterable[str], keep: int = KEEP_RUNS) -> list[str]:
    """The runs whose records go: all but the ``keep`` latest (run ids sort in time order)."""
    ordered = sorted(set(runs))
    return ordered[: max(0, len(ordered) - keep)]


def read_record(configmap: Mapping[str, Any]) -> dict[str, Any] | None:
    try:
        data = json.loads((configmap.get("data") or {}).get(RESULTS_KEY) or "null")
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


# ----------------------------------------------------------------- reading the cluster back


@dataclasses.dataclass(frozen=True)
class PodVerdict:
    """A tuning pod as read: Ready at ``ip``, failed (``failure``: why), or still starting (``detail``)."""

    ip: str | None = None
    failure: str | None = None
    detail: str = "no pod yet"


def pod_verdict(pods: Sequence[Mapping[str, Any]]) -> PodVerdict:
    """Whether a candidate's pod serves, will never serve, or is still starting (observation.pod_state)."""
    states = [pod_state(p) for p in pods]
    live = [s for s in states if not s.terminating]
    if not live:
        return PodVerdict()
    state = live[0]
    if state.ready and state.ip:
        return PodVerdict(ip=state.ip, detail="Ready")
    if state.sync_failure:
        return PodVerdict(failure=f"pod {state.name}: sync failed: {state.sync_failure}")
    if state.crash_looping(threshold=2) or state.waiting_reason:
        reason = state.waiting_reason or "restarting"
        message = f": {state.waiting_message}" if state.waiting_message else ""
        failures = "; ".join(f"{f.model} {f.version}: {f.reason}" for f in state.triton_failures)
        extra = f" (Triton: {failures})" if failures else ""
        return PodVerdict(failure=f"pod {state.name}: {reason}{message}{extra}")
    if state.unschedulable:
        return PodVerdict(detail=f"pod {state.name} unschedulable: {state.unschedulable}")
    return PodVerdict(detail=f"pod {state.name} starting")


def job_verdict(job: Mapping[str, Any]) -> str | None:
    """``complete`` or ``failed`` once a Job has finished (its conditions), None while it runs."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Complete":
            return "complete"
        if condition.get("type") == "Failed":
            return "failed"
    return None


# ----------------------------------------------------------------- the operator's end of runs left behind


@dataclasses.dataclass(frozen=True)
class Expiry:
    """What the operator does with what sweeps left past their deadline (expire)."""

    delete: tuple[tuple[str, str, str], ...] = ()
    """(kind, namespace, name) of the tuning objects to delete (their pods go with them)."""
    abandon: tuple[tuple[str, str, str, dict[str, Any]], ...] = ()
    """(namespace, name, resourceVersion, record) of the records that still say Running: marked Abandoned."""


def deadline_of(obj: Mapping[str, Any]) -> datetime | None:
    """A tuning object's deadline: its ANNOTATION_DEADLINE; without a readable one, its creation plus
    LONGEST_RUN_SECONDS (no sweep runs longer); None when it has neither."""
    metadata = obj.get("metadata") or {}
    deadline = parse_time((metadata.get("annotations") or {}).get(ANNOTATION_DEADLINE))
    if deadline is not None:
        return deadline
    created = parse_time(metadata.get("creationTimestamp"))
    return created + timedelta(seconds=LONGEST_RUN_SECONDS) if created is not None else None


def abandoned_record(data: Mapping[str, Any], deadline: datetime, now: datetime) -> dict[str, Any]:
    """A record that still said Running at its deadline, as the operator leaves it."""
    return {
        **data,
        "state": ABANDONED,
        "message": (
            f"the sweep's client stopped before the run ended (deadline {format_time(deadline)} passed with "
            f"the record still Running{': ' + str(data['message']) if data.get('message') else ''}); "
            "the operator deleted the objects it left"
        ),
        "finishedAt": format_time(now),
    }


def expire(objects: Sequence[Mapping[str, Any]], now: datetime) -> Expiry:
    """What to do with the tuning objects (``objects``: every object with LABEL_TUNING, any kind, each
    with its ``kind``) at ``now``: each past its deadline is deleted (Deployments, Jobs, Services, input
    ConfigMaps; never pods, which their owners' deletion takes), and each record past its deadline that
    still says Running is marked Abandoned (records stay: the sweep's end keeps the latest)."""
    delete: list[tuple[str, str, str]] = []
    abandon: list[tuple[str, str, str, dict[str, Any]]] = []
    for obj in objects:
        metadata = obj.get("metadata") or {}
        labels = metadata.get("labels") or {}
        kind = str(obj.get("kind", ""))
        if LABEL_TUNING not in labels or kind == "Pod" or metadata.get("deletionTimestamp"):
            continue
        deadline = deadline_of(obj)
        if deadline is None or now < deadline:
            continue
        where = (str(metadata.get("namespace", "")), str(metadata.get("name", "")))
        if labels.get(LABEL_RESULTS) != "true":
            delete.append((kind, *where))
            continue
        data = read_record(obj)
        if data is not None and data.get("state") == RUNNING:
            abandon.append(
                (*where, str(metadata.get("resourceVersion", "")), abandoned_record(data, deadline, now))
            )
    return Expiry(tuple(sorted(delete)), tuple(sorted(abandon, key=lambda a: a[:2])))


def next_deadline(objects: Sequence[Mapping[str, Any]], now: datetime) -> datetime | None:
    """The earliest deadline after ``now`` among tuning objects (pods aside): when expire has work next."""
    upcoming = [
        d
        for o in objects
        if o.get("kind") != "Pod" and LABEL_TUNING in ((o.get("metadata") or {}).get("labels") or {})
        for d in [deadline_of(o)]
        if d is not None and d > now
    ]
    return min(upcoming, default=None)


def record_patch(data: Mapping[str, Any], resource_version: str) -> dict[str, Any]:
    """The merge patch that writes ``data`` into a record unless it changed since ``resource_version``."""
    return {
        "metadata": {"resourceVersion": resource_version},
        "data": {RESULTS_KEY: json.dumps(data, sort_keys=True)},
    }
