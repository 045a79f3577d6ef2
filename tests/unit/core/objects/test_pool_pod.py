"""The pod of a pooled TritonService: its agent reads the assignment annotation through the in-place
volume's downwardAPI payload (--pool-assignment); a service without spec.pool renders the pod it did."""

from __future__ import annotations

from typing import Any

from triton_operator.cli import build_parser
from triton_operator.core.objects.builders import build_deployment, compute_revision
from triton_operator.core.objects.names import AGENT_CONTAINER, INPLACE_VOLUME
from triton_operator.core.pool.assignment import ASSIGNMENT_ANNOTATION
from tritonservice_bodies import SETTINGS, configs_of, ts_of

MODEL = {"memory": "100Mi", "minCopies": 1, "maxCopies": 1}


def pooled(memory: str = "4Gi", model_memory: str = "100Mi") -> dict[str, Any]:
    ts = ts_of()
    models = [{**m, **MODEL, "memory": model_memory} for m in ts.spec.model_dump(by_alias=True)["models"]]
    return {"pool": {"memoryPerPod": memory}, "models": models}


def pod_of(**spec: Any) -> dict[str, Any]:
    deployment = build_deployment(ts_of(**spec), "rev1", SETTINGS, 2)
    template: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return template


def items(spec: dict[str, Any]) -> list[dict[str, Any]]:
    (volume,) = [v for v in spec["volumes"] if v["name"] == INPLACE_VOLUME]
    (downward,) = [s["downwardAPI"] for s in volume["projected"]["sources"] if "downwardAPI" in s]
    found: list[dict[str, Any]] = downward["items"]
    return found


def agent_args(spec: dict[str, Any]) -> Any:
    (agent,) = [c for c in spec["containers"] if c["name"] == AGENT_CONTAINER]
    return build_parser().parse_args([*agent["command"][1:], *agent["args"]])


def test_a_pooled_pods_agent_reads_its_assignment_from_the_in_place_payload() -> None:
    spec = pod_of(**pooled())
    fields = {i["path"]: i["fieldRef"]["fieldPath"] for i in items(spec)}
    assert fields["pool-models"] == f"metadata.annotations['{ASSIGNMENT_ANNOTATION}']"
    args = agent_args(spec)
    assert args.pool_assignment is not None
    assert args.pool_assignment.parent == args.inplace_dir  # one payload with the target annotation
    assert args.pool_assignment.name == "pool-models"


def test_without_a_pool_the_pod_has_neither_the_item_nor_the_flag() -> None:
    spec = pod_of()
    assert [i["path"] for i in items(spec)] == ["target"]
    assert agent_args(spec).pool_assignment is None


def test_a_pool_switched_on_makes_new_pods_and_repacking_it_does_not() -> None:
    def revision(**spec: Any) -> str:
        ts = ts_of(**spec)
        return compute_revision(ts, SETTINGS, configs_of(ts), "d")

    assert revision(**pooled()) != revision()
    assert revision(**pooled("8Gi", "200Mi")) == revision(**pooled())


def test_a_pooled_pods_agent_stops_with_tritonserver_so_the_terminating_pod_stays_ready() -> None:
    """The agent answers the pod's readiness: in a pool it waits tritonserver's preStop (drainSeconds)
    before it stops, so a terminating pod whose copies are their models' only answering ones stays a
    serving endpoint of their Services while tritonserver serves; without a pool it stops at once.
    With leaveSeconds 0 both wait drainSeconds alone (test_pool_leave_pod.py: the default's wait)."""

    def drain_only(**spec: Any) -> dict[str, Any]:
        return {**spec, "pool": {**spec["pool"], "leaveSeconds": 0}}

    for spec, drain in ((drain_only(**pooled()), 5), (drain_only(**pooled(), drainSeconds=12), 12)):
        containers = {c["name"]: c for c in pod_of(**spec)["containers"]}
        expected = {"preStop": {"exec": {"command": ["sleep", str(drain)]}}}
        assert containers[AGENT_CONTAINER]["lifecycle"] == expected
        assert containers["tritonserver"]["lifecycle"] == expected
    unpooled = {c["name"]: c for c in pod_of()["containers"]}
    assert "lifecycle" not in unpooled[AGENT_CONTAINER]
    no_drain = {c["name"]: c for c in pod_of(**drain_only(**pooled()), drainSeconds=0)["containers"]}
    assert "lifecycle" not in no_drain[AGENT_CONTAINER]


def test_a_pooled_pods_agent_reads_the_gpu_gauges_at_tritonservers_metrics_interval() -> None:
    """serverArgs' --metrics-interval-ms (how often tritonserver refreshes its GPU gauges) is the
    agent's --triton-metrics-interval, in seconds; left at Triton's default, the agent's default (2 s)."""
    assert agent_args(pod_of(**pooled())).triton_metrics_interval == 2.0
    for given in (["--metrics-interval-ms=5000"], ["--metrics-interval-ms", "5000"]):
        assert agent_args(pod_of(**pooled(), serverArgs=given)).triton_metrics_interval == 5.0
