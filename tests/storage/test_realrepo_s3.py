"""tests/support/realrepo.py streamed to a real S3 server: the objects are the description's, the operator
pins the repository with the generated spec.models, `triton-operator sync` fetches it, and a real
tritonserver serves every model with the answers its weights give."""

from __future__ import annotations

import hashlib
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from boto3.s3.transfer import TransferConfig

from realrepo import ENSEMBLE, KiB, MiB, RepoShape, upload_repository
from storage_backends import S3Backend
from testkit import run_init_sync
from triton_operator.adapters.storage import pin_repository
from triton_operator.core.repository.manifest import manifest_to_json
from triton_operator.core.spec.modelconfig import build_config_pbtxt
from triton_operator.models import ModelSpec
from tritonserver import TritonInstall, start_server

pytestmark = [pytest.mark.storage, pytest.mark.triton]

SHAPE = RepoShape(
    big_bytes=3 * MiB + 1, medium_bytes=MiB, small_count=2, small_bytes=16 * KiB, shard_bytes=MiB, seed=5
)
PART = 5 * MiB  # S3's smallest multipart part


def objects(client: Any, bucket: str, prefix: str) -> Iterator[dict[str, Any]]:
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        yield from page.get("Contents", [])


def test_the_uploaded_objects_are_the_described_files(s3_backend: S3Backend) -> None:
    bucket = s3_backend.new_bucket()
    # An 11 MiB shard goes up in three parts of at most 5 MiB, read from the generator as they go.
    shape = RepoShape(
        big_bytes=11 * MiB, medium_bytes=0, small_count=2, small_bytes=KiB, shard_bytes=16 * MiB, seed=5
    )
    config = TransferConfig(multipart_threshold=PART, multipart_chunksize=PART)
    repository = upload_repository(s3_backend.client, bucket, "real/", shape, transfer_config=config)
    listed = {o["Key"]: o["Size"] for o in objects(s3_backend.client, bucket, "real/")}
    assert listed == {f"real/{f.path}": f.size for f in repository.files}
    for file in repository.files:
        body = s3_backend.client.get_object(Bucket=bucket, Key=f"real/{file.path}")["Body"].read()
        assert hashlib.sha256(body).hexdigest() == file.sha256, file.path
    head = s3_backend.client.head_object(Bucket=bucket, Key="real/llm/1/weights-00001-of-00001.bin")
    assert head["ETag"].strip('"').endswith("-3"), head["ETag"]


def upload_peak(s3_backend: S3Backend, size: int) -> int:
    """tracemalloc's peak while uploading one model of ``size`` bytes in one shard, in parts of 5 MiB."""
    bucket = s3_backend.new_bucket()
    shape = RepoShape(big_bytes=size, medium_bytes=0, small_count=0, shard_bytes=size, ensemble=False)
    config = TransferConfig(multipart_threshold=PART, multipart_chunksize=PART, max_concurrency=2)
    config.max_in_memory_upload_chunks = 2
    tracemalloc.start()
    try:
        upload_repository(s3_backend.client, bucket, "real", shape, transfer_config=config)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    head = s3_backend.client.head_object(Bucket=bucket, Key="real/llm/1/weights-00001-of-00001.bin")
    assert head["ContentLength"] == size
    return peak


def test_the_upload_streams_in_parts(s3_backend: S3Backend) -> None:
    """Uploading a 128 MiB shard holds the parts in flight (boto3 reads some ahead), not the shard, and
    no more than a 16 MiB shard does (a memory check, not a timing one)."""
    small = upload_peak(s3_backend, 16 * MiB)
    large = upload_peak(s3_backend, 128 * MiB)
    assert large < 128 * MiB // 3, f"peak {large} bytes for a 128 MiB shard"
    assert large - small < PART, f"peak {small} bytes at 16 MiB, {large} at 128 MiB"


def test_a_tritonservice_spec_of_the_generated_repository_serves_from_s3(
    s3_backend: S3Backend, triton_install: TritonInstall, tmp_path: Path
) -> None:
    bucket = s3_backend.new_bucket()
    repository = upload_repository(s3_backend.client, bucket, "real", SHAPE)
    specs = [ModelSpec.model_validate(m) for m in repository.spec_models]
    manifest = pin_repository(s3_backend.repository(bucket, "real"), specs, s3_backend.credentials)
    pinned = {e.dest: e.size for e in manifest.entries}
    # Every weight file and model.py is pinned; the stored config.pbtxt files are the operator's to render.
    assert pinned == {f.path: f.size for f in repository.files if not f.path.endswith("/config.pbtxt")}

    (tmp_path / "manifest.json").write_text(manifest_to_json(manifest))
    for spec in specs:
        (tmp_path / "configs" / spec.name).mkdir(parents=True)
        (tmp_path / "configs" / spec.name / "config.pbtxt").write_text(
            build_config_pbtxt(spec.name, spec.config)
        )
    result = run_init_sync(tmp_path, s3_backend.credentials, timeout=300)
    assert result.returncode == 0, result.stderr

    names = [s.name for s in specs]
    server = start_server(triton_install, tmp_path / "models", names, tmp_path / "tritonserver.log")
    try:
        for name in names:
            body: dict[str, Any] = {
                "inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1.0, 2.0]}]
            }
            reply = requests.post(f"{server.http_url}/v2/models/{name}/infer", json=body, timeout=60)
            assert reply.status_code == 200, f"{name}: {reply.text}\n{server.log_tail()}"
            added = repository.added(name)
            assert reply.json()["outputs"][0]["data"] == [1.0 + added, 2.0 + added], name
    finally:
        server.stop()
    assert ENSEMBLE in names
