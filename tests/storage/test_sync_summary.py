"""`triton-operator sync`'s success summary: written to its termination log on exit 0, read back by the
core (core.pod.startup.parse_summary) into the bytes a pod's start fetched from the store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from storage_backends import Backend
from triton_operator.adapters.storage import pin_repository
from triton_operator.core.observed.observation import pod_state
from triton_operator.core.pod.startup import SyncSummary, parse_summary
from triton_operator.core.repository.manifest import Manifest, manifest_to_json
from triton_operator.models import ModelSpec

pytestmark = pytest.mark.storage

MODELS = [ModelSpec(name="adder", config={"backend": "python", "maxBatchSize": 4})]
FILES = {f"models/adder/1/weights{i}.bin": os.urandom(20_000 + i) for i in range(5)}
TOTAL = sum(len(d) for d in FILES.values())


def run_sync(
    work: Path, manifest: Manifest, env: dict[str, str], *extra: str
) -> subprocess.CompletedProcess[str]:
    """`triton-operator sync` of ``manifest`` into work/models, as the init container runs it."""
    path = work / "manifest.json"
    path.write_text(manifest_to_json(manifest))
    args = [sys.executable, "-m", "triton_operator.cli", "sync", "--manifest", str(path)]
    args += ["--dest", str(work / "models"), *extra]
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "GOOGLE_"))}
    return subprocess.run(
        args, env={**clean, **env}, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture
def manifest(s3_backend: Backend) -> Manifest:
    bucket = s3_backend.new_bucket()
    for key, data in FILES.items():
        s3_backend.put(bucket, key, data)
    return pin_repository(s3_backend.repository(bucket), MODELS, s3_backend.credentials)


def summary(log: Path) -> SyncSummary:
    text = log.read_text()
    assert text.endswith("\n") and text.count("\n") == 1, text  # one line
    parsed = parse_summary(text)
    assert parsed is not None, text
    return parsed


def test_the_summary_says_what_was_fetched_then_what_was_already_present(
    s3_backend: Backend, manifest: Manifest, tmp_path: Path
) -> None:
    log = tmp_path / "termination-log"
    log.write_text("")  # kubelet makes the file; sync only writes into one that exists
    first = run_sync(tmp_path, manifest, s3_backend.credentials, "--termination-log", str(log))
    assert first.returncode == 0, first.stderr
    cold = summary(log)
    assert (cold.objects, cold.fetched, cold.present) == (len(FILES), TOTAL, 0)
    assert cold.seconds > 0

    # The same pod's sync again (a restarted init container): every byte is already there.
    (tmp_path / "models" / "adder" / "1" / "weights0.bin").unlink()
    again = run_sync(tmp_path, manifest, s3_backend.credentials, "--termination-log", str(log))
    assert again.returncode == 0, again.stderr
    warm = summary(log)
    one = len(FILES["models/adder/1/weights0.bin"])
    assert (warm.objects, warm.fetched, warm.present) == (len(FILES), one, TOTAL - one)


def test_the_summary_reaches_the_pods_start_as_kubernetes_keeps_it(
    s3_backend: Backend, manifest: Manifest, tmp_path: Path
) -> None:
    log = tmp_path / "termination-log"
    log.write_text("")
    assert run_sync(tmp_path, manifest, s3_backend.credentials, "--termination-log", str(log)).returncode == 0
    # kubelet puts the file's content, as written, into the init container's state.terminated.message
    terminated = {"exitCode": 0, "reason": "Completed", "message": log.read_text()}
    terminated |= {"startedAt": "2026-11-27T10:00:03Z", "finishedAt": "2026-11-27T10:00:05Z"}
    pod = pod_state(
        {"status": {"initContainerStatuses": [{"name": "sync", "state": {"terminated": terminated}}]}}
    )
    assert pod.start.sync is not None and pod.start.sync.fetched == TOTAL
    assert pod.sync_failure is None  # a success is no failure (Degraded reads only exits other than 0)


def test_without_the_file_nothing_is_written(s3_backend: Backend, manifest: Manifest, tmp_path: Path) -> None:
    log = tmp_path / "no-such-termination-log"
    result = run_sync(tmp_path, manifest, s3_backend.credentials, "--termination-log", str(log))
    assert result.returncode == 0, result.stderr
    assert not log.exists()
