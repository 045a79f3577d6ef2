"""What `kubectl triton tune` relies on, shown with the real perf_analyzer 2.51.0 against a real
tritonserver: it is the tritonserver's release, the perf Job's own script (core.tuning.perf_script)
runs as written, and its output parses into one row per concurrency (core.tuning.parse_perf_csv),
for the model's own config and for a candidate rendered from the sweep.

perf_analyzer comes from e2e/perf_analyzer.py (run by e2e/bootstrap); without it the tests skip."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

import perf_analyzer  # e2e/perf_analyzer.py
from real_pods import ADD_SUB_CONFIG, behaving_source
from triton_operator.core import tuning
from triton_operator.core.spec.modelconfig import build_config_pbtxt
from tritonserver import RunningServer, TritonInstall, start_server

pytestmark = [pytest.mark.triton, pytest.mark.timeout(300)]

OWN = "own"
BATCHED = "batched"


@pytest.fixture(scope="module")
def binary() -> Path:
    path = perf_analyzer.installed()
    if path is None:
        pytest.skip("perf_analyzer is not installed (python e2e/perf_analyzer.py install)")
    return path


@pytest.fixture(scope="module")
def server(
    triton_install: TritonInstall, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    """The adder with 20 ms per execute(), twice: its own config, and a candidate with dynamic batching."""
    root = tmp_path_factory.mktemp("tune") / "models"
    configs = {
        OWN: ADD_SUB_CONFIG,
        BATCHED: tuning.with_settings(ADD_SUB_CONFIG, {"maxQueueDelayMicroseconds": 0}),
    }
    for name, config in configs.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_bytes(behaving_source(delay=0.02))
        (root / name / "config.pbtxt").write_text(build_config_pbtxt(name, config))
    running = start_server(triton_install, root, list(configs), root.parent / "tritonserver.log")
    yield running
    running.stop()


def test_perf_analyzer_is_the_tritonservers_release(binary: Path, server: RunningServer) -> None:
    proc = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=True)
    out = proc.stdout + proc.stderr  # it prints to stderr
    version = requests.get(f"{server.http_url}/v2", timeout=10).json()["version"]
    assert f"Perf Analyzer Version {version} " in out, (out, version)
    assert version == perf_analyzer.VERSION


@pytest.mark.parametrize("model", [OWN, BATCHED])
def test_the_jobs_script_runs_and_its_output_parses_into_one_row_per_concurrency(
    binary: Path, server: RunningServer, model: str
) -> None:
    sweep = tuning.Sweep(
        model=model, concurrencies=(1, 4), measurement_ms=500, max_trials=6, stability_percentage=50
    )
    script = tuning.perf_script(model, server.grpc_url, sweep)
    env = {**os.environ, "PATH": f"{binary.parent}:{os.environ['PATH']}"}
    proc = subprocess.run(
        ["sh", "-c", script], capture_output=True, text=True, env=env, timeout=240, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = tuning.parse_perf_csv(tuning.job_output_csv(proc.stdout + proc.stderr))
    print(
        f"\n{model}: " + ", ".join(f"c={r.concurrency} {r.throughput:.1f}/s p95 {r.p95_us} us" for r in rows)
    )
    assert [r.concurrency for r in rows] == [1, 4]
    assert all(r.throughput > 0 and 0 < r.p50_us <= r.p95_us <= r.p99_us for r in rows)


def test_a_failing_perf_analyzer_stops_the_script_and_says_where(binary: Path, server: RunningServer) -> None:
    sweep = tuning.Sweep(model="missing", concurrencies=(1,), measurement_ms=200)
    env = {**os.environ, "PATH": f"{binary.parent}:{os.environ['PATH']}"}
    script = tuning.perf_script("missing", server.grpc_url, sweep)
    proc = subprocess.run(
        ["sh", "-c", script], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert proc.returncode == 1
    assert "perf_analyzer failed at concurrency 1" in proc.stderr
    with pytest.raises(ValueError, match="no measurement"):
        tuning.parse_perf_csv(tuning.job_output_csv(proc.stdout))
