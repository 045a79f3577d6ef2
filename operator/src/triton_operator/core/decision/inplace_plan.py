"""The rollout engine's in-place mode in one pass, pure: its inputs from what the pass read, and its writes.

With spec.rollout.modelUpdates: InPlace, a change from the revision the stable pods serve to the
spec's revision that core.rollout.rollout_kind.rollout_kind finds loadable in place (and whose files fit the
`<deployment>-inplace` ConfigMap) is not rolled out as new pods: the rollout engine keeps the
stable ("host") revision as it is, and core.rollout.inplace moves the models its pods serve. Any
other change (or one while a new-pods rollout runs) goes to the engine as before, with the reasons
that force new pods in status.rolloutKindReason and an Event. The engine takes the control requests
and chooses (core.rollout.engine.choose_in_place); this module only says, for each revision the pods
may be asked for, how they would load it (``in_place_inputs``), and what the plan writes
(``in_place_writes``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
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
from triton_operator.core.rollout.engine import in_place_option
from triton_operator.core.rollout.inplace import (
    AgentStatus,
    AnalysisSides,
    HostPod,
    InPlaceState,
    analysis_sides,
    history_after,
)
from triton_operator.core.rollout.plan import InPlaceMode, InPlacePlan, RolloutPlan
from triton_operator.core.rollout.requests import ControlRequest
from triton_operator.core.rollout.rollout_kind import InPlace, NewPods, RevisionParts, rollout_kind
from triton_operator.core.rollout.state import HistoryEntry, RevisionState, RolloutStatus
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
class InPlaceInputs:
    """The in-place mode's inputs for the engine (core.rollout.plan.InPlaceMode), and what its writes
    read once the engine ran."""

    mode: InPlaceMode | None = None
    """None: no in-place mode (no stable revision yet, or no opt-in and nothing in place)."""
    files: Mapping[str, RevisionFiles | None] = dataclasses.field(default_factory=dict)
    """The files of the revisions the pods may serve or load (the in-place ConfigMap holds two), and
    the host's own (a pool's model the change leaves as the host has it loads from the pod's files)."""
    stored: Mapping[str, str] | None = None
    """The in-place ConfigMap's data as read (kept when a revision's files cannot be read back)."""
    history: Sequence[HistoryEntry] = ()
    """status.history as it came in."""
    host: str | None = None
    """The stable revision as read: the revisions its pods served in place before keep their ConfigMaps."""


@dataclasses.dataclass(frozen=True)
class InPlaceDecision:
    """What the in-place mode decided for one pass, once the engine moved its update."""

    engine_revision: str
    """The revision the rollout engine rolls out: the host's while the models move in place."""
    plan: InPlacePlan | None = None
    """The in-place update's plan (None: nothing is in place)."""
    kind: tuple[str, str] | None = None
    """(InPlace | NewPods, why) of the change in progress, for the status; None keeps the last."""
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
    analysis: AnalysisResult | None = None
    """The analysis verdict of the in-place step's window (reconcile.analysis), if one was judged."""


def in_place_inputs(
    ts: TritonService,
    settings: Settings,
    revision: str,
    ctx: InPlaceContext,
    *,
    configs: Mapping[str, str],
    manifest_json: str | None,
) -> InPlaceInputs:
    """The engine's in-place mode (core.rollout.plan.InPlaceMode) for ``revision`` of ``ts``: how the
    host's pods would load the spec's revision, and any earlier one an undo (or its pin) goes back
    to, from what the pass read (see the module)."""
    previous = ctx.previous
    rs = RolloutStatus.from_status(previous)
    host = rs.stable_revision
    state = InPlaceState.from_status(previous)
    if state is not None and state.host != host:
        state = None  # new pods took over: what the old host served in place is history
    if host is None or (state is None and not in_place(ts)):
        return InPlaceInputs(history=rs.history, host=host)

    def files(rev: str | None) -> RevisionFiles | None:
        if rev is None:
            return None
        if rev == revision and manifest_json is not None:
            return RevisionFiles(manifest_json, dict(configs))
        return revision_files(ctx.configmaps, rev)

    served = state.stable if state is not None else host
    # The revisions the pods may load in this pass: the one in progress (no other starts before it
    # ends), else the spec's and the one an undo pinned; and the one a pending undo asks for.
    loads: set[str] = set()
    change: InPlace | NewPods | None = None
    pinned: str | None = None

    def option(rev: str) -> bool:  # the engine asks only then (core.rollout.engine.in_place_change)
        return in_place_option(rs, ctx.revisions, opted_in=in_place(ts), revision=rev)

    if state is not None and state.next is not None:
        loads.add(state.next)
    else:
        if revision != served:
            loads.add(revision)
            if option(revision):
                spec = parts_of(ts, settings, configs, manifest_json)
                change = _change(ts, settings, ctx, host, change=(served, revision), files=files, new=spec)
        if state is not None and state.pinned is not None:
            loads.add(state.pinned)
            pinned = state.pinned if option(state.pinned) else None
    undo = _undo_target(ctx, rs, served)
    if undo is not None:
        loads.add(undo)
    back = sorted(r for r in (pinned, undo) if r is not None and r != served)
    earlier = {rev: _change(ts, settings, ctx, host, change=(served, rev), files=files) for rev in back}
    mode = InPlaceMode(
        host=host,
        state=state,
        opted_in=in_place(ts),
        change=change,
        earlier=earlier,
        models={rev: changed_models(files(served), files(rev)) for rev in sorted(loads)},
        pods=host_pods(host, ctx.pods, ctx.agents),
        configmap_stable=observed_state_stable(ctx.configmaps, host),
        described=str(previous.get("rolloutKindReason") or ""),
        analysis=ctx.analysis,
    )
    return InPlaceInputs(
        mode=mode,
        files={r: files(r) for r in sorted({host, served, *loads})},
        stored=_stored_inplace_data(ctx.configmaps, host),
        history=rs.history,
        host=host,
    )


def _undo_target(ctx: InPlaceContext, rs: RolloutStatus, served: str) -> str | None:
    """The revision a pending undo request asks for (--to-revision, else status.history's last),
    when the host's pods could load it in place (core.rollout.engine.undo_in_place)."""
    host = rs.stable_revision
    here = {h.revision for h in rs.history if h.in_place_host == host}
    for req in ctx.requests:
        if req.action == "undo" and rs.handled_requests.get("undo") != req.request_id:
            target = req.to_revision or (rs.history[-1].revision if rs.history else None)
            return target if target in here or (target == host and served != host) else None
    return None


def in_place_writes(ts: TritonService, inputs: InPlaceInputs, plan: RolloutPlan) -> InPlaceDecision:
    """What the in-place mode writes once the engine moved its update (``plan.in_place``): the
    `<deployment>-inplace` ConfigMap, the ConfigMaps kept, the kind and the served revision for the
    status."""
    engine, moved = plan.engine_revision, plan.in_place
    assert engine is not None  # plan_rollout says
    host = inputs.host
    kept = tuple(h.revision for h in inputs.history if host is not None and h.in_place_host == host)
    if moved is None or moved.before is None:
        return InPlaceDecision(engine_revision=engine, kind=plan.kind, keep=kept)
    state = moved.before
    configmap: dict[str, Any] | None = None
    keep: tuple[str, ...] = ()
    if moved.configmap is not None:
        stable, nxt = moved.configmap
        stored = {r: inputs.files.get(r) for r in (stable, nxt) if r}
        if all(v is not None for v in stored.values()):
            data = inplace_data(stable, nxt, {r: v for r, v in stored.items() if v is not None})
        else:
            # A revision's own ConfigMap cannot be read back (never expected: they are kept while
            # served or loading): the ConfigMap the pods follow stays as it is, never deleted.
            data = dict(inputs.stored or {})
        configmap = build_inplace_configmap(ts, state.host, data) if data else None
        keep = tuple(stored)
    after = moved.state
    history = history_after(inputs.history, ts.spec.rollout.revision_history_limit, state, after)
    entries = history if history is not None else inputs.history
    kept = tuple(h.revision for h in entries if h.in_place_host == state.host)
    return InPlaceDecision(
        engine_revision=engine,
        plan=moved,
        kind=plan.kind,
        configmap=configmap,
        keep=tuple(dict.fromkeys((*keep, *kept))),
        served=after.stable if after is not None and after.stable != after.host else None,
    )


def _change(
    ts: TritonService,
    settings: Settings,
    ctx: InPlaceContext,
    host: str,
    *,
    change: tuple[str, str],
    files: Callable[[str | None], RevisionFiles | None],
    new: RevisionParts | None = None,
) -> InPlace | NewPods | None:
    """How the host's pods would go from ``served`` to ``revision``: rollout_kind's answer, NewPods
    when too few pods serve or the files do not fit the in-place ConfigMap; None when ``revision``'s
    parts cannot be read. ``new``: its parts (None: an earlier revision's, read from its
    ConfigMaps). Whether in place is an option at all (opt-in, no rollout of new pods in progress)
    is the engine's to say (core.rollout.engine.in_place_change)."""
    served, revision = change
    old = stored_parts(ts, settings, ctx.configmaps, served)
    if old is None:
        return NewPods((f"revision {served}'s ConfigMap cannot be read: nothing to compare with",))
    if new is None:
        new = stored_parts(ts, settings, ctx.configmaps, revision)
    if new is None:
        return None
    kind = rollout_kind(old, new)
    if isinstance(kind, NewPods):
        return kind
    pods = host_pods(host, ctx.pods, {})
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
