"""The pool in a pass, pure: placement over live pods, moves, per-model Services, pod patches, status.pool."""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from triton_operator.core.decision.actions import applied_as_built, stamped
from triton_operator.core.edges.backoff import Backoff
from triton_operator.core.objects.builders import (
    RevisionFiles,
    agent_drain_seconds,
    build_labels,
    build_owner_reference,
)
from triton_operator.core.objects.model_routes import (
    LABEL_MODEL_ROUTE,
    MODEL_ANNOTATION,
    build_model_http_routes,
    build_model_service,
    model_endpoints,
)
from triton_operator.core.objects.names import LABEL_REVISION, LABEL_SERVICE
from triton_operator.core.pool.assignment import (
    ASSIGNMENT_ANNOTATION,
    DELETION_COST_ANNOTATION,
    AssignmentError,
    Copy,
    build_assignment,
    deletion_cost,
    parse_assignment,
)
from triton_operator.core.pool.copies import (
    MEMORY_SHORT,
    NO_READINGS,
    CopiesDecision,
    Figures,
    ModelLoad,
    PoolSize,
    Streak,
    decide_copies,
    fit_pool,
    used_at,
)
from triton_operator.core.pool.explain import (
    LoadShown,
    agents_waiting,
    measured_memory,
    pool_status,
    room_waits,
    update_measured,
    waiting_for,
)
from triton_operator.core.pool.labels import READY, model_label_key
from triton_operator.core.pool.members import most_pods, pool_budget, pool_models, thresholds
from triton_operator.core.pool.moves import PodState, plan_moves
from triton_operator.core.pool.placement import LARGER_THAN_POD, Placement, PoolPod, place
from triton_operator.core.repository.manifest import ManifestEntry, ManifestError, manifest_from_json
from triton_operator.core.rollout.clock import format_time, parse_time
from triton_operator.core.rollout.hostpods import APPLIED, APPLYING, FAILED, AgentStatus
from triton_operator.core.rollout.plan import RolloutEvent
from triton_operator.core.vocabulary import conditions as cond
from triton_operator.core.vocabulary.triton_state import VERSION_READY
from triton_operator.models import PoolStatus, TritonService
from triton_operator.settings import Settings

LOAD_BACKOFF = Backoff(base=5.0, cap=300.0)
"""Delays before a failed model load is asked again (a higher attempt in the assignment)."""


@dataclasses.dataclass(frozen=True)
class PodPatch:
    """A merge patch of one pool pod: its assignment annotation and model labels (None removes one),
    conditional on the resourceVersion the pass read (a conflict waits for the next pass)."""

    pod: str
    resource_version: str | None
    annotations: Mapping[str, str | None] = dataclasses.field(default_factory=dict)
    labels: Mapping[str, str | None] = dataclasses.field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        metadata: dict[str, Any] = {}
        if self.annotations:
            metadata["annotations"] = dict(self.annotations)
        if self.labels:
            metadata["labels"] = dict(self.labels)
        if self.resource_version:
            metadata["resourceVersion"] = self.resource_version
        return {"metadata": metadata}


@dataclasses.dataclass(frozen=True)
class PoolPlan:
    """What a pass writes for spec.pool: per-model Services (server-side applied), pod patches (after
    the Services: a pod is labelled only once its model's Service exists), status.pool, the next wait."""

    services: tuple[dict[str, Any], ...]
    """Per-model Services and HTTPRoutes to apply (those not stored as built)."""
    patches: tuple[PodPatch, ...]
    status: dict[str, Any] | None
    """status.pool (None: the service has no pool, and status.pool goes)."""
    next_at: float | None = None
    waiting: tuple[str, ...] = ()
    loading: tuple[tuple[str, str], ...] = ()
    """The copies (pod, model) an agent is asked to load and has not reported READY yet (Moves.loading)."""
    unloading: tuple[tuple[str, str], ...] = ()
    """The copies (pod, model) an agent is to unload, and still reports loaded, while a new copy waits for
    their room (Moves.unloading)."""
    delete: tuple[tuple[str, str], ...] = ()
    """(kind, name) of per-model Services and routes no longer wanted (a model gone, the pool gone)."""
    events: tuple[RolloutEvent, ...] = ()
    """A Warning per model load that failed since the last pass (each attempt once)."""
    replicas: int | None = None
    """The pool's pods (PoolCopies.replicas; None without spec.pool)."""


POOL_LOADING_SECONDS = 1.0
"""How soon a pass looks again while a copy loads: its pod's agent is read again (adapters.pool_reader,
one request a pod), and the pass after the read that finds it READY labels it. A copy is routed
within about this long (plus a read and a pass) of its load ending, well inside the default
drainSeconds during which a leaving pod still answers for the models it held alone."""
POOL_RETRY_SECONDS = 5.0
"""How soon a pass looks again while the pool's moves wait on anything else without a time (a pod
patch to see written, a label to take effect, other copies changing version)."""
POOL_LOAD_SECONDS = 15.0
"""How soon a pass looks again at a pool's load (its copies follow it) when nothing else is due."""


def pool_requeue(plan: PoolPlan | None, now: float) -> float | None:
    """Seconds until the pool's next pass is due (None: never, for the pool's sake): POOL_LOADING_SECONDS
    while a copy loads, or waits for its pod's agent to unload others (its next report); a drain or a
    retry ending; POOL_RETRY_SECONDS while other moves wait on the agents; at the latest the next look
    at the models' load. Nothing loading, nothing waiting: one pass every POOL_LOAD_SECONDS, no faster."""
    if plan is None:
        return None
    due = [POOL_LOAD_SECONDS] if plan.replicas is not None else []
    if plan.loading or plan.unloading:
        due.append(POOL_LOADING_SECONDS)
    if plan.next_at is not None:
        due.append(max(0.0, plan.next_at - now))
    elif plan.waiting or plan.patches:
        due.append(POOL_RETRY_SECONDS)
    return min(due) if due else None


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _unwanted(
    stored: Sequence[Mapping[str, Any]], wanted: Sequence[Mapping[str, Any]]
) -> tuple[tuple[str, str], ...]:
    keep = {(str(o.get("kind")), _name(o)) for o in wanted}
    return tuple(
        sorted((str(o.get("kind")), _name(o)) for o in stored if (str(o.get("kind")), _name(o)) not in keep)
    )


def pool_objects(ts_name: str, objects: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The per-model Services and routes of TritonService ``ts_name`` among ``objects`` (by their labels)."""
    out = []
    for obj in objects:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if labels.get(LABEL_MODEL_ROUTE) == "true" and labels.get(LABEL_SERVICE) == ts_name:
            out.append(obj)
    return out


def service_addresses(stored: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Each model's Service address (spec.clusterIP) among a pool's objects as read (pool_objects), for
    its pods' assignments (a leaving pod asks it which pod answers, core.pool.assignment.served_here):
    only an IP address (not "None", nor one not given yet)."""
    out = {}
    for obj in stored:
        if obj.get("kind") != "Service":
            continue
        model = ((obj.get("metadata") or {}).get("annotations") or {}).get(MODEL_ANNOTATION)
        address = (obj.get("spec") or {}).get("clusterIP")
        if isinstance(model, str) and isinstance(address, str):
            try:
                ipaddress.ip_address(address)
            except ValueError:
                continue
            out[model] = address
    return out


POOL_FIELDS = frozenset({"memory", "minCopies", "maxCopies"})
"""A model's fields that say where and how often it is placed, not what it loads: no part of its version."""


def _entries(manifest_json: str | None) -> tuple[ManifestEntry, ...] | None:
    """The pinned manifest's entries (None: no pinned manifest, or one that does not parse)."""
    if manifest_json is None:
        return None
    try:
        return manifest_from_json(manifest_json).entries
    except ManifestError:
        return None


def _files_token(config: str | None, model: str, entries: Sequence[ManifestEntry]) -> str:
    """A model's version token from its config and its pinned files (the manifest's entries under it)."""
    pinned = sorted(repr(e) for e in entries if e.dest.split("/", 1)[0] == model)
    body = json.dumps({"config": config, "files": pinned}, sort_keys=True)
    return "f" + hashlib.sha256(body.encode()).hexdigest()[:11]


def model_version(
    ts: TritonService, model: str, configs: Mapping[str, str], manifest_json: str | None = None
) -> str:
    """The version token of ``model`` (a change reloads it): a digest of its config and its pinned files
    (``manifest_json``, the revision's pinned manifest: the files' checksums and versions, as in-place
    updates compare them), so that new files in the store under the same spec are a new version; without
    a pinned manifest, a digest of its spec entry and config. Its pool fields (POOL_FIELDS: memory,
    minCopies, maxCopies) are in neither: changing them reloads nothing."""
    entries = _entries(manifest_json)
    if entries is not None:
        return _files_token(configs.get(model), model, entries)
    entry = next(m for m in ts.spec.models if m.name == model)
    spec = entry.model_dump(mode="json", by_alias=True, exclude_none=True)
    body = {"spec": {k: v for k, v in spec.items() if k not in POOL_FIELDS}, "config": configs.get(model)}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]


@dataclasses.dataclass(frozen=True)
class PoolInPlace:
    """A change of models moving in place in a pool (spec.rollout.modelUpdates: InPlace): the host
    revision whose pods stay, the revision the pods not asked serve, the revision each pod is asked
    for (the rollout engine's steps: its in-place target annotation) and the files of each revision
    (the in-place ConfigMap's, core.decision.inplace_plan). The pool's moves carry each changed model
    to the asked version on the pods that hold it, one pod at a time."""

    host: str
    served: str
    targets: Mapping[str, str]
    files: Mapping[str, RevisionFiles | None]
    next: str | None = None
    """The revision in progress: with ``served``, the revisions whose files the in-place ConfigMap
    carries (None: none in progress)."""


@dataclasses.dataclass(frozen=True)
class PoolVersions:
    """The version of each model: ``spec`` (the spec's revision's), ``on`` (pod -> model -> another
    version, the pods whose revision is another) and ``revisions`` (version -> the revision whose files
    hold it, when not the pods' own)."""

    spec: dict[str, str]
    on: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    revisions: dict[str, str] = dataclasses.field(default_factory=dict)


def _digests(files: RevisionFiles | None) -> dict[str, str]:
    """Per model of ``files``, its version token (model_version's, from that revision's files)."""
    if files is None:
        return {}
    entries = _entries(files.manifest_json) or ()
    return {model: _files_token(config, model, entries) for model, config in files.configs.items()}


def _changed(old: Mapping[str, str], new: Mapping[str, str]) -> set[str]:
    return {m for m, digest in new.items() if old.get(m) != digest}


def pool_versions(
    ts: TritonService,
    configs: Mapping[str, str],
    revision: str,
    pods: Sequence[Mapping[str, Any]],
    in_place: PoolInPlace | None,
    *,
    manifest_json: str | None = None,
) -> PoolVersions:
    """Each model's version, per pod while a change moves in place. A pod asked for the spec's
    ``revision`` (or serving it) holds the spec's version of each model; a pod serving another revision
    keeps, of a model that differs there, the copy it holds from that revision's files (else that
    revision's version of it). A model that does not differ between the two is the same version on
    every pod: it is never touched. A version whose files are not the host's own names its revision:
    the spec's while the in-place ConfigMap carries its files (it is served or in progress), else the
    served one when that holds the same version (an aborted revision's files are gone: a new copy
    named after it would wait for them for ever)."""
    models = [m.name for m in ts.spec.models]
    spec = {m: model_version(ts, m, configs, manifest_json) for m in models}
    if in_place is None:
        return PoolVersions(spec)
    out = PoolVersions(spec)
    host_files = in_place.files.get(in_place.host)
    host_digests, spec_digests = _digests(host_files), _digests(in_place.files.get(revision))
    own = _changed(host_digests, spec_digests) if host_files is not None else set(models)
    served_digests = _digests(in_place.files.get(in_place.served))
    carried = revision in (in_place.served, in_place.next)
    if revision != in_place.host:
        for m in sorted(own):
            same = in_place.served != in_place.host and m in spec_digests
            same = same and served_digests.get(m) == spec_digests[m]
            out.revisions[spec[m]] = in_place.served if same and not carried else revision
    for pod in pods:
        metadata = pod.get("metadata") or {}
        name = str(metadata.get("name"))
        if (metadata.get("labels") or {}).get(LABEL_REVISION) != in_place.host:
            continue
        at = in_place.targets.get(name, in_place.served)
        files = in_place.files.get(at)
        if at == revision or files is None:
            continue
        try:
            held = parse_assignment((metadata.get("annotations") or {}).get(ASSIGNMENT_ANNOTATION)).models
        except AssignmentError:
            held = {}
        digests = _digests(files)
        moved = _changed(host_digests, digests) if host_files is not None else set(models)
        for model in sorted(_changed(digests, spec_digests) if spec_digests else ()):
            if model not in spec or model not in digests:
                continue
            entry = held.get(model)
            if entry is not None and (entry.revision or in_place.host) == at:
                version = entry.version  # the copy it holds from that revision: kept
            else:
                version = digests[model]
                if model in moved and at != in_place.host:
                    out.revisions[version] = at
            out.on.setdefault(name, {})[model] = version
    return out


def pool_agents(
    pods: Sequence[Mapping[str, Any]],
    reports: Mapping[str, Mapping[str, Copy]],
    versions: PoolVersions,
    in_place: PoolInPlace,
    *,
    changed: Mapping[str, Sequence[str]],
) -> dict[str, AgentStatus]:
    """What each host pod of a pool serves, as the rollout engine's in-place mode reads an agent
    (core.rollout.hostpods.AgentStatus), from its assignment and its agent's pool report: the revision
    it is asked for (or serves) Applied once every model it holds is READY at that revision's version,
    Failed when a load of one of them failed (Triton's message: the engine rolls back), else Applying;
    with the models it holds (AgentStatus.holds: an in-place step's analysis judges the pods that hold
    a changed model, on that model's figures).
    A changed model (``changed``, by revision) the pod does not hold counts READY: nothing to load."""
    out: dict[str, AgentStatus] = {}
    for pod in pods:
        metadata = pod.get("metadata") or {}
        name = str(metadata.get("name"))
        if (metadata.get("labels") or {}).get(LABEL_REVISION) != in_place.host:
            continue
        at = in_place.targets.get(name, in_place.served)
        try:
            assignment = parse_assignment((metadata.get("annotations") or {}).get(ASSIGNMENT_ANNOTATION))
        except AssignmentError:
            assignment = parse_assignment(None)
        report = reports.get(name, {})
        holds = frozenset(m for m in assignment.models if m not in assignment.draining)
        wanted = {m: versions.on.get(name, {}).get(m, v) for m, v in versions.spec.items()}
        states: dict[str, str] = dict.fromkeys(changed.get(at, ()), VERSION_READY)
        failed = ""
        for model, entry in sorted(assignment.models.items()):
            if model not in wanted:
                continue
            copy = report.get(model)
            done = entry.version == wanted[model] and copy is not None and copy.state == VERSION_READY
            done = done and copy is not None and copy.version == wanted[model]
            # Not at its version yet: loading (a READY copy of another version is not this one).
            left = copy.state if copy is not None and copy.state != VERSION_READY else "LOADING"
            states[model] = VERSION_READY if done else left
            record = assignment.failed.get(model)
            if record is not None and record.version == wanted[model] and not failed:
                failed = f"model {model} failed to load: {record.message or record.reason}"
        if failed:
            out[name] = AgentStatus(
                revision=None, target=at, state=FAILED, message=failed, models=states, holds=holds
            )
        elif all(state == VERSION_READY for state in states.values()):
            out[name] = AgentStatus(revision=at, target=at, state=APPLIED, models=states, holds=holds)
        else:
            out[name] = AgentStatus(revision=None, target=at, state=APPLYING, models=states, holds=holds)
    return out


def _live(pod: Mapping[str, Any]) -> bool:
    return not _leaving(pod) and bool((pod.get("status") or {}).get("podIP"))


def _leaving(pod: Mapping[str, Any]) -> bool:
    """A terminating pod (deletionTimestamp set): never a placement target, but its READY copies stay
    on their routes until their models' copies answer elsewhere (make-before-break, as for any move)."""
    return (pod.get("metadata") or {}).get("deletionTimestamp") is not None


def _ready(pod: Mapping[str, Any]) -> bool:
    """The pod's Ready condition: its labels route requests to it only then (its Services' endpoints)."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def pool_drain_seconds(
    ts: TritonService, settings: Settings, recorded: Mapping[str, Settings], revisions: Iterable[str]
) -> float | None:
    """How long a pool's copy off its routes drains before it unloads: agent_drain_seconds with the
    settings each of ``revisions`` (the pool's pods') was created with (``recorded``; ``settings`` for
    a new one): a quick agent probe's, or the one before; the longest of them (None: no revision)."""
    return max((float(agent_drain_seconds(ts, recorded.get(r, settings))) for r in revisions), default=None)


def _recorded(previous: Mapping[str, Any]) -> PoolStatus | None:
    """status.pool as read; None when there is none or it does not parse (placed afresh then)."""
    recorded = previous.get("pool")
    if not isinstance(recorded, Mapping):
        return None
    try:
        return PoolStatus.model_validate(recorded)
    except ValueError:
        return None


@dataclasses.dataclass(frozen=True)
class PoolCopies:
    """How many copies each pooled model wants from its load (core.pool.copies), and the pods that takes."""

    wanted: dict[str, int]
    """Each model's wanted copies, after what memory short took back."""
    replicas: int
    """The pool's pods: spec.replicas (an HPA's or `kubectl scale`'s), raised to what the wanted copies
    need (podsNeeded), up to the most the pool may have (spec.autoscaling.maxReplicas, else spec.replicas)."""
    pods_needed: int
    shown: dict[str, LoadShown]
    last_used: dict[str, float]


def _stamp(seconds: float | None) -> str | None:
    return format_time(datetime.fromtimestamp(seconds, UTC)) if seconds is not None else None


def _seconds(value: str | None) -> float | None:
    moment = parse_time(value)
    return moment.timestamp() if moment is not None else None


def _serving(
    pods: Sequence[Mapping[str, Any]], reports: Mapping[str, Mapping[str, Copy]]
) -> tuple[dict[str, int], dict[str, int]]:
    """Per model, its copies READY and labelled ready on a live pod (they serve), and those its pods'
    assignments hold that do not serve yet (loading; a copy draining before its unload is neither)."""
    serving: dict[str, int] = {}
    loading: dict[str, int] = {}
    for pod in pods:
        if not _live(pod):
            continue
        metadata = pod.get("metadata") or {}
        labels = metadata.get("labels") or {}
        try:
            assignment = parse_assignment((metadata.get("annotations") or {}).get(ASSIGNMENT_ANNOTATION))
        except AssignmentError:
            continue
        report = reports.get(str(metadata.get("name")), {})
        for model in assignment.models:
            if model in assignment.draining:
                continue  # on its way out: neither serving nor to come
            copy = report.get(model)
            if (
                labels.get(model_label_key(model)) == READY
                and copy is not None
                and copy.state == VERSION_READY
            ):
                serving[model] = serving.get(model, 0) + 1
            else:
                loading[model] = loading.get(model, 0) + 1
    return serving, loading


def pool_copies(
    ts: TritonService,
    pods: Sequence[Mapping[str, Any]],
    reports: Mapping[str, Mapping[str, Copy]],
    *,
    previous: Mapping[str, Any],
    load: Mapping[str, Figures] | None,
    now: float,
) -> PoolCopies | None:
    """Each model's wanted copies from its load (None without spec.pool): ``load`` its figures over the
    window (reconcile.analysis; None: not read over a window yet, every model keeps what it wanted),
    counted against the copies that serve (READY and labelled on ``pods``, as ``reports`` say); the
    wanted copies so far, the busy and idle streaks and when each model was last used come from
    ``previous`` (status.pool). The pool then needs the pods of fit_pool: when they are more than the
    pool may have, copies beyond a model's least go, the least recently used model's first."""
    if ts.spec.pool is None:
        return None
    recorded = _recorded(previous)
    before = {m.name: m for m in recorded.models} if recorded is not None else {}
    limits = {m.name: (m.min_copies, m.max_copies) for m in pool_models(ts.spec)}
    current = {name: entry.wanted_copies for name, entry in before.items() if entry.wanted_copies > 0}
    streaks = {
        name: Streak(_seconds(entry.busy_since), _seconds(entry.idle_since)) for name, entry in before.items()
    }
    last_used = {
        name: used for name, entry in before.items() if (used := _seconds(entry.last_used)) is not None
    }
    serving, loading = _serving(pods, reports)
    figures = load or {}
    loads = [
        ModelLoad(
            name,
            serving.get(name, 0),
            figures[name].queue_us,
            figures[name].inferences_per_second,
            loading.get(name, 0),
        )
        for name in limits
        if name in figures
    ]
    decided = decide_copies(loads, limits, thresholds(ts.spec), now, streaks, current=current)
    for name, (least, most) in limits.items():
        if name in decided.wanted:
            continue
        # No figures: it keeps what it wanted (within its limits), its streaks end.
        base = max(least, current.get(name, least))
        kept = min(base, most) if most is not None else base
        decided.wanted[name], decided.reasons[name] = kept, NO_READINGS
        why = "not read over a window yet" if load is None else "no figures from Triton for it"
        decided.messages[name] = f"{why}: keeps {kept} copies"
    for name, figure in figures.items():
        if name in limits and figure.requests > 0:
            last_used[name] = used_at(now)
    budget = pool_budget(ts.spec)
    measured = _measured(ts, recorded, reports)
    models = pool_models(ts.spec, measured, wanted=decided.wanted, last_used=last_used)
    most = most_pods(ts.spec)
    rates = {name: figure.inferences_per_second for name, figure in figures.items()}
    size = fit_pool(models, budget, most, rates)
    shown = _shown(decided, size, last_used=last_used, most=most)
    replicas = min(most, max(ts.spec.replicas, size.pods))
    return PoolCopies(size.wanted, replicas, size.pods, shown, last_used)


def _shown(
    decided: CopiesDecision,
    size: PoolSize,
    *,
    last_used: Mapping[str, float],
    most: int,
) -> dict[str, LoadShown]:
    shown: dict[str, LoadShown] = {}
    wanted, trimmed = size.wanted, size.trimmed
    for name, why in decided.reasons.items():
        reason, message = why, decided.messages[name]
        if name in trimmed:
            reason = MEMORY_SHORT
            message = (
                f"its load asks for {decided.wanted[name]} copies, but {most} pods cannot hold every"
                f" model's wanted copies: {wanted[name]} kept, the least recently used models' extra"
                f" copies taken back first, then those serving least a copy ({message})"
            )
        streak = decided.streaks.get(name, Streak())
        shown[name] = LoadShown(
            reason=reason,
            message=message,
            busy_since=_stamp(streak.busy_since),
            idle_since=_stamp(streak.idle_since),
            last_used=_stamp(last_used.get(name)),
        )
    return shown


def _measured(
    ts: TritonService, recorded: PoolStatus | None, reports: Mapping[str, Mapping[str, Copy]]
) -> dict[str, int]:
    """Each model's measured memory: status.pool's, updated from what the agents measured at its loads."""
    return update_measured(measured_memory(recorded), reports, [m.name for m in ts.spec.models])


def _too_large(placed: Placement, recorded: PoolStatus | None) -> tuple[RolloutEvent, ...]:
    """A Warning per model that became larger than a pod (measured so) since status.pool said last."""
    before = {m.name: m.reason for m in recorded.models} if recorded is not None else {}
    return tuple(
        RolloutEvent(cond.WARNING, cond.POOL_MODEL_TOO_LARGE, f"model {m.name}: {m.message}")
        for m in placed.models.values()
        if m.reason == LARGER_THAN_POD and before.get(m.name) != LARGER_THAN_POD
    )


def _not_running(
    pods: Sequence[Mapping[str, Any]], revisions: set[str], target: str | None
) -> dict[str, str]:
    """The pool's pods that placement cannot use yet (no IP: not scheduled, or not started), of the
    revision placement goes to (``target``, else any of ``revisions``), not leaving; each with why, in
    the words of its PodScheduled condition when the scheduler cannot place it."""
    placing = {target} if target is not None else revisions
    out: dict[str, str] = {}
    for pod in pods:
        metadata, status = pod.get("metadata") or {}, pod.get("status") or {}
        revision = (metadata.get("labels") or {}).get(LABEL_REVISION)
        if _leaving(pod) or status.get("podIP") or revision not in placing:
            continue
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        scheduled = conditions.get(cond.POD_SCHEDULED) or {}
        if scheduled.get("status") == cond.FALSE:
            why = f"Pending, {scheduled.get('reason') or 'not scheduled'}: {scheduled.get('message') or ''}"
        elif not (pod.get("spec") or {}).get("nodeName"):
            why = "Pending, not scheduled yet"
        else:
            why = f"{status.get('phase') or 'Pending'} on node {pod['spec']['nodeName']}, no IP yet"
        out[str(metadata.get("name"))] = why
    return out


def _placing(live: Sequence[Mapping[str, Any]], target: str | None) -> Sequence[Mapping[str, Any]]:
    """The pods placement may use: the target revision's once it has a live pod, else every live pod."""
    ours = [p for p in live if ((p.get("metadata") or {}).get("labels") or {}).get(LABEL_REVISION) == target]
    return ours if target is not None and ours else live


def decide_pool(
    ts: TritonService,
    pods: Sequence[Mapping[str, Any]],
    reports: Mapping[str, Mapping[str, Copy]],
    *,
    revisions: Sequence[str],
    configs: Mapping[str, str],
    previous: Mapping[str, Any],
    now: float,
    stored: Sequence[Mapping[str, Any]] = (),
    parent_refs: Sequence[Mapping[str, Any]] = (),
    copies: PoolCopies | None = None,
    target: str | None = None,
    versions: PoolVersions | None = None,
    manifest_json: str | None = None,
    drain_seconds: float | None = None,
) -> PoolPlan | None:
    """The pool's writes for ``ts`` (None without spec.pool): its models placed over the live pods
    (``pods``: the owned pods as read, of the ``revisions`` the plan keeps), starting from each pod's
    assignment annotation; ``reports``: each pod's agent report (the latest reading); ``previous``:
    the status as read (the measured memory); ``stored``: its per-model Services and routes as read
    (pool_objects); ``parent_refs``: the parentRefs of the user's HTTPRoute (spec.rollout.trafficRouting
    .gatewayAPI.httpRoute, as read): the per-model HTTPRoutes attach there (none: no per-model routes);
    ``copies``: each model's wanted copies from its load (pool_copies; None: its least copies);
    ``manifest_json``: the spec's revision's pinned manifest (each model's version names its files).
    ``drain_seconds``: how long a copy off its routes drains before it unloads (agent_drain_seconds
    with the settings its revisions recorded; None: the longer probe's, agent_drain_seconds(ts)).
    ``target``: the revision the rollout goes to. Once it has live pods, the models are placed on its
    pods only: the other revisions' pods are leaving, and their copies stay on their routes until the
    copies placed on the target's pods answer (plan_moves), so a rollout that retires them drops no
    model. A terminating pod is never placed on; its READY copies stay on their routes (and count
    READY) until their models' wanted copies answer elsewhere, then come off, drain and unload as any
    copy placement no longer wants (its pod keeps serving meanwhile: build_pod_template's preStop).
    Without spec.pool, only what a former pool left goes (None when it left nothing)."""
    if ts.spec.pool is None:
        if not stored and not previous.get("pool"):
            return None
        return PoolPlan(services=(), patches=(), status=None, delete=_unwanted(stored, ()))
    wanted_revisions = set(revisions)
    # The pods whose copies may serve: the live ones and the terminating ones (until their copies
    # are off their routes); placement uses the live ones only.
    members = [
        p
        for p in pods
        if (p.get("status") or {}).get("podIP")
        and ((p.get("metadata") or {}).get("labels") or {}).get(LABEL_REVISION) in wanted_revisions
    ]
    live = [p for p in members if not _leaving(p)]
    budget = pool_budget(ts.spec)
    recorded = _recorded(previous)
    measured = _measured(ts, recorded, reports)
    models = pool_models(
        ts.spec,
        measured,
        wanted=copies.wanted if copies is not None else None,
        last_used=copies.last_used if copies is not None else None,
    )
    known = {m.name for m in recorded.models} if recorded is not None else set()
    states: dict[str, PodState] = {}
    for p in members:
        metadata = p.get("metadata") or {}
        name = str(metadata.get("name"))
        try:
            assignment = parse_assignment((metadata.get("annotations") or {}).get(ASSIGNMENT_ANNOTATION))
        except AssignmentError:
            assignment = parse_assignment(None)  # written again from the placement
        labels = metadata.get("labels") or {}
        # Every model that may still carry a label: the spec's, the pod's assignment's, the pool's last.
        names = {m.name for m in models} | set(assignment.models) | known
        routed = frozenset(m for m in names if labels.get(model_label_key(m)) == READY)
        states[name] = PodState(
            assignment=assignment,
            copies=dict(reports.get(name, {})),
            routed=routed,
            ready=_ready(p),
            reported=name in reports,
        )
    current = {pod: tuple(s.assignment.models) for pod, s in states.items()}
    placing = _placing(live, target)
    # A copy of a model larger than a pod is placed nowhere, but stays where it is loaded while it is
    # the model's last: the memory it holds there is given to no other model.
    oversize = {m.name: m.memory for m in models if m.memory > budget}
    pool_pods = [
        PoolPod(
            name := str((p.get("metadata") or {}).get("name")),
            (p.get("spec") or {}).get("nodeName"),
            budget,
            reserved=sum(oversize.get(m, 0) for m in current.get(name, ())),
        )
        for p in placing
    ]
    placed = place(pool_pods, models, {pod: current[pod] for pod in (p.name for p in pool_pods)})
    versions = versions or PoolVersions(
        {m.name: model_version(ts, m.name, configs, manifest_json) for m in models}
    )
    moves = plan_moves(
        placed.pods,
        {m.name: versions.spec[m.name] for m in models},
        states,
        now=now,
        drain=float(agent_drain_seconds(ts) if drain_seconds is None else drain_seconds),
        backoff=LOAD_BACKOFF,
        on=versions.on,
        revisions=versions.revisions,
        measured=measured,
        # A pod is given a copy only with the room beside what it still holds (its copies leaving
        # included), in placement's figures; an oversize copy counts there too (placement's reserved).
        memory={m.name: m.memory for m in models},
        budgets={p.name: p.budget for p in pool_pods},
    )
    events = tuple(
        RolloutEvent(
            cond.WARNING,
            cond.POOL_LOAD_FAILED,
            f"model {f.model} (version {f.version}) failed to load on {', '.join(f.pods)}: "
            f"{f.message or f.reason}; tried again later",
        )
        for f in moves.failures.values()
        if any(
            moves.pods[p].assignment.failed.get(f.model) != states[p].assignment.failed.get(f.model)
            for p in f.pods
        )
    )
    events += _too_large(placed, recorded)
    by_name = {str((p.get("metadata") or {}).get("name")): p for p in members}
    addresses = service_addresses(stored)
    patches: list[PodPatch] = []
    ready: dict[str, int] = {}
    for pod, step in sorted(moves.pods.items()):
        metadata = by_name[pod].get("metadata") or {}
        label_patch: dict[str, str | None] = {model_label_key(m): None for m in step.unlabel}
        label_patch.update({model_label_key(m): READY for m in step.label})
        on_pod = metadata.get("annotations") or {}
        assignment = dataclasses.replace(
            step.assignment, services={m: addresses[m] for m in step.assignment.models if m in addresses}
        )
        text, cost = build_assignment(assignment), deletion_cost(assignment)
        annotations = {
            key: value
            for key, value in ((ASSIGNMENT_ANNOTATION, text), (DELETION_COST_ANNOTATION, cost))
            if on_pod.get(key) != value
        }
        routed_after = (states[pod].routed | set(step.label)) - set(step.unlabel)
        for model in routed_after:
            copy = states[pod].copies.get(model)
            if copy is not None and copy.state == VERSION_READY:
                ready[model] = ready.get(model, 0) + 1
        if label_patch or annotations:
            patches.append(PodPatch(pod, metadata.get("resourceVersion"), annotations, label_patch))
    owner = build_owner_reference({"metadata": ts.metadata})
    wanted: list[dict[str, Any]] = [
        stamped(build_model_service(ts.name, ts.namespace, m.name, owner_ref=owner, labels=build_labels(ts)))
        for m in models
    ]
    if parent_refs:
        wanted += [
            stamped(route)
            for route in build_model_http_routes(
                ts.name,
                ts.namespace,
                [m.name for m in models],
                parent_refs=parent_refs,
                owner_ref=owner,
                labels=build_labels(ts),
            )
        ]
    by_key = {(str(o.get("kind")), _name(o)): o for o in stored}
    services = tuple(o for o in wanted if not applied_as_built(o, by_key.get((str(o.get("kind")), _name(o)))))
    endpoints = {m.name: model_endpoints(ts.name, ts.namespace, m.name) for m in models}
    status = pool_status(
        waiting_for(
            agents_waiting(room_waits(placed, moves.room), {pod: s.copies for pod, s in states.items()}),
            _not_running(pods, wanted_revisions, target),
        ),
        models,
        measured,
        copies.pods_needed if copies is not None else None,
        ready=ready,
        endpoints=endpoints,
        load=copies.shown if copies is not None else None,
    )
    return PoolPlan(
        services=services,
        patches=tuple(patches),
        status=status.model_dump(mode="json", by_alias=True, exclude_none=True),
        next_at=moves.next_at,
        waiting=moves.waiting,
        loading=moves.loading,
        unloading=moves.unloading,
        delete=_unwanted(stored, wanted),
        events=events,
        replicas=copies.replicas if copies is not None else None,
    )
