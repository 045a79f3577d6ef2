"""A real tritonserver loads, serves and rejects the model configs the operator renders."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from google.protobuf import json_format
from google.protobuf.message import Message
from tritonclient.grpc import model_config_pb2

import triton_http
from testkit import free_port
from triton_operator.core.spec.modelconfig import parse_model_config
from triton_operator.models import TritonServiceSpec
from triton_specs import BROKEN_SPEC, OFFSET, SCALE_FACTOR, build_repository, validated_spec
from tritonserver import (
    RunningServer,
    TritonInstall,
    TritonStartError,
    missing_libraries,
    prepare_server,
    start_server,
)

pytestmark = [pytest.mark.triton, pytest.mark.timeout(600)]

TIMEOUT = 120  # seconds a request may take before the test gives up (not an assertion on speed)


@pytest.fixture(scope="session")
def http(triton_server: RunningServer) -> Iterator[requests.Session]:
    """One HTTP session, closed before the server stops (an open connection delays its exit)."""
    with requests.Session() as session:
        yield session


def url(server: RunningServer, path: str) -> str:
    return server.http_url + path


def infer(
    http: requests.Session,
    server: RunningServer,
    model: str,
    inputs: dict[str, np.ndarray[Any, Any]],
    parameters: dict[str, Any] | None = None,
) -> dict[str, np.ndarray[Any, Any]]:
    """POST /v2/models/<model>/infer with JSON tensors; the outputs as arrays of their datatype."""
    datatypes = {np.dtype(np.float32): "FP32", np.dtype(np.int32): "INT32"}
    body: dict[str, Any] = {
        "inputs": [
            {
                "name": name,
                "shape": list(a.shape),
                "datatype": datatypes[a.dtype],
                "data": a.flatten().tolist(),
            }
            for name, a in inputs.items()
        ]
    }
    if parameters:
        body["parameters"] = parameters
    response = http.post(url(server, f"/v2/models/{model}/infer"), json=body, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    numpy_types = {"FP32": np.float32, "INT32": np.int32}
    return {
        out["name"]: np.array(out["data"], dtype=numpy_types[out["datatype"]]).reshape(out["shape"])
        for out in response.json()["outputs"]
    }


def statistics(http: requests.Session, server: RunningServer, model: str) -> dict[str, Any]:
    response = http.get(url(server, f"/v2/models/{model}/stats"), timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    stats: dict[str, Any] = response.json()["model_stats"][0]
    return stats


def batched(stats: dict[str, Any]) -> int:
    """How many inferences a model's per-batch-size statistics account for."""
    return sum(int(b["batch_size"]) * int(b["compute_infer"]["count"]) for b in stats["batch_stats"])


def _is_repeated(field: Any) -> bool:
    is_repeated = getattr(field, "is_repeated", None)  # protobuf >= 5.29; label is deprecated there
    return bool(is_repeated) if is_repeated is not None else bool(field.label == field.LABEL_REPEATED)


def assert_subset(ours: Message, theirs: Message, where: str) -> None:
    """Every field set in ``ours`` has the same value in ``theirs`` (Triton fills in defaults besides)."""
    for field, value in ours.ListFields():
        other = getattr(theirs, field.name)
        path = f"{where}.{field.name}"
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            for key in value:
                assert key in other, f"{path}: key {key!r} missing"
                if field.message_type.fields_by_name["value"].message_type is not None:
                    assert_subset(value[key], other[key], f"{path}[{key!r}]")
                else:
                    assert value[key] == other[key], path
        elif _is_repeated(field) and field.message_type is not None:
            assert len(value) == len(other), f"{path}: {len(value)} != {len(other)}"
            for i, (mine, served) in enumerate(zip(value, other, strict=True)):
                assert_subset(mine, served, f"{path}[{i}]")
        elif field.message_type is not None:
            assert_subset(value, other, path)
        elif _is_repeated(field):
            assert list(value) == list(other), path
        else:
            assert value == other, path


# ---------------------------------------------------------------- every model of the spec


def test_every_model_of_the_spec_is_ready(
    triton_server: RunningServer, http: requests.Session, service_spec: TritonServiceSpec
) -> None:
    index = http.post(url(triton_server, "/v2/repository/index"), json={}, timeout=TIMEOUT).json()
    states = {entry["name"]: (entry.get("version"), entry.get("state")) for entry in index}
    assert states == {m.name: ("1", "READY") for m in service_spec.models}
    assert http.get(url(triton_server, "/v2/health/ready"), timeout=TIMEOUT).status_code == 200
    for model in service_spec.models:
        ready = http.get(url(triton_server, f"/v2/models/{model.name}/ready"), timeout=TIMEOUT)
        assert ready.status_code == 200, f"{model.name}: {ready.text}"


def test_triton_serves_the_config_the_spec_asked_for(
    triton_server: RunningServer, http: requests.Session, service_spec: TritonServiceSpec
) -> None:
    for model in service_spec.models:
        served = http.get(url(triton_server, f"/v2/models/{model.name}/config"), timeout=TIMEOUT)
        assert served.status_code == 200, served.text
        theirs = json_format.ParseDict(
            served.json(), model_config_pb2.ModelConfig(), ignore_unknown_fields=True
        )
        assert_subset(parse_model_config(model.name, model.config), theirs, model.name)


def test_adder_adds_and_subtracts_a_batch(triton_server: RunningServer, http: requests.Session) -> None:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.array([[0.5, -1, 2, 10], [3, 3, 3, 3]], dtype=np.float32)
    out = infer(http, triton_server, "adder", {"INPUT0": a, "INPUT1": b})
    assert {name: (o.dtype, o.shape) for name, o in out.items()} == {
        "OUTPUT0": (np.float32, (2, 4)),
        "OUTPUT1": (np.float32, (2, 4)),
    }
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)


def test_concurrent_requests_all_answer_correctly(
    triton_server: RunningServer, http: requests.Session
) -> None:
    rng = np.random.default_rng(7)
    cases = [(rng.random((1, 4), dtype=np.float32), rng.random((1, 4), dtype=np.float32)) for _ in range(16)]

    def one(case: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        with requests.Session() as own:
            return infer(own, triton_server, "adder", {"INPUT0": case[0], "INPUT1": case[1]})

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, cases))
    for (a, b), out in zip(cases, results, strict=True):
        np.testing.assert_array_equal(out["OUTPUT0"], a + b)
        np.testing.assert_array_equal(out["OUTPUT1"], a - b)


def test_dynamic_batcher_runs_four_requests_as_one_batch(
    triton_server: RunningServer, http: requests.Session
) -> None:
    """adder_batch4 prefers batches of 4 and waits a minute for them: 4 concurrent requests run once."""
    before = statistics(http, triton_server, "adder_batch4")
    cases = [(np.full((1, 4), i, np.float32), np.arange(4, dtype=np.float32).reshape(1, 4)) for i in range(4)]

    def one(case: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        with requests.Session() as own:
            return infer(own, triton_server, "adder_batch4", {"INPUT0": case[0], "INPUT1": case[1]})

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, cases))
    for (a, b), out in zip(cases, results, strict=True):
        np.testing.assert_array_equal(out["OUTPUT0"], a + b)
        np.testing.assert_array_equal(out["OUTPUT1"], a - b)
    # Triton records a request's statistics just after its response goes out: wait until the
    # per-batch counts account for all 4 requests, then look at how they were batched.
    deadline = time.monotonic() + TIMEOUT
    while True:
        after = statistics(http, triton_server, "adder_batch4")
        done = after["inference_count"] - before["inference_count"] >= 4
        if (done and batched(after) - batched(before) >= 4) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert after["inference_count"] - before["inference_count"] == 4
    assert after["execution_count"] - before["execution_count"] == 1
    assert batched(after) - batched(before) == 4
    batches = {b["batch_size"]: int(b["compute_infer"]["count"]) for b in after["batch_stats"]}
    assert batches == {4: 1}


def test_sequences_keep_separate_running_sums(triton_server: RunningServer, http: requests.Session) -> None:
    def step(sequence: int, value: int, *, start: bool = False, end: bool = False) -> int:
        out = infer(
            http,
            triton_server,
            "accumulator",
            {"INPUT": np.array([[value]], dtype=np.int32)},
            {"sequence_id": sequence, "sequence_start": start, "sequence_end": end},
        )
        return int(out["OUTPUT"][0, 0])

    assert step(101, 1, start=True) == 1
    assert step(202, 10, start=True) == 10
    assert step(101, 2) == 3
    assert step(202, 20) == 30
    assert step(101, 3, end=True) == 6
    assert step(202, 30) == 60
    # A sequence id may start again after it ended: its sum starts over.
    assert step(101, 5, start=True) == 5
    assert step(202, 40, end=True) == 100
    assert step(101, 5, end=True) == 10


def test_concurrent_sequences_keep_separate_running_sums(
    triton_server: RunningServer, http: requests.Session
) -> None:
    values = {sequence: list(range(sequence, sequence + 6)) for sequence in (301, 302, 303, 304)}

    def run(sequence: int) -> list[int]:
        sums = []
        with requests.Session() as own:
            for i, value in enumerate(values[sequence]):
                params = {"sequence_id": sequence, "sequence_start": i == 0, "sequence_end": i == 5}
                out = infer(
                    own, triton_server, "accumulator", {"INPUT": np.array([[value]], np.int32)}, params
                )
                sums.append(int(out["OUTPUT"][0, 0]))
        return sums

    with ThreadPoolExecutor(4) as pool:
        results = dict(zip(values, pool.map(run, values), strict=True))
    assert results == {sequence: np.cumsum(v).tolist() for sequence, v in values.items()}


def test_ensemble_scales_then_offsets(triton_server: RunningServer, http: requests.Session) -> None:
    x = np.array([[1, 2, 3, 4], [-1, 0, 0.25, 100]], dtype=np.float32)
    out = infer(http, triton_server, "pipeline", {"X": x})
    assert set(out) == {"Y"}
    np.testing.assert_array_equal(out["Y"], x * np.float32(SCALE_FACTOR) + np.float32(OFFSET))


# ---------------------------------------------------------------- triton_http


async def test_adapter_reads_readiness_and_index(
    triton_server: RunningServer, service_spec: TritonServiceSpec
) -> None:
    base = triton_server.http_url
    assert await triton_http.server_ready(base)
    index = await triton_http.model_index(base)
    assert sorted(e["name"] for e in index) == sorted(m.name for m in service_spec.models)
    assert {e["state"] for e in index} == {"READY"}
    assert len(await triton_http.model_index(base, ready_only=True)) == len(index)
    assert await triton_http.model_ready(base, "adder")
    assert await triton_http.model_ready(base, "pipeline", "1")
    assert not await triton_http.model_ready(base, "adder", "2")
    assert not await triton_http.model_ready(base, "no-such-model")


async def test_adapter_on_a_port_nothing_listens_on() -> None:
    base = f"http://127.0.0.1:{free_port()}"
    assert not await triton_http.server_ready(base)
    assert not await triton_http.model_ready(base, "adder")
    with pytest.raises(triton_http.TritonAPIError):
        await triton_http.model_index(base)


# ---------------------------------------------------------------- configs Triton rejects

BROKEN_CAUSES = {
    "gpu_adder": "instance group gpu_adder_0 of model gpu_adder has kind KIND_GPU but no GPUs are available",
    "no_such_backend": "unable to find backend library for backend 'tensorrt_llm_nope'",
    "pipeline_dims": "in ensemble pipeline_dims, ensemble tensor X: inconsistent shape",
}


@pytest.mark.parametrize("model", sorted(BROKEN_CAUSES))
async def test_triton_rejects_a_broken_config_and_logs_why(broken_server: RunningServer, model: str) -> None:
    with requests.Session() as http:
        response = http.post(url(broken_server, f"/v2/repository/models/{model}/load"), timeout=TIMEOUT)
    assert response.status_code == 400
    assert BROKEN_CAUSES[model] in response.json()["error"]
    assert BROKEN_CAUSES[model] in broken_server.log()
    assert not await triton_http.model_ready(broken_server.http_url, model)
    states = {e["name"]: e.get("state") for e in await triton_http.model_index(broken_server.http_url)}
    assert states[model] != "READY"


def test_a_model_that_fails_at_startup_fails_the_start_with_the_log(
    triton_install: TritonInstall, tmp_path: Path
) -> None:
    repository = build_repository(validated_spec(BROKEN_SPEC), tmp_path / "models")
    with pytest.raises(TritonStartError) as failure:
        start_server(triton_install, repository, ["gpu_adder"], tmp_path / "tritonserver.log")
    assert "exited with status" in failure.value.problem
    assert BROKEN_CAUSES["gpu_adder"] in str(failure.value)
    assert BROKEN_CAUSES["gpu_adder"] in (tmp_path / "tritonserver.log").read_text()


# ---------------------------------------------------------------- tritonserver


def test_stop_leaves_no_process(
    triton_install: TritonInstall, service_spec: TritonServiceSpec, tmp_path: Path
) -> None:
    spec = service_spec.model_copy(update={"models": [m for m in service_spec.models if m.name == "adder"]})
    repository = build_repository(spec, tmp_path / "models")
    server = start_server(triton_install, repository, ["adder"], tmp_path / "tritonserver.log")
    members = server.processes()
    assert server.pid in members
    assert len(members) >= 2, "the adder's Python backend stub should run in the server's process group"
    assert server.stop() == 0
    assert server.processes() == []
    for pid in members:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert server.stop() == 0  # stopping again is harmless


def test_stop_kills_a_server_that_ignores_sigterm(
    triton_install: TritonInstall, service_spec: TritonServiceSpec, tmp_path: Path
) -> None:
    spec = service_spec.model_copy(update={"models": [m for m in service_spec.models if m.name == "adder"]})
    repository = build_repository(spec, tmp_path / "models")
    server = start_server(triton_install, repository, ["adder"], tmp_path / "tritonserver.log")
    os.kill(server.pid, signal.SIGSTOP)  # a stopped process cannot act on SIGTERM
    assert server.stop(timeout=1) == -signal.SIGKILL
    assert server.processes() == []


def test_prepare_reuses_a_matching_copy_and_replaces_a_stale_one(
    triton_install: TritonInstall, tmp_path: Path
) -> None:
    first = prepare_server(tmp_path)
    marker = next(first.root.glob(".triton-operator-source.json"))
    stamp = marker.stat().st_mtime_ns
    (first.backend_dir / "python" / "triton_python_backend_stub").write_bytes(b"")  # not copied again...
    again = prepare_server(tmp_path)
    assert again.root == first.root
    assert marker.stat().st_mtime_ns == stamp
    assert (again.backend_dir / "python" / "triton_python_backend_stub").stat().st_size == 0
    marker.write_text(json.dumps({"dist": "something else"}))  # ...until the source no longer matches
    fresh = prepare_server(tmp_path)
    assert fresh.root == first.root
    assert (fresh.backend_dir / "python" / "triton_python_backend_stub").stat().st_size > 0
    assert os.access(fresh.binary, os.X_OK)
    assert fresh.env["LD_LIBRARY_PATH"].split(os.pathsep)[0].endswith("nvidia_pytriton.libs")
    assert [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_prepared_install_finds_every_shared_library(triton_install: TritonInstall) -> None:
    stub = triton_install.backend_dir / "python" / "triton_python_backend_stub"
    for binary in (triton_install.binary, stub):
        assert missing_libraries(binary, triton_install.env) == []
    without = {**triton_install.env, "LD_LIBRARY_PATH": ""}
    assert "libtritonserver-717102f0.so" in missing_libraries(triton_install.binary, without)
