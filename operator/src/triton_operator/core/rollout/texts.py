"""Texts the rollout shows people: a step in a short human form."""

from __future__ import annotations

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
