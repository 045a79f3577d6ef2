"""`triton-operator sync` as the init container runs it: exit status, messages and log lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from storage_backends import Backend
from triton_operator.adapters.storage import pin_repository
from triton_operator.core.repository import manifestparts
from triton_operator.core.repository.manifest import Manifest, manifest_to_dict, manifest_to_json
from triton_operator.core.spec.modelconfig import build_config_pbtxt
from triton_operator.models import ModelSpec

pytestmark = pytest.mark.storage

MODELS = [ModelSpec(name="adder", config={"backend": "python", "maxBatchSize": 4})]
FILES = {f"models/adder/1/part{i}.bin": os.urandom(1000 + i) for i in range(30)}


def run_sync(
    tmp_path: Path, manifest: Manifest | dict[str, object], env: dict[str, str], *extra: str
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "manifest.json"
    text = manifest_to_json(manifest) if isinstance(manifest, Manifest) else json.dumps(manifest)
    path.write_text(text)
    configs = tmp_path / "configs"
    for m in MODELS:
        (configs / m.name).mkdir(parents=True, exist_ok=True)
        (configs / m.name / "config.pbtxt").write_text(build_config_pbtxt(m.name, m.config))
    args = [sys.executable, "-m", "triton_operator.cli", "sync", "--manifest", str(path)]
    args += ["--configs", str(configs), "--dest", str(tmp_path / "models"), "--concurrency", "4", *extra]
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "GOOGLE_"))}
    return subprocess.run(
        args, env={**clean, **env}, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture
def pinned(s3_backend: Backend) -> tuple[str, Manifest]:
    bucket = s3_backend.new_bucket()
    for key, data in FILES.items():
        s3_backend.put(bucket, key, data)
    return bucket, pin_repository(s3_backend.repository(bucket), MODELS, s3_backend.credentials)


def test_sync_exits_0_and_logs_json_lines(
    s3_backend: Backend, pinned: tuple[str, Manifest], tmp_path: Path
) -> None:
    _, manifest = pinned
    result = run_sync(tmp_path, manifest, s3_backend.credentials)
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert events[-1]["event"] == "summary"
    assert events[-1]["downloaded_files"] == 30 and events[-1]["configs_written"] == 1
    assert any(e["event"] == "progress" for e in events[:-1])
    for key, data in FILES.items():
        assert (tmp_path / "models" / key.removeprefix("models/")).read_bytes() == data
    assert (tmp_path / "models/adder/config.pbtxt").read_text() == build_config_pbtxt(
        "adder", MODELS[0].config
    )

    again = run_sync(tmp_path, manifest, s3_backend.credentials, "--progress", "bar")
    assert again.returncode == 0, again.stderr
    assert again.stdout == "" and "[####" in again.stderr and "30/30 files" in again.stderr
    assert "0 downloaded, 30 present" in again.stderr


def test_an_object_changed_since_pinning_exits_3_naming_it(
    s3_backend: Backend, pinned: tuple[str, Manifest], tmp_path: Path
) -> None:
    bucket, manifest = pinned
    key = "models/adder/1/part7.bin"
    s3_backend.put(bucket, key, b"replaced")
    result = run_sync(tmp_path, manifest, s3_backend.credentials)
    assert result.returncode == 3, result.stderr
    entry = next(e for e in manifest.entries if e.key == key)
    assert f"object '{key}' changed since it was pinned" in result.stderr
    assert f"pinned etag {entry.etag}" in result.stderr and "now etag " in result.stderr
    assert json.loads(result.stdout.splitlines()[-1])["event"] == "error"


@pytest.mark.parametrize(
    ("env", "botocore"),
    [({}, False), ({"AWS_MAX_ATTEMPTS": "3"}, True)],
    ids=["own-http-reads", "boto3-honours-the-environment"],
)
def test_sync_reads_s3_without_botocore_unless_the_environment_asks_for_it(
    s3_backend: Backend, pinned: tuple[str, Manifest], tmp_path: Path, env: dict[str, str], botocore: bool
) -> None:
    """Static keys and an endpoint: the pod's sync signs its own GETs (storage.s3_http) and never
    imports botocore; an AWS_* setting that boto3 would honour sends it through boto3."""
    _, manifest = pinned
    result = run_sync(tmp_path, manifest, {**s3_backend.credentials, "PYTHONPROFILEIMPORTTIME": "1", **env})
    assert result.returncode == 0, result.stderr[-3000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert "triton_operator.adapters.storage.s3_http" in imported
    assert ("botocore" in imported) is botocore
    for key, data in FILES.items():
        assert (tmp_path / "models" / key.removeprefix("models/")).read_bytes() == data


def test_wrong_credentials_exit_5(s3_backend: Backend, pinned: tuple[str, Manifest], tmp_path: Path) -> None:
    _, manifest = pinned
    creds = {**s3_backend.credentials, "AWS_SECRET_ACCESS_KEY": "nope"}
    result = run_sync(tmp_path, manifest, creds)
    assert result.returncode == 5, result.stderr
    assert "access denied" in result.stderr and "SignatureDoesNotMatch" in result.stderr


def test_a_manifest_escaping_dest_exits_2_naming_the_field(
    s3_backend: Backend, pinned: tuple[str, Manifest], tmp_path: Path
) -> None:
    _, manifest = pinned
    doc = manifest_to_dict(manifest)
    doc["entries"][3]["dest"] = "adder/../../../etc/cron.d/x"
    result = run_sync(tmp_path, doc, s3_backend.credentials)
    assert result.returncode == 2, result.stderr
    assert "manifest.entries[3].dest: it has a '..' path segment" in result.stderr
    assert not (tmp_path / "models").exists()


def test_a_manifest_in_parts_syncs_as_the_plain_one(
    s3_backend: Backend, pinned: tuple[str, Manifest], tmp_path: Path
) -> None:
    """The pod of a large repository gets its manifest as gzipped parts in a folder (one file per
    ConfigMap key, as the kubelet projects them): sync reads them in order and syncs the same objects."""
    _, manifest = pinned
    blob = manifestparts.compress(manifest_to_json(manifest))
    folder = tmp_path / "config" / "manifest"
    folder.mkdir(parents=True)
    for index, part in enumerate(manifestparts.split(blob, 100, 300)):
        (folder / manifestparts.part_key(index)).write_bytes(part)
    # the later --manifest wins over run_sync's plain file
    result = run_sync(tmp_path, manifest, s3_backend.credentials, "--manifest", str(folder))
    assert result.returncode == 0, result.stderr
    assert len(list(folder.iterdir())) > 2
    for key, data in FILES.items():
        assert (tmp_path / "models" / key.removeprefix("models/")).read_bytes() == data
