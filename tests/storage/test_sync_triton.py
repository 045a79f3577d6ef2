"""A real tritonserver loads and serves the model repository that `triton-operator sync` wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import requests

from storage_backends import Backend
from testkit import run_init_sync
from triton_operator.adapters.storage import pin_repository
from triton_operator.core.repository.manifest import manifest_to_json
from triton_operator.core.spec.modelconfig import build_config_pbtxt
from triton_operator.models import ModelSpec
from tritonserver import (
    TritonInstall,
    start_server,
)

pytestmark = [pytest.mark.storage, pytest.mark.triton]

MODEL_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

OP = "{op}"


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B").as_numpy()
            out = a + b if OP == "add" else a * b
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out.astype(np.float32))]))
        return responses
"""

CONFIG = {
    "backend": "python",
    "maxBatchSize": 0,
    "versionPolicy": {"latest": {"numVersions": 1}},
    "input": [
        {"name": "A", "dataType": "TYPE_FP32", "dims": ["2"]},
        {"name": "B", "dataType": "TYPE_FP32", "dims": ["2"]},
    ],
    "output": [{"name": "OUT", "dataType": "TYPE_FP32", "dims": ["2"]}],
    "instanceGroup": [{"kind": "KIND_CPU", "count": 1}],
}


def out_of(server: Any, model: str) -> list[float]:
    """OUT of ``model`` for A = [2, 3], B = [4, 5] (HTTP/REST inference)."""
    body = {
        "inputs": [
            {"name": "A", "shape": [2], "datatype": "FP32", "data": [2.0, 3.0]},
            {"name": "B", "shape": [2], "datatype": "FP32", "data": [4.0, 5.0]},
        ]
    }
    reply = requests.post(f"{server.http_url}/v2/models/{model}/infer", data=json.dumps(body), timeout=30)
    assert reply.status_code == 200, f"{reply.text}\n{server.log_tail()}"
    data: list[float] = reply.json()["outputs"][0]["data"]
    return data


def run_sync(backend: Backend, manifest: Any, configs: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    """`triton-operator sync` as the init container runs it: manifest, rendered configs, /models."""
    (tmp_path / "manifest.json").write_text(manifest_to_json(manifest))
    for name, config in configs.items():
        (tmp_path / "configs" / name).mkdir(parents=True)
        (tmp_path / "configs" / name / "config.pbtxt").write_text(build_config_pbtxt(name, config))
    result = run_init_sync(tmp_path, backend.credentials)
    assert result.returncode == 0, result.stderr


def test_tritonserver_serves_what_sync_fetched(
    s3_backend: Backend, triton_install: TritonInstall, tmp_path: Path
) -> None:
    bucket = s3_backend.new_bucket()
    s3_backend.put(bucket, "repo/calc/1/model.py", MODEL_PY.format(op="add").encode())
    s3_backend.put(bucket, "repo/calc/2/model.py", MODEL_PY.format(op="mul").encode())
    s3_backend.put(bucket, "repo/calc/config.pbtxt", b'name: "calc" backend: "broken on purpose"')
    spec = ModelSpec(name="calc", config=CONFIG)
    manifest = pin_repository(s3_backend.repository(bucket, "repo"), [spec], s3_backend.credentials)
    assert manifest.models[0].versions == ("2",)

    run_sync(s3_backend, manifest, {"calc": CONFIG}, tmp_path)
    assert sorted(
        p.relative_to(tmp_path / "models").as_posix() for p in (tmp_path / "models").rglob("*.p*")
    ) == [
        "calc/2/model.py",
        "calc/config.pbtxt",
    ]

    server = start_server(triton_install, tmp_path / "models", ["calc"], tmp_path / "tritonserver.log")
    try:
        meta = requests.get(f"{server.http_url}/v2/models/calc", timeout=10).json()
        assert meta["versions"] == ["2"], meta
        assert out_of(server, "calc") == [8.0, 15.0]  # version 2 multiplies
    finally:
        server.stop()


ENSEMBLE = {
    "platform": "ensemble",
    "maxBatchSize": 0,
    "input": [
        {"name": "A", "dataType": "TYPE_FP32", "dims": ["2"]},
        {"name": "B", "dataType": "TYPE_FP32", "dims": ["2"]},
    ],
    "output": [{"name": "OUT", "dataType": "TYPE_FP32", "dims": ["2"]}],
    "ensembleScheduling": {
        "step": [
            {
                "modelName": "calc",
                "modelVersion": "-1",
                "inputMap": {"A": "A", "B": "B"},
                "outputMap": {"OUT": "OUT"},
            }
        ]
    },
}


def test_an_ensemble_from_an_object_store_and_versions_as_triton_reads_them(
    s3_backend: Backend, triton_install: TritonInstall, tmp_path: Path
) -> None:
    """An ensemble has an empty version folder, which no object store keeps: pinning names the
    version and sync creates it. "010" is no version for Triton (leading zero), so "latest" is 1."""
    bucket = s3_backend.new_bucket()
    s3_backend.put(bucket, "repo/calc/1/model.py", MODEL_PY.format(op="add").encode())
    s3_backend.put(bucket, "repo/calc/010/model.py", MODEL_PY.format(op="mul").encode())
    s3_backend.put(bucket, "repo/pipe/README", b"an ensemble over calc")  # no version folder object
    specs = [ModelSpec(name="calc", config=CONFIG), ModelSpec(name="pipe", config=ENSEMBLE)]
    manifest = pin_repository(s3_backend.repository(bucket, "repo"), specs, s3_backend.credentials)
    assert {m.name: m.versions for m in manifest.models} == {"calc": ("1",), "pipe": ("1",)}

    run_sync(s3_backend, manifest, {"calc": CONFIG, "pipe": ENSEMBLE}, tmp_path)
    assert (tmp_path / "models/pipe/1").is_dir() and not any((tmp_path / "models/pipe/1").iterdir())

    server = start_server(
        triton_install, tmp_path / "models", ["calc", "pipe"], tmp_path / "tritonserver.log"
    )
    try:
        assert out_of(server, "pipe") == [6.0, 8.0]  # version 1 adds
    finally:
        server.stop()
