"""core.tuning: a sweep's candidates, each validated; tuning pods, Jobs; perf_analyzer's CSV; the choice."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml

from triton_operator.core import tuning as t
from triton_operator.core.objects.builders import build_configmaps, build_service
from triton_operator.core.objects.names import (
    AGENT_CONTAINER,
    LABEL_REVISION,
    LABEL_SERVICE,
    TRITON_CONTAINER,
)
from triton_operator.core.observed.observation import check_body
from triton_operator.models import TritonService
from tritonservice_bodies import CONFIG, SETTINGS, UID, body

# perf_analyzer 2.51.0's `-f` CSV, as it wrote it against the Python model of the e2e test (one run).
REAL_CSV = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
    "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency\n"
    "4,46.3352,7,513,63500,53,20966,487,3,84855,88303,90275,92587\n"
)


def spec_of(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = body()["spec"]
    spec.update(overrides)
    return spec


def plan(sweep: t.Sweep, spec: dict[str, Any] | None = None) -> t.Plan:
    return t.plan_sweep(body(), spec or spec_of(), sweep)


def m(conc: int, tput: float, p95: int, p99: int | None = None) -> t.Measurement:
    return t.Measurement(conc, tput, p95 // 2, p95 - 1, p95, p99 if p99 is not None else p95 + 1)


# ----------------------------------------------------------------- candidates


def test_the_models_own_config_is_candidate_zero_and_the_only_one_without_values() -> None:
    result = plan(t.Sweep(model="m1"))
    assert [c.name for c in result.candidates] == ["c0"]
    assert result.candidates[0].default
    assert result.candidates[0].config == CONFIG


@pytest.mark.parametrize(
    ("sweep", "count"),
    [
        (t.Sweep(model="m1", instance_counts=(1, 2, 3)), 3),  # 1 is the model's own: folded into c0
        (t.Sweep(model="m1", instance_counts=(2, 3)), 3),
        (t.Sweep(model="m1", max_batch_sizes=(4, 8, 16)), 3),
        (t.Sweep(model="m1", dynamic_batching=(False, True)), 2),
        (t.Sweep(model="m1", queue_delays_us=(0, 100, 1000)), 4),
        (t.Sweep(model="m1", instance_counts=(1, 2), queue_delays_us=(0, 500)), 5),
        # dynamic batching off folds every delay and preferred size into one candidate per instance count
        (t.Sweep(model="m1", dynamic_batching=(False,), queue_delays_us=(0, 500), instance_counts=(1, 2)), 2),
        (t.Sweep(model="m1", preferred_batch_sizes=((4,), (4, 8)), max_candidates=8), 3),
    ],
)
def test_candidate_count_is_the_distinct_combinations_plus_the_models_own(sweep: t.Sweep, count: int) -> None:
    result = plan(sweep)
    assert len(result.candidates) == count
    configs = [json.dumps(c.config, sort_keys=True) for c in result.candidates]
    assert len(set(configs)) == count
    assert [c.index for c in result.candidates] == list(range(count))


def test_each_candidate_passes_the_operators_checks_and_renders() -> None:
    sweep = t.Sweep(model="m1", instance_counts=(2,), max_batch_sizes=(8,), queue_delays_us=(100,))
    for candidate in plan(sweep).candidates:
        checked = check_body(t.candidate_body(body(), spec_of(), "m1", candidate.config))
        assert checked.problems == ()
        assert "m1" in checked.configs


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ({"instances": 3}, {"instanceGroup": [{"kind": "KIND_CPU", "count": 3}]}),
        ({"maxBatchSize": 16}, {"maxBatchSize": 16}),
        ({"dynamicBatching": True}, {"dynamicBatching": {}}),
        ({"maxQueueDelayMicroseconds": 250}, {"dynamicBatching": {"maxQueueDelayMicroseconds": "250"}}),
        ({"preferredBatchSize": [4, 8]}, {"dynamicBatching": {"preferredBatchSize": [4, 8]}}),
    ],
)
def test_with_settings_sets_each_knob_in_proto3_json(
    setting: dict[str, Any], expected: dict[str, Any]
) -> None:
    config = t.with_settings(CONFIG, setting)
    for key, value in expected.items():
        assert config[key] == value
    assert CONFIG["maxBatchSize"] == 8  # the base is not changed


def test_instances_set_every_group_and_add_one_where_there_is_none() -> None:
    two = {**CONFIG, "instanceGroup": [{"kind": "KIND_GPU", "gpus": [0]}, {"kind": "KIND_GPU", "gpus": [1]}]}
    assert [g["count"] for g in t.with_settings(two, {"instances": 2})["instanceGroup"]] == [2, 2]
    none = {k: v for k, v in CONFIG.items() if k != "instanceGroup"}
    assert t.with_settings(none, {"instances": 4})["instanceGroup"] == [{"count": 4}]


def test_dynamic_batching_off_drops_the_batcher() -> None:
    batching = {**CONFIG, "dynamicBatching": {"maxQueueDelayMicroseconds": "100"}}
    assert "dynamicBatching" not in t.with_settings(batching, {"dynamicBatching": False})


@pytest.mark.parametrize(
    ("sweep", "field"),
    [
        # A preferred batch size above maxBatchSize: Triton's own check (core.spec.validation.batching).
        (t.Sweep(model="m1", preferred_batch_sizes=((16,),)), "dynamicBatching.preferredBatchSize"),
        (t.Sweep(model="m1", max_batch_sizes=(4,), preferred_batch_sizes=((8,),)), "preferredBatchSize"),
    ],
)
def test_a_combination_our_validation_refuses_is_reported_not_run(sweep: t.Sweep, field: str) -> None:
    result = plan(sweep)
    assert [c.name for c in result.candidates] == ["c0"]
    assert len(result.refused) == 1
    assert any(field in p and p.startswith("spec.models[0].config") for p in result.refused[0].problems)


def test_a_gpu_instance_group_beyond_the_pods_gpus_is_refused() -> None:
    spec = spec_of(resources={"gpus": 1})
    spec["models"][0]["config"]["instanceGroup"] = [{"kind": "KIND_GPU", "count": 1, "gpus": [0]}]
    base = {**spec["models"][0]["config"]}
    refused = t.with_settings(base, {"instances": 2})
    assert refused["instanceGroup"][0]["gpus"] == [0]  # the count changes, the devices stay
    bad = copy.deepcopy(spec)
    bad["models"][0]["config"]["instanceGroup"] = [{"kind": "KIND_GPU", "count": 1, "gpus": [3]}]
    result = t.plan_sweep(body(), bad, t.Sweep(model="m1", instance_counts=(2,)))
    assert result.refused and "gpus" in " ".join(result.refused[0].problems)


@pytest.mark.parametrize(("before", "after"), [(8, 0), (0, 8)])
def test_a_max_batch_size_that_changes_the_input_shapes_is_refused(before: int, after: int) -> None:
    spec = spec_of()
    spec["models"][0]["config"]["maxBatchSize"] = before
    result = t.plan_sweep(body(), spec, t.Sweep(model="m1", max_batch_sizes=(after,) if after else ()))
    if after:
        assert [c.name for c in result.candidates] == ["c0"]
        assert "input shapes" in result.refused[0].problems[0]
    else:  # 0 is not a value --max-batch-size takes
        with pytest.raises(t.TuningError, match="--max-batch-size"):
            t.plan_sweep(body(), spec, t.Sweep(model="m1", max_batch_sizes=(0,)))


@pytest.mark.parametrize(
    ("sweep", "flag"),
    [
        (t.Sweep(model="m1", concurrencies=()), "--concurrency"),
        (t.Sweep(model="m1", concurrencies=(0,)), "--concurrency"),
        (t.Sweep(model="m1", percentile=97), "--percentile"),
        (t.Sweep(model="m1", instance_counts=(0,)), "--instances"),
        (t.Sweep(model="m1", queue_delays_us=(-1,)), "--queue-delay-us"),
        (t.Sweep(model="m1", latency_bound_us=0), "--latency-bound-us"),
        (t.Sweep(model="m1", parallel=0), "--parallel"),
        (t.Sweep(model="m1", max_seconds=5), "--max-seconds"),
        (t.Sweep(model="m1", preferred_batch_sizes=((0,),)), "--preferred-batch-sizes"),
        (t.Sweep(model="m1", max_candidates=65), "--max-candidates"),
    ],
)
def test_a_bad_sweep_is_refused_naming_the_flag(sweep: t.Sweep, flag: str) -> None:
    with pytest.raises(t.TuningError, match=flag):
        plan(sweep)


def test_an_unknown_model_is_refused_naming_the_models() -> None:
    with pytest.raises(t.TuningError, match=r"'nope' is not in the spec \(models: m1\)"):
        plan(t.Sweep(model="nope"))


def test_more_candidates_than_the_bound_is_refused_before_anything_runs() -> None:
    with pytest.raises(t.TuningError, match=r"7 candidates .* more than --max-candidates 4"):
        plan(t.Sweep(model="m1", instance_counts=(2, 3), queue_delays_us=(0, 100, 1000), max_candidates=4))


# ----------------------------------------------------------------- tuning objects


def stable(ts_body: dict[str, Any], revision: str = "abc1234567") -> list[dict[str, Any]]:
    checked = check_body(ts_body)
    assert checked.ts is not None
    manifest = json.dumps({"version": 1, "models": {}})
    return build_configmaps(checked.ts, revision, checked.configs, manifest, settings=SETTINGS)


def objects(candidate_config: dict[str, Any] | None = None, **spec: Any) -> list[dict[str, Any]]:
    ts_body = body(**spec)
    candidate = t.Candidate(2, candidate_config or t.with_settings(CONFIG, {"instances": 2}))
    return t.tuning_objects(
        ts_body, stable(ts_body), "abc1234567", t.Sweep(model="m1"), candidate, "r1", SETTINGS
    )


def test_tuning_pods_are_never_selected_by_the_services_service() -> None:
    ts_body = body(podLabels={LABEL_SERVICE: "svc", "team": "a"})
    candidate = t.Candidate(1, CONFIG)
    out = t.tuning_objects(
        ts_body, stable(ts_body), "abc1234567", t.Sweep(model="m1"), candidate, "r1", SETTINGS
    )
    ts = TritonService.model_validate(ts_body)
    assert not t.service_selects_tuning_pods(ts, out)
    selector = build_service(ts)["spec"]["selector"]
    pod_labels = out[-1]["spec"]["template"]["metadata"]["labels"]
    assert not t.selects(selector, pod_labels)
    assert pod_labels["team"] == "a"
    assert LABEL_REVISION not in pod_labels


def test_the_service_selector_check_would_catch_a_pod_with_the_service_label() -> None:
    out = objects()
    out[-1]["spec"]["template"]["metadata"]["labels"][LABEL_SERVICE] = "svc"
    assert t.service_selects_tuning_pods(TritonService.model_validate(body()), out)


def test_tuning_objects_carry_the_candidates_config_one_replica_and_no_controller_owner() -> None:
    out = objects()
    kinds = [o["kind"] for o in out]
    assert kinds == ["ConfigMap", "Deployment"]
    configmap, deployment = out
    assert configmap["metadata"]["name"] == "svc-tune-r1-c2"
    assert "count: 2" in configmap["data"]["m1.config.pbtxt"]
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["selector"]["matchLabels"] == {t.LABEL_RUN: "r1", t.LABEL_CANDIDATE: "c2"}
    for obj in out:
        assert obj["metadata"]["labels"][t.LABEL_TUNING] == "svc"
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner["uid"] == UID
        assert owner["controller"] is False
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert any((v.get("configMap") or {}).get("name") == "svc-tune-r1-c2" for v in volumes)


def test_tuning_pods_have_no_drain_and_no_in_place_agent() -> None:
    """modelUpdates changes nothing of a tuning pod (of the one pod shape: the agent loads its models)."""
    deployment = objects(rollout={"modelUpdates": "InPlace"}, drainSeconds=30)[-1]
    containers = deployment["spec"]["template"]["spec"]["containers"]
    plain = objects()[-1]["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == [TRITON_CONTAINER, AGENT_CONTAINER]
    assert containers == plain
    assert "lifecycle" not in containers[0]


def test_tuning_objects_use_the_stable_revisions_spec_not_the_live_one() -> None:
    ts_body = body()
    configmaps = stable(ts_body)
    live = body(image="example.com/other:1")
    out = t.tuning_objects(
        live, configmaps, "abc1234567", t.Sweep(model="m1"), t.Candidate(1, CONFIG), "r1", SETTINGS
    )
    image = out[-1]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == SETTINGS.default_image


@pytest.mark.parametrize(
    ("gpus", "budget", "replicas", "parallel", "refused"),
    [
        (0, None, 3, 4, False),
        (1, None, 3, 2, False),
        (1, 4, 3, 1, False),
        (1, 4, 3, 2, True),
        (2, 4, 2, 1, True),
        (2, 6, 2, 1, False),
    ],
)
def test_tuning_pods_must_fit_the_gpu_budget_beside_stable(
    gpus: int, budget: int | None, replicas: int, parallel: int, refused: bool
) -> None:
    spec = spec_of(resources={"gpus": gpus}, rollout={"gpuBudget": budget} if budget is not None else {})
    problem = t.gpu_budget_problem(spec, {}, replicas, parallel)
    assert (problem is not None) == refused
    if problem:
        assert problem.startswith("spec.rollout.gpuBudget")


@pytest.mark.parametrize(
    ("image", "perf"),
    [
        ("nvcr.io/nvidia/tritonserver:25.01-py3", "nvcr.io/nvidia/tritonserver:25.01-py3-sdk"),
        (
            "localhost/triton-operator/tritonserver-cpu:2.51.0",
            "localhost/triton-operator/perf-analyzer:2.51.0",
        ),
        ("registry.example.com/triton:own", "registry.example.com/triton:own"),
    ],
)
def test_default_perf_image(image: str, perf: str) -> None:
    assert t.default_perf_image(image) == perf


def test_perf_job_runs_each_concurrency_once_against_the_pod_and_never_retries() -> None:
    sweep = t.Sweep(model="m1", concurrencies=(1, 8), measurement_ms=500, candidate_seconds=90)
    job = t.perf_job(body(), "r1", t.Candidate(0, CONFIG, default=True), sweep, "10.0.0.7", "img:1")
    assert job["metadata"]["name"] == "svc-tune-r1-c0-perf"
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["activeDeadlineSeconds"] == 90
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["securityContext"]["runAsNonRoot"] is True
    script = pod["containers"][0]["command"][2]
    assert script.count("perf_analyzer -m m1 -u 10.0.0.7:8001 -i grpc") == 2
    assert "--concurrency-range 1:1" in script and "--concurrency-range 8:8" in script
    assert "--measurement-interval 500" in script
    assert script.count(t.CSV_MARKER) == 2


def test_perf_job_runs_where_the_services_pods_run() -> None:
    spec = {
        "nodeSelector": {"pool": "gpu"},
        "tolerations": [{"key": "gpu", "operator": "Exists"}],
        "imagePullSecrets": ["ngc"],
        "env": [{"name": "X", "value": "1"}],
    }
    job = t.perf_job(body(), "r1", t.Candidate(0, CONFIG), t.Sweep(model="m1"), "10.0.0.7", "img", spec=spec)
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert pod["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert pod["imagePullSecrets"] == [{"name": "ngc"}]
    assert "env" not in pod["containers"][0]


def test_perf_job_mounts_user_input_data() -> None:
    job = t.perf_job(
        body(), "r1", t.Candidate(0, CONFIG), t.Sweep(model="m1"), "10.0.0.7", "img", input_configmap="in"
    )
    pod = job["spec"]["template"]["spec"]
    assert pod["volumes"] == [{"name": "input", "configMap": {"name": "in"}}]
    assert "--input-data /etc/tuning-input/data.json" in pod["containers"][0]["command"][2]


def test_service_perf_job_loads_the_services_address_as_clients_reach_it() -> None:
    sweep = t.Sweep(model="m1", concurrencies=(1, 8), measurement_ms=500, candidate_seconds=90)
    spec = {"nodeSelector": {"pool": "gpu"}}
    job = t.service_perf_job(body(), "bench-before", sweep, "10.96.0.12", "img:1", spec=spec)
    assert job["metadata"]["name"] == "svc-tune-bench-before-service-perf"
    labels = job["metadata"]["labels"]
    assert labels[t.LABEL_TUNING] == "svc" and labels[t.LABEL_RUN] == "bench-before"
    assert LABEL_SERVICE not in labels and LABEL_REVISION not in labels
    assert job["spec"]["template"]["metadata"]["labels"] == labels
    assert job["metadata"]["ownerReferences"][0]["controller"] is False
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 90
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "gpu"}
    script = pod["containers"][0]["command"][2]
    assert script.count("perf_analyzer -m m1 -u 10.96.0.12:8001 -i grpc") == 2
    assert script.count(t.CSV_MARKER) == 2
    # The same load as a candidate's pod gets, only the address and the name differ.
    candidate = t.perf_job(
        body(), "bench-before", t.Candidate(0, CONFIG), sweep, "10.0.0.7", "img:1", spec=spec
    )
    assert script == candidate["spec"]["template"]["spec"]["containers"][0]["command"][2].replace(
        "10.0.0.7", "10.96.0.12"
    )


# ----------------------------------------------------------------- perf_analyzer's output


def test_parse_the_real_csv_of_perf_analyzer() -> None:
    (row,) = t.parse_perf_csv(REAL_CSV)
    assert row == t.Measurement(4, 46.3352, 84855, 88303, 90275, 92587)
    assert row.latency(99) == 92587


def test_parse_several_csvs_from_a_job_log() -> None:
    second = REAL_CSV.replace("\n4,46.3352", "\n8,90.5")
    log = f"perf noise\n{t.CSV_MARKER}\n{REAL_CSV}\n*** more noise\n{t.CSV_MARKER}\n{second}\n"
    rows = t.parse_perf_csv(t.job_output_csv(log))
    assert [(r.concurrency, r.throughput) for r in rows] == [(4, 46.3352), (8, 90.5)]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "no measurement"),
        ("Concurrency,Inferences/Second\n1,2\n", "no column p50 latency"),
        (REAL_CSV.replace("46.3352", "fast"), "row"),
    ],
)
def test_unreadable_perf_output_says_why(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        t.parse_perf_csv(text)


# ----------------------------------------------------------------- the choice


def results(*rows: tuple[int, list[t.Measurement]], error_of: int | None = None) -> list[t.CandidateResult]:
    return [
        t.CandidateResult(
            t.Candidate(i, {"maxBatchSize": i}, default=i == 0), tuple(ms), "x" if i == error_of else None
        )
        for i, ms in rows
    ]


@pytest.mark.parametrize(
    ("percentile", "bound", "expected"),
    [
        (95, None, (2, 8)),  # the most throughput, whatever its latency
        (95, 50_000, (1, 8)),  # c2 at 8 is over the bound at p95
        (99, 50_000, (1, 4)),  # ... and c1 at 8 at p99
        (95, 9_000, (0, 1)),  # only the model's own at concurrency 1 fits
        (95, 1_000, None),
    ],
)
def test_choose_the_most_throughput_under_the_latency_bound(
    percentile: int, bound: int | None, expected: tuple[int, int] | None
) -> None:
    measured = results(
        (0, [m(1, 50, 8_000), m(8, 60, 90_000)]),
        (1, [m(4, 150, 30_000), m(8, 200, 45_000, 70_000)]),
        (2, [m(8, 400, 60_000)]),
    )
    choice = t.choose(measured, percentile, bound)
    if expected is None:
        assert choice is None
        return
    assert choice is not None
    assert (choice.candidate.index, choice.measurement.concurrency) == expected


def test_the_choice_carries_the_models_own_best_under_the_same_bound() -> None:
    measured = results((0, [m(1, 50, 8_000), m(8, 60, 90_000)]), (1, [m(8, 200, 45_000)]))
    choice = t.choose(measured, 95, 50_000)
    assert choice is not None and choice.baseline is not None
    assert choice.baseline.throughput == 50
    assert choice.gain == pytest.approx(4.0)


def test_ties_go_to_lower_latency_then_to_the_models_own() -> None:
    tie = results((0, [m(4, 100, 20_000)]), (1, [m(4, 100, 10_000)]))
    assert t.choose(tie, 95, None).candidate.index == 1  # type: ignore[union-attr]
    same = results((0, [m(4, 100, 10_000)]), (1, [m(4, 100, 10_000)]))
    assert t.choose(same, 95, None).candidate.index == 0  # type: ignore[union-attr]


def test_a_failed_candidate_is_never_chosen() -> None:
    measured = results((0, [m(1, 50, 8_000)]), (1, [m(8, 900, 8_000)]), error_of=1)
    assert t.choose(measured, 95, None).candidate.index == 0  # type: ignore[union-attr]


# ----------------------------------------------------------------- the spec change


def test_spec_patch_replaces_only_that_models_config_and_tests_its_name() -> None:
    spec = spec_of(models=[{"name": "a", "config": CONFIG}, {"name": "m1", "config": CONFIG}])
    new = t.with_settings(CONFIG, {"maxQueueDelayMicroseconds": 100})
    patch = t.spec_patch(spec, "m1", new)
    assert patch == [
        {"op": "test", "path": "/spec/models/1/name", "value": "m1"},
        {"op": "replace", "path": "/spec/models/1/config", "value": new},
    ]
    assert yaml.safe_load(t.patch_yaml(patch)) == patch


# ----------------------------------------------------------------- the record


def test_record_and_table_of_a_sweep() -> None:
    sweep = t.Sweep(model="m1", queue_delays_us=(100,), concurrencies=(1, 8), latency_bound_us=50_000)
    the_plan = plan(sweep)
    measured = [
        t.CandidateResult(the_plan.candidates[0], (m(1, 50, 8_000), m(8, 60, 90_000))),
        t.CandidateResult(the_plan.candidates[1], (m(1, 48, 9_000), m(8, 300, 40_000))),
    ]
    data = t.record(
        service="svc",
        run="r1",
        sweep=sweep,
        plan=the_plan,
        results=measured,
        state=t.SUCCEEDED,
        message="",
        started_at="2026-11-27T17:00:00Z",
        finished_at="2026-11-27T17:05:00Z",
        spec=spec_of(),
    )
    json.dumps(data)  # JSON-able
    assert data["choice"]["candidate"] == "c1"
    assert data["choice"]["gain"] == 6.0
    assert data["choice"]["patch"][1]["value"]["dynamicBatching"] == {"maxQueueDelayMicroseconds": "100"}
    rows = t.result_rows(data)
    assert [r[0] for r in rows] == ["c0 (own)", "c0 (own)", "c1", "c1"]
    assert rows[1][-1] == "over bound"
    assert rows[3][-1] == "<- best"
    text = t.summary(data)
    assert "best under p95 <= 50.0 ms: c1" in text and "x6.00" in text
    configmap = t.results_configmap(body(), "r1", data)
    assert t.read_record(configmap) == json.loads(json.dumps(data))
    assert configmap["metadata"]["labels"][t.LABEL_RESULTS] == "true"
    assert LABEL_SERVICE not in configmap["metadata"]["labels"]


def test_a_candidate_not_run_shows_why() -> None:
    sweep = t.Sweep(model="m1", queue_delays_us=(100,))
    the_plan = plan(sweep)
    data = t.record(
        service="svc",
        run="r1",
        sweep=sweep,
        plan=the_plan,
        results=[t.CandidateResult(the_plan.candidates[0], (), "pod not Ready in 300 s")],
        state=t.FAILED,
        message="",
        started_at="x",
        finished_at=None,
        spec=spec_of(),
    )
    rows = t.result_rows(data)
    assert rows[0][-1] == "pod not Ready in 300 s"
    assert rows[1][-1] == "not run"
    assert data["choice"] is None
    assert "none" in t.summary(data)


# ----------------------------------------------------------------- reading pods and Jobs back


def pod(ready: bool = False, ip: str | None = None, **status: Any) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {
        "metadata": {"name": "svc-tune-r1-c1-abc"},
        "status": {"conditions": conditions, **({"podIP": ip} if ip else {}), **status},
    }


def waiting(reason: str, message: str = "", init: bool = False) -> dict[str, Any]:
    key = "initContainerStatuses" if init else "containerStatuses"
    name = "sync" if init else "tritonserver"
    return {
        key: [{"name": name, "restartCount": 0, "state": {"waiting": {"reason": reason, "message": message}}}]
    }


@pytest.mark.parametrize(
    ("pods", "ip", "failure", "detail"),
    [
        ([], None, None, "no pod yet"),
        ([pod(True, "10.0.0.9")], "10.0.0.9", None, "Ready"),
        ([pod(False, "10.0.0.9")], None, None, "starting"),
        (
            [pod(**waiting("ImagePullBackOff", "no such image"))],
            None,
            "ImagePullBackOff: container tritonserver: no such image",
            "",
        ),
        ([pod(**waiting("CrashLoopBackOff"))], None, "CrashLoopBackOff", ""),
        (
            [
                pod(
                    conditions=[
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": "0/2 nodes",
                        }
                    ]
                )
            ],
            None,
            None,
            "unschedulable: 0/2 nodes",
        ),
    ],
)
def test_pod_verdict(pods: list[dict[str, Any]], ip: str | None, failure: str | None, detail: str) -> None:
    verdict = t.pod_verdict(pods)
    assert verdict.ip == ip
    if failure is None:
        assert verdict.failure is None
        assert detail in verdict.detail
    else:
        assert verdict.failure is not None and failure in verdict.failure


def test_a_terminating_pod_is_not_the_candidates_pod() -> None:
    gone = pod(True, "10.0.0.1")
    gone["metadata"]["deletionTimestamp"] = "2026-11-27T17:00:00Z"
    assert t.pod_verdict([gone]).ip is None
    assert t.pod_verdict([gone, pod(True, "10.0.0.2")]).ip == "10.0.0.2"


@pytest.mark.parametrize(
    ("conditions", "verdict"),
    [
        ([], None),
        ([{"type": "Complete", "status": "True"}], "complete"),
        ([{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}], "failed"),
        ([{"type": "Failed", "status": "False"}], None),
    ],
)
def test_job_verdict(conditions: list[dict[str, Any]], verdict: str | None) -> None:
    assert t.job_verdict({"status": {"conditions": conditions}}) == verdict


@pytest.mark.parametrize(
    ("runs", "keep", "expired"),
    [
        ([], 5, []),
        (["b", "a"], 5, []),
        (["261127-170300", "261127-170000", "261127-170100"], 2, ["261127-170000"]),
        (["a", "b", "c"], 0, ["a", "b", "c"]),
    ],
)
def test_expired_runs_are_all_but_the_latest(runs: list[str], keep: int, expired: list[str]) -> None:
    assert t.expired_runs(runs, keep) == expired


# ----------------------------------------------------------------- GPU holders and the operator's end of runs


def _pod(name: str, owner: tuple[str, str] | None, **extra: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, **extra.pop("metadata", {})}
    if owner is not None:
        metadata["ownerReferences"] = [{"kind": owner[0], "name": owner[1]}]
    return {"metadata": metadata, **extra}


def test_held_pods_count_deployments_terminating_and_orphaned_pods_but_no_job_or_finished_pod() -> None:
    deployments = [
        {"metadata": {"name": "svc-a"}, "spec": {"replicas": 2}, "status": {"replicas": 3}},  # surge
        {"metadata": {"name": "svc-b"}, "spec": {"replicas": 1}, "status": {}},  # pod not made yet
        {"metadata": {"name": "svc-tune-r-c0"}, "spec": {"replicas": 1}, "status": {"replicas": 1}},
    ]
    pods = [
        _pod("svc-a-1-x", ("ReplicaSet", "svc-a-1")),  # counted in its Deployment's status.replicas
        _pod("svc-a-1-y", ("ReplicaSet", "svc-a-1"), metadata={"deletionTimestamp": "2026-01-01T00:00:00Z"}),
        _pod("svc-tune-q-c0-5-z", ("ReplicaSet", "svc-tune-q-c0-5")),  # its Deployment deleted: still there
        _pod("svc-tune-q-c0-5-w", ("ReplicaSet", "svc-tune-q-c0-5"), status={"phase": "Failed"}),
        _pod("svc-tune-r-c0-perf-k", ("Job", "svc-tune-r-c0-perf")),  # perf_analyzer: no GPU
    ]
    assert t.held_pods(deployments, pods) == 3 + 1 + 1 + 1 + 1


def test_a_sweep_may_not_start_during_a_rollout_under_a_gpu_budget() -> None:
    spec = spec_of(resources={"gpus": 1}, rollout={"gpuBudget": 8})
    assert t.gpu_budget_problem(spec, {"canaryRevision": "b"}, 1, 1) is not None
    assert t.gpu_budget_problem(spec, {"stableRevision": "a"}, 1, 1) is None
    assert t.gpu_budget_problem(spec_of(), {"canaryRevision": "b"}, 1, 1) is None  # no budget: no limit


def _tuning(kind: str, name: str, deadline: str | None, **labels: str) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": "ml",
        "resourceVersion": "7",
        "creationTimestamp": "2026-11-27T10:00:00Z",
        "labels": {**t.run_labels("svc", "r"), **labels},
    }
    if deadline is not None:
        metadata["annotations"] = {t.ANNOTATION_DEADLINE: deadline}
    return {"kind": kind, "metadata": metadata}


def test_expire_deletes_owners_past_their_deadline_and_marks_running_records_abandoned() -> None:
    past, future = "2026-11-27T16:59:00Z", "2026-11-27T17:01:00Z"
    record = _tuning("ConfigMap", "svc-tune-r-results", past, **{t.LABEL_RESULTS: "true"})
    record["data"] = {t.RESULTS_KEY: json.dumps({"run": "r", "state": t.RUNNING, "message": ""})}
    done = _tuning("ConfigMap", "svc-tune-q-results", past, **{t.LABEL_RESULTS: "true"})
    done["data"] = {t.RESULTS_KEY: json.dumps({"run": "q", "state": t.SUCCEEDED})}
    objects = [
        _tuning("Deployment", "svc-tune-r-c0", past),
        _tuning("Job", "svc-tune-r-c0-perf", past),
        _tuning("ConfigMap", "svc-tune-r-c0", past),
        _tuning("Pod", "svc-tune-r-c0-1-x", past),  # its Deployment's deletion takes it
        _tuning("Deployment", "svc-tune-s-c0", future),
        _tuning("Deployment", "svc-tune-o-c0", None),  # no deadline: creation + the longest run
        record,
        done,
    ]
    now = datetime(2026, 11, 27, 17, 0, 0, tzinfo=UTC)
    expiry = t.expire(objects, now)
    assert expiry.delete == (
        ("ConfigMap", "ml", "svc-tune-r-c0"),
        ("Deployment", "ml", "svc-tune-r-c0"),
        ("Job", "ml", "svc-tune-r-c0-perf"),
    )
    ((namespace, name, version, data),) = expiry.abandon
    assert (namespace, name, version) == ("ml", "svc-tune-r-results", "7")
    assert data["state"] == t.ABANDONED and data["finishedAt"] == "2026-11-27T17:00:00Z"
    assert "deadline 2026-11-27T16:59:00Z passed" in data["message"]
    later = now + timedelta(seconds=t.LONGEST_RUN_SECONDS)
    assert ("Deployment", "ml", "svc-tune-o-c0") in t.expire(objects, later).delete
    patch = t.record_patch(data, version)
    assert patch["metadata"]["resourceVersion"] == "7"
    assert json.loads(patch["data"][t.RESULTS_KEY]) == data


def test_run_deadline_covers_the_sweep_and_a_last_candidate() -> None:
    start = datetime(2026, 11, 27, 17, 0, 0, tzinfo=UTC)
    sweep = t.Sweep(model="m1", max_seconds=600, candidate_seconds=100)
    assert t.run_deadline(start, sweep) == start + timedelta(seconds=600 + 200 + t.DEADLINE_GRACE_SECONDS)
    (stamped,) = t.with_deadline([{"metadata": {"name": "x", "annotations": {"a": "b"}}}], start)
    assert stamped["metadata"]["annotations"] == {"a": "b", t.ANNOTATION_DEADLINE: "2026-11-27T17:00:00Z"}
