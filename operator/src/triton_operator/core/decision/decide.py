"""One pass's decision, pure: what the pass observed in; the rollout plan, the writes and the status out.

reconcile.observe gathers an ``Observed`` from the cluster (`triton-operator render` builds an empty
one from a file); ``decide`` turns it into a ``Decision``; reconcile.apply carries that out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from triton_operator.core.decision.actions import Actions, InPlaceWrites, RevisionPlan, plan_actions
from triton_operator.core.decision.actions import Target as Target  # noqa: PLC0414 (decide's input, re-exported)
from triton_operator.core.decision.inplace_plan import (
    InPlaceContext,
    InPlaceDecision,
    changed_models,
    host_pods,
    in_place_inputs,
    in_place_sides,
    in_place_writes,
    revision_files,
)
from triton_operator.core.decision.pool_plan import (
    PoolInPlace,
    PoolPlan,
    decide_pool,
    pool_agents,
    pool_copies,
    pool_drain_seconds,
    pool_versions,
)
from triton_operator.core.decision.scaling import (
    Autoscalers,
    scale_replicas,
    scale_selector,
    scaled_revisions,
)
from triton_operator.core.decision.service_status import Observation, build_status
from triton_operator.core.objects.builders import RevisionFiles, endpoints
from triton_operator.core.observed.observation import DeploymentState, PodState, recorded_revisions
from triton_operator.core.pod.startup import InPlaceRecords, parse_timeline
from triton_operator.core.pool.assignment import Copy
from triton_operator.core.pool.copies import Figures
from triton_operator.core.rollout.canary_analysis import AnalysisResult
from triton_operator.core.rollout.clock import format_time
from triton_operator.core.rollout.engine import plan_rollout
from triton_operator.core.rollout.inplace import AgentStatus, AnalysisSides, InPlaceState, analysis_sides
from triton_operator.core.rollout.plan import RolloutInput, RolloutPlan
from triton_operator.core.rollout.requests import parse_control_requests
from triton_operator.core.rollout.state import RevisionState, RolloutStatus
from triton_operator.core.vocabulary import conditions as cond
from triton_operator.models import TritonService
from triton_operator.settings import Settings


@dataclasses.dataclass(frozen=True)
class Observed:
    """What a pass read that its decision needs, parsed once (reconcile.observe gathers it)."""

    moment: datetime
    previous: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """The status as read (the base of the next one)."""
    annotations: Mapping[str, str] | None = None
    """The TritonService's annotations (control requests)."""
    generation: int = 0
    deployments: Sequence[Mapping[str, Any]] = ()
    """The owned revision Deployments as read."""
    configmaps: Sequence[Mapping[str, Any]] = ()
    """The owned ConfigMaps as read."""
    deployment_states: Sequence[DeploymentState] = ()
    pods: Sequence[PodState] = ()
    """The owned pods, parsed once."""
    revisions: Mapping[str, RevisionState] = dataclasses.field(default_factory=dict)
    """Every revision Deployment with its pods, as the rollout engine reads them."""
    autoscalers: Autoscalers | None = None
    """The HPAs that target the service (None: not listed)."""
    stale_disruption_budget: bool = False
    """The PodDisruptionBudget exists while the spec no longer wants one."""
    agents: Mapping[str, AgentStatus] = dataclasses.field(default_factory=dict)
    """The in-place agents' statuses read in this pass, by pod name (core.rollout.inplace)."""
    tuning_pods: int = 0
    """Pods of the service's tuning sweeps that hold GPUs (read only under a GPU budget)."""
    pod_bodies: Sequence[Mapping[str, Any]] = ()
    """The owned pods as read (a pool reads their assignment annotations and model labels)."""
    pool_reports: Mapping[str, Mapping[str, Copy]] = dataclasses.field(default_factory=dict)
    """The pool agents' latest reports, by pod name (GET :8009/v1/pool, read in the background)."""
    pool_objects: Sequence[Mapping[str, Any]] = ()
    """The per-model Services and HTTPRoutes as read (listed only while a pool is or was set)."""
    pool_parent_refs: Sequence[Mapping[str, Any]] = ()
    """The parentRefs of the user's HTTPRoute: where the per-model routes attach (none: no routes)."""
    pool_load: Mapping[str, Figures] | None = None
    """Each pooled model's figures over spec.pool.scaling.windowSeconds, from Triton's per-model metrics
    on its pods (reconcile.analysis; None: not read over a window yet)."""

    @property
    def now(self) -> str:
        return format_time(self.moment)


@dataclasses.dataclass(frozen=True)
class Decision:
    """What one pass does: the rollout engine's plan, and the writes that carry it out."""

    rollout: RolloutPlan
    actions: Actions
    in_place: InPlaceDecision | None = None
    """What the in-place mode writes and shows (core.decision.inplace_plan), from the same plan."""
    pool: PoolPlan | None = None
    """spec.pool's writes (core.decision.pool_plan; None without spec.pool)."""


def decide(
    target: Target,
    settings: Settings,
    observed: Observed,
    *,
    analysis: AnalysisResult | None = None,
    in_place_analysis: AnalysisResult | None = None,
) -> Decision:
    """The rollout toward ``target`` (its spec's revision; core.rollout, whose in-place mode
    core.decision.inplace_plan describes for models that move in place), and what to apply, scale
    and delete for it (core.decision.actions). ManifestTooLarge when the revision's manifest cannot be
    stored. ``analysis``: the canary's verdict in its window; ``in_place_analysis``: the in-place
    step's (rollout.hostpods.AnalysisSides)."""
    ts, revision = target.ts, target.revision
    configs, manifest_json, unsyncable = target.configs, target.manifest_json, target.unsyncable
    requests = parse_control_requests(observed.annotations)
    inputs = in_place_inputs(
        ts,
        settings,
        revision,
        InPlaceContext(
            previous=observed.previous,
            configmaps=observed.configmaps,
            revisions=observed.revisions,
            pods=observed.pods,
            agents=observed.agents,
            requests=requests,
            analysis=in_place_analysis,
        ),
        configs=configs,
        manifest_json=manifest_json,
    )
    if ts.spec.pool is not None and inputs.mode is not None:
        mode = inputs.mode
        served = _pool_host_agents(
            target,
            observed,
            host=mode.host,
            served=mode.state.stable if mode.state is not None else mode.host,
            files=inputs.files,
            changed=mode.models,
        )
        agents = {**observed.agents, **served}
        inputs = dataclasses.replace(
            inputs, mode=dataclasses.replace(mode, pods=host_pods(mode.host, observed.pods, agents))
        )
    # A pool's pods follow its models' wanted copies (spec.replicas at least: an HPA's, `kubectl scale`'s).
    copies = pool_copies(
        ts,
        observed.pod_bodies,
        observed.pool_reports,
        previous=observed.previous,
        load=observed.pool_load,
        now=observed.moment.timestamp(),
    )
    plan = plan_rollout(
        RolloutInput(
            rollout=ts.spec.rollout,
            replicas=copies.replicas if copies is not None else ts.spec.replicas,
            desired_revision=revision,
            now=observed.moment,
            status=RolloutStatus.from_status(observed.previous),
            revisions=observed.revisions,
            gpus_per_pod=ts.spec.resources.gpus,
            requests=requests,
            progress_deadline_seconds=ts.spec.progress_deadline(),
            unsyncable=unsyncable,
            analysis=analysis,
            tuning_pods=observed.tuning_pods,
            in_place=inputs.mode,
        )
    )
    ip = in_place_writes(ts, inputs, plan)
    scalers = observed.autoscalers
    actions = plan_actions(
        target,
        settings,
        plan,
        deployments=observed.deployments,
        configmaps=observed.configmaps,
        revision_services=cond.find_condition(observed.previous.get("conditions") or [], cond.TRAFFIC_ROUTED)
        is not None,
        disruption_budget=observed.stale_disruption_budget,
        autoscaler=scalers.apply_own(ts) if scalers is not None else False,
        stale_autoscaler=scalers.delete_own(ts) if scalers is not None else False,
        stored_autoscaler=scalers.own if scalers is not None else None,
        in_place=InPlaceWrites(
            configmap=ip.configmap,
            keep=ip.keep,
            annotations=plan.in_place.annotations if plan.in_place is not None else {},
            history=revision if revision != ip.engine_revision else None,
        ),
    )
    versions = None
    moving = plan.in_place.state if plan.in_place is not None else None
    if ts.spec.pool is not None and moving is not None:
        targets: dict[str, str | None] = {p.name: p.inplace_target for p in observed.pods}
        targets.update(plan.in_place.annotations if plan.in_place is not None else {})
        asked = PoolInPlace(
            moving.host, moving.stable, {p: t for p, t in targets.items() if t}, inputs.files, moving.next
        )
        versions = pool_versions(
            ts, configs, revision, observed.pod_bodies, asked, manifest_json=manifest_json
        )
    drain = None
    if ts.spec.pool is not None:  # a pool's copies drain by the probe each revision recorded
        recorded = recorded_revisions(settings, observed.deployments, observed.configmaps)
        drain = pool_drain_seconds(ts, settings, recorded, plan.replicas)
    pool_plan = decide_pool(
        ts,
        observed.pod_bodies,
        observed.pool_reports,
        revisions=sorted(plan.replicas),
        configs=configs,
        previous=observed.previous,
        now=observed.moment.timestamp(),
        stored=observed.pool_objects,
        parent_refs=observed.pool_parent_refs,
        copies=copies,
        target=plan.engine_revision,
        versions=versions,
        manifest_json=manifest_json,
        drain_seconds=drain,
    )
    return Decision(rollout=plan, actions=actions, in_place=ip, pool=pool_plan)


def _pool_host_agents(
    target: Target,
    observed: Observed,
    *,
    host: str,
    served: str,
    files: Mapping[str, RevisionFiles | None],
    changed: Mapping[str, Sequence[str]],
) -> dict[str, AgentStatus]:
    """A pool's host pods as the in-place mode reads their agents: a pooled pod reports no in-place
    revision of its own, what it serves comes from its assignment and its agent's pool report
    (core.decision.pool_plan.pool_agents)."""
    read = PoolInPlace(
        host, served, {p.name: p.inplace_target for p in observed.pods if p.inplace_target}, files
    )
    versions = pool_versions(
        target.ts,
        target.configs,
        target.revision,
        observed.pod_bodies,
        read,
        manifest_json=target.manifest_json,
    )
    return pool_agents(observed.pod_bodies, observed.pool_reports, versions, read, changed=changed)


def in_place_sides_of(target: Target, observed: Observed) -> AnalysisSides | None:
    """What the analysis of the in-place update in the status as read judges in this pass
    (core.decision.inplace_plan.in_place_sides); for a pool, its pods read as ``decide`` reads them
    (their assignments and pool reports), so that the verdict is of the sides the engine judges:
    the pods holding a changed model, on that model's figures (core.rollout.hostpods.analysis_sides)."""
    previous = observed.previous
    state = InPlaceState.from_status(previous)
    if target.ts.spec.pool is None or state is None or state.next is None:
        return in_place_sides(previous, observed.pods, observed.agents)
    if state.host != RolloutStatus.from_status(previous).stable_revision:
        return None
    files = {
        rev: RevisionFiles(target.manifest_json, dict(target.configs))
        if rev == target.revision and target.manifest_json is not None
        else revision_files(observed.configmaps, rev)
        for rev in (state.stable, state.next)
    }
    changed = {state.next: changed_models(files[state.stable], files[state.next])}
    agents = _pool_host_agents(
        target, observed, host=state.host, served=state.stable, files=files, changed=changed
    )
    pods = host_pods(state.host, observed.pods, {**observed.agents, **agents})
    return analysis_sides(state, pods, changed[state.next])


@dataclasses.dataclass(frozen=True)
class Shown:
    """What the status shows beside the decision: read (Triton, images) or learnt while applying (routes)."""

    images: tuple[str | None, str | None] = (None, None)
    """The tritonserver image the stable revision runs, and the operator's default when the spec names
    none and that image is another (status.image, status.defaultImage)."""
    repository: cond.Verdict | None = None
    blocked: tuple[str, str] | None = None
    """(message, Ready reason) when ``ts`` is the last valid spec and the current one waits."""
    traffic: cond.Verdict | None = None
    models: Sequence[Mapping[str, Any]] = ()
    analysis: Mapping[str, Any] | None = None
    autoscaling: cond.Verdict | None = None


def decided_status(ts: TritonService, decision: Decision, observed: Observed, shown: Shown) -> dict[str, Any]:
    """The status a pass writes once it carried out ``decision``
    (core.decision.service_status.build_status)."""
    plan = decision.rollout
    rs = plan.status
    kept = set(plan.replicas)
    scaled = scaled_revisions(ts.spec.rollout.strategy, rs.stable_revision, rs.canary_revision, plan.replicas)
    degraded = plan.condition(cond.DEGRADED)
    ip = decision.in_place
    rollout = rs.to_status()
    in_place_rolling: str | None = None
    aborted = degraded.message if rs.aborted_revision is not None and degraded is not None else None
    if ip is not None:
        rollout.update(ip.status_fields(observed.previous))
        if ip.governs and ip.plan is not None and ip.plan.state is not None:
            state = ip.plan.state
            progressing = plan.condition(cond.PROGRESSING)  # the in-place update's: the mode governs
            if state.next is not None and state.rolling_back is None and progressing is not None:
                in_place_rolling = progressing.message
            elif state.aborted_revision is not None and degraded is not None:
                aborted = degraded.message
    status = build_status(
        observed.previous,
        Observation(
            generation=observed.generation,
            now=observed.now,
            deployments=[d for d in observed.deployment_states if d.revision in kept],
            pods=[p for p in observed.pods if p.revision in kept],
            invalid=shown.blocked[0] if shown.blocked else None,
            blocked_reason=shown.blocked[1] if shown.blocked else cond.INVALID_SPEC,
            plan=RevisionPlan(
                replicas=plan.replicas,
                delete=plan.delete,
                stable=rs.stable_revision,
                rolling=rs.canary_revision,
            ),
            replicas=(
                decision.pool.replicas
                if decision.pool is not None and decision.pool.replicas is not None
                else ts.spec.replicas
            ),
            scale_replicas=scale_replicas(scaled, observed.deployment_states),
            scale_selector=scale_selector(ts.name, scaled),
            autoscaling=shown.autoscaling,
            repository=shown.repository,
            endpoints=endpoints(ts),
            models=shown.models,
            analysis=shown.analysis,
            image=shown.images[0],
            default_image=shown.images[1],
            rollout=rollout,
            progressing=plan.condition(cond.PROGRESSING),
            rollout_degraded=degraded,
            aborted=aborted,
            in_place_rolling=in_place_rolling,
            traffic=shown.traffic,
            in_place=in_place_records(rollout, observed.agents),
        ),
    )
    if decision.pool is not None and decision.pool.status is not None:
        status["pool"] = decision.pool.status
    return status


def in_place_records(rollout: Mapping[str, Any], agents: Mapping[str, AgentStatus]) -> InPlaceRecords | None:
    """What status.timeToServe reads of the in-place update: its host, the revision the host pods
    serve (servedRevision) and the one they load (inPlace.next), and each agent read this pass's
    record of its last in-place change; None without an in-place update."""
    state = rollout.get("inPlace") or {}
    host = state.get("host") if isinstance(state, Mapping) else None
    if not host:
        return None
    revisions = tuple(dict.fromkeys(r for r in (rollout.get("servedRevision"), state.get("next")) if r))
    timelines = {name: t for name, a in agents.items() if (t := parse_timeline(a.in_place)) is not None}
    return InPlaceRecords(str(host), revisions, timelines)


def held_status(
    observed: Observed, message: str, reason: str, repository: cond.Verdict | None
) -> dict[str, Any]:
    """The status while the current spec cannot be applied and no last valid spec can be carried out:
    only Ready (and RepositoryReady) say why; nothing is applied."""
    status = build_status(
        observed.previous,
        Observation(
            generation=observed.generation,
            now=observed.now,
            deployments=observed.deployment_states,
            pods=observed.pods,
            invalid=message,
            blocked_reason=reason,
            repository=repository,
        ),
    )
    if observed.previous.get("pool"):
        status["pool"] = observed.previous["pool"]  # the pool stays as it was placed and routed
    return status
