"""TritonClient of a pooled TritonService: each model's requests go to its own endpoint (status.pool)."""

from __future__ import annotations

from typing import Any

import pytest

from triton_operator.client import ModelNotServedError, TritonClient
from triton_operator.core.objects.model_routes import model_endpoints
from triton_operator.core.pool.explain import pool_status
from triton_operator.core.pool.placement import PoolModel, PoolPod, place

MiB = 1 << 20
ENDPOINTS = {"http": "127.0.0.1:8000", "grpc": "127.0.0.1:8001", "metrics": "127.0.0.1:8002"}


def pooled(pool: dict[str, Any], models: tuple[str, ...] = ("a", "b")) -> dict[str, Any]:
    return {
        "metadata": {"name": "tiny", "namespace": "demo"},
        "spec": {
            "pool": {"memoryPerPod": "1Gi"},
            "models": [{"name": m, "memory": "100Mi", "config": {"input": [{"name": "X"}]}} for m in models],
        },
        "status": {"endpoints": ENDPOINTS, "pool": pool},
    }


def entry(name: str, port: int, **extra: Any) -> dict[str, Any]:
    """A status.pool.models[] entry whose endpoints point at loopback ports (resolvable here)."""
    return {
        "name": name,
        "pods": ["tiny-0"],
        "copies": 1,
        "readyCopies": 1,
        "reason": "Wanted",
        "endpoints": {"http": f"127.0.0.1:{port}", "grpc": f"127.0.0.1:{port + 1}", "metrics": "x:8002"},
        **extra,
    }


@pytest.mark.parametrize(("protocol", "offset"), [("http", 0), ("grpc", 1)])
def test_each_model_goes_to_its_own_endpoint_and_server_wide_calls_to_the_service(
    protocol: Any, offset: int
) -> None:
    obj = pooled({"models": [entry("a", 18000), entry("b", 19000)]})
    with TritonClient.from_tritonservice(
        obj, protocol=protocol, host="127.0.0.1" if protocol == "http" else None
    ) as c:
        assert c.model_url("a") == f"{protocol}://127.0.0.1:{18000 + offset}"
        assert c.model_url("b") == f"{protocol}://127.0.0.1:{19000 + offset}"
        assert c.model("a").client is not c.model("b").client
        assert c.model("a").client is c.a.client  # one client per model, kept
        assert c.a.client.model_names() == ["a"] and c.model_names() == ["a", "b"]
        assert c.url == f"{protocol}://127.0.0.1:{800 * 10 + offset}"


def test_a_model_not_placed_or_not_ready_raises_naming_it_and_its_status_pool_reason() -> None:
    obj = pooled(
        {
            "models": [
                entry("a", 18000),
                entry(
                    "b",
                    19000,
                    pods=[],
                    copies=0,
                    readyCopies=0,
                    reason="BudgetFull",
                    message="no pod has room",
                ),
            ]
        },
        models=("a", "b", "c"),
    )
    c = TritonClient.from_tritonservice(obj)
    assert c.model_url("a") == "grpc://127.0.0.1:18001"
    with pytest.raises(
        ModelNotServedError,
        match=r"model 'b' of TritonService demo/tiny has no copy READY on its routes yet "
        r"\(status.pool reason BudgetFull: no pod has room\)",
    ):
        c.model("b")
    with pytest.raises(ModelNotServedError, match=r"model 'c' of TritonService demo/tiny is not placed yet"):
        c.c.run([1.0])
    assert c.is_model_ready("b") is False  # no request sent: nothing to send it to
    with pytest.raises(ModelNotServedError, match="'b'"):
        c.get_model_config("b")


def test_placed_but_not_yet_ready_or_without_an_endpoint_is_not_served() -> None:
    obj = pooled(
        {"models": [entry("a", 18000, readyCopies=0, reason="Wanted"), entry("b", 1, endpoints=None)]}
    )
    c = TritonClient.from_tritonservice(obj, protocol="http")
    with pytest.raises(
        ModelNotServedError, match=r"'a' .* has no copy READY on its routes yet \(status.pool reason Wanted\)"
    ):
        c.model("a")
    with pytest.raises(ModelNotServedError, match=r"'b' .* has no status.pool.models\[\].endpoints.http yet"):
        c.model("b")


def test_one_host_routes_http_by_path_but_refuses_grpc_which_cannot_be_routed_by_model() -> None:
    obj = pooled({"models": [entry("a", 18000)]}, models=("a",))
    with TritonClient.from_tritonservice(obj, protocol="http", host="gw.example:8080") as http:
        assert http.model_url("a") == "http://gw.example:8080" == http.url
    grpc = TritonClient.from_tritonservice(obj, protocol="grpc", host="gw.example")
    with pytest.raises(
        ModelNotServedError,
        match=r"gRPC cannot be routed by model through one host \(gw.example\); pass host=\{'a'",
    ):
        grpc.model("a")


def test_status_pool_written_by_the_operator_gives_the_client_each_model_s_service() -> None:
    """The core writes each model's Service into status.pool; the client reads it back, with ``host`` a
    mapping (port-forwards to each model's Service) and one model left unmapped (its Service does not
    resolve outside the cluster)."""
    models = [PoolModel("a", 100 * MiB), PoolModel("b", 100 * MiB), PoolModel("c", 100 * MiB)]
    placed = place([PoolPod("tiny-0", "n0", 200 * MiB), PoolPod("tiny-1", "n1", 200 * MiB)], models)
    status = pool_status(
        placed,
        models,
        {},
        ready={"a": 1, "b": 1, "c": 1},
        endpoints={m.name: model_endpoints("tiny", "demo", m.name) for m in models},
    ).to_api()
    assert status["models"][0]["endpoints"] == {
        "http": "tiny-m-a.demo.svc:8000",
        "grpc": "tiny-m-a.demo.svc:8001",
        "metrics": "tiny-m-a.demo.svc:8002",
    }
    host = {"": "127.0.0.1", "a": "127.0.0.1:28001", "b": "localhost"}
    c = TritonClient.from_tritonservice(pooled(status, models=("a", "b", "c")), host=host)
    assert (c.url, c.model_url("a"), c.model_url("b")) == (
        "grpc://127.0.0.1:8001",
        "grpc://127.0.0.1:28001",
        "grpc://localhost:8001",
    )
    with pytest.raises(
        ModelNotServedError, match=r"tiny-m-c.demo.svc:8001 \(status.pool.models\[\].endpoints"
    ):
        c.model("c")


def test_without_spec_pool_every_model_goes_to_the_service_endpoint() -> None:
    obj = pooled({"models": [entry("a", 18000)]}, models=("a",))
    del obj["spec"]["pool"]
    c = TritonClient.from_tritonservice(obj, host="127.0.0.1")
    assert c.model_url("a") == c.url == "grpc://127.0.0.1:8001" and c.a.client is c
