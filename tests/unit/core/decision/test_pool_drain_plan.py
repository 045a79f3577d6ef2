"""A pool's copy off its routes drains as its revision recorded its probe: the quick agent probe's
(1 s x 1) plus drainSeconds, or the one before it (2 s x 2) for a revision recorded before."""

from __future__ import annotations

import dataclasses

from test_pool_copies_plan import service, serving_pods  # type: ignore[import-not-found,unused-ignore]

from triton_operator.core.decision.pool_plan import decide_pool, pool_drain_seconds
from triton_operator.core.pool.assignment import (
    ASSIGNMENT_ANNOTATION,
    PodAssignment,
    Wanted,
    build_assignment,
    parse_assignment,
)
from triton_operator.core.pool.labels import model_label_key
from triton_operator.settings import Settings

QUICK = Settings(quick_agent_probe=True)
BEFORE = dataclasses.replace(QUICK, quick_agent_probe=False)


def test_the_drain_is_the_one_each_revision_recorded_the_longest_of_the_pools() -> None:
    ts = service()
    assert ts.spec.drain_seconds == 5
    assert pool_drain_seconds(ts, QUICK, {"r1": QUICK}, ["r1"]) == 1 * 1 + 5
    assert pool_drain_seconds(ts, QUICK, {"r1": BEFORE}, ["r1"]) == 2 * 2 + 5
    assert pool_drain_seconds(ts, QUICK, {}, ["r2"]) == 1 * 1 + 5  # a new revision: today's settings
    assert pool_drain_seconds(ts, QUICK, {"r1": BEFORE}, ["r1", "r2"]) == 2 * 2 + 5
    assert pool_drain_seconds(ts, QUICK, {}, []) is None


def test_a_copy_off_its_routes_unloads_once_its_revisions_drain_is_over() -> None:
    """c's extra copy on p0 came off its route at 1000 s: with the quick probe recorded, the pass waits
    until 1006 s (1 s x 1 + 5 s); without a figure, as before, until 1009 s."""
    ts = service(replicas=2)
    pods, reports = serving_pods({"p0": ["a", "c"], "p1": ["b", "c"]})
    held = PodAssignment(models={m: Wanted("v1") for m in ("a", "c")}, draining={"c": 1000.0})
    pods[0]["metadata"]["annotations"][ASSIGNMENT_ANNOTATION] = build_assignment(held)
    del pods[0]["metadata"]["labels"][model_label_key("c")]
    quick = decide_pool(
        ts, pods, reports, revisions=["r1"], configs={}, previous={}, now=1001.0, drain_seconds=6.0
    )
    before = decide_pool(ts, pods, reports, revisions=["r1"], configs={}, previous={}, now=1001.0)
    assert quick is not None and before is not None
    assert (quick.next_at, before.next_at) == (1006.0, 1009.0)
    done = decide_pool(
        ts, pods, reports, revisions=["r1"], configs={}, previous={}, now=1006.0, drain_seconds=6.0
    )
    assert done is not None
    written = [p.annotations[ASSIGNMENT_ANNOTATION] for p in done.patches if p.pod == "p0"]
    assert [set(parse_assignment(text).models) for text in written] == [{"a"}]  # c unloads
