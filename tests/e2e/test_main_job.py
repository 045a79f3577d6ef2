"""The README's main command (`make run` = e2e/run.py) converges an example on a real cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from real_pods import real_node

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.cluster


def test_main_job_reaches_ready_and_pins_the_uploaded_model(cluster: Path, namespace: str) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "e2e" / "run.py"),
            "--exit-when-ready",
            "--namespace",
            namespace,
            "--timeout",
            "120",
        ],
        env={**os.environ, "KUBECONFIG": str(cluster)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    # It printed the status as it converged, ending Ready at the observed generation.
    ready_lines = [line for line in out.splitlines() if "Ready=True" in line and "observed=1" in line]
    assert ready_lines, out[-4000:]
    # It shows what the revision serves: the config rendered from the spec and the pinned object.
    assert 'name: "add_sub"' in out and "max_batch_size: 8" in out, out[-4000:]
    pinned = [json.loads(line.strip()) for line in out.splitlines() if line.strip().startswith('{"checksum"')]
    assert [p["key"] for p in pinned] == ["tiny/add_sub/1/model.py"], out[-4000:]
    model = ROOT / "tests" / "data" / "triton_models" / "adder" / "1" / "model.py"
    assert pinned[0]["size"] == model.stat().st_size
    # On the real node it ends with an inference answered through the TritonService's Service.
    node, why = real_node()
    if node is None:
        assert f"no real node ({why})" in out or "no real node" in out, out[-4000:]
        return
    assert f"real node {node['name']}" in out, out[-4000:]
    assert "OUTPUT0 = [11.0, 22.0, 33.0, 44.0]" in out, out[-4000:]
    assert "OUTPUT1 = [-9.0, -18.0, -27.0, -36.0]" in out, out[-4000:]


def test_main_job_leaves_its_objects_behind_for_kubectl(cluster: Path, namespace: str, kube: Any) -> None:
    """After --exit-when-ready the cluster keeps the TritonService it applied (only processes stop)."""
    from lightkube.generic_resource import create_namespaced_resource  # noqa: PLC0415

    proc = subprocess.run(
        [sys.executable, str(ROOT / "e2e" / "run.py"), "--exit-when-ready", "--namespace", namespace],
        env={**os.environ, "KUBECONFIG": str(cluster)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    tsvc = create_namespaced_resource("triton-operator.io", "v1alpha1", "TritonService", "tritonservices")
    obj = kube.get(tsvc, "tiny", namespace=namespace)
    conditions = {c["type"]: c["status"] for c in obj.status["conditions"]}
    assert conditions["Ready"] == "True"
    assert obj.status["stableRevision"]
