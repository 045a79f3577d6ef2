"""manifests/ and the chart's CRD copy are generated, and stay in sync with the chart and crds/."""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from packaging_helpers import chartlib


@pytest.fixture(scope="module")
def crd_source() -> Path:
    if not chartlib.CRD_SOURCE.exists():
        pytest.skip("crds/tritonservices.yaml does not exist yet (make crd)")
    return Path(chartlib.CRD_SOURCE)


def test_chart_crd_is_an_exact_copy_of_crds_dir(crd_source: Path) -> None:
    assert chartlib.CRD_COPY.exists(), "charts/triton-operator/crds/tritonservices.yaml missing"
    assert filecmp.cmp(crd_source, chartlib.CRD_COPY, shallow=False), (
        "the chart's CRD differs from crds/tritonservices.yaml: run charts/generate-manifests"
    )


def test_manifests_do_not_drift(helm: Path, crd_source: Path, tmp_path: Path) -> None:
    """Re-run the generator into a temp dir: the committed manifests/ must be identical."""
    out = tmp_path / "manifests"
    proc = subprocess.run(
        [sys.executable, str(chartlib.CHARTS_DIR / "generate-manifests"), "--output", str(out)],
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, "HELM": str(helm)},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    generated = {p.name: p.read_text() for p in out.glob("*.yaml")}
    committed = {p.name: p.read_text() for p in chartlib.MANIFESTS_DIR.glob("*.yaml")}
    assert sorted(generated) == sorted(committed) == ["00-namespace.yaml", "01-crds.yaml", "02-operator.yaml"]
    stale = [name for name in generated if generated[name] != committed[name]]
    assert not stale, f"manifests/ is stale ({stale}): run charts/generate-manifests"


def test_drift_detection_notices_a_change(helm: Path, crd_source: Path, tmp_path: Path) -> None:
    files = chartlib.render_manifests(helm=helm)
    chartlib.write_manifests(tmp_path, files)
    assert chartlib.drift(files, tmp_path) == []
    (tmp_path / "02-operator.yaml").write_text(
        files["02-operator.yaml"].replace("replicas: 1", "replicas: 2")
    )
    [diff] = chartlib.drift(files, tmp_path)
    assert "-  replicas: 2" in diff and "+  replicas: 1" in diff


def test_manifests_content(crd_source: Path) -> None:
    docs = {
        p.name: [d for d in yaml.safe_load_all(p.read_text()) if d]
        for p in sorted(chartlib.MANIFESTS_DIR.glob("*.yaml"))
    }
    assert [(d["kind"], d["metadata"]["name"]) for d in docs["00-namespace.yaml"]] == [
        ("Namespace", "triton-operator")
    ]
    crds = {d["metadata"]["name"] for d in docs["01-crds.yaml"]}
    assert "tritonservices.triton-operator.io" in crds
    source = yaml.safe_load(crd_source.read_text())
    assert (
        next(d for d in docs["01-crds.yaml"] if d["metadata"]["name"] == source["metadata"]["name"]) == source
    )
    operator = docs["02-operator.yaml"]
    kinds = sorted(d["kind"] for d in operator)
    assert kinds == sorted(["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service", "Deployment"])
    for d in operator:
        if d["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert d["metadata"]["namespace"] == "triton-operator"
        assert "helm.sh/hook" not in d["metadata"].get("annotations", {})
    for text in (p.read_text() for p in chartlib.MANIFESTS_DIR.glob("*.yaml")):
        assert text.startswith(chartlib.GENERATED_HEADER)
