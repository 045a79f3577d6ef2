"""What one reconcile reads, all before it decides: the TritonService, the objects it owns, the pods'
model-agents during an in-place update, what an undo may not reach, and for each spec it may carry
out the HPAs, the PodDisruptionBudget, the routes, Triton's readings and the analysis windows."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from triton_operator.adapters.agent_reader import AgentReader
from triton_operator.adapters.kube import (
    KubeAPI,
    Owned,
)
from triton_operator.core import tuning
from triton_operator.core.decision.decide import Observed, Target, in_place_sides_of
from triton_operator.core.decision.pool_plan import pool_objects
from triton_operator.core.decision.scaling import Autoscalers
from triton_operator.core.objects.builders import disruption_budget_enabled
from triton_operator.core.objects.model_routes import LABEL_MODEL_ROUTE
from triton_operator.core.objects.names import LABEL_MANAGED_BY, LABEL_SERVICE, MANAGED_BY
from triton_operator.core.observed.observation import (
    DeploymentState,
    PodState,
    deployment_state,
    nothing_applied_yet,
    observe_revisions,
    pod_state,
    revision_manifest,
    split_by_owner,
)
from triton_operator.core.pool.assignment import Copy
from triton_operator.core.repository.manifest import (
    stale_pins,
)
from triton_operator.core.rollout.clock import format_time
from triton_operator.core.rollout.inplace import AgentStatus, InPlaceState
from triton_operator.core.rollout.requests import pending_requests
from triton_operator.core.rollout.state import RolloutStatus
from triton_operator.reconcile.analysis import TritonSeen, TritonView
from triton_operator.reconcile.autoscaling import look
from triton_operator.reconcile.pinning import PinnedManifest, parse_manifest
from triton_operator.reconcile.routes import Routes, read_routes


def owned_selector(name: str) -> dict[str, str]:
    return {LABEL_SERVICE: name, LABEL_MANAGED_BY: MANAGED_BY}


def current_manifest(owned: Owned, previous: Mapping[str, Any]) -> str | None:
    """The manifest JSON of the newest running revision (the canary's, else the one loading in place,
    else the one the stable pods serve: in place, or their own)."""
    in_place = previous.get("inPlace") or {}
    newest = (
        previous.get("canaryRevision"),
        in_place.get("next"),
        previous.get("servedRevision"),
        previous.get("stableRevision"),
    )
    for revision in newest:
        text = revision_manifest(owned.configmaps, revision) if revision else None
        if text is not None:
            return text
    return None


def undo_waits(seen: Seen) -> bool:
    """Whether an undo request waits (the annotations hold one the status has not handled)."""
    requests = pending_requests(seen.metadata.get("annotations"), seen.previous)
    return any(r.action == "undo" for r in requests)


def unsyncable(seen: Seen, pinned: PinnedManifest | None) -> dict[str, str]:
    """Revisions an undo must not go back to: objects they pinned were overwritten (unversioned).

    Judged against the listing just pinned, and only while an undo request waits (it parses
    the manifest of every revision an undo may go back to).
    """
    if pinned is None or pinned.digest is None or not undo_waits(seen):
        return {}
    current = parse_manifest(pinned.json)
    if current is None:
        return {}
    out: dict[str, str] = {}
    status = RolloutStatus.from_status(seen.previous)
    # What an undo may go back to (core.rollout: the stable revision or one in history).
    candidates = [h.revision for h in status.history] + [r for r in (status.stable_revision,) if r]
    for revision in candidates:
        earlier = parse_manifest(revision_manifest(seen.owned.configmaps, revision))
        why = (
            stale_pins(earlier, current, versions_kept=pinned.versions_kept is not False)
            if earlier is not None
            else None
        )
        if why is not None:
            out[revision] = why
    return out


@dataclasses.dataclass(frozen=True)
class Seen:
    """What one reconcile read: the TritonService and the objects it owns (by owner, not by label)."""

    namespace: str
    name: str
    metadata: Mapping[str, Any]
    generation: int
    previous: Mapping[str, Any]
    moment: datetime.datetime
    owned: Owned
    foreign: frozenset[str]
    deployments: list[DeploymentState]
    pods: list[PodState]
    replicas: int | None = None
    """spec.replicas as stored now (an HPA, KEDA or `kubectl scale` writes it through /scale), even
    while the rest of the spec is blocked; None when it is not a count."""
    agents: Mapping[str, AgentStatus] = dataclasses.field(default_factory=dict)
    """The host pods' model-agents, by pod name, while an in-place update moves (observe_agents)."""
    tuning_pods: int = 0
    """Pods of the service's tuning sweeps (core.tuning.held_pods), read only under a GPU budget."""
    pool_reports: Mapping[str, Mapping[str, Copy]] = dataclasses.field(default_factory=dict)
    """The pool agents' latest reports by pod name (GET :8009/v1/pool), as last read in the background."""
    pool_objects: Sequence[Mapping[str, Any]] = ()
    """The pool's per-model Services and HTTPRoutes as read (pool_objects_of)."""

    @property
    def now(self) -> str:
        return format_time(self.moment)


async def observe(
    kube: KubeAPI, namespace: str, name: str, body: Mapping[str, Any], moment: datetime.datetime
) -> Seen:
    metadata: Mapping[str, Any] = body.get("metadata") or {}
    found = await kube.list_owned(namespace, owned_selector(name))
    # By owner, not by label: what a deleted TritonService of this name left is not ours.
    adoption = split_by_owner(str(metadata.get("uid") or ""), found.deployments, found.configmaps, found.pods)
    owned = Owned(
        deployments=[dict(d) for d in adoption.deployments],
        configmaps=[dict(c) for c in adoption.configmaps],
        pods=[dict(p) for p in adoption.pods],
    )
    return Seen(
        namespace=namespace,
        name=name,
        metadata=metadata,
        generation=int(metadata.get("generation") or 0),
        previous=body.get("status") or {},
        moment=moment,
        owned=owned,
        foreign=frozenset(adoption.foreign),
        deployments=[deployment_state(d) for d in owned.deployments],
        pods=[pod_state(p) for p in owned.pods],
        replicas=live_replicas(body),
        tuning_pods=await tuning_pods(kube, namespace, name, body),
        pool_objects=await pool_objects_of(kube, namespace, name, body),
    )


async def pool_objects_of(
    kube: KubeAPI, namespace: str, name: str, body: Mapping[str, Any]
) -> list[Mapping[str, Any]]:
    """The per-model Services and HTTPRoutes of a pool (core.decision.pool_plan.pool_objects): listed
    only while the spec has spec.pool or the status a status.pool (what a former pool left goes); the
    HTTPRoutes only while the spec names an HTTPRoute (Gateway API is installed then)."""
    spec = body.get("spec") or {}
    if not spec.get("pool") and not (body.get("status") or {}).get("pool"):
        return []
    # Selected by the labels every one of them carries (build_labels): the Services come from the
    # operator's watches (adapters.cached_kube), so a pass each second while copies load lists nothing.
    labels = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_SERVICE: name, LABEL_MODEL_ROUTE: "true"}
    found = await kube.list_kind("Service", namespace, labels)
    gateway = ((spec.get("rollout") or {}).get("trafficRouting") or {}).get("gatewayAPI") or {}
    if gateway.get("httpRoute"):
        found += await kube.list_kind("HTTPRoute", namespace, labels)
    return pool_objects(name, found)


async def tuning_pods(kube: KubeAPI, namespace: str, name: str, body: Mapping[str, Any]) -> int:
    """The pods of the service's tuning sweeps (`kubectl triton tune`), which count against
    spec.rollout.gpuBudget; listed only when the spec has a budget and asks for GPUs."""
    spec = body.get("spec") or {}
    gpus = (spec.get("resources") or {}).get("gpus")
    if (spec.get("rollout") or {}).get("gpuBudget") is None or not gpus:
        return 0
    found = await kube.list_owned(namespace, {tuning.LABEL_TUNING: name})
    return tuning.held_pods(found.deployments, found.pods)


async def observe_agents(triton: TritonView | None, seen: Seen) -> Seen:
    """``seen`` with the host pods' model-agents read (only while an in-place update moves,
    status.inPlace.next; each read bounded: adapters.agent_reader): once a pass, before any
    decision, whichever spec the pass carries out (the current one, or the last valid one should
    the API server refuse the first)."""
    if triton is None:
        return seen
    seen = await observe_starts(triton.agents, seen)
    return dataclasses.replace(seen, agents=await triton.read_agents(seen.previous, seen.pods))


async def observe_starts(reader: AgentReader | None, seen: Seen) -> Seen:
    """``seen`` with each Ready pod of the one shape given its agent's record of its first fill
    (core.pod.startup.FillTimeline: its sync phase and bytes in status.timeToServe and the metrics).
    Asked once per pod (adapters.agent_reader.AgentReader.read_fills, bounded), and only while its
    time to serve is not recorded: its revision has no status.timeToServe entry, or it became Ready
    since this process started (the metrics observe it); never again on later passes."""
    if reader is None:
        return seen
    recorded = {e.get("revision") for e in seen.previous.get("timeToServe") or []}

    def wanted(pod: PodState) -> bool:
        ready = pod.start.ready
        new = pod.revision not in recorded or (ready is not None and ready >= reader.since)
        return pod.ready and pod.live and bool(pod.uid) and pod.start.fills and new

    ask = {p.uid: p.ip for p in seen.pods if wanted(p) and not reader.asked(p.uid)}
    await reader.read_fills(ask)
    pods = [p.with_fill(reader.fill(p.uid)) for p in seen.pods]
    return dataclasses.replace(seen, pods=pods)


def live_replicas(body: Mapping[str, Any]) -> int | None:
    """A body's spec.replicas when it is a count (0 or more), else None."""
    replicas = (body.get("spec") or {}).get("replicas")
    return (
        replicas if isinstance(replicas, int) and not isinstance(replicas, bool) and replicas >= 0 else None
    )


@dataclasses.dataclass(frozen=True)
class Around:
    """A spec the pass may carry out (the current one, or the last valid one while the current one is
    blocked or refused), and what was read for it beside the objects it owns: read before the
    decision, never after."""

    target: Target
    autoscalers: Autoscalers | None
    """The namespace's HPAs that target the service (None: not listed, see reconcile.autoscaling.look)."""
    stale_disruption_budget: bool
    """The PodDisruptionBudget exists while the spec no longer wants one (looked up only then)."""
    routes: Routes
    """The Gateway API routes the spec names, as read (none when it names none)."""
    triton: TritonSeen | None = None
    """Triton's readings of its pods and the analysis windows' verdicts (None: Triton is not read)."""


class Absences:
    """The PodDisruptionBudgets this process found absent (or deleted) and has not applied since, by
    TritonService: a pass whose spec wants none looks one up only when it may exist, not on every
    pass. Process memory: empty at start (each is looked up once) and emptied when the operator
    pauses (another replica may write one meanwhile)."""

    def __init__(self) -> None:
        self._absent: set[tuple[str, str]] = set()

    def may_exist(self, namespace: str, name: str) -> bool:
        return (namespace, name) not in self._absent

    def absent(self, namespace: str, name: str) -> None:
        """Found absent, or deleted."""
        self._absent.add((namespace, name))

    def present(self, namespace: str, name: str) -> None:
        """About to be applied (or the TritonService is gone: nothing is known of its next one)."""
        self._absent.discard((namespace, name))

    def clear(self) -> None:
        self._absent.clear()


async def observe_specs(
    kube: KubeAPI,
    seen: Seen,
    targets: Sequence[Target],
    absences: Absences | None = None,
    triton: TritonView | None = None,
) -> list[Around]:
    """Read what the decision for each of ``targets`` needs beyond ``seen``: HPAs, the
    PodDisruptionBudget, the routes, and Triton's readings and analysis verdicts (``triton``; None:
    not read). ``targets``: the spec the pass carries out, and the last valid one it carries out
    instead should the API server refuse the first: read together, each object once, so that a
    pass reads nothing after it has decided. ``absences``: the PodDisruptionBudgets known absent
    (None: none is)."""
    specs = [t.ts for t in targets]
    scalers = await look(kube, specs, seen.metadata, seen.previous)
    # A PodDisruptionBudget a spec no longer wants is looked up (and deleted) only then, and only
    # while it may exist: not before the first pass applied anything, nor once known absent.
    unwanted = [not disruption_budget_enabled(ts) for ts in specs]
    pdb = False
    new = nothing_applied_yet(seen.previous, seen.owned.deployments, seen.owned.configmaps)
    if new and absences is not None:
        absences.absent(seen.namespace, seen.name)  # until a pass applies one (Absences.present)
    if any(unwanted) and not new and (absences is None or absences.may_exist(seen.namespace, seen.name)):
        pdb = await kube.get("PodDisruptionBudget", seen.namespace, seen.name) is not None
        if not pdb and absences is not None:
            absences.absent(seen.namespace, seen.name)
    routes = await read_routes(kube, specs)
    return [
        Around(
            target=t,
            autoscalers=s,
            stale_disruption_budget=pdb and u,
            routes=r,
            triton=observe_triton(triton, seen, t) if triton is not None else None,
        )
        for t, s, u, r in zip(targets, scalers, unwanted, routes, strict=True)
    ]


def observe_triton(triton: TritonView, seen: Seen, target: Target) -> TritonSeen:
    """What the operator holds of Triton for ``target``: its pods' readings, and the verdicts of the
    canary's and the in-place step's analysis windows at this pass's moment (reconcile.analysis;
    nothing is waited for, nothing recorded: the pass keeps what it carries out)."""
    moving = InPlaceState.from_status(seen.previous)
    return triton.read(
        (seen.namespace, seen.name),
        target.ts,
        RolloutStatus.from_status(seen.previous),
        target.revision,
        seen.pods,
        now=seen.moment,
        in_place=moving is not None and moving.next is not None,
        sides=in_place_sides_of(target, observed(seen)),
    )


def _parent_refs(around: Around | None) -> list[Mapping[str, Any]]:
    """The parentRefs of the user's HTTPRoute as read (where a pool's per-model routes attach)."""
    if around is None:
        return []
    for (kind, _name), route in around.routes.items():
        if kind == "HTTPRoute" and route is not None:
            return list((route.get("spec") or {}).get("parentRefs") or [])
    return []


def observed(seen: Seen, around: Around | None = None) -> Observed:
    """What the decision (core.decision.decide) reads of this pass's observations (``around``: for the spec it
    carries out; None when it carries out none)."""
    return Observed(
        moment=seen.moment,
        previous=seen.previous,
        annotations=seen.metadata.get("annotations"),
        generation=seen.generation,
        deployments=seen.owned.deployments,
        configmaps=seen.owned.configmaps,
        deployment_states=seen.deployments,
        pods=seen.pods,
        revisions=observe_revisions(seen.deployments, seen.pods),
        autoscalers=around.autoscalers if around is not None else None,
        stale_disruption_budget=around.stale_disruption_budget if around is not None else False,
        agents=seen.agents,
        tuning_pods=seen.tuning_pods,
        pod_bodies=seen.owned.pods,
        pool_reports=seen.pool_reports,
        pool_objects=seen.pool_objects,
        pool_parent_refs=_parent_refs(around),
        pool_load=around.triton.pool_load if around is not None and around.triton is not None else None,
    )
