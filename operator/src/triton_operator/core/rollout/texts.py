"""Texts the rollout shows people, one for both step movers: a step in short, where a rollout stands."""

from __future__ import annotations

from collections.abc import Sequence

from triton_operator.models import CanaryStep


def describe_step(step: CanaryStep) -> str:
    """A short human form of a step: setWeight 10, pause 60s, pause (until promoted), setHeaderRoute x."""
    if step.set_weight is not None:
        return f"setWeight {step.set_weight}"
    if step.pause is not None:
        if step.pause.duration_seconds is None:
            return "pause (until promoted)"
        return f"pause {step.pause.duration_seconds}s"
    if step.set_header_route is not None:
        return f"setHeaderRoute {step.set_header_route.name}"
    return "step"


def step_at(index: int, steps: Sequence[CanaryStep]) -> str:
    """Where a rollout stands, for either step mover: step i/n (what the step does)."""
    return f"step {index}/{len(steps)} ({describe_step(steps[index])})"


def step_completed(about: str, index: int, steps: Sequence[CanaryStep], how: str = "") -> str:
    """StepCompleted's message, for either step mover (``about``: the revision, and "in place")."""
    return f"{about}: {step_at(index, steps)} completed{how}"
