"""triton_operator.client against a real tritonserver, over HTTP and gRPC: models as attributes, inputs
checked before sending, a decoupled model streamed, versions, and every Triton API passed through."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from triton_operator import kubectl_plugin
from triton_operator.client import ClientError, InputError, TritonClient, UnknownModelError
from triton_operator.models import TritonServiceSpec
from triton_specs import CPU, build_repository, validated_spec
from tritonserver import RunningServer, TritonInstall, start_server

pytestmark = [pytest.mark.triton, pytest.mark.timeout(300)]


def _tensor(name: str, data_type: str, dims: list[int], **extra: Any) -> dict[str, Any]:
    return {"name": name, "dataType": data_type, "dims": [str(d) for d in dims], **extra}


ADDER = {
    "backend": "python",
    "maxBatchSize": 8,
    "input": [_tensor("INPUT0", "TYPE_FP32", [4]), _tensor("INPUT1", "TYPE_FP32", [4])],
    "output": [_tensor("OUTPUT0", "TYPE_FP32", [4]), _tensor("OUTPUT1", "TYPE_FP32", [4])],
    "instanceGroup": CPU,
}
# The models a TritonService would list; "spare" is in the repository but not loaded at start.
CLIENT_SPEC: dict[str, Any] = {
    "repository": {"uri": "pvc://models/client"},
    "models": [
        {
            "name": "mixed",
            "config": {
                "backend": "python",
                "maxBatchSize": 4,
                "input": [
                    _tensor("IMAGE", "TYPE_FP32", [2, 2]),
                    _tensor("SCALE", "TYPE_INT32", [1]),
                    _tensor("OFFSET", "TYPE_UINT8", [1]),
                    _tensor("LABEL", "TYPE_STRING", [1]),
                ],
                "output": [_tensor("OUT", "TYPE_FP32", [2, 2]), _tensor("TAG", "TYPE_STRING", [1])],
                "instanceGroup": CPU,
            },
        },
        {
            "name": "versioned",
            "config": {
                "backend": "python",
                "input": [_tensor("INPUT", "TYPE_INT64", [-1])],
                "output": [_tensor("OUTPUT", "TYPE_INT64", [-1])],
                "versionPolicy": {"all": {}},
                "instanceGroup": CPU,
            },
        },
        {
            "name": "counter",
            "config": {
                "backend": "python",
                "input": [_tensor("COUNT", "TYPE_INT32", [1]), _tensor("VALUE", "TYPE_FP32", [1])],
                "output": [_tensor("OUT", "TYPE_FP32", [1])],
                "modelTransactionPolicy": {"decoupled": True},
                "instanceGroup": CPU,
            },
        },
        {"name": "add-sub", "path": "adder", "config": ADDER},
        {"name": "spare", "path": "adder", "config": ADDER},
    ],
}
LOADED = ["mixed", "versioned", "counter", "add-sub"]


@pytest.fixture(scope="module")
def client_spec() -> TritonServiceSpec:
    return validated_spec(CLIENT_SPEC)


@pytest.fixture(scope="module")
def server(
    triton_install: TritonInstall, client_spec: TritonServiceSpec, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    base = tmp_path_factory.mktemp("triton-client")
    repository = build_repository(client_spec, base / "models")
    running = start_server(triton_install, repository, LOADED, base / "tritonserver.log")
    yield running
    running.stop()


def url_of(server: RunningServer, protocol: str) -> str:
    return server.http_url if protocol == "http" else f"grpc://{server.grpc_url}"


def service_object(server: RunningServer) -> dict[str, Any]:
    """A TritonService as the API server returns it, its endpoints pointing at the local server."""
    return {
        "apiVersion": "triton-operator.io/v1alpha1",
        "kind": "TritonService",
        "metadata": {"name": "client", "namespace": "ml"},
        "spec": CLIENT_SPEC,
        "status": {
            "endpoints": {
                "http": f"127.0.0.1:{server.http_port}",
                "grpc": f"127.0.0.1:{server.grpc_port}",
                "metrics": f"127.0.0.1:{server.metrics_port}",
            }
        },
    }


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, server: RunningServer) -> Iterator[TritonClient]:
    """A client of the server's URL (configs read from the server), over each protocol."""
    with TritonClient(url_of(server, request.param)) as c:
        yield c


@pytest.fixture(params=["http", "grpc"])
def service_client(request: pytest.FixtureRequest, server: RunningServer) -> Iterator[TritonClient]:
    """A client made from the TritonService object (configs from its spec), over each protocol."""
    with TritonClient.from_tritonservice(service_object(server), protocol=request.param) as c:
        yield c


def mixed_inputs(batch: int = 2) -> dict[str, Any]:
    return {
        "IMAGE": np.arange(batch * 4, dtype=np.float32).reshape(batch, 2, 2),
        "SCALE": np.array([[3]] * batch, dtype=np.int32),
        "OFFSET": np.array([[1]] * batch, dtype=np.uint8),
        "LABEL": np.array([[f"cat{i}"] for i in range(batch)], dtype=np.object_),
    }


def expected_mixed(inputs: dict[str, Any]) -> tuple[np.ndarray[Any, Any], list[list[bytes]]]:
    image, scale, offset = inputs["IMAGE"], inputs["SCALE"], inputs["OFFSET"]
    out = np.asarray(image, np.float32) * np.asarray(scale).reshape(-1, 1, 1) + np.asarray(offset).reshape(
        -1, 1, 1
    )
    tags = [[str(x).upper().encode() + b"!" for x in row] for row in inputs["LABEL"]]
    return out.astype(np.float32), tags


# ---------------------------------------------------------------- running models


def test_url_parsing_picks_the_protocol(server: RunningServer) -> None:
    with TritonClient(server.grpc_url) as bare, TritonClient(server.http_url) as http:
        assert (bare.protocol, bare.url) == ("grpc", f"grpc://{server.grpc_url}")
        assert (http.protocol, http.url) == ("http", server.http_url)
        assert bare.is_server_ready() and http.is_server_ready()


def test_inputs_of_four_types_by_name_and_by_position_give_the_same_answer(client: TritonClient) -> None:
    inputs = mixed_inputs()
    out, tags = expected_mixed(inputs)
    by_name = client.mixed.run(**inputs)
    by_position = client.mixed.run(inputs["IMAGE"], inputs["SCALE"], inputs["OFFSET"], inputs["LABEL"])
    for result in (by_name, by_position):
        np.testing.assert_array_equal(result.as_numpy("OUT"), out)
        assert result.as_numpy("OUT").dtype == np.float32
        assert result.as_numpy("TAG").tolist() == tags
        assert result.get_output("OUT") is not None and result.get_response() is not None


def test_lossless_values_are_converted_before_sending(client: TritonClient) -> None:
    """int64 scales, a Python list image, float64 offsets that are whole and str labels all fit."""
    inputs = {
        "IMAGE": [[[0.5, 1.5], [2.0, -1.0]]],
        "SCALE": np.array([[2]], dtype=np.int64),
        "OFFSET": np.array([[4.0]], dtype=np.float64),
        "LABEL": [["dog"]],
    }
    result = client.mixed.run(**inputs)
    np.testing.assert_array_equal(result.as_numpy("OUT"), [[[5.0, 7.0], [8.0, 2.0]]])
    assert result.as_numpy("TAG").tolist() == [[b"DOG!"]]


def test_a_name_that_is_not_an_identifier_is_reached_by_model(client: TritonClient) -> None:
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    result = client.model("add-sub").run(a, a * 10)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 11)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a * -9)


def test_version_selects_the_model_version(client: TritonClient) -> None:
    x = np.array([10, 20, 30], dtype=np.int64)  # dims [-1], no batching: any length
    assert client.versioned.run(x).as_numpy("OUTPUT").tolist() == [12, 22, 32]  # latest: 2
    assert client.model("versioned", version=1).run(x).as_numpy("OUTPUT").tolist() == [11, 21, 31]
    assert client.model("versioned", version="2").run(INPUT=x[:1]).as_numpy("OUTPUT").tolist() == [12]
    with pytest.raises(UnknownModelError, match="no version 7 of model 'versioned' served at"):
        client.model("versioned", version=7).run(x)


async def test_async_run_over_both_protocols(client: TritonClient) -> None:
    inputs = mixed_inputs(3)
    out, tags = expected_mixed(inputs)
    try:
        results = await asyncio.gather(
            client.mixed.async_run(**inputs), client.mixed.async_run(*inputs.values())
        )
        for result in results:
            np.testing.assert_array_equal(result.as_numpy("OUT"), out)
            assert result.as_numpy("TAG").tolist() == tags
        with pytest.raises(InputError, match="both by position"):
            await client.mixed.async_run(inputs["IMAGE"], SCALE=inputs["SCALE"])
        x = np.array([1], dtype=np.int64)
        assert (await client.model("versioned", version=1).async_run(x)).as_numpy("OUTPUT").tolist() == [2]
    finally:
        await client.aclose()


def test_the_service_client_uses_the_spec_configs(service_client: TritonClient) -> None:
    assert service_client.service == "ml/client"
    assert set(service_client.model_names()) == {m["name"] for m in CLIENT_SPEC["models"]}
    assert "mixed" in dir(service_client) and "add-sub" not in dir(service_client)
    inputs = mixed_inputs(1)
    out, _ = expected_mixed(inputs)
    np.testing.assert_array_equal(service_client.mixed.run(**inputs).as_numpy("OUT"), out)


# ---------------------------------------------------------------- the decoupled model


def test_a_decoupled_model_streams_every_response_over_grpc(server: RunningServer) -> None:
    with TritonClient(f"grpc://{server.grpc_url}") as client:
        answers = [
            r.as_numpy("OUT").tolist() for r in client.counter.stream(COUNT=[3], VALUE=[1.5], timeout=60)
        ]
        assert answers == [[1.5], [3.0], [4.5]]
        # a non-decoupled model over a stream: its one response
        (only,) = list(client.model("versioned", version=1).stream(np.array([5], np.int64), timeout=60))
        assert only.as_numpy("OUTPUT").tolist() == [6]
        with pytest.raises(ClientError, match=r"decoupled.*stream"):
            client.counter.run(COUNT=[3], VALUE=[1.5])
        with pytest.raises(InputError, match="COUNT"):
            list(client.counter.stream(COUNT=[2.5], VALUE=[1.0]))


async def test_a_decoupled_model_streams_asynchronously(server: RunningServer) -> None:
    async with TritonClient(f"grpc://{server.grpc_url}") as client:
        count = np.array([2], np.int32)
        answers = [r.as_numpy("OUT").tolist() async for r in client.counter.async_stream(count, [0.5])]
    assert answers == [[0.5], [1.0]]


def test_streaming_over_http_is_refused(server: RunningServer) -> None:
    with TritonClient(server.http_url) as client, pytest.raises(ClientError, match="streaming needs gRPC"):
        list(client.counter.stream(COUNT=[1], VALUE=[1.0]))


# ---------------------------------------------------------------- refusals, before anything is sent


def inference_count(client: TritonClient, model: str) -> int:
    stats = client.get_inference_statistics(model)["model_stats"]
    return sum(int(s.get("inference_count", 0)) for s in stats)


REFUSALS: list[tuple[str, Any, str]] = [
    (
        "mixing",
        lambda i: ([i["IMAGE"]], {"SCALE": i["SCALE"]}),
        r"both by position \(1\) and by name \(SCALE\)",
    ),
    ("too few", lambda i: ([i["IMAGE"], i["SCALE"]], {}), r"takes 4 inputs by position .* got 2"),
    ("too many", lambda i: ([*i.values(), i["SCALE"]], {}), r"takes 4 inputs by position .* got 5"),
    ("unknown name", lambda i: ([], {**i, "COLOR": i["SCALE"]}), r"no input named 'COLOR'"),
    ("missing name", lambda i: ([], {k: v for k, v in i.items() if k != "LABEL"}), r"input LABEL: missing"),
    (
        "lossy float",
        lambda i: ([], {**i, "IMAGE": i["IMAGE"].astype(np.float64) + 0.1}),
        r"input IMAGE: float64",
    ),
    ("negative uint8", lambda i: ([], {**i, "OFFSET": np.array([[-1], [2]])}), r"input OFFSET: .*-1"),
    ("fraction to int", lambda i: ([], {**i, "SCALE": [[1.5], [2]]}), r"input SCALE: float64 .*1\.5"),
    (
        "number as string",
        lambda i: ([], {**i, "LABEL": np.array([[1], [2]])}),
        r"input LABEL: expected BYTES",
    ),
    ("string as number", lambda i: ([], {**i, "SCALE": [["3"], ["4"]]}), r"input SCALE: expected INT32"),
    ("no batch dim", lambda i: ([], {**i, "IMAGE": i["IMAGE"][0]}), r"input IMAGE: shape \[2, 2\] has 2 dim"),
    (
        "wrong dim",
        lambda i: ([], {**i, "IMAGE": np.zeros((2, 2, 3), np.float32)}),
        r"dimension 2 is 3, expected 2",
    ),
    ("batch too big", lambda i: ([], mixed_inputs(5)), r"batch of 5 .* larger than max_batch_size 4"),
    ("batches differ", lambda i: ([], {**i, "SCALE": i["SCALE"][:1]}), r"input SCALE: batch of 1, but IMAGE"),
]


@pytest.mark.parametrize(("case", "make", "message"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_inputs_the_config_refuses_are_refused_before_sending(
    client: TritonClient, case: str, make: Any, message: str
) -> None:
    args, kwargs = make(mixed_inputs())
    before = inference_count(client, "mixed")
    with pytest.raises(InputError, match=message) as caught:
        client.mixed.run(*args, **kwargs)
    assert caught.value.model == "mixed"
    assert inference_count(client, "mixed") == before, "a refused request reached the server"


def test_an_unknown_model_is_refused(client: TritonClient, service_client: TritonClient) -> None:
    with pytest.raises(UnknownModelError, match=r"no model 'nosuch' .*mixed"):
        client.nosuch.run([1])
    with pytest.raises(UnknownModelError, match=r"no model 'nosuch' in TritonService ml/client"):
        service_client.model("nosuch")
    assert not hasattr(service_client, "nosuch") and hasattr(service_client, "mixed")


def test_a_variable_dimension_takes_any_length_but_not_another_rank(client: TritonClient) -> None:
    assert client.versioned.run(np.arange(7, dtype=np.int64)).as_numpy("OUTPUT").shape == (7,)
    with pytest.raises(InputError, match=r"input INPUT: shape \[1, 7\] has 2 dimensions, expected 1: \[-1\]"):
        client.versioned.run(np.arange(7).reshape(1, 7))


# ---------------------------------------------------------------- the other Triton APIs


def test_server_and_model_apis(client: TritonClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.get_server_metadata()["name"] == "triton"
    assert client.mixed.ready() and client.is_model_ready("versioned", "1")
    metadata = client.mixed.metadata()
    assert [i["name"] for i in metadata["inputs"]] == ["IMAGE", "SCALE", "OFFSET", "LABEL"]
    assert [i["datatype"] for i in metadata["inputs"]] == ["FP32", "INT32", "UINT8", "BYTES"]
    config = client.mixed.config()
    assert config["name"] == "mixed" and int(config["max_batch_size"]) == 4
    index = {(e["name"], e.get("version")): e.get("state") for e in client.get_model_repository_index()}
    assert index[("versioned", "1")] == index[("versioned", "2")] == "READY"
    assert "spare" in {name for name, _ in index}  # in the repository, not loaded
    client.mixed.run(**mixed_inputs(1))
    assert client.mixed.statistics()["model_stats"][0]["name"] == "mixed"
    assert inference_count(client, "mixed") >= 1


def test_load_and_unload(client: TritonClient) -> None:
    spare = client.model("spare")
    with contextlib.suppress(InferenceServerException):
        spare.unload()
    assert not spare.ready()
    spare.load()
    assert spare.ready()
    a = np.ones((1, 4), np.float32)
    np.testing.assert_array_equal(spare.run(a, a).as_numpy("OUTPUT0"), a * 2)
    spare.unload()
    assert not client.is_model_ready("spare")


def test_log_and_trace_settings(client: TritonClient) -> None:
    settings = client.get_log_settings()
    assert "log_verbose_level" in settings
    try:
        assert client.update_log_settings({"log_verbose_level": 1})["log_verbose_level"] == 1
        assert client.get_log_settings()["log_verbose_level"] == 1
    finally:
        client.update_log_settings({"log_verbose_level": settings["log_verbose_level"]})
    trace = client.get_trace_settings()
    assert trace["trace_level"] == ["OFF"] and trace["trace_rate"] == "1000"
    updated = client.update_trace_settings("mixed", {"trace_rate": "7"})
    assert updated["trace_rate"] == "7" and client.get_trace_settings("mixed")["trace_rate"] == "7"
    client.update_trace_settings("mixed", {"trace_rate": None})


def test_system_shared_memory_registration(client: TritonClient) -> None:
    name = f"tsm{uuid.uuid4().hex[:8]}"
    region = shared_memory.SharedMemory(name=name, create=True, size=64)
    try:
        client.register_system_shared_memory(name, f"/{name}", 64)
        (region_status,) = client.get_system_shared_memory_status(name)
        assert region_status["name"] == name and region_status["key"] == f"/{name}"
        assert int(region_status["byte_size"]) == 64
        client.unregister_system_shared_memory(name)
        assert name not in [r["name"] for r in client.get_system_shared_memory_status()]
    finally:
        region.close()
        region.unlink()


# ---------------------------------------------------------------- kubectl triton infer


class OneService:
    """The API server's answer for one TritonService (what kubectl-triton reads through lightkube)."""

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj
        self.namespace = "ml"

    def get(self, name: str, namespace: str) -> dict[str, Any]:
        assert (namespace, name) == ("ml", "client")
        return self.obj

    def tuning_results(self, name: str, namespace: str) -> list[dict[str, Any]]:
        return []

    def list(self, namespace: str | None) -> list[dict[str, Any]]:
        return [self.obj]

    def request(
        self,
        name: str,
        namespace: str,
        action: Any,
        to_revision: str | None = None,
        *,
        revision: str | None = None,
    ) -> str:
        raise AssertionError("infer makes no control request")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_kubectl_triton_infer_prints_the_outputs(
    server: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], protocol: str
) -> None:
    image = tmp_path / "image.npy"
    np.save(image, np.ones((1, 2, 2), np.float32))
    argv = [
        "infer", "client", "mixed", "--protocol", protocol,
        "--input", f"IMAGE=@{image}", "--input", "SCALE=[[2]]", "--input", "OFFSET=[[1]]",
        "--input", 'LABEL=[["cat"]]',
    ]  # fmt: skip
    assert kubectl_plugin.main(argv, client=OneService(service_object(server))) == 0
    out = capsys.readouterr().out
    assert "OUT  FP32 [1, 2, 2]  [[[3.0, 3.0], [3.0, 3.0]]]" in out
    assert "TAG  BYTES [1, 1]  [['CAT!']]" in out

    bad = [*argv[:-1], 'LABEL=[["cat"]]', "--input", "COLOR=[1]"]
    assert kubectl_plugin.main(bad, client=OneService(service_object(server))) == 1
    assert "no input named 'COLOR'" in capsys.readouterr().err
