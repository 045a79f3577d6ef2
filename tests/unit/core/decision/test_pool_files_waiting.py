"""An agent whose entry waits for its revision's files (its report's ``waiting``) is named in
status.pool.models[].message for that model only, as the pass writes it (core.decision.pool_plan)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from test_pool_copies_plan import (  # type: ignore[import-not-found,unused-ignore]
    service,
    serving_pods,
)

from triton_operator.core.decision.pool_plan import decide_pool
from triton_operator.core.pool.assignment import Copy, build_report, parse_report

WAITS = (
    "waits for revision r2's files, not in the in-place volume "
    "(/etc/triton-operator-inplace/r2.manifest.json and its configs) nor in the agent's own copy "
    "(/var/run/triton-operator/revisions/r2) after 5s"
)


def messages(reports: Mapping[str, Mapping[str, Copy]]) -> dict[str, str]:
    ts = service(replicas=2)
    pods, _ = serving_pods({"p0": ["a", "b"], "p1": ["c"]})
    plan = decide_pool(ts, pods, reports, revisions=["r1"], configs={}, previous={}, now=1000.0)
    assert plan is not None and plan.status is not None
    return {m["name"]: m["message"] for m in plan.status["models"]}


def test_the_model_an_agent_waits_for_names_the_pod_and_what_it_waits_for() -> None:
    _, reports = serving_pods({"p0": ["a", "b"], "p1": ["c"]})
    before = messages(reports)
    # p0's agent, as it serves its report and the operator reads it back (GET :8009/v1/pool).
    waiting = {**reports["p0"], "a": dataclasses.replace(reports["p0"]["a"], waiting=WAITS)}
    reports["p0"] = parse_report(build_report(waiting, pod="p0"))
    after = messages(reports)
    assert after["a"] == f"{before['a']}; pod p0 {WAITS}"
    assert {m: after[m] for m in "bc"} == {m: before[m] for m in "bc"}
    assert messages(reports) == after  # the same report, the same text: status is not written again
