"""One call of the engine: its one context (input, status being built, Events), what its functions take."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from triton_operator.core.rollout.clock import elapsed, to_utc
from triton_operator.core.rollout.plan import InPlacePlan, RolloutEvent, RolloutInput
from triton_operator.core.rollout.requests import Action
from triton_operator.core.rollout.state import RevisionState, paused
from triton_operator.core.vocabulary.conditions import NORMAL
from triton_operator.models import CanaryStep, Strategy


class Call:
    """One call's context (as Argo Rollouts' rolloutContext): the engine's modules are functions of it,
    none a subclass; the status is a frozen value replaced (``set``), never edited. Pure: reads the
    input, builds the plan, touches nothing else."""

    def __init__(self, inp: RolloutInput) -> None:
        self.inp = inp
        self.now = to_utc(inp.now).replace(microsecond=0)
        self.st = inp.status
        self.r = max(inp.replicas, 0)
        self.strategy = inp.rollout.strategy
        self.steps: tuple[CanaryStep, ...] = (
            () if self.strategy == Strategy.RECREATE else tuple(inp.rollout.steps)
        )
        self.events: list[RolloutEvent] = []
        self.handled: dict[str, str] = dict(inp.status.handled_requests)
        self.promote_step = False
        self.promote_full = False
        self.abort_requested = False
        self.retry = False
        self.desired = inp.desired_revision
        """The revision the Deployments roll toward: the spec's, or the host's while its pods' models
        move in place (the in-place mode chooses)."""
        self.target = inp.desired_revision
        self.rollback = False
        self.made_for: dict[Action, str] = {}
        """The revision each FOR_REVISION request taken in this call applies to (only that one)."""
        self.forced = False
        """A promote request completed a step in this call: the promotion after it skips the analysis."""
        self.waiting_on_analysis: str | None = None
        """Why the current step waits for the analysis (the Progressing message), when it does."""
        self.moved: InPlacePlan | None = None
        """The host pods' update as the in-place mode moved it in this call (None: none runs)."""
        self.chosen: tuple[RolloutEvent, ...] = ()
        """What the in-place mode's requests and choice said (before the update's own Events)."""
        self.kind: tuple[str, str] | None = None
        """(InPlace | NewPods, why) of the change in progress, when the in-place mode chose it."""

    # ------------------------------------------------------------- small helpers

    def set(self, **changes: Any) -> None:
        self.st = dataclasses.replace(self.st, **changes)

    def event(self, reason: str, message: str, kind: str = NORMAL) -> None:
        self.events.append(RolloutEvent(kind, reason, message))

    @property
    def paused(self) -> bool:
        return paused(self.inp.rollout, self.st)

    def observed(self, revision: str | None) -> RevisionState | None:
        return self.inp.revisions.get(revision) if revision else None

    def history_revisions(self) -> list[str]:
        return [h.revision for h in self.st.history]

    def seconds_since(self, moment: datetime | None) -> float:
        return (self.now - moment).total_seconds() if moment is not None else 0.0

    def deadline_seconds(self) -> int:
        return deadline_seconds(self.inp)

    def elapsed(self, since: datetime | None, seconds: int) -> bool:
        return elapsed(since, seconds, self.now)

    def position(self) -> int:
        index = self.st.current_step_index or 0
        return min(max(index, 0), len(self.steps))

    def other_pods(self, *exclude: str | None) -> int:
        """GPU pods beside those of ``exclude``: other revisions' and tuning pods."""
        others = sum(s.gpu_pods for rev, s in self.inp.revisions.items() if rev not in exclude)
        return others + self.inp.tuning_pods

    def clear_canary(self) -> None:
        self.set(
            canary_revision=None,
            canary_weight=None,
            current_step_index=None,
            step_started_at=None,
            canary_started_at=None,
            waiting_since=None,
            promoting=False,
        )


def deadline_seconds(inp: RolloutInput) -> int:
    """The progress deadline: the spec's effective one (it knows the startup timeout), else rollout's."""
    if inp.progress_deadline_seconds is not None:
        return inp.progress_deadline_seconds
    return inp.rollout.progress_deadline()
