"""The host pods of an in-place update: what their agents report, the update's state, batches and sides."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from triton_operator.core.rollout.clock import format_time, parse_time
from triton_operator.models import InPlaceRollout

APPLIED = "Applied"
APPLYING = "Applying"
FAILED = "Failed"
READY_STATE = "READY"
POLL_SECONDS = 2.0
"""How soon a pass looks again while pods load: the agents' progress raises no Kubernetes event."""


@dataclasses.dataclass(frozen=True)
class AgentStatus:
    """A pod's model-agent as it reports itself (GET :8009/v1/inplace), or why it could not be read."""

    revision: str | None = None
    """The revision the pod's /models holds and Triton loaded (the agent's last success)."""
    target: str | None = None
    state: str | None = None
    """Applied, Applying or Failed."""
    message: str = ""
    models: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Triton's per-model state after the last load (READY, UNAVAILABLE, ...)."""
    error: str | None = None
    """Why the agent could not be read (then nothing else is known)."""
    in_place: Mapping[str, Any] | None = None
    """Its record of the last revision it applied in place, as it says it (``inPlace``; read by
    core.pod.startup.parse_timeline for the in-place update's phases)."""
    holds: frozenset[str] | None = None
    """The models a pod of a pool holds (core.decision.pool_plan.pool_agents); None: a pod outside a
    pool, which holds every model of its revision."""


def parse_agent_status(payload: Any) -> AgentStatus:
    """The agent's JSON as the contract has it; anything else is an unreadable status."""
    if not isinstance(payload, Mapping):
        return AgentStatus(error="not an agent status")
    models = payload.get("models")

    def text(key: str) -> str | None:
        value = payload.get(key)
        return str(value) if isinstance(value, str) and value else None

    return AgentStatus(
        revision=text("revision"),
        target=text("target"),
        state=text("state"),
        message=str(payload.get("message") or "")[:1024],
        models={str(k): str(v) for k, v in models.items()} if isinstance(models, Mapping) else {},
        in_place=record if isinstance(record := payload.get("inPlace"), Mapping) else None,
    )


@dataclasses.dataclass(frozen=True)
class HostPod:
    """One pod of the host revision, as the in-place update reads it."""

    name: str
    ready: bool = False
    terminating: bool = False
    target: str | None = None
    """Its `triton-operator.io/inplace-target` annotation."""
    agent: AgentStatus | None = None
    """Its agent's status (None: not read in this pass)."""
    problem: str | None = None
    """Why it cannot serve now (Pending, crash looping, not started: observation.PodState.
    cannot_serve); None: it can. Only pods that can serve are counted, asked and waited for."""


@dataclasses.dataclass(frozen=True)
class InPlaceState:
    """status.inPlace: everything a restarted operator needs to resume an in-place update."""

    host: str
    stable: str
    next: str | None = None
    step_index: int | None = None
    step_started_at: datetime | None = None
    waiting_since: datetime | None = None
    pods: tuple[str, ...] = ()
    rolling_back: str | None = None
    """The abort reason while the pods load the stable revision again."""
    aborted_revision: str | None = None
    aborted_reason: str | None = None
    aborted_detail: str | None = None
    pinned: str | None = None
    """The revision an undo went back to in place: served instead of the spec's ``pinned_for``."""
    pinned_for: str | None = None
    asked_at_step: int = 0
    """How many pods were asked when the current step began: the analysis gates a step's first
    pods, not each batch of them."""
    promoted: bool = False
    """A promote request took the update to its end: no analysis holds it any more."""

    @classmethod
    def from_status(cls, status: Mapping[str, Any] | None) -> InPlaceState | None:
        raw = (status or {}).get("inPlace")
        if not isinstance(raw, Mapping) or not raw.get("host") or not raw.get("stable"):
            return None
        index = raw.get("stepIndex")
        pods = raw.get("pods") or []
        return cls(
            host=str(raw["host"]),
            stable=str(raw["stable"]),
            next=str(raw["next"]) if raw.get("next") else None,
            step_index=int(index) if isinstance(index, int) and not isinstance(index, bool) else None,
            step_started_at=parse_time(raw.get("stepStartedAt")),
            waiting_since=parse_time(raw.get("waitingSince")),
            pods=tuple(str(p) for p in pods) if isinstance(pods, list) else (),
            rolling_back=str(raw["rollingBack"]) if raw.get("rollingBack") else None,
            aborted_revision=str(raw["abortedRevision"]) if raw.get("abortedRevision") else None,
            aborted_reason=str(raw["abortedReason"]) if raw.get("abortedReason") else None,
            aborted_detail=str(raw["abortedDetail"]) if raw.get("abortedDetail") else None,
            pinned=str(raw["pinned"]) if raw.get("pinned") else None,
            pinned_for=str(raw["pinnedFor"]) if raw.get("pinnedFor") else None,
            asked_at_step=_count(raw.get("askedAtStep")),
            promoted=raw.get("promoted") is True,
        )

    def to_status(self) -> dict[str, Any]:
        def t(moment: datetime | None) -> str | None:
            return format_time(moment) if moment is not None else None

        return InPlaceRollout(
            host=self.host,
            stable=self.stable,
            next=self.next,
            step_index=self.step_index,
            step_started_at=t(self.step_started_at),
            waiting_since=t(self.waiting_since),
            pods=list(self.pods),
            rolling_back=self.rolling_back,
            aborted_revision=self.aborted_revision,
            aborted_reason=self.aborted_reason,
            aborted_detail=self.aborted_detail,
            pinned=self.pinned,
            pinned_for=self.pinned_for,
            asked_at_step=self.asked_at_step or None,
            promoted=self.promoted or None,
        ).model_dump(by_alias=True, exclude_none=True, exclude_defaults=True, mode="json") | {
            "host": self.host,
            "stable": self.stable,
        }


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def serves(pod: HostPod, revision: str, models: Sequence[str] = ()) -> bool:
    """The pod is Ready and its agent reports ``revision`` Applied, with each of ``models`` READY."""
    agent = pod.agent
    if agent is None or agent.error or agent.revision != revision or agent.state != APPLIED:
        return False
    return pod.ready and all(agent.models.get(m) == READY_STATE for m in models)


@dataclasses.dataclass(frozen=True)
class AnalysisSides:
    """What the analysis of an in-place step compares (spec.rollout.analysis, as for a canary): the
    pods the update moved to ``revision`` (every pod asked so far, each serving it) against the
    pods not asked yet, which serve the stable revision. The Service spreads requests over the pods
    alike, so ``weight`` (the share of the pods updated) stands for a canary's traffic weight; with
    no pod left on the stable revision it is 100, and, as for a canary at 100, the latency is not
    compared with the stable's then (nothing to compare with): only the absolute checks apply."""

    revision: str
    updated: tuple[str, ...]
    baseline: tuple[str, ...]
    models: tuple[str, ...] = ()
    """The models judged when not every model of the spec: a pool's update judges the models it
    changes, and its sides are the pods that hold one of them (no other pod's copies move)."""

    @property
    def weight(self) -> int:
        if not self.baseline:
            return 100
        return max(1, (100 * len(self.updated)) // (len(self.updated) + len(self.baseline)))


def analysis_sides(
    state: InPlaceState | None, pods: Sequence[HostPod], models: Sequence[str] = ()
) -> AnalysisSides | None:
    """The sides an in-place analysis judges now; None while nothing is judged: no update moves
    (or it rolls back), no pod is asked yet, or a pod asked does not serve the next revision with
    ``models`` READY yet (a step's window starts once its pods all have)."""
    if state is None or state.next is None or state.rolling_back is not None or not state.pods:
        return None
    live = {p.name: p for p in pods if not p.terminating and (p.problem is None or p.name in state.pods)}
    if any(name not in live or not serves(live[name], state.next, models) for name in state.pods):
        return None
    held = holders(live.values(), models)
    if held is not None:
        # A pool: the changed models' copies are judged, on the pods that hold them, asked or not.
        updated = tuple(sorted(name for name in state.pods if name in held))
        if not updated:
            return None
        baseline = tuple(sorted(name for name in live if name not in state.pods and name in held))
        return AnalysisSides(state.next, updated, baseline, tuple(models))
    baseline = tuple(sorted(name for name in live if name not in state.pods))
    return AnalysisSides(state.next, tuple(sorted(state.pods)), baseline)


def holders(pods: Iterable[HostPod], models: Sequence[str]) -> frozenset[str] | None:
    """The pods of a pool that hold one of ``models`` (their agents' AgentStatus.holds); None when
    no pod is a pool's (every pod holds every model)."""
    pooled = [p for p in pods if p.agent is not None and p.agent.holds is not None]
    if not pooled:
        return None
    return frozenset(p.name for p in pooled if p.agent is not None and set(p.agent.holds or ()) & set(models))


@dataclasses.dataclass(frozen=True)
class InPlaceRequests:
    """The control requests this call takes (made for the in-place revision, never handled before)."""

    promote: bool = False
    promote_full: bool = False
    abort: bool = False


def step_pods(weight: int, pods: int) -> int:
    """How many of the host's ``pods`` a setWeight step updates: ceil(weight% of them)."""
    return min(pods, math.ceil(pods * max(weight, 0) / 100))


RELOADING_SHARE = 25
"""The share of the pods that can serve that may reload at once (as a Deployment's default
maxUnavailable): a pod leaves the Service while its models reload."""
NAMED_PODS = 5
"""At most this many pods are named in a condition's message (then "and k more")."""


def batch_size(servable: int) -> int:
    """How many of ``servable`` pods may reload at once: max(1, 25% of them, rounded down), and never
    all of them, so that at least one pod serves throughout (0 with fewer than 2 pods)."""
    return max(0, min(max(1, servable * RELOADING_SHARE // 100), servable - 1))


def named(items: Sequence[str]) -> str:
    shown = ", ".join(items[:NAMED_PODS])
    return shown + (f" and {len(items) - NAMED_PODS} more" if len(items) > NAMED_PODS else "")


def why_not_on(pod: HostPod, revision: str, models: Sequence[str] = ()) -> str:
    """Why ``pod`` does not serve ``revision`` (with ``models`` READY) yet, in words for the status."""
    if pod.problem is not None:
        return pod.problem
    agent = pod.agent
    if agent is None:
        return "agent not read yet"
    if agent.error:
        return f"agent not readable ({agent.error})"
    if agent.state != APPLIED or agent.revision != revision:
        state = agent.state or "no state"
        said = f"agent reports {state if agent.state != APPLIED else f'{agent.revision} Applied'}"
        return f"{said}: {agent.message}" if agent.message else said
    states = {m: agent.models.get(m) or "not reported" for m in models}
    waiting = [f"model {m} is {state}" for m, state in states.items() if state != READY_STATE]
    if waiting:
        return ", ".join(waiting)
    return "not Ready" if not pod.ready else "serves it"
