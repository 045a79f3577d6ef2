"""A pool pod's deletion cost is the copies it is given: a pool made smaller (its HPA, `kubectl scale`)
loses the pod whose copies are fewest to load elsewhere; the cost is written only when it changes."""

from __future__ import annotations

from test_pool_copies_plan import (  # type: ignore[import-not-found,unused-ignore]
    service,
    serving_pods,
)

from triton_operator.core.decision.pool_plan import decide_pool
from triton_operator.core.pool.assignment import DELETION_COST_ANNOTATION


def test_each_pool_pod_costs_the_copies_it_is_given_and_is_patched_only_when_that_changes() -> None:
    ts = service(replicas=3)
    pods, reports = serving_pods({"p0": ["a", "b"], "p1": ["c"], "p2": []})
    plan = decide_pool(ts, pods, reports, revisions=["r1"], configs={}, previous={}, now=1000.0)
    assert plan is not None
    costs = {p.pod: p.annotations.get(DELETION_COST_ANNOTATION) for p in plan.patches}
    assert costs == {"p0": "2", "p1": "1", "p2": "0"}

    for pod in pods:  # the patches written: the next pass has nothing to say
        pod["metadata"]["annotations"][DELETION_COST_ANNOTATION] = costs[pod["metadata"]["name"]]
    again = decide_pool(ts, pods, reports, revisions=["r1"], configs={}, previous={}, now=1010.0)
    assert again is not None
    assert [p for p in again.patches if DELETION_COST_ANNOTATION in p.annotations] == []
