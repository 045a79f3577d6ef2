"""Every rendering of the chart, and manifests/, validate with kubeconform -strict against offline schemas."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from packaging_helpers import chartlib

VALIDATE = chartlib.CHARTS_DIR / "validate"


def _validate(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(VALIDATE), *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def spec() -> Path:
    try:
        return Path(chartlib.openapi_spec())
    except chartlib.ToolMissingError as exc:
        pytest.skip(f"no Kubernetes OpenAPI spec offline: {exc}")


def test_validate_script_passes(helm: Path, kubeconform: Path, spec: Path) -> None:
    proc = _validate()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # The default rendering, each ci/ scenario and each manifests/ file were validated.
    assert out.count("helm lint --strict passed") == 1 + len(chartlib.ci_values_files())
    summaries = [line for line in out.splitlines() if "Summary:" in line]
    assert len(summaries) == 1 + len(chartlib.ci_values_files()) + len(
        list(chartlib.MANIFESTS_DIR.glob("*.yaml"))
    )
    assert all("Invalid: 0, Errors: 0" in s for s in summaries), out
    # Only the prometheus-operator kinds are skipped (no schema offline); everything else is checked.
    ha = next(s for s in summaries if "cluster-ha-values" in s)
    assert "Skipped: 2" in ha
    assert all("Skipped: 0" in s for s in summaries if s is not ha)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["spec"].update(replica=2), "additional properties 'replica' not allowed"),
        (
            lambda d: d["spec"]["template"]["spec"]["containers"][0]["ports"][0].update(containerPort="8080"),
            "got string, want integer",
        ),
        (
            lambda d: d["spec"]["template"]["spec"]["containers"][0]["securityContext"].update(readOnly=True),
            "additional properties 'readOnly' not allowed",
        ),
        (lambda d: d["spec"].pop("selector"), "missing property 'selector'"),
    ],
)
@pytest.mark.usefixtures("kubeconform", "spec")
def test_kubeconform_really_validates_built_in_kinds(
    helm: Path, tmp_path: Path, mutate: object, message: str
) -> None:
    """A broken Deployment fails: the schemas are real and strict, not skipped or permissive."""
    docs = [d for d in yaml.safe_load_all(chartlib.helm_template(helm=helm)) if d]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    mutate(deployment)  # type: ignore[operator]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump_all(docs))
    proc = _validate("--file", bad)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert message in proc.stdout


def test_kubeconform_validates_custom_resources_against_their_crd(
    kubeconform: Path, spec: Path, helm: Path, tmp_path: Path
) -> None:
    peering = {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": "p"}}
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(peering))
    assert _validate("--file", good).returncode == 0
    peering["spec"] = {"x": 1}  # the peering CRD defines no spec
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(peering))
    proc = _validate("--file", bad)
    assert proc.returncode == 1 and "additional properties 'spec' not allowed" in proc.stdout


def test_unknown_kind_is_an_error_not_a_skip(
    kubeconform: Path, spec: Path, helm: Path, tmp_path: Path
) -> None:
    f = tmp_path / "x.yaml"
    f.write_text("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n")
    proc = _validate("--file", f)
    assert proc.returncode == 1
    assert "no schema for: example.com/v1/Widget" in proc.stderr


def test_kind_suffix_matches_kubeconform() -> None:
    assert chartlib.schema_file_name("apps/v1", "Deployment") == "deployment-apps-v1.json"
    assert chartlib.schema_file_name("v1", "Service") == "service-v1.json"
    assert chartlib.schema_file_name("rbac.authorization.k8s.io/v1", "Role") == "role-rbac-v1.json"
    assert (
        chartlib.schema_file_name("triton-operator.io/v1alpha1", "TritonService")
        == "tritonservice-triton-operator-v1alpha1.json"
    )


def test_tritonservice_examples_validate_with_full_metadata(
    kubeconform: Path, spec: Path, helm: Path, tmp_path: Path
) -> None:
    """A CRD's schema may constrain metadata.name, but metadata is an ObjectMeta: namespace,
    labels, annotations and generation of examples/ and live objects are accepted, while the
    spec stays strict."""
    examples = [
        d
        for path in sorted((chartlib.REPO_ROOT / "examples").glob("*.yaml"))
        for d in yaml.safe_load_all(path.read_text())
        if d and d["kind"] == "TritonService"
    ]
    assert examples
    good = tmp_path / "examples.yaml"
    good.write_text(yaml.safe_dump_all(examples))
    proc = _validate("--file", good)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"Valid: {len(examples)}, Invalid: 0" in proc.stdout
    doc = examples[0]
    doc["metadata"].update(labels={"team": "ml"}, annotations={"a": "b"}, generation=3)
    doc["spec"]["replicaz"] = 2
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    proc = _validate("--file", bad)
    assert proc.returncode == 1
    assert "additional properties 'replicaz' not allowed" in proc.stdout
    assert "/metadata" not in proc.stdout, proc.stdout
