"""The operator's metrics render in the Prometheus exposition format with the expected names and labels."""

from __future__ import annotations

import datetime
import urllib.request

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from pod_bodies import CREATED, started_pod
from triton_operator import metrics
from triton_operator.core.observed.observation import pod_state
from triton_operator.core.pod.startup import format_summary
from triton_operator.core.pool.copies import Figures
from triton_operator.metrics import OperatorMetrics


def _samples(m: OperatorMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Parse the rendered text back, as Prometheus would, into {(sample, labels): value}."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(m.render().decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


@pytest.fixture
def m() -> OperatorMetrics:
    return OperatorMetrics(CollectorRegistry())


def test_reconcile_success_and_error_are_timed_by_outcome(m: OperatorMetrics) -> None:
    with m.reconcile_timer():
        pass
    with pytest.raises(ValueError), m.reconcile_timer():
        raise ValueError("boom")
    with m.reconcile_timer() as result:
        result.fail("RepositoryUnavailable")

    s = _samples(m)
    assert s[("triton_operator_reconcile_duration_seconds_count", (("outcome", "success"),))] == 1
    assert s[("triton_operator_reconcile_duration_seconds_count", (("outcome", "error"),))] == 2
    assert s[("triton_operator_reconcile_errors_total", (("reason", "ValueError"),))] == 1
    assert s[("triton_operator_reconcile_errors_total", (("reason", "RepositoryUnavailable"),))] == 1
    # A success records no error at all.
    assert not [k for k in s if k[0] == "triton_operator_reconcile_errors_total" and k[1] == ()]


def test_reconcile_duration_lands_in_buckets(m: OperatorMetrics) -> None:
    m.record_reconcile(0.3, metrics.ReconcileOutcome())
    s = _samples(m)
    le = "triton_operator_reconcile_duration_seconds_bucket"
    assert s[(le, (("le", "0.25"), ("outcome", "success")))] == 0
    assert s[(le, (("le", "0.5"), ("outcome", "success")))] == 1
    assert s[("triton_operator_reconcile_duration_seconds_sum", (("outcome", "success"),))] == pytest.approx(
        0.3
    )


def test_rollout_gauges_per_tritonservice_and_forget(m: OperatorMetrics) -> None:
    m.set_rollout("ml", "resnet", step_index=2, canary_weight=50)
    m.set_rollout("ml", "bert", step_index=None, canary_weight=0)
    s = _samples(m)
    resnet = (("name", "resnet"), ("namespace", "ml"))
    bert = (("name", "bert"), ("namespace", "ml"))
    assert s[("triton_operator_rollout_step_index", resnet)] == 2
    assert s[("triton_operator_canary_weight_percent", resnet)] == 50
    assert s[("triton_operator_rollout_step_index", bert)] == -1

    m.forget("ml", "resnet")
    m.forget("ml", "never-seen")  # no error for unknown series
    s = _samples(m)
    assert ("triton_operator_rollout_step_index", resnet) not in s
    assert ("triton_operator_canary_weight_percent", resnet) not in s
    assert ("triton_operator_rollout_step_index", bert) in s


def test_a_pooled_models_figures_are_gauges_that_follow_the_window_and_go_with_it(m: OperatorMetrics) -> None:
    """status.pool no longer carries them (they move every window): one series per model, the queue's
    absent for a window without a request, a model gone from the figures and a forgotten service
    leave no series."""

    def key(model: str) -> tuple[tuple[str, str], ...]:
        return (("model", model), ("name", "pool"), ("namespace", "ml"))

    rate, queue = (
        "triton_operator_pool_model_inferences_per_second",
        "triton_operator_pool_model_queue_microseconds",
    )
    m.set_pool_load("ml", "pool", {"a": Figures(90.0, 80_000.0, 900.0), "b": Figures(0.0, None, 0.0)})
    s = _samples(m)
    assert (s[(rate, key("a"))], s[(queue, key("a"))], s[(rate, key("b"))]) == (90.0, 80_000.0, 0.0)
    assert (queue, key("b")) not in s  # no request in the window: no queue time
    m.set_pool_load("ml", "pool", {"a": Figures(0.0, None, 0.0)})
    s = _samples(m)
    assert s[(rate, key("a"))] == 0.0 and (queue, key("a")) not in s and (rate, key("b")) not in s
    m.set_pool_load("ml", "pool", {"b": Figures(3.0, 500.0, 30.0)})
    m.forget("ml", "pool")
    assert not [k for k in _samples(m) if k[0] in (rate, queue)]
    m.set_pool_load("ml", "pool", {"a": Figures(1.0, 10.0, 1.0)})
    m.set_pool_load("ml", "pool", None)  # no window yet, or spec.pool unset
    assert not [k for k in _samples(m) if k[0] in (rate, queue)]


def test_repository_listing(m: OperatorMetrics) -> None:
    m.record_repository_listing("ml", "resnet", scheme="s3", seconds=1.5, objects=12, total_bytes=4096)
    s = _samples(m)
    key = (("name", "resnet"), ("namespace", "ml"))
    assert s[("triton_operator_repository_objects", key)] == 12
    assert s[("triton_operator_repository_bytes", key)] == 4096
    assert s[("triton_operator_repository_list_duration_seconds_count", (("scheme", "s3"),))] == 1
    assert s[("triton_operator_repository_list_duration_seconds_sum", (("scheme", "s3"),))] == 1.5


def test_exposition_has_help_and_type_lines(m: OperatorMetrics) -> None:
    text = m.render().decode()
    assert "# TYPE triton_operator_reconcile_duration_seconds histogram" in text
    assert "# TYPE triton_operator_reconcile_errors_total counter" in text
    assert "# TYPE triton_operator_canary_weight_percent gauge" in text
    assert 'triton_operator_info{version="0.1.0"} 1.0' in text


def test_port_from_env() -> None:
    assert metrics.port_from_env({}) == metrics.DEFAULT_PORT == 8080
    assert metrics.port_from_env({metrics.PORT_ENV: "9100"}) == 9100
    with pytest.raises(ValueError):
        metrics.port_from_env({metrics.PORT_ENV: "70000"})


def test_metrics_server_serves_the_registry_over_http(m: OperatorMetrics) -> None:
    m.set_rollout("ml", "resnet", step_index=1, canary_weight=10)
    server, thread = metrics.start_metrics_server(0, addr="127.0.0.1", metrics=m)
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as rsp:
            body = rsp.read().decode()
        assert rsp.status == 200
        assert 'triton_operator_canary_weight_percent{name="resnet",namespace="ml"} 10.0' in body
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_process_wide_metrics_include_process_collector() -> None:
    names = {f.name for f in text_string_to_metric_families(metrics.METRICS.render().decode())}
    assert "triton_operator_reconcile_duration_seconds" in names
    assert "process_cpu_seconds" in names or "python_info" in names


# ----------------------------------------------------------------- pods' time to serve


def test_every_phase_is_listed_before_any_pod_starts(m: OperatorMetrics) -> None:
    s = _samples(m)
    phases = {"scheduling", "imageAndSandbox", "sync", "tritonserverStart", "tritonserverLoad", "total"}
    counted = {
        dict(labels)["phase"] for name, labels in s if name == "triton_operator_time_to_serve_seconds_count"
    }
    assert counted == phases
    assert s[("triton_operator_time_to_serve_fetched_bytes_count", ())] == 0


def test_each_pods_start_is_observed_once_by_phase_with_the_bytes_fetched() -> None:
    m = OperatorMetrics(CollectorRegistry(), since=CREATED)
    first = pod_state(started_pod("r1", "a"))  # 9 s; sync 2 s, 512 MiB fetched
    warm = started_pod("r1", "b", sync_finished=2, triton_started=3, ready=6)
    warm["status"]["initContainerStatuses"][0]["state"]["terminated"]["message"] = format_summary(
        3, 0, 536870912, 0.2
    )
    assert m.record_pod_starts([first, pod_state(warm), pod_state(started_pod("r1", "c", ready=None))]) == 2
    assert m.record_pod_starts([first, pod_state(warm)]) == 0  # the next passes see them again
    s = _samples(m)
    name = "triton_operator_time_to_serve_seconds"
    assert s[(f"{name}_count", (("phase", "total"),))] == 2
    assert s[(f"{name}_sum", (("phase", "total"),))] == 9 + 6
    assert s[(f"{name}_sum", (("phase", "sync"),))] == 2 + 1
    assert s[(f"{name}_bucket", (("le", "2.0"), ("phase", "tritonserverLoad")))] == 0
    assert s[(f"{name}_bucket", (("le", "3.0"), ("phase", "tritonserverLoad")))] == 1  # warm: 3 s
    assert s[(f"{name}_bucket", (("le", "5.0"), ("phase", "tritonserverLoad")))] == 2
    fetched = "triton_operator_time_to_serve_fetched_bytes"
    assert s[(f"{fetched}_bucket", (("le", "0.0"),))] == 1  # the warm pod read nothing from the store
    assert s[(f"{fetched}_bucket", (("le", "5.36870912e+08"),))] == 2  # 512 MiB
    assert s[(f"{fetched}_sum", ())] == 536870912


def test_a_pod_ready_before_the_operator_started_is_not_a_start_it_saw() -> None:
    m = OperatorMetrics(CollectorRegistry(), since=CREATED + datetime.timedelta(seconds=10))
    assert m.record_pod_starts([pod_state(started_pod("r1", "old"))]) == 0  # Ready at 9 s
    assert m.record_pod_starts([pod_state(started_pod("r1", "new", ready=12))]) == 1
    assert _samples(m)[("triton_operator_time_to_serve_seconds_count", (("phase", "total"),))] == 1
