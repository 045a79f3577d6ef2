"""Replica maths: the canary's share of spec.replicas for a weight, and the split under a GPU budget."""

from __future__ import annotations

import dataclasses

from triton_operator.core.rollout.state import RevisionState


def canary_replicas(replicas: int, weight: int) -> int:
    """ceil(replicas * weight / 100), in integers: the canary's share of ``replicas`` for ``weight`` %."""
    if not 0 <= weight <= 100:
        raise ValueError(f"weight must be 0..100, got {weight}")
    if replicas < 0:
        raise ValueError(f"replicas must be >= 0, got {replicas}")
    return -(-replicas * weight // 100)


@dataclasses.dataclass(frozen=True)
class Split:
    """Replicas of stable and canary under a GPU budget (the maths: docs/rollouts.md, the engine)."""

    stable: int
    """Stable replicas to apply now."""
    canary: int
    """Canary replicas to apply now."""
    stable_goal: int
    canary_goal: int
    """Canary replicas the current step waits to see Ready."""
    too_small: bool = False
    """The budget cannot hold one canary pod beside a serving stable."""


def _grow(goal: int, current: int, free: int) -> int:
    """Scale down at once; scale up only into released capacity."""
    if goal <= current:
        return goal
    return min(goal, max(current, free))


def gpu_split(
    replicas: int,
    canary_goal: int,
    gpus_per_pod: int,
    gpu_budget: int | None,
    *,
    stable: RevisionState | None = None,
    canary: RevisionState | None = None,
    other_pods: int = 0,
) -> Split:
    """Stable and canary replicas so that (stable + canary) * gpus_per_pod <= gpu_budget at all times."""
    if gpu_budget is None or gpus_per_pod <= 0:
        return Split(replicas, canary_goal, replicas, canary_goal)
    budget_pods = gpu_budget // gpus_per_pod
    if budget_pods >= replicas + canary_goal:
        stable_goal, goal = replicas, canary_goal
    else:
        floor = max(replicas - canary_goal, 1) if replicas > 0 else 0
        goal = max(0, min(canary_goal, budget_pods - floor))
        if canary_goal > 0 and goal == 0:
            return Split(replicas, 0, replicas, 0, too_small=True)
        stable_goal = min(replicas, budget_pods - goal)
    stable_pods = stable.gpu_pods if stable else 0
    canary_pods = canary.gpu_pods if canary else 0
    if canary_pods == 0 and goal == 0 and other_pods == 0:
        # A single revision alone is never capped below spec.replicas.
        return Split(replicas, 0, replicas, 0)
    stable_now = _grow(
        stable_goal, stable.spec_replicas if stable else 0, budget_pods - canary_pods - other_pods
    )
    canary_now = _grow(goal, canary.spec_replicas if canary else 0, budget_pods - stable_pods - other_pods)
    return Split(stable_now, canary_now, stable_goal, goal)


# ----------------------------------------------------------------- control annotations
