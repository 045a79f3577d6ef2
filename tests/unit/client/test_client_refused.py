"""TritonClient: an inference whose connection is refused (a pod whose tritonserver crashed, still in its
Service's rules for a moment) is sent again on new connections, with a short backoff, until a server
takes it or retry_seconds have passed; a sequence's step is not, 0 turns it off, a bad value is
refused naming the option. A real port on loopback that refuses (nothing listens) and then accepts (a
real gRPC server implementing Triton's GRPCInferenceService, or a real HTTP server, started on it), and
tritonclient's own clients (gRPC and HTTP, sync and asyncio)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import aiohttp
import grpc  # type: ignore[import-untyped]
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from triton_operator.client import TritonClient

CONFIG = {
    "a": {
        "maxBatchSize": 0,
        "input": [{"name": "X", "dataType": "TYPE_FP32", "dims": ["1"]}],
        "output": [{"name": "Y", "dataType": "TYPE_FP32", "dims": ["1"]}],
    }
}
LATER = 0.6
"""Seconds the port refuses connections before a server listens on it."""


@dataclass
class Late:
    """A loopback port nothing listens on until ``start`` (then a server answering Y = X + 1); the
    values of the inferences the server answered."""

    protocol: str
    port: int = 0
    answered: list[float] = field(default_factory=list)
    stops: list[Callable[[], None]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"{self.protocol}://127.0.0.1:{self.port}"

    def start(self) -> None:
        (self._grpc if self.protocol == "grpc" else self._http)()

    def _grpc(self) -> None:
        answered = self.answered

        class Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
            def ModelInfer(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC's name
                (value,) = struct.unpack("<f", request.raw_input_contents[0])
                answered.append(value)
                response = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
                output = response.outputs.add()
                output.name, output.datatype = "Y", "FP32"
                output.shape.append(1)
                response.raw_output_contents.append(struct.pack("<f", value + 1))
                return response

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer(), server)
        assert server.add_insecure_port(f"127.0.0.1:{self.port}") == self.port
        server.start()
        self.stops.append(lambda: server.stop(None))

    def _http(self) -> None:
        answered = self.answered

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                size = int(self.headers.get("Inference-Header-Content-Length") or len(body))
                (value,) = struct.unpack("<f", body[size : size + 4])
                answered.append(value)
                answer = json.dumps(
                    {
                        "model_name": "a",
                        "outputs": [{"name": "Y", "datatype": "FP32", "shape": [1], "data": [value + 1]}],
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        self.stops.append(server.shutdown)
        self.stops.append(server.server_close)


@contextlib.contextmanager
def late_server(protocol: str, after: float | None = LATER) -> Iterator[Late]:
    """A port that refuses connections, and a server on it ``after`` seconds (None: never)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        late = Late(protocol, port=probe.getsockname()[1])
    timer = threading.Timer(after, late.start) if after is not None else None
    if timer:
        timer.start()
    try:
        yield late
    finally:
        if timer:
            timer.cancel()
            timer.join()
        for stop in late.stops:
            stop()


def refused_error(protocol: str) -> tuple[type[BaseException], ...]:
    """What each client raises for a refused connection (tritonclient's for gRPC, the OS's or aiohttp's
    for HTTP)."""
    return (
        (InferenceServerException,)
        if protocol == "grpc"
        else (ConnectionRefusedError, aiohttp.ClientConnectorError)
    )


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_an_inference_refused_until_a_server_listens_is_answered_once_it_does(protocol: str) -> None:
    with late_server(protocol) as late, TritonClient(late.url, configs=CONFIG) as client:
        sent = time.monotonic()
        assert float(client.a.run([5.0]).as_numpy("Y")[0]) == 6.0
        took = time.monotonic() - sent
        assert late.answered == [5.0]  # sent again until taken, and run once
        assert LATER <= took < LATER + 1.5, took  # a short backoff: answered soon after the server listens


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_an_asyncio_inference_refused_until_a_server_listens_is_answered_once_it_does(protocol: str) -> None:
    async def run() -> float:
        async with TritonClient(late.url, configs=CONFIG) as client:
            return float((await client.a.async_run([5.0])).as_numpy("Y")[0])

    with late_server(protocol) as late:
        sent = time.monotonic()
        assert asyncio.run(run()) == 6.0
        assert late.answered == [5.0]
        assert LATER <= time.monotonic() - sent < LATER + 1.5


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_an_inference_refused_longer_than_retry_seconds_fails(protocol: str) -> None:
    with late_server(protocol, after=None) as late:
        client = TritonClient(late.url, configs=CONFIG, retry_seconds=0.4)
        sent = time.monotonic()
        with pytest.raises(refused_error(protocol)):
            client.a.run([5.0])
        # sent again (0.05, 0.1, 0.2 s apart) until the next wait would end past 0.4 s
        assert 0.3 <= time.monotonic() - sent < 1.0
        client.close()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_no_retry_with_retry_seconds_0_nor_for_a_sequence_step(protocol: str) -> None:
    with late_server(protocol, after=0.2) as late:
        off = TritonClient(late.url, configs=CONFIG, retry_seconds=0)
        on = TritonClient(late.url, configs=CONFIG)
        sent = time.monotonic()
        with pytest.raises(refused_error(protocol)):
            off.a.run([1.0])
        with pytest.raises(refused_error(protocol)):
            on.a.infer([[2.0]], sequence_id=7, sequence_start=True)
        assert time.monotonic() - sent < 0.2  # neither waited for the server
        time.sleep(0.6)
        assert late.answered == []  # neither was sent again once the server listened
        off.close()
        on.close()


@pytest.mark.parametrize("bad", [-1, -0.5, float("nan"), float("inf"), "5", True, None])
def test_a_bad_retry_seconds_is_refused_naming_it(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"retry_seconds must be a number of seconds, 0 or more"):
        TritonClient("grpc://127.0.0.1:1", configs=CONFIG, retry_seconds=bad)
    obj = {
        "metadata": {"name": "t", "namespace": "n"},
        "spec": {"models": [{"name": "a", "config": CONFIG["a"]}]},
        "status": {"endpoints": {"grpc": "127.0.0.1:1"}},
    }
    with pytest.raises(ValueError, match="retry_seconds"):
        TritonClient.from_tritonservice(obj, retry_seconds=bad)


def test_a_pooled_clients_per_model_clients_keep_its_retry_seconds() -> None:
    obj = {
        "metadata": {"name": "t", "namespace": "n"},
        "spec": {"pool": {"memoryPerPod": "1Gi"}, "models": [{"name": "a", "config": CONFIG["a"]}]},
        "status": {
            "endpoints": {"grpc": "127.0.0.1:1"},
            "pool": {"models": [{"name": "a", "copies": 1, "endpoints": {"grpc": "127.0.0.1:2"}}]},
        },
    }
    with TritonClient.from_tritonservice(obj, retry_seconds=1.5) as client:
        assert client.retry_seconds == 1.5
        assert client.model("a").client.retry_seconds == 1.5
        assert client.model("a").client.url == "grpc://127.0.0.1:2"


DIES = """
import os, signal, struct, sys
from concurrent import futures
import grpc
from tritonclient.grpc import service_pb2_grpc

class Dies(service_pb2_grpc.GRPCInferenceServiceServicer):
    def ModelInfer(self, request, context):
        (value,) = struct.unpack("<f", request.raw_input_contents[0])
        print(value, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Dies(), server)
server.add_insecure_port("127.0.0.1:" + sys.argv[1])
server.start()
print("serving", flush=True)
server.wait_for_termination()
"""
"""A gRPC server (a process of its own) killed by SIGKILL as its first inference reaches it."""


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "asyncio"])
def test_a_grpc_inference_whose_server_is_killed_under_it_is_answered_by_the_next(asynchronous: bool) -> None:
    """A tritonserver crashing under a request: its stream is cut (asked again once, as an HTTP one whose
    connection closes under it), the port then refuses (sent again with a backoff) until a server
    listens there again, which answers."""
    with late_server("grpc", after=None) as late:
        dying = subprocess.Popen(
            [sys.executable, "-c", DIES, str(late.port)], stdout=subprocess.PIPE, text=True
        )
        assert dying.stdout is not None
        try:
            assert dying.stdout.readline().strip() == "serving"

            def restart() -> None:
                dying.wait()
                time.sleep(0.3)
                late.start()

            restarter = threading.Thread(target=restart, daemon=True)
            restarter.start()
            with TritonClient(late.url, configs=CONFIG) as client:
                if asynchronous:

                    async def run() -> Any:
                        try:
                            return await client.a.async_run([5.0])
                        finally:
                            await client.aclose()

                    result = asyncio.run(run())
                else:
                    result = client.a.run([5.0])
            assert float(result.as_numpy("Y")[0]) == 6.0
            restarter.join(5)
            assert dying.returncode == -signal.SIGKILL and dying.stdout.read().split() == ["5.0"]
            assert late.answered == [5.0]
        finally:
            if dying.poll() is None:
                dying.kill()
            dying.wait()
