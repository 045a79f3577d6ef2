"""A pooled TritonService's client against real tritonservers: one client, two models, each model's
requests sent to the server that holds it (its own endpoint in status.pool), over HTTP and gRPC."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from triton_operator.client import ModelNotServedError, TritonClient
from triton_specs import CPU, build_repository, validated_spec
from tritonserver import RunningServer, TritonInstall, start_server

pytestmark = [pytest.mark.triton, pytest.mark.timeout(300)]

_ADDER = {
    "backend": "python",
    "maxBatchSize": 8,
    "input": [{"name": f"INPUT{i}", "dataType": "TYPE_FP32", "dims": ["4"]} for i in (0, 1)],
    "output": [{"name": f"OUTPUT{i}", "dataType": "TYPE_FP32", "dims": ["4"]} for i in (0, 1)],
    "instanceGroup": CPU,
}
POOLED_SPEC: dict[str, Any] = {
    "repository": {"uri": "pvc://models/pooled"},
    "pool": {"memoryPerPod": "100Mi"},
    "models": [
        {"name": name, "path": "adder", "memory": "60Mi", "config": _ADDER}
        for name in ("left", "right", "spare")
    ],
}


@pytest.fixture(scope="module")
def servers(
    triton_install: TritonInstall, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, RunningServer]]:
    """Two pods of the pool as two tritonservers over one repository: one holds "left", one "right"."""
    base = tmp_path_factory.mktemp("triton-pooled")
    repository = build_repository(validated_spec(POOLED_SPEC), base / "models")
    running: dict[str, RunningServer] = {}
    try:
        for model in ("left", "right"):
            running[model] = start_server(triton_install, repository, [model], base / f"{model}.log")
        yield running
    finally:
        for server in running.values():
            server.stop()


def pooled_object(servers: dict[str, RunningServer]) -> dict[str, Any]:
    """The TritonService as the API server returns it: each placed model's endpoints at the server holding
    it; "spare" left unplaced for want of room."""

    def endpoints(server: RunningServer) -> dict[str, str]:
        return {
            "http": f"127.0.0.1:{server.http_port}",
            "grpc": f"127.0.0.1:{server.grpc_port}",
            "metrics": f"127.0.0.1:{server.metrics_port}",
        }

    placed = [
        {
            "name": name,
            "pods": [f"pooled-{i}"],
            "copies": 1,
            "readyCopies": 1,
            "reason": "Wanted",
            "endpoints": endpoints(servers[name]),
        }
        for i, name in enumerate(("left", "right"))
    ]
    spare = {
        "name": "spare",
        "pods": [],
        "copies": 0,
        "reason": "BudgetFull",
        "message": "no pod has 60Mi left",
    }
    return {
        "metadata": {"name": "pooled", "namespace": "ml"},
        "spec": POOLED_SPEC,
        # The service-wide endpoint: any pod of the pool (here the one holding "left").
        "status": {"endpoints": endpoints(servers["left"]), "pool": {"models": [*placed, spare]}},
    }


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_one_client_sends_each_model_to_the_pod_that_holds_it(
    servers: dict[str, RunningServer], protocol: Any
) -> None:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    with TritonClient.from_tritonservice(pooled_object(servers), protocol=protocol) as client:
        for name in ("left", "right"):
            result = client.model(name).run(a, a * 10)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 11)
            assert client.is_model_ready(name)
            count = client.get_inference_statistics(name)["model_stats"][0]["inference_count"]
            assert int(count) >= 2
        # Each server holds one model only: the other's requests would have failed there.
        with TritonClient(servers["left"].http_url) as left_pod:
            assert not left_pod.is_model_ready("right") and left_pod.is_model_ready("left")
        with pytest.raises(
            ModelNotServedError, match=r"'spare' .* is on no pod yet \(status.pool reason BudgetFull"
        ):
            client.spare.run(a, a)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_pods_unknown_model_is_sent_again_until_the_model_is_loaded_there(
    servers: dict[str, RunningServer], protocol: Any
) -> None:
    """A pod whose tritonserver answers "unknown model" for a model it is placed with (a crashed
    tritonserver back before its agent loaded its models, still on the model's routes): the inference ran
    nowhere, and is sent again until the model answers there."""
    pod = servers["right"]
    url = pod.http_url if protocol == "http" else f"grpc://127.0.0.1:{pod.grpc_port}"
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    load = urllib.request.Request(f"{pod.http_url}/v2/repository/models/spare/load", data=b"", method="POST")
    loading = threading.Timer(0.5, lambda: urllib.request.urlopen(load, timeout=60).close())
    loader = TritonClient(pod.http_url)
    try:
        with TritonClient(url, configs={"spare": _ADDER}, routed=True) as routed:
            assert not routed.is_model_ready("spare")
            loading.start()
            sent = time.monotonic()
            result = routed.model("spare").run(a, a * 10)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 11)
            assert time.monotonic() - sent >= 0.5  # answered once loaded, not before
    finally:
        if loading.ident is not None:
            loading.join()
        loader.unload_model("spare")
        loader.close()
