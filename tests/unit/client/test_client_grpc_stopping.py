"""TritonClient over gRPC: an inference that a stopping server refuses with UNAVAILABLE "Server is
stopping to serve requests." (gRPC's text as tritonserver's gRPC server shuts down: a pod leaving, its
kept channel still pinned to it) is asked again once on a new channel, hence a new connection, and
answered; a sequence's step and any other error are not sent again. A real gRPC server on loopback
implementing Triton's GRPCInferenceService, and tritonclient's own gRPC clients (sync and asyncio)."""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from triton_operator.client import TritonClient

STOPPING = "Server is stopping to serve requests."
CONFIG = {
    "a": {
        "maxBatchSize": 0,
        "input": [{"name": "X", "dataType": "TYPE_FP32", "dims": ["1"]}],
        "output": [{"name": "Y", "dataType": "TYPE_FP32", "dims": ["1"]}],
    }
}


@dataclass
class Server(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """Answers the first connection's first inference, then refuses that connection's next ones
    UNAVAILABLE with ``refusal`` (a pod that started stopping under a kept channel); answers every
    inference on any other connection. Connections are told apart by the client's address."""

    refusal: str = STOPPING
    port: int = 0
    answered: list[tuple[str, float]] = field(default_factory=list)
    refused: list[tuple[str, float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    def peers(self) -> list[str]:
        return list(dict.fromkeys(peer for peer, _ in [*self.answered, *self.refused]))

    def ModelInfer(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 - gRPC's name
        (value,) = struct.unpack("<f", request.raw_input_contents[0])
        peer = context.peer()
        with self.lock:
            first = self.peers()[:1] or [peer]
            if peer == first[0] and self.answered:
                self.refused.append((peer, value))
                context.abort(grpc.StatusCode.UNAVAILABLE, self.refusal)
            self.answered.append((peer, value))
        response = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
        output = response.outputs.add()
        output.name, output.datatype = "Y", "FP32"
        output.shape.append(1)
        response.raw_output_contents.append(struct.pack("<f", value + 1))
        return response


@contextlib.contextmanager
def stopping_server(refusal: str = STOPPING) -> Iterator[Server]:
    servicer = Server(refusal=refusal)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    servicer.port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer
    finally:
        server.stop(None)


def test_an_inference_a_stopping_server_refuses_is_asked_again_on_a_new_channel() -> None:
    with stopping_server() as server, TritonClient(server.url, configs=CONFIG) as client:
        assert float(client.a.run([1.0]).as_numpy("Y")[0]) == 2.0
        # refused on the kept channel's connection: asked again on a new one, and answered there
        assert float(client.a.run([5.0]).as_numpy("Y")[0]) == 6.0
        first, second = server.peers()
        assert server.answered == [(first, 1.0), (second, 5.0)] and server.refused == [(first, 5.0)]


def test_an_asyncio_inference_a_stopping_server_refuses_is_asked_again_on_a_new_channel() -> None:
    async def run() -> list[float]:
        async with TritonClient(server.url, configs=CONFIG) as client:
            first = await client.a.async_run([1.0])
            second = await client.a.async_run([5.0])
            return [float(first.as_numpy("Y")[0]), float(second.as_numpy("Y")[0])]

    with stopping_server() as server:
        assert asyncio.run(run()) == [2.0, 6.0]
        first, second = server.peers()
        assert server.answered == [(first, 1.0), (second, 5.0)] and server.refused == [(first, 5.0)]


def test_a_sequence_step_a_stopping_server_refuses_is_not_sent_again() -> None:
    with stopping_server() as server, TritonClient(server.url, configs=CONFIG) as client:
        client.a.infer([[1.0]], sequence_id=7, sequence_start=True)
        with pytest.raises(InferenceServerException, match="Server is stopping"):
            client.a.infer([[5.0]], sequence_id=7)
        (peer,) = server.peers()
        assert server.answered == [(peer, 1.0)] and server.refused == [(peer, 5.0)]


def test_another_unavailable_is_not_sent_again() -> None:
    with stopping_server("Server not ready") as server, TritonClient(server.url, configs=CONFIG) as client:
        client.a.run([1.0])
        with pytest.raises(InferenceServerException, match="Server not ready"):
            client.a.run([5.0])
        (peer,) = server.peers()
        assert server.answered == [(peer, 1.0)] and server.refused == [(peer, 5.0)]
