"""client.tuning_runner: the sweep's order, its record, its bounds, and cleanup on success, failure and
Ctrl-C.

The cluster is a fake (FakeTuningCluster, named so) that keeps what was created as a real API
server would, so that what is left after a sweep can be asserted; the same sweep runs against the
real node in tests/e2e/test_tuning_e2e.py.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from triton_operator import kubectl_plugin as kp
from triton_operator.adapters.tuning_cluster import TuningPodError
from triton_operator.client.tuning_runner import tune
from triton_operator.core import tuning as core
from triton_operator.core.objects.builders import build_configmaps
from triton_operator.core.observed.observation import check_body
from triton_operator.core.rollout.requests import Action
from tritonservice_bodies import SETTINGS, body

NOW = datetime(2026, 11, 27, 17, 0, 0, tzinfo=UTC)


def csv_for(throughputs: Mapping[int, float]) -> str:
    header = ",".join(
        [
            *["Concurrency", "Inferences/Second", "Client Send", "Network+Server Send/Recv", "Server Queue"],
            *["Server Compute Input", "Server Compute Infer", "Server Compute Output", "Client Recv"],
            *["p50 latency", "p90 latency", "p95 latency", "p99 latency"],
        ]
    )
    parts = []
    for conc, tput in throughputs.items():
        latency = int(conc * 1_000_000 / tput)
        parts.append(
            f"{core.CSV_MARKER}\n{header}\n{conc},{tput},1,1,1,1,1,1,1,{latency},{latency},{latency},{latency}\n"
        )
    return "".join(parts)


@dataclasses.dataclass
class FakeTuningCluster:
    """A fake of the cluster (the real one: adapters.tuning_cluster.KubeTuning, in the e2e test)."""

    ts_body: dict[str, Any]
    configmaps: list[dict[str, Any]]
    throughput: Callable[[Mapping[str, Any]], Mapping[int, float]]
    fail_pod: set[str] = dataclasses.field(default_factory=set)
    on_job: Callable[[str], None] | None = None
    clock_step: float = 0.0
    objects: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    saved: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    patches: list[Sequence[Mapping[str, Any]]] = dataclasses.field(default_factory=list)
    most_pods: int = 0
    forgotten: set[str] = dataclasses.field(default_factory=set)
    now: float = 0.0
    refuse_delete: set[str] = dataclasses.field(default_factory=set)
    """Kinds whose deletes the API server refuses (403), as for a user without that right."""
    created: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    holders: tuple[list[dict[str, Any]], list[dict[str, Any]]] = ([], [])

    def clock(self) -> float:
        return self.now

    def service(self, name: str, namespace: str) -> dict[str, Any]:
        return self.ts_body

    def revision_configmaps(self, name: str, namespace: str, revision: str) -> list[dict[str, Any]]:
        return self.configmaps

    def create(self, objects: Sequence[Mapping[str, Any]]) -> None:
        for obj in objects:
            self.objects[f"{obj['kind']}/{obj['metadata']['name']}"] = dict(obj)
            self.created.append(dict(obj))
        pods = sum(1 for key in self.objects if key.startswith("Deployment/"))
        self.most_pods = max(self.most_pods, pods)

    def _deployment(self, labels: Mapping[str, str]) -> dict[str, Any]:
        return next(
            o
            for o in self.objects.values()
            if o["kind"] == "Deployment" and core.selects(labels, o["metadata"]["labels"])
        )

    def pod_ip(self, namespace: str, labels: Mapping[str, str], timeout: float) -> str:
        self.now += self.clock_step
        if labels[core.LABEL_CANDIDATE] in self.fail_pod:
            raise TuningPodError("pod x: CrashLoopBackOff")
        self._deployment(labels)
        return "10.1.2.3"

    def job_log(self, namespace: str, name: str, timeout: float) -> str:
        self.now += self.clock_step
        if self.on_job is not None:
            self.on_job(name)
        job = self.objects[f"Job/{name}"]
        deployment = self._deployment({core.LABEL_CANDIDATE: job["metadata"]["labels"][core.LABEL_CANDIDATE]})
        configmap = next(
            o
            for o in self.objects.values()
            if o["kind"] == "ConfigMap" and o["metadata"]["name"] == deployment["metadata"]["name"]
        )
        return "perf_analyzer says things\n" + csv_for(self.throughput(configmap["data"]))

    def delete(self, namespace: str, labels: Mapping[str, str]) -> list[str]:
        problems = []
        for key in [k for k, o in self.objects.items() if core.selects(labels, o["metadata"]["labels"])]:
            if key.split("/")[0] in self.refuse_delete:
                problems.append(f"could not delete {key}: forbidden")
                continue
            del self.objects[key]
        return problems

    def gpu_holders(self, name: str, namespace: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return self.holders

    def leftovers(self, namespace: str, labels: Mapping[str, str]) -> list[str]:
        return [k for k, o in self.objects.items() if core.selects(labels, o["metadata"]["labels"])]

    def save(self, configmap: Mapping[str, Any]) -> None:
        self.saved.append(json.loads(configmap["data"][core.RESULTS_KEY]))
        self.created.append(dict(configmap))

    def patch_spec(self, name: str, namespace: str, patch: Sequence[Mapping[str, Any]]) -> None:
        self.patches.append(patch)

    def runs(self, name: str, namespace: str) -> list[str]:
        return sorted({r["run"] for r in self.saved} - self.forgotten)

    def forget(self, name: str, namespace: str, run: str) -> None:
        self.forgotten.add(run)


def batching_wins(data: Mapping[str, Any]) -> Mapping[int, float]:
    """A model whose per-execute overhead dynamic batching amortises: more throughput with the batcher."""
    batched = "dynamic_batching" in data["m1.config.pbtxt"]
    return {1: 45.0, 4: 170.0 if batched else 46.0}


def cluster(
    throughput: Callable[[Mapping[str, Any]], Mapping[int, float]] = batching_wins, **kw: Any
) -> FakeTuningCluster:
    ts_body = body()
    ts_body["status"] = {"stableRevision": "abc1234567"}
    checked = check_body(ts_body)
    assert checked.ts is not None
    configmaps = build_configmaps(checked.ts, "abc1234567", checked.configs, None, settings=SETTINGS)
    return FakeTuningCluster(ts_body, configmaps, throughput, **kw)


SWEEP = core.Sweep(model="m1", queue_delays_us=(0, 1000), concurrencies=(1, 4))


def run(fake: FakeTuningCluster, sweep: core.Sweep = SWEEP, **kw: Any) -> dict[str, Any]:
    return tune("svc", "ml", sweep, cluster=fake, now=lambda: NOW, clock=fake.clock, **kw)


def test_a_sweep_measures_each_candidate_chooses_the_best_and_leaves_only_its_record() -> None:
    fake = cluster()
    data = run(fake)
    assert data["state"] == core.SUCCEEDED
    assert [c["name"] for c in data["candidates"]] == ["c0", "c1", "c2"]
    assert all(c["measurements"] for c in data["candidates"])
    assert data["choice"]["candidate"] == "c1"  # the first batching one (ties go to the earlier)
    assert data["choice"]["gain"] == round(170 / 46, 3)
    assert fake.objects == {}
    assert fake.most_pods == 1
    assert fake.patches == []
    assert fake.saved[0]["state"] == core.RUNNING and fake.saved[-1] == data


def test_apply_patches_the_spec_with_the_winner() -> None:
    fake = cluster()
    data = run(fake, apply=True)
    (patch,) = fake.patches
    assert patch[1]["value"]["dynamicBatching"] == {"maxQueueDelayMicroseconds": "0"}
    assert "applied c1" in data["message"]


def test_nothing_is_applied_when_the_models_own_config_wins() -> None:
    fake = cluster(lambda data: {1: 45.0, 4: 46.0 if "dynamic_batching" in data["m1.config.pbtxt"] else 60.0})
    data = run(fake, apply=True)
    assert data["choice"]["default"] is True
    assert data["choice"]["patch"] is None
    assert fake.patches == []


def test_a_candidate_whose_pod_fails_is_recorded_and_cleaned_up_and_the_sweep_goes_on() -> None:
    fake = cluster(fail_pod={"c1"})
    data = run(fake)
    assert data["state"] == core.SUCCEEDED
    failed = data["candidates"][1]
    assert failed["error"] == "pod x: CrashLoopBackOff" and failed["measurements"] == []
    assert data["choice"]["candidate"] == "c2"
    assert fake.objects == {}


@pytest.mark.parametrize(("at", "parallel"), [("c1", 1), ("c0", 2), ("c1", 2)])
def test_ctrl_c_during_a_measurement_deletes_everything_and_records_interrupted(
    at: str, parallel: int
) -> None:
    def interrupt(name: str) -> None:
        if name.endswith(f"-{at}-perf"):
            assert fake.objects  # the candidate's pod (and with parallel, the next one's) exist
            raise KeyboardInterrupt

    fake = cluster(on_job=interrupt)
    with pytest.raises(KeyboardInterrupt):
        run(fake, dataclasses.replace(SWEEP, parallel=parallel), input_data="{}")
    assert fake.objects == {}
    assert fake.saved[-1]["state"] == core.INTERRUPTED
    assert fake.saved[-1]["finishedAt"] is not None
    measured = [c["name"] for c in fake.saved[-1]["candidates"] if c["measured"]]
    assert measured == ([] if at == "c0" else ["c0"])


def test_an_error_of_the_api_deletes_everything_and_records_failed() -> None:
    def broken(name: str) -> None:
        raise ConnectionError("the API server went away")

    fake = cluster(on_job=broken)
    with pytest.raises(ConnectionError):
        run(fake)
    assert fake.objects == {}
    assert fake.saved[-1]["state"] == core.FAILED
    assert "went away" in fake.saved[-1]["message"]


def test_the_sweep_stops_at_its_time_bound_and_says_how_many_were_not_run() -> None:
    fake = cluster(clock_step=20.0)  # each wait takes 20 s of the fake's clock: 40 s a candidate
    data = run(fake, dataclasses.replace(SWEEP, max_seconds=60))
    measured = [c["name"] for c in data["candidates"] if c["measured"]]
    assert measured == ["c0", "c1"]
    assert "--max-seconds 60 reached: 1 not run" in data["message"]
    assert fake.objects == {}


def test_parallel_starts_pods_ahead_but_never_more_than_asked() -> None:
    fake = cluster()
    run(fake, dataclasses.replace(SWEEP, parallel=2))
    assert fake.most_pods == 2
    assert fake.objects == {}


def test_user_input_data_goes_to_a_configmap_the_jobs_mount_and_is_deleted() -> None:
    fake = cluster()
    seen: list[dict[str, Any]] = []
    fake.on_job = lambda name: seen.append(fake.objects[f"Job/{name}"])
    run(fake, input_data='{"data": []}')
    volumes = seen[0]["spec"]["template"]["spec"]["volumes"]
    assert volumes[0]["configMap"]["name"].endswith("-input")
    assert fake.objects == {}


def test_a_sweep_that_cannot_run_creates_nothing() -> None:
    fake = cluster()
    with pytest.raises(core.TuningError, match="--max-candidates"):
        run(fake, dataclasses.replace(SWEEP, max_candidates=2))
    assert fake.objects == {} and fake.saved == []
    fake.ts_body["status"] = {}
    with pytest.raises(core.TuningError, match="no stable revision"):
        run(fake)


def test_a_sweep_beyond_the_gpu_budget_is_refused() -> None:
    fake = cluster()
    fake.ts_body["spec"]["resources"] = {"gpus": 1}
    fake.ts_body["spec"]["replicas"] = 2
    fake.ts_body["spec"]["rollout"] = {"gpuBudget": 2}
    fake.holders = (
        [{"metadata": {"name": "svc-abc"}, "spec": {"replicas": 2}, "status": {"replicas": 2}}],
        [],
    )
    with pytest.raises(core.TuningError, match="gpuBudget"):
        run(fake)


def test_a_refused_delete_is_recorded_and_logged_and_the_record_is_saved_all_the_same() -> None:
    fake = cluster(refuse_delete={"Deployment"})
    lines: list[str] = []
    data = run(fake, log=lines.append)
    assert data["state"] == core.SUCCEEDED
    assert fake.saved[-1] == data and data["finishedAt"] is not None
    assert set(fake.objects) == {f"Deployment/svc-tune-261127-170000-c{i}" for i in range(3)}
    assert data["cleanup"] == [
        f"could not delete Deployment/svc-tune-261127-170000-c{i}: forbidden" for i in range(3)
    ]
    assert "cleanup incomplete: 3 delete(s) failed" in data["message"]
    assert [line for line in lines if line.startswith("cleanup: ")] == [
        f"cleanup: {p}" for p in data["cleanup"]
    ]


def test_an_api_server_gone_during_cleanup_still_leaves_a_saved_finished_record() -> None:
    fake = cluster()

    def gone(namespace: str, labels: Mapping[str, str]) -> list[str]:
        raise ConnectionError("the API server went away")

    fake.delete = gone  # type: ignore[method-assign]
    data = run(fake)
    assert fake.saved[-1] == data and data["state"] == core.SUCCEEDED and data["finishedAt"] is not None
    assert data["cleanup"] and all("went away" in p for p in data["cleanup"])


def test_every_object_of_a_sweep_and_its_record_carry_the_runs_deadline() -> None:
    fake = cluster()
    sweep = dataclasses.replace(SWEEP, max_seconds=100, candidate_seconds=30)
    run(fake, sweep, input_data="{}")
    kinds = {o["kind"] for o in fake.created}
    assert kinds == {"ConfigMap", "Deployment", "Job"}
    deadline = "2026-11-27T17:03:40Z"  # 100 + 2 x 30 + 60 s after the start
    assert {o["metadata"]["annotations"][core.ANNOTATION_DEADLINE] for o in fake.created} == {deadline}
    results = [o for o in fake.created if o["metadata"]["labels"].get(core.LABEL_RESULTS) == "true"]
    assert results and all(
        o["metadata"]["annotations"][core.ANNOTATION_DEADLINE] == deadline for o in results
    )


def test_tuning_pods_count_against_the_gpu_budget_with_the_pods_of_every_revision() -> None:
    fake = cluster()
    fake.ts_body["spec"]["resources"] = {"gpus": 1}
    fake.ts_body["spec"]["replicas"] = 1
    fake.ts_body["spec"]["rollout"] = {"gpuBudget": 3}
    stable = {"metadata": {"name": "svc-abc"}, "spec": {"replicas": 1}, "status": {"replicas": 1}}
    canary = {"metadata": {"name": "svc-def"}, "spec": {"replicas": 1}, "status": {"replicas": 0}}
    fake.holders = ([stable, canary], [])
    run(fake)  # 1 + 1 + 1 tuning pod = 3
    fake.holders = ([stable, canary, {**stable, "metadata": {"name": "svc-tune-x-c0"}}], [])
    with pytest.raises(core.TuningError, match="hold 3 and 1 tuning pod"):
        run(fake)
    fake.holders = ([stable], [])
    fake.ts_body["status"]["canaryRevision"] = "def"
    with pytest.raises(core.TuningError, match="rollout is under way"):
        run(fake)


# ----------------------------------------------------------------- kubectl triton tune


@dataclasses.dataclass
class FakeControl:
    """A fake of the plugin's Control: the TritonService and no recorded sweeps."""

    objects: dict[tuple[str, str], dict[str, Any]]
    namespace: str = "default"

    def get(self, name: str, namespace: str) -> dict[str, Any]:
        return self.objects[(namespace, name)]

    def tuning_results(self, name: str, namespace: str) -> list[dict[str, Any]]:
        return []

    def list(self, namespace: str | None) -> list[dict[str, Any]]:
        raise AssertionError("tune lists no TritonServices")

    def request(
        self,
        name: str,
        namespace: str,
        action: Action,
        to_revision: str | None = None,
        *,
        revision: str | None = None,
    ) -> str:
        raise AssertionError("tune makes no control request")


def test_kubectl_triton_tune_prints_the_table_and_the_spec_change(capsys: pytest.CaptureFixture[str]) -> None:
    fake = cluster()
    control = FakeControl(objects={("ml", "svc"): fake.ts_body})
    argv = ["tune", "svc", "-n", "ml", "--model", "m1", "--queue-delay-us", "0,1000", "--concurrency", "1,4"]
    assert kp.main(argv, client=control, tuning_cluster=fake) == 0
    captured = capsys.readouterr()
    assert "best under p95, no bound: c1" in captured.out
    assert "<- best" in captured.out
    assert "kubectl patch tsvc svc -n ml --type json -p" in captured.out
    assert "c0: " in captured.err  # progress on stderr


def test_kubectl_triton_tune_ctrl_c_exits_130_after_cleanup(capsys: pytest.CaptureFixture[str]) -> None:
    def interrupt(name: str) -> None:
        raise KeyboardInterrupt

    fake = cluster(on_job=interrupt)
    control = FakeControl(objects={("ml", "svc"): fake.ts_body})
    assert kp.main(["tune", "svc", "-n", "ml", "--model", "m1"], client=control, tuning_cluster=fake) == 130
    assert fake.objects == {}
    assert "interrupted" in capsys.readouterr().err


def test_kubectl_triton_status_shows_the_latest_sweep() -> None:
    fake = cluster()
    data = run(fake)
    text = kp.render_status(fake.ts_body, NOW, [data])
    assert "Tuning (kubectl triton tune; latest last):" in text
    assert "best under p95, no bound: c1" in text


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--instances", "1,x"], "whole numbers"),
        (["--dynamic-batching", "maybe"], "on, off"),
        (["--percentile", "90"], "invalid choice"),
    ],
)
def test_kubectl_triton_tune_refuses_bad_flags(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        kp.build_parser().parse_args(["tune", "svc", "--model", "m1", *argv])
    assert error in capsys.readouterr().err


def test_kubectl_triton_tune_flags_make_the_sweep() -> None:
    args = kp.build_parser().parse_args(
        [
            "tune",
            "svc",
            "--model",
            "m1",
            "--instances",
            "1,2",
            "--dynamic-batching",
            "on,off",
            "--preferred-batch-sizes",
            "4,8;none",
            "--latency-bound-ms",
            "12.5",
            "--percentile",
            "99",
        ]
    )
    sweep = kp.sweep_of(args)
    assert sweep.instance_counts == (1, 2)
    assert sweep.dynamic_batching == (True, False)
    assert sweep.preferred_batch_sizes == ((4, 8), ())
    assert sweep.latency_bound_us == 12_500
    assert sweep.percentile == 99


def test_a_sweep_keeps_the_records_of_the_latest_runs_only() -> None:
    fake = cluster()
    for minute in range(4):
        moment = NOW.replace(minute=minute)
        tune(
            "svc",
            "ml",
            SWEEP,
            cluster=fake,
            now=functools.partial(lambda m: m, moment),
            clock=fake.clock,
            keep=2,
        )
    assert fake.runs("svc", "ml") == ["261127-170200", "261127-170300"]
    assert fake.forgotten == {"261127-170000", "261127-170100"}


def test_each_candidate_says_k_of_n_the_time_elapsed_and_an_estimate_of_what_is_left() -> None:
    from triton_operator.client.tuning_runner import duration  # noqa: PLC0415

    fake = cluster(clock_step=20.0)  # 40 s a candidate on the fake's clock: 2 waits of 20 s
    lines: list[str] = []
    run(fake, log=lines.append)
    started = [line for line in lines if "candidate " in line]
    assert started == [
        "c0 (candidate 1 of 3, 0s elapsed, no estimate before the first is measured): "
        + started[0].split(": ", 1)[1],
        "c1 (candidate 2 of 3, 40s elapsed, about 1m20s left): " + started[1].split(": ", 1)[1],
        "c2 (candidate 3 of 3, 1m20s elapsed, about 40s left): " + started[2].split(": ", 1)[1],
    ]
    assert [duration(s) for s in (0, 59.6, 61, 3725)] == ["0s", "1m00s", "1m01s", "1h02m"]
