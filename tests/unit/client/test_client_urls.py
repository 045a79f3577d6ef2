"""TritonClient's URLs and TritonService lookups that need no server: schemes, default ports, no endpoint."""

from __future__ import annotations

from typing import Any

import pytest

from triton_operator.client import ClientError, TritonClient
from triton_operator.client.triton import parse_url


@pytest.mark.parametrize(
    ("url", "parsed"),
    [
        ("http://triton:8000", ("http", "triton:8000", False)),
        ("https://triton.example", ("http", "triton.example:8000", True)),
        ("grpc://10.0.0.1:9001", ("grpc", "10.0.0.1:9001", False)),
        ("grpcs://triton", ("grpc", "triton:8001", True)),
        ("tiny.demo.svc:8001", ("grpc", "tiny.demo.svc:8001", False)),  # bare host:port is gRPC
        ("localhost", ("grpc", "localhost:8001", False)),
        ("http://[::1]:8000/", ("http", "[::1]:8000", False)),
    ],
)
def test_urls(url: str, parsed: tuple[str, str, bool]) -> None:
    assert parse_url(url) == parsed


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://triton:21", "the scheme must be http, https, grpc or grpcs, not 'ftp'"),
        ("http://h:1/v2", "no path"),
    ],
)
def test_bad_urls(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_url(url)


def service(status: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "tiny", "namespace": "demo"},
        "spec": {"models": [{"name": "add_sub", "config": {"input": [{"name": "X"}]}}]},
        "status": status,
    }


def test_a_tritonservice_without_endpoints_yet_is_refused() -> None:
    with pytest.raises(ClientError, match=r"TritonService demo/tiny has no status.endpoints.grpc yet"):
        TritonClient.from_tritonservice(service({}))
    with pytest.raises(ValueError, match="protocol must be 'http' or 'grpc'"):
        TritonClient.from_tritonservice(service({}), protocol="tcp")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("protocol", "host", "url"),
    [("grpc", "127.0.0.1", "grpc://127.0.0.1:8001"), ("http", "127.0.0.1:18000", "http://127.0.0.1:18000")],
)
def test_host_replaces_the_endpoint_host(protocol: Any, host: str, url: str) -> None:
    endpoints = {"http": "tiny.demo.svc:8000", "grpc": "tiny.demo.svc:8001"}
    with TritonClient.from_tritonservice(
        service({"endpoints": endpoints}), protocol=protocol, host=host
    ) as c:
        assert (c.url, c.service, c.model_names()) == (url, "demo/tiny", ["add_sub"])
        assert "add_sub" in dir(c)
