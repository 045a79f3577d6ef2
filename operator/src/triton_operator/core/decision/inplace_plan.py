"""Where an in-place model update fits in one pass, pure: does a change go in place, and what it writes.

With spec.rollout.modelUpdates: InPlace, a change from the revision the stable pods serve to the
spec's revision that core.rollout.rollout_kind.rollout_kind finds loadable in place (and whose files fit the
`<deployment>-inplace` ConfigMap) is not rolled out as new pods: the rollout engine keeps the
stable ("host") revision as it is, and core.rollout.inplace moves the models its pods serve. Any
other change (or one while a new-pods rollout runs) goes to the engine as before, with the reasons
that force new pods in status.rolloutKindReason and an Event.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from triton_operator.core.objects.builders import (
    RevisionFiles,
    build_inplace_configmap,
    in_place,
    inplace_data,
    inplace_data_bytes,
    pod_template_inputs,
)
from triton_operator.core.objects.names import (
    CONFIG_KEY_SUFFIX,
    INPLACE_STATE_KEY,
    LABEL_INPLACE_HOST,
    SPEC_KEY,
)
from triton_operator.core.observed.observation import (
    PodState,
    recorded_settings,
    revision_configmaps,
    revision_manifest,
)
from triton_operator.core.repository.manifest import Manifest, manifest_from_json
from triton_operator.core.repository.manifestparts import CONFIGMAP_BUDGET
from triton_operator.core.rollout.canary_analysis import AnalysisResult
from triton_operator.core.rollout.inplace import (
    AgentStatus,
    AnalysisSides,
    HostPod,
    InPlaceRequests,
    InPlaceState,
    analysis_sides,
    history_after,
)
from triton_operator.core.rollout.plan import InPlaceInput, InPlaceMode, InPlacePlan, RolloutEvent
from triton_operator.core.rollout.requests import ControlRequest
from triton_operator.core.rollout.rollout_kind import InPlace, NewPods, RevisionParts, describe, rollout_kind
from triton_operator.core.rollout.state import HistoryEntry, RevisionState, RolloutStatus, paused
from triton_operator.core.vocabulary.conditions import (
    NEW_PODS_REQUIRED,
    NORMAL,
    ROLLOUT_RETRIED,
    UNDO_REJECTED,
    UNDO_REQUESTED,
    WARNING,
)
from triton_operator.models import TritonService
from triton_operator.settings import Settings

IN_PLACE = "InPlace"
NEW_PODS = "NewPods"
TOO_LARGE = "manifest too large for an in-place update"
MIN_IN_PLACE_PODS = 2
"""A pod leaves the Service while its models reload: in place needs another pod serving meanwhile."""


def too_few_pods(servable: int) -> str:
    """Why a change with fewer than MIN_IN_PLACE_PODS pods that can serve makes new pods instead."""
    have = "1 replica" if servable == 1 else f"{servable} pods that can serve"
    return (
        f"in place needs at least {MIN_IN_PLACE_PODS} pods: a pod leaves the Service while it reloads; "
        f"with {have} new pods take over instead"
    )


@dataclasses.dataclass(frozen=True)
class InPlaceChoice:
    """In place or new pods, chosen before the engine runs: the revision the engine rolls out, the
    in-place mode it runs (core.rollout.plan.InPlaceMode), and what the writes need once it ran."""

    engine_revision: str
    """The revision the rollout engine rolls out: the host's while the models move in place."""
    requests: tuple[ControlRequest, ...]
    """The control requests left to the engine (those the mode took are in ``mode.handled``)."""
    mode: InPlaceMode
    kind: tuple[str, str] | None = None
    """(InPlace | NewPods, why) of the change in progress, for the status; None keeps the last."""
    keep: tuple[str, ...] = ()
    """Revisions whose ConfigMaps stay (served here in place before), Deployment or not."""
    described: str = ""
    """What the update in progress does, in words (status.rolloutKindReason)."""
    files: Mapping[str, RevisionFiles | None] = dataclasses.field(default_factory=dict)
    """The files of the update's stable and next revisions (the in-place ConfigMap holds both)."""
    stored: Mapping[str, str] | None = None
    """The in-place ConfigMap's data as read (kept when a revision's files cannot be read back)."""
    history: Sequence[HistoryEntry] = ()
    """status.history as it came in."""


@dataclasses.dataclass(frozen=True)
class InPlaceDecision:
    """What the in-place mode decided for one pass, once the engine moved its update."""

    engine_revision: str
    """The revision the rollout engine rolls out: the host's while the models move in place."""
    requests: tuple[ControlRequest, ...]
    """The control requests left to the engine (those taken here are recorded as handled)."""
    handled: Mapping[str, str]
    """The requests taken here: action -> request id (status.handledRequests)."""
    plan: InPlacePlan | None = None
    """The in-place update's plan (None: nothing is in place)."""
    kind: tuple[str, str] | None = None
    """(InPlace | NewPods, why) of the change in progress, for the status; None keeps the last."""
    events: tuple[RolloutEvent, ...] = ()
    configmap: dict[str, Any] | None = None
    """The `<deployment>-inplace` ConfigMap to apply (None: none wanted)."""
    keep: tuple[str, ...] = ()
    """Revisions whose ConfigMaps stay (the ones the pods serve or load), Deployment or not."""
    served: str | None = None
    """status.servedRevision: the revision the stable pods serve when it is not their own."""

    def status_fields(self, previous: Mapping[str, Any]) -> dict[str, Any]:
        """servedRevision, inPlace, rolloutKind and rolloutKindReason as the status writes them."""
        kind, why = self.kind or (previous.get("rolloutKind"), previous.get("rolloutKindReason"))
        return {
            "servedRevision": self.served,
            "inPlace": self.plan.state.to_status() if self.plan is not None and self.plan.state else None,
            "rolloutKind": kind,
            "rolloutKindReason": why,
        }

    @property
    def governs(self) -> bool:
        """The in-place layer's conditions stand for the rollout (the engine keeps the host)."""
        return self.plan is not None and self.engine_revision == (
            self.plan.state.host if self.plan.state else None
        )


def revision_files(configmaps: Sequence[Mapping[str, Any]], revision: str) -> RevisionFiles | None:
    """A revision's manifest and configs, read back from its own ConfigMaps (None: they are gone)."""
    manifest = revision_manifest(configmaps, revision)
    if manifest is None:
        return None
    configs: dict[str, str] = {}
    for configmap in revision_configmaps(configmaps, revision):
        for key, value in (configmap.get("data") or {}).items():
            if str(key).endswith(CONFIG_KEY_SUFFIX):
                configs[str(key)[: -len(CONFIG_KEY_SUFFIX)]] = str(value)
    return RevisionFiles(manifest, configs)


def _manifest(text: str | None) -> Manifest | None:
    try:
        return manifest_from_json(text) if text else None
    except ValueError:
        return None


def parts_of(
    ts: TritonService, settings: Settings, configs: Mapping[str, str], manifest_json: str | None
) -> RevisionParts:
    return RevisionParts(
        pod=pod_template_inputs(ts, settings),
        configs=dict(configs),
        model_configs={m.name: m.config for m in ts.spec.models},
        manifest=_manifest(manifest_json),
    )


def stored_parts(
    ts: TritonService, settings: Settings, configmaps: Sequence[Mapping[str, Any]], revision: str
) -> RevisionParts | None:
    """What a stored revision is made of, from its ConfigMaps (spec.json, configs, manifest)."""
    own = revision_configmaps(configmaps, revision)
    files = revision_files(configmaps, revision)
    text = next(((c.get("data") or {}).get(SPEC_KEY) for c in own if SPEC_KEY in (c.get("data") or {})), None)
    if files is None or text is None:
        return None
    try:
        spec = json.loads(text)
        earlier = TritonService.model_validate({"metadata": dict(ts.metadata), "spec": spec})
    except ValueError:
        return None
    return parts_of(earlier, recorded_settings(settings, own, None), files.configs, files.manifest_json)


def observed_state_stable(configmaps: Sequence[Mapping[str, Any]], host: str) -> str | None:
    """state.json's stable in the host's in-place ConfigMap as read (None: none, or unreadable)."""
    for configmap in configmaps:
        labels = (configmap.get("metadata") or {}).get("labels") or {}
        if labels.get(LABEL_INPLACE_HOST) != host:
            continue
        try:
            state = json.loads((configmap.get("data") or {}).get(INPLACE_STATE_KEY) or "")
        except ValueError:
            return None
        stable = state.get("stable") if isinstance(state, dict) else None
        return str(stable) if stable else None
    return None


def _stored_inplace_data(configmaps: Sequence[Mapping[str, Any]], host: str) -> dict[str, str] | None:
    for configmap in configmaps:
        labels = (configmap.get("metadata") or {}).get("labels") or {}
        if labels.get(LABEL_INPLACE_HOST) == host:
            return {str(k): str(v) for k, v in (configmap.get("data") or {}).items()}
    return None


def _taken(
    requests: Sequence[ControlRequest], handled: Mapping[str, str], revisions: set[str]
) -> tuple[list[ControlRequest], list[ControlRequest]]:
    """(taken here, left to the engine): promote, promote-full, abort and retry made for the
    in-place revision (or for none: the rollout in progress), never handled before."""
    mine: list[ControlRequest] = []
    rest: list[ControlRequest] = []
    for req in requests:
        fresh = handled.get(req.action) != req.request_id
        ours = req.action in ("promote", "promote-full", "abort", "retry") and (
            req.revision is None or req.revision in revisions
        )
        (mine if fresh and ours else rest).append(req)
    return mine, rest


def changed_models(old: RevisionFiles | None, new: RevisionFiles | None) -> tuple[str, ...]:
    """The models of ``new`` whose config or pinned files differ from ``old``'s: their readiness gates
    a pod (an unchanged model is never touched by the agent)."""
    if new is None:
        return ()
    old_manifest = _manifest(old.manifest_json) if old is not None else None
    new_manifest = _manifest(new.manifest_json)
    out: list[str] = []
    for model, text in sorted(new.configs.items()):
        before = old.configs.get(model) if old is not None else None
        if before != text or _entries(old_manifest, model) != _entries(new_manifest, model):
            out.append(model)
    return tuple(out)


def _entries(manifest: Manifest | None, model: str) -> frozenset[Any]:
    if manifest is None:
        return frozenset()
    return frozenset(e for e in manifest.entries if e.dest.split("/", 1)[0] == model)


def host_pods(host: str, pods: Sequence[PodState], agents: Mapping[str, AgentStatus]) -> list[HostPod]:
    """The host revision's pods as the in-place update reads them, each with its agent's status and
    why it cannot serve (PodState.cannot_serve); a Failed or Succeeded pod (an evicted one) is not
    one of them: it never runs again, as a deleted pod."""
    return [
        HostPod(
            p.name,
            p.ready,
            p.terminating,
            p.inplace_target,
            agents.get(p.name),
            problem=None if p.terminating else p.cannot_serve(),
        )
        for p in pods
        if p.revision == host and not p.settled
    ]


def in_place_sides(
    previous: Mapping[str, Any], pods: Sequence[PodState], agents: Mapping[str, AgentStatus]
) -> AnalysisSides | None:
    """What the analysis of the in-place update in ``previous`` (status.inPlace) judges in this pass:
    the pods its steps moved to the next revision against the others (core.rollout.inplace.
    analysis_sides); None while nothing is judged."""
    state = InPlaceState.from_status(previous)
    if state is None or state.host != RolloutStatus.from_status(previous).stable_revision:
        return None
    return analysis_sides(state, host_pods(state.host, pods, agents))


@dataclasses.dataclass(frozen=True)
class InPlaceContext:
    """What the in-place layer reads of a pass, beside the spec."""

    previous: Mapping[str, Any]
    configmaps: Sequence[Mapping[str, Any]]
    revisions: Mapping[str, RevisionState]
    pods: Sequence[PodState]
    agents: Mapping[str, AgentStatus]
    requests: Sequence[ControlRequest]
    now: datetime
    deadline_seconds: int
    analysis: AnalysisResult | None = None
    """The analysis verdict of the in-place step's window (reconcile.analysis), if one was judged."""
    unsyncable: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Revisions an undo must not go back to (their pinned objects were overwritten), and why."""


def choose_in_place(
    ts: TritonService,
    settings: Settings,
    revision: str,
    ctx: InPlaceContext,
    *,
    configs: Mapping[str, str],
    manifest_json: str | None,
) -> InPlaceChoice:
    """Which revision the engine rolls out, and the in-place mode it runs (see the module)."""
    previous = ctx.previous
    rs = RolloutStatus.from_status(previous)
    host = rs.stable_revision
    state = InPlaceState.from_status(previous)
    if state is not None and state.host != host:
        state = None  # new pods took over: what the old host served in place is history
    # The revisions served here in place before (status.history): their ConfigMaps stay, for an undo.
    kept = tuple(h.revision for h in rs.history if host is not None and h.in_place_host == host)
    untouched = InPlaceChoice(
        engine_revision=revision,
        requests=tuple(ctx.requests),
        mode=InPlaceMode(),
        keep=kept,
        history=rs.history,
    )
    if host is None or (state is None and not in_place(ts)):
        return untouched

    def files(rev: str | None) -> RevisionFiles | None:
        if rev is None:
            return None
        if rev == revision and manifest_json is not None:
            return RevisionFiles(manifest_json, dict(configs))
        return revision_files(ctx.configmaps, rev)

    served = state.stable if state is not None else host
    events: list[RolloutEvent] = []
    kind: tuple[str, str] | None = None
    described = str(previous.get("rolloutKindReason") or "")
    asked = _requests(ts, settings, ctx, state=state, served=served, revision=revision, files=files)
    state, taken, rest, desired = asked.state, asked.taken, asked.rest, asked.desired
    events += asked.events
    actions = {r.action for r in taken}
    engine = host
    replaced_by: str | None = None
    if state is not None and state.next is not None:
        if state.next != desired:
            # A newer spec (or an undo), also while rolling back: the update in progress goes back,
            # and the new one starts once no pod is asked for it any more (core.rollout.inplace).
            replaced_by = desired
    elif state is not None and state.aborted_revision is not None:
        pass  # held: the host serves what it served, the spec's revision waits
    elif desired != served:
        change = _change(
            ts,
            settings,
            ctx,
            change=(served, desired),
            files=files,
            configs=configs,
            manifest_json=manifest_json,
            undo=desired != revision,
        )
        if isinstance(change, InPlace):
            pin = (state.pinned, state.pinned_for) if state is not None else (None, None)
            state = InPlaceState(host=host, stable=served, next=desired, pinned=pin[0], pinned_for=pin[1])
            described = describe(change)
            kind = (IN_PLACE, described)
        else:
            if change is not None:
                kind = (NEW_PODS, describe(change))
                if previous.get("rolloutKindReason") != kind[1]:
                    events.append(RolloutEvent(NORMAL, NEW_PODS_REQUIRED, f"revision {revision}: {kind[1]}"))
            if state is None:
                return dataclasses.replace(untouched, kind=kind, mode=InPlaceMode(events=tuple(events)))
            engine = revision  # new pods over a host that serves in place: the engine rolls them out
    elif state is None:
        return untouched
    assert state is not None
    update = InPlaceInput(
        rollout=ts.spec.rollout,
        state=state,
        models=changed_models(files(state.stable), files(state.next)) if state.next else (),
        pods=host_pods(state.host, ctx.pods, ctx.agents),
        now=ctx.now,
        deadline_seconds=ctx.deadline_seconds,
        paused=paused(ts.spec.rollout, rs),
        requests=InPlaceRequests(
            promote="promote" in actions, promote_full="promote-full" in actions, abort="abort" in actions
        ),
        configmap_stable=observed_state_stable(ctx.configmaps, state.host),
        describe=described,
        replaced_by=replaced_by,
        analysis=ctx.analysis,
    )
    handled: dict[str, str] = {r.action: r.request_id for r in taken}
    return InPlaceChoice(
        engine_revision=engine,
        requests=tuple(rest),
        mode=InPlaceMode(update=update, handled=handled, events=tuple(events)),
        kind=kind,
        described=described,
        files={r: files(r) for r in (state.stable, state.next) if r},
        stored=_stored_inplace_data(ctx.configmaps, state.host),
        history=rs.history,
    )


def in_place_writes(ts: TritonService, choice: InPlaceChoice, moved: InPlacePlan | None) -> InPlaceDecision:
    """What the in-place mode writes once the engine moved its update (``moved``: the plan's
    in_place): the `<deployment>-inplace` ConfigMap, the ConfigMaps kept, the kind and the served
    revision for the status."""
    mode, update = choice.mode, choice.mode.update
    handled = dict(mode.handled)
    if update is None or moved is None:
        return InPlaceDecision(
            engine_revision=choice.engine_revision,
            requests=choice.requests,
            handled=handled,
            kind=choice.kind,
            events=mode.events,
            keep=choice.keep,
        )
    state, plan, kind, described = update.state, moved, choice.kind, choice.described

    configmap: dict[str, Any] | None = None
    keep: tuple[str, ...] = ()
    if plan.configmap is not None:
        stable, nxt = plan.configmap
        stored = {r: choice.files.get(r) for r in (stable, nxt) if r}
        if all(v is not None for v in stored.values()):
            data = inplace_data(stable, nxt, {r: v for r, v in stored.items() if v is not None})
        else:
            # A revision's own ConfigMap cannot be read back (never expected: they are kept while
            # served or loading): the ConfigMap the pods follow stays as it is, never deleted.
            data = dict(choice.stored or {})
        configmap = build_inplace_configmap(ts, state.host, data) if data else None
        keep = tuple(stored)
    after = plan.state
    if kind is None and after is not None and after.next is not None:
        kind = (IN_PLACE, described)
    history = history_after(choice.history, ts.spec.rollout.revision_history_limit, state, after)
    entries = history if history is not None else choice.history
    kept = tuple(h.revision for h in entries if h.in_place_host == state.host)
    return InPlaceDecision(
        engine_revision=choice.engine_revision,
        requests=choice.requests,
        handled=handled,
        plan=plan,
        kind=kind,
        events=(*mode.events, *plan.events),
        configmap=configmap,
        keep=tuple(dict.fromkeys((*keep, *kept))),
        served=after.stable if after is not None and after.stable != after.host else None,
    )


@dataclasses.dataclass(frozen=True)
class _Asked:
    """The control requests one pass takes here, and what they leave to do."""

    state: InPlaceState | None
    taken: list[ControlRequest]
    rest: list[ControlRequest]
    events: list[RolloutEvent]
    desired: str
    """What the pods are to serve: the spec's revision, or the one an undo went back to."""


def _requests(
    ts: TritonService,
    settings: Settings,
    ctx: InPlaceContext,
    *,
    state: InPlaceState | None,
    served: str,
    revision: str,
    files: Callable[[str | None], RevisionFiles | None],
) -> _Asked:
    """The requests for the in-place rollout (promote, promote-full, abort, retry), an undo it can
    load in place, a retry after one; the pin and the hold they end."""
    rs = RolloutStatus.from_status(ctx.previous)
    events: list[RolloutEvent] = []
    ours = {r for r in (state.next, state.aborted_revision) if r} if state is not None else set()
    taken, rest = _taken(ctx.requests, rs.handled_requests, ours) if ours else ([], list(ctx.requests))
    undo = _undo(ts, settings, ctx, rest, state=state, served=served, revision=revision, files=files)
    if undo is not None:
        state = undo.state
        events += undo.events
        taken += undo.taken
        rest = [r for r in rest if r not in undo.taken]
    if state is not None and state.pinned is not None:
        # A retry rolls the spec forward after an undo made here (as after the engine's pin).
        retry = [r for r in rest if r.action == "retry" and rs.handled_requests.get("retry") != r.request_id]
        taken += retry
        rest = [r for r in rest if r not in retry]
    actions = {r.action for r in taken}
    ended = state is not None and (state.pinned_for != revision or "retry" in actions)
    if state is not None and state.pinned is not None and ended:
        if state.pinned_for == revision:
            forward = f"rolling forward to revision {revision}"
            events.append(RolloutEvent(NORMAL, ROLLOUT_RETRIED, forward))
        state = dataclasses.replace(state, pinned=None, pinned_for=None)  # a new spec, or a retry
    desired = state.pinned if state is not None and state.pinned is not None else revision
    held = state is not None and state.next is None and state.aborted_revision is not None
    if state is not None and held and (state.aborted_revision != desired or "retry" in actions):
        if state.aborted_revision == desired:
            events.append(RolloutEvent(NORMAL, ROLLOUT_RETRIED, f"retrying revision {desired} in place"))
        state = dataclasses.replace(state, aborted_revision=None, aborted_reason=None, aborted_detail=None)
    return _Asked(state, taken, rest, events, desired)


@dataclasses.dataclass(frozen=True)
class _Undone:
    state: InPlaceState | None
    events: tuple[RolloutEvent, ...]
    taken: tuple[ControlRequest, ...]


def _undo(
    ts: TritonService,
    settings: Settings,
    ctx: InPlaceContext,
    requests: Sequence[ControlRequest],
    *,
    state: InPlaceState | None,
    served: str,
    revision: str,
    files: Callable[[str | None], RevisionFiles | None],
) -> _Undone | None:
    """An undo request the in-place layer takes: its target (--to-revision, else the last entry of
    status.history) was served in place in the host's pods (status.history's inPlaceHost), or is the
    host's own revision while they serve another in place. Pinned (status.inPlace.pinned) until the
    spec changes or a retry request, as the engine pins an undo; the pods move to it as any in-place
    update does, step by step, gated. None: not one for in place (the engine takes it)."""
    rs = RolloutStatus.from_status(ctx.previous)
    host = rs.stable_revision
    fresh = [r for r in requests if r.action == "undo" and rs.handled_requests.get("undo") != r.request_id]
    if not fresh or host is None or rs.canary_revision is not None or not in_place(ts):
        return None
    req = fresh[-1]
    in_place_here = {h.revision for h in rs.history if h.in_place_host == host}
    target = req.to_revision or (rs.history[-1].revision if rs.history else None)
    if target is None or not (target in in_place_here or (target == host and served != host)):
        return None

    def rejected(why: str) -> _Undone:
        message = f"undo: revision {target} cannot be loaded in place: {why}"
        return _Undone(state, (RolloutEvent(WARNING, UNDO_REJECTED, message),), (req,))

    if target in ctx.unsyncable:
        return rejected(f"it cannot sync any more: {ctx.unsyncable[target]}")
    if target != served:
        change = _change(
            ts,
            settings,
            ctx,
            change=(served, target),
            files=files,
            configs={},
            manifest_json=None,
            undo=True,
            checks=False,
        )
        if not isinstance(change, InPlace):
            return rejected(describe(change) if change is not None else "its ConfigMap is gone")
    base = state if state is not None else InPlaceState(host=host, stable=served)
    pinned = dataclasses.replace(base, pinned=target, pinned_for=revision)
    message = (
        f"rolling back to revision {target} in place, in the pods of revision {host} (serving {served}); "
        f"the spec's revision {revision} waits until the spec changes or a retry request"
    )
    return _Undone(pinned, (RolloutEvent(NORMAL, UNDO_REQUESTED, message),), (req,))


def _change(
    ts: TritonService,
    settings: Settings,
    ctx: InPlaceContext,
    *,
    change: tuple[str, str],
    files: Callable[[str | None], RevisionFiles | None],
    configs: Mapping[str, str],
    manifest_json: str | None,
    undo: bool = False,
    checks: bool = True,
) -> InPlace | NewPods | None:
    """How the change from ``served`` to ``revision`` rolls out: None when in place is not an option
    (not opted in, new pods already rolling, an undo pin), else rollout_kind's answer, NewPods when
    the files do not fit the in-place ConfigMap. ``undo``: ``revision`` is an earlier one an undo
    goes back to (its parts read from its ConfigMaps, not the spec's); ``checks``: whether the
    rollout in progress is looked at (an undo being decided is checked for that by _undo)."""
    served, revision = change
    rs = RolloutStatus.from_status(ctx.previous)
    if checks and (not in_place(ts) or rs.canary_revision is not None or rs.pinned_revision is not None):
        return None
    if checks and (rs.aborted_revision == revision or rs.stable_revision not in ctx.revisions):
        return None
    old = stored_parts(ts, settings, ctx.configmaps, served)
    if old is None:
        return NewPods((f"revision {served}'s ConfigMap cannot be read: nothing to compare with",))
    new = (
        stored_parts(ts, settings, ctx.configmaps, revision)
        if undo
        else parts_of(ts, settings, configs, manifest_json)
    )
    if new is None:
        return None
    kind = rollout_kind(old, new)
    if isinstance(kind, NewPods):
        return kind
    pods = host_pods(rs.stable_revision or "", ctx.pods, {})
    servable = sum(1 for p in pods if not p.terminating and p.problem is None)
    if servable < MIN_IN_PLACE_PODS:
        return NewPods((too_few_pods(servable),))
    held = {r: files(r) for r in (served, revision)}
    if any(v is None for v in held.values()):
        return NewPods(("the pinned manifest is not stored yet",))
    data = inplace_data(served, revision, {r: v for r, v in held.items() if v is not None})
    if inplace_data_bytes(data) > CONFIGMAP_BUDGET:
        return NewPods((TOO_LARGE,))
    return kind
