"""The sides an in-place step's analysis judges in a pool: the pods holding a changed model."""

from __future__ import annotations

import pytest

from triton_operator.core.rollout.hostpods import (
    APPLIED,
    AgentStatus,
    AnalysisSides,
    HostPod,
    InPlaceState,
    analysis_sides,
    holders,
)

H, S, N = "host", "stable", "next"
PODS = ("p0", "p1", "p2", "p3")
HOLDS = {"p0": {"a", "b"}, "p1": {"b", "c"}, "p2": {"a", "c"}, "p3": {"b"}}
"""Model a's copies are on p0 and p2."""


def pooled(revision: str, pod: str) -> AgentStatus:
    return AgentStatus(
        revision=revision, target=revision, state=APPLIED, models={"a": "READY"}, holds=frozenset(HOLDS[pod])
    )


@pytest.mark.parametrize(
    ("asked", "expected"),
    [
        (("p0",), AnalysisSides(N, ("p0",), ("p2",), ("a",))),  # a's new copy against its old one
        (("p0", "p1"), AnalysisSides(N, ("p0",), ("p2",), ("a",))),  # p1 holds no a: on neither side
        (("p1",), None),  # the pods asked hold no copy of a: nothing to judge
        (("p0", "p2"), AnalysisSides(N, ("p0", "p2"), (), ("a",))),  # every copy of a moved: weight 100
    ],
)
def test_a_pools_sides_are_the_pods_holding_the_changed_model(
    asked: tuple[str, ...], expected: AnalysisSides | None
) -> None:
    pods = [HostPod(p, ready=True, agent=pooled(N if p in asked else S, p)) for p in PODS]
    state = InPlaceState(host=H, stable=S, next=N, step_index=0, pods=asked)
    assert analysis_sides(state, pods, ("a",)) == expected
    assert holders(pods, ("a",)) == frozenset({"p0", "p2"})
    if expected is not None:
        assert expected.weight == (100 if not expected.baseline else 50)


def test_pods_outside_a_pool_hold_every_model() -> None:
    pods = [HostPod(p, ready=True, agent=AgentStatus(revision=S, target=S, state=APPLIED)) for p in PODS]
    assert holders(pods, ("a",)) is None
