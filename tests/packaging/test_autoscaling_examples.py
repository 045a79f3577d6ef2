"""examples/autoscaling/ validates: kubeconform -strict against the pinned KEDA and prometheus-operator
CRDs and the Kubernetes OpenAPI spec, the prometheus-adapter rules' structure, and every PromQL query
parsed by Prometheus's own parser (charts/validate --autoscaling); broken copies are refused."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from packaging_helpers import chartlib
from triton_operator.models import INFERENCE_RATE_METRIC, QUEUE_TIME_METRIC

EXAMPLES = chartlib.AUTOSCALING_DIR


def _validate(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(chartlib.CHARTS_DIR / "validate"), "--autoscaling", *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,  # the first run builds charts/promql-check (about a minute cold)
    )


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.fixture(scope="module")
def schemas(helm: Path, kubeconform: Path) -> None:
    """The Kubernetes OpenAPI spec, the KEDA/prometheus-operator CRDs and charts/promql-check."""
    try:
        chartlib.openapi_spec()
        chartlib.autoscaling_crds()
        chartlib.promql_check_binary()
    except chartlib.ToolMissingError as exc:
        pytest.skip(f"no schemas or PromQL checker offline: {exc}")


def test_autoscaling_examples_validate(schemas: None) -> None:
    proc = _validate()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    files = chartlib.autoscaling_files()
    summaries = [line for line in out.splitlines() if "Summary:" in line]
    assert len(summaries) == len(files), out
    assert all("Invalid: 0, Errors: 0, Skipped: 0" in s for s in summaries), out
    docs = [d for f in files for d in _docs(f)]
    kinds = Counter(d["kind"] for d in docs)
    for kind in ("ConfigMap", "HorizontalPodAutoscaler", "PodMonitor", "ScaledObject"):
        assert kinds[kind] == 1, kinds
    # Every query was parsed: 2 per adapter rule (seriesQuery, metricsQuery), 1 per KEDA trigger.
    queries = chartlib.prometheus_queries(docs, "")
    assert len(queries) == 2 * len(chartlib.ADAPTER_METRICS) + 2
    assert out.count(": PromQL parsed") == len(queries), out


def test_the_examples_scale_a_tritonservice_on_the_adapter_metrics() -> None:
    (hpa,) = _docs(EXAMPLES / "hpa-own.yaml")
    (scaled,) = _docs(EXAMPLES / "keda-scaledobject.yaml")
    target = {"apiVersion": "triton-operator.io/v1alpha1", "kind": "TritonService", "name": "resnet"}
    assert hpa["spec"]["scaleTargetRef"] == target
    assert scaled["spec"]["scaleTargetRef"] == target
    pods_metrics = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    assert sorted(pods_metrics) == sorted(chartlib.ADAPTER_METRICS)
    # ... the names spec.autoscaling's HPA reads (queueTime, inferencesPerSecond without metricName)
    assert chartlib.ADAPTER_METRICS == (QUEUE_TIME_METRIC, INFERENCE_RATE_METRIC)
    assert scaled["spec"]["minReplicaCount"] >= 1  # no pod: nothing to measure, never woken
    (_, config), *others = chartlib.adapter_configs(_docs(EXAMPLES / "prometheus-adapter-rules.yaml"))
    assert others == []
    assert chartlib.adapter_config_problems(config, "config") == []


def _rule(docs: list[dict[str, Any]], index: int, change: Callable[[dict[str, Any]], None]) -> None:
    """Apply ``change`` to rule ``index`` of the adapter ConfigMap's config.yaml."""
    data = docs[0]["data"]
    config = yaml.safe_load(data["config.yaml"])
    change(config["rules"][index])
    data["config.yaml"] = yaml.safe_dump(config)


def _rename(key: str, new: str) -> Callable[[dict[str, Any]], None]:
    return lambda d: d.update({new: d.pop(key)})


BROKEN: list[tuple[str, Callable[[list[dict[str, Any]]], None], str]] = [
    (
        "keda-scaledobject.yaml",
        lambda docs: _rename("minReplicaCount", "minReplicas")(docs[0]["spec"]),
        "minReplicas",
    ),
    (
        "keda-scaledobject.yaml",
        lambda docs: docs[0]["spec"].update(pollingInterval="15s"),
        "pollingInterval",
    ),
    (
        "keda-scaledobject.yaml",
        lambda docs: docs[0]["spec"]["triggers"][0]["metadata"].update(
            query=docs[0]["spec"]["triggers"][0]["metadata"]["query"].replace("or vector(0)", "or vector(0")
        ),
        "parse error",
    ),
    (
        "podmonitor.yaml",
        lambda docs: _rename("port", "portName")(docs[0]["spec"]["podMetricsEndpoints"][0]),
        "portName",
    ),
    (
        "hpa-own.yaml",
        lambda docs: _rename("averageValue", "averageValues")(
            docs[0]["spec"]["metrics"][0]["pods"]["target"]
        ),
        "averageValues",
    ),
    (
        "prometheus-adapter-rules.yaml",
        lambda docs: _rule(docs, 0, _rename("metricsQuery", "metricQuery")),
        "rules[0].metricQuery: unknown field",
    ),
    (
        "prometheus-adapter-rules.yaml",
        lambda docs: _rule(docs, 1, lambda r: r["name"].update({"as": "triton_inferences_per_sec"})),
        "rules[1].name.as: 'triton_inferences_per_sec' is not one of",
    ),
    (
        "prometheus-adapter-rules.yaml",
        lambda docs: _rule(docs, 0, lambda r: r["resources"]["overrides"].pop("pod")),
        "rules[0].resources.overrides.pod",
    ),
    (
        "prometheus-adapter-rules.yaml",
        lambda docs: _rule(
            docs,
            0,
            lambda r: r.update(
                metricsQuery=r["metricsQuery"].replace(
                    "nv_inference_request_success{<<.LabelMatchers>>}", "nv_inference_request_success{}", 1
                )
            ),
        ),
        "nv_inference_request_success: does not match namespace and pod",
    ),
    (
        "prometheus-adapter-rules.yaml",
        lambda docs: _rule(docs, 1, lambda r: r.update(metricsQuery=r["metricsQuery"] + " <<.Seris>>")),
        "can't evaluate field Seris",
    ),
]


@pytest.mark.parametrize(
    ("file", "mutate", "message"),
    BROKEN,
    ids=[
        "keda-misspelled-field",
        "keda-wrong-type",
        "keda-promql-syntax",
        "podmonitor-misspelled-field",
        "hpa-misspelled-field",
        "adapter-misspelled-field",
        "adapter-unknown-metric-name",
        "adapter-no-pod-override",
        "adapter-selector-without-label-matchers",
        "adapter-template-unknown-field",
    ],
)
def test_autoscaling_validation_refuses_broken_examples(
    schemas: None,
    tmp_path: Path,
    file: str,
    mutate: Callable[[list[dict[str, Any]]], None],
    message: str,
) -> None:
    docs = _docs(EXAMPLES / file)
    mutate(docs)
    broken = tmp_path / file
    broken.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    proc = _validate("--file", broken)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert message in proc.stdout, proc.stdout


def test_the_readme_names_every_example() -> None:
    readme = (EXAMPLES / "README.md").read_text()
    files = sorted(p.name for p in EXAMPLES.glob("*.yaml"))
    assert len(files) >= 4
    assert [f for f in files if f"`{f}`" not in readme] == []
