"""The autoscaling examples' PromQL against a real tritonserver: every metric and label the queries name is
one Triton exports (or one the PodMonitor's scrape adds), and the queries, evaluated by Prometheus's own
engine over real scrapes, give Triton's own queue time per request and inferences a second, and 0 for an
idle pod.

The queries are read from examples/autoscaling/ (prometheus-adapter rules, KEDA triggers); the scrape
labels from its PodMonitor. The evaluation runs charts/promql-check (Prometheus's parser and engine,
built with `go`); the expected figures come from Triton's statistics API, not from the metrics.
"""

from __future__ import annotations

import json
import math
import re
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from real_pods import behaving_source
from testkit import load_chartlib
from triton_specs import ADD_SUB_CONFIG_PBTXT
from tritonserver import RunningServer, TritonInstall, start_server

pytestmark = [pytest.mark.triton, pytest.mark.timeout(600)]

chartlib = load_chartlib()
EXAMPLES = chartlib.AUTOSCALING_DIR

CONFIG = ADD_SUB_CONFIG_PBTXT
# `slow` takes 30 ms a request on its one instance: concurrent requests wait in Triton's queue.
MODELS = {"slow": 0.03, "fast": 0.0}
BODY = json.dumps(
    {
        "inputs": [
            {"name": "INPUT0", "shape": [2, 4], "datatype": "FP32", "data": [1, 2, 3, 4] * 2},
            {"name": "INPUT1", "shape": [2, 4], "datatype": "FP32", "data": [1, 1, 1, 1] * 2},
        ]
    }
).encode()  # a batch of 2: nv_inference_count counts 2 a request
SCRAPE_INTERVAL = 15.0  # seconds between the scrapes as Prometheus would store them (podmonitor.yaml)
NAMESPACE, SERVICE, BUSY, IDLE = "ml", "resnet", "resnet-7d9c-busy", "resnet-7d9c-idle"
# What prometheus-operator's scrape of a PodMonitor endpoint adds to every series (pkg/prometheus/
# promcfg.go: namespace, container, pod relabelled; job, endpoint, instance), besides podTargetLabels.
SCRAPE_LABELS = ("namespace", "container", "pod", "job", "endpoint", "instance")


SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Family:
    """A metric of the Prometheus text format as exposed: its TYPE and samples (labels, value)."""

    type: str
    samples: list[tuple[dict[str, str], float]]


def parse_exposition(text: str) -> dict[str, Family]:
    """Triton's /metrics text by metric name, names as exposed (prometheus_client's parser would
    rename a counter's samples to name_total, which is not what Prometheus stores for Triton)."""
    families: dict[str, Family] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            families[name] = Family(kind, [])
        elif line and not line.startswith("#"):
            m = SAMPLE.fullmatch(line.strip())
            assert m is not None, f"not a sample line: {line!r}"
            labels = dict(LABEL.findall(m.group(2) or ""))
            families.setdefault(m.group(1), Family("untyped", [])).samples.append((labels, float(m.group(3))))
    return families


@dataclass(frozen=True)
class Scrape:
    """One /metrics text of the server and its statistics API at the same moment."""

    metrics: str
    stats: dict[str, dict[str, Any]]


@dataclass(frozen=True)
class Run:
    """Scrapes of a busy minute (requests between scrapes) and of an idle one (none), 5 each."""

    busy: list[Scrape]
    idle: list[Scrape]


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def _queries() -> list[dict[str, str]]:
    return [
        q
        for name in ("prometheus-adapter-rules.yaml", "keda-scaledobject.yaml")
        for q in chartlib.prometheus_queries(_docs(name), name)
    ]


def _target_labels() -> dict[str, str]:
    """The labels the example PodMonitor's scrape puts on a pod's series (its podTargetLabels, the
    pod's labels as the operator sets them, sanitized as prometheus-operator does)."""
    (monitor,) = _docs("podmonitor.yaml")
    pod_labels = {"triton-operator.io/service": SERVICE, "triton-operator.io/revision": "7d9c"}
    return {
        re.sub(r"[^a-zA-Z0-9_]", "_", label): pod_labels[label]
        for label in monitor["spec"].get("podTargetLabels", [])
        if label in pod_labels
    }


def _infer(server: RunningServer, model: str) -> None:
    request = urllib.request.Request(f"{server.http_url}/v2/models/{model}/infer", data=BODY, method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200


def _load(server: RunningServer, requests_per_model: int) -> None:
    """``requests_per_model`` concurrent requests to each model."""
    jobs = [m for m in MODELS for _ in range(requests_per_model)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        list(pool.map(lambda m: _infer(server, m), jobs))


def _scrape(server: RunningServer) -> Scrape:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        metrics = response.read().decode()
    with urllib.request.urlopen(f"{server.http_url}/v2/models/stats", timeout=10) as response:
        stats = {s["name"]: s for s in json.load(response)["model_stats"]}
    return Scrape(metrics, stats)


@pytest.fixture(scope="module")
def server(
    triton_install: TritonInstall, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    base = tmp_path_factory.mktemp("autoscaling")
    for name, delay in MODELS.items():
        (base / "models" / name / "1").mkdir(parents=True)
        (base / "models" / name / "config.pbtxt").write_text(CONFIG.format(name=name))
        (base / "models" / name / "1" / "model.py").write_bytes(behaving_source(delay=delay))
    running = start_server(triton_install, base / "models", list(MODELS), base / "tritonserver.log")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def run(server: RunningServer) -> Run:
    _load(server, 4)  # counters well above zero before the window: rate()'s extrapolation is plain
    busy = [_scrape(server)]
    for _ in range(4):
        _load(server, 4)
        busy.append(_scrape(server))
    idle = [_scrape(server) for _ in range(5)]
    return Run(busy, idle)


@pytest.fixture(scope="module")
def promql() -> Path:
    try:
        return Path(chartlib.promql_check_binary())
    except chartlib.ToolMissingError as exc:
        pytest.skip(f"no PromQL engine: {exc}")


def _series(scrapes: list[Scrape], pod: str) -> list[dict[str, Any]]:
    """The scrapes as Prometheus stores them: one sample a scrape, SCRAPE_INTERVAL apart, ending at
    t=60 s; the first one 0.5 s inside the query's 1m window, so rate() covers all four intervals."""
    extra = {
        "namespace": NAMESPACE,
        "pod": pod,
        "container": "tritonserver",
        "job": "monitoring/tritonserver",
        "endpoint": "metrics",
        "instance": f"{pod}:8002",
        **_target_labels(),
    }
    times = [0.5, *(SCRAPE_INTERVAL * i for i in range(1, len(scrapes)))]
    out: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for at, scrape in zip(times, scrapes, strict=True):
        for name, family in parse_exposition(scrape.metrics).items():
            for sample_labels, value in family.samples:
                labels = {**sample_labels, **extra, "__name__": name}
                key = tuple(sorted(labels.items()))
                out.setdefault(key, {"labels": labels, "samples": []})["samples"].append([at, value])
    return list(out.values())


def _evaluate(run: Run, queries: list[dict[str, str]]) -> list[dict[str, Any]]:
    series = _series(run.busy, BUSY) + _series(run.idle, IDLE)
    results: list[dict[str, Any]] = chartlib.promql_check(
        queries, series=series, at=60.0, namespace=NAMESPACE, pods=[BUSY, IDLE]
    )
    assert [r for r in results if r.get("error")] == [], results
    return results


def _by_pod(result: dict[str, Any]) -> dict[str, float]:
    return {s["labels"].get("pod", ""): float(s["value"]) for s in result["vector"]}


def _delta(run: Run, field: str) -> float:
    """The increase of a statistics-API figure over the busy minute, summed over the models."""

    def total(scrape: Scrape) -> float:
        out = 0.0
        for stats in scrape.stats.values():
            value: Any = stats
            for key in field.split("."):
                value = value[key]
            out += float(value)
        return out

    return total(run.busy[-1]) - total(run.busy[0])


def _expected(run: Run) -> tuple[float, float]:
    """Queue time per request (µs) and inferences a second over the busy minute, from Triton's
    statistics API: queue ns over successful requests, inference count over the minute."""
    queue_us = _delta(run, "inference_stats.queue.ns") / 1000
    requests = _delta(run, "inference_stats.success.count")
    assert _delta(run, "inference_stats.queue.count") == requests  # one queue time a request
    return queue_us / requests, _delta(run, "inference_count") / 60


# ------------------------------------------------------------------ names and labels


def test_every_metric_the_examples_query_is_one_triton_exports(run: Run, promql: Path) -> None:
    queries = _queries()
    parsed = chartlib.promql_check(queries)
    assert [r for r in parsed if r.get("error")] == []
    used = {s["name"]: set(s["labels"]) for r in parsed for s in r["selectors"]}
    used_labels = {lab for labels in used.values() for lab in labels} | {
        g for r in parsed for g in r["grouping"]
    }
    assert len(used) >= 3 and "" not in used, used  # every selector names its metric
    families = parse_exposition(run.busy[-1].metrics)
    missing = sorted(set(used) - set(families))
    assert missing == [], f"the examples query metrics Triton does not export: {missing}"
    scrape_labels = set(SCRAPE_LABELS) | set(_target_labels())
    for name in used:
        family = families[name]
        # rate() is only meaningful on a counter.
        assert family.type == "counter", f"{name} is a {family.type}"
        triton_labels = {lab for labels, _ in family.samples for lab in labels}
        # One series per model and version: what the queries sum over.
        assert {"model", "version"} <= triton_labels, (name, triton_labels)
        assert {labels["model"] for labels, _ in family.samples} == set(MODELS)
        # Triton's own labels do not collide with what the scrape adds (exported_pod, ...).
        assert not triton_labels & scrape_labels, (name, triton_labels & scrape_labels)
        unknown = used_labels - triton_labels - scrape_labels
        assert not unknown, (
            f"labels the queries use on {name} that neither Triton nor the scrape sets: {unknown}"
        )


def test_a_query_naming_a_metric_triton_lacks_is_caught(run: Run, promql: Path) -> None:
    """The check above can fail: a misspelt metric in a copy of the adapter rules is reported."""
    (configmap,) = _docs("prometheus-adapter-rules.yaml")
    configmap["data"]["config.yaml"] = configmap["data"]["config.yaml"].replace(
        "nv_inference_request_success", "nv_inference_request_successes"
    )
    parsed = chartlib.promql_check(chartlib.prometheus_queries([configmap], "copy"))
    used = {s["name"] for r in parsed for s in r["selectors"]}
    assert used - set(parse_exposition(run.busy[-1].metrics)) == {"nv_inference_request_successes"}


# ------------------------------------------------------------------ the maths


def test_adapter_rules_give_triton_s_queue_time_and_throughput_per_pod(run: Run, promql: Path) -> None:
    queue_per_request, inferences = _expected(run)
    assert queue_per_request > 1000  # requests did wait: 4 at a time on a 30 ms model
    assert inferences == pytest.approx(2 * 4 * 2 * 4 / 60)  # 4 rounds, 2 models, 4 requests of 2
    adapter = [q for q in _queries() if q["source"].endswith(".metricsQuery")]
    results = _evaluate(run, adapter)
    ((_, config),) = chartlib.adapter_configs(_docs("prometheus-adapter-rules.yaml"))
    by_metric = {}
    for query, result in zip(adapter, results, strict=True):
        rule = re.search(r"rules\[(\d+)\]", query["source"])
        assert rule is not None
        by_metric[config["rules"][int(rule.group(1))]["name"]["as"]] = _by_pod(result)
    queue = by_metric["triton_queue_time_per_request_microseconds"]
    throughput = by_metric["triton_inferences_per_second"]
    # rate() extrapolates both counters of the ratio alike: it is Triton's own, to its whole µs.
    # The throughput is over 59.5 s of samples, extrapolated to the minute (0.8 %).
    print(f"queue time per request {queue[BUSY]:.0f} µs (statistics API {queue_per_request:.0f} µs)")
    assert queue[BUSY] == pytest.approx(queue_per_request, rel=0.01)
    assert throughput[BUSY] == pytest.approx(inferences, rel=0.02)
    # An idle pod reads 0: present, not NaN.
    assert queue[IDLE] == 0 and throughput[IDLE] == 0


def test_keda_queries_give_the_service_s_queue_time_and_throughput(run: Run, promql: Path) -> None:
    queue_per_request, inferences = _expected(run)
    keda = [q for q in _queries() if "ScaledObject" in q["source"]]
    (scaled,) = _docs("keda-scaledobject.yaml")
    kinds = [t["metricType"] for t in scaled["spec"]["triggers"]]
    values = [_by_pod(r) for r in _evaluate(run, keda)]
    assert all(list(v) == [""] for v in values), values  # one value for the whole service
    by_kind = dict(zip(kinds, (v[""] for v in values), strict=True))
    # Value: the service's average over both pods (the idle one adds no request);
    # AverageValue: the sum, which the HPA divides by the replica count.
    assert by_kind["Value"] == pytest.approx(queue_per_request, rel=0.01)
    assert by_kind["AverageValue"] == pytest.approx(inferences, rel=0.02)


def test_an_idle_service_reads_zero_where_a_plain_ratio_is_nan(run: Run, promql: Path) -> None:
    """Why the examples guard the division: over an idle minute the plain ratio is 0/0."""
    plain = (
        f"sum by (pod) (rate(nv_inference_queue_duration_us{{namespace='{NAMESPACE}'}}[1m]))"
        f" / sum by (pod) (rate(nv_inference_request_success{{namespace='{NAMESPACE}'}}[1m]))"
    )
    (result,) = _evaluate(run, [{"source": "plain", "kind": "expr", "text": plain}])
    values = _by_pod(result)
    assert math.isnan(values[IDLE]) and values[BUSY] > 0
    idle_only = Run(busy=run.idle, idle=run.idle)
    keda = [q for q in _queries() if "ScaledObject" in q["source"]]
    assert [_by_pod(r) for r in _evaluate(idle_only, keda)] == [{"": 0.0}, {"": 0.0}]
