"""TritonClient over HTTP: an inference sent on a kept-alive connection that the server closes under
it, unanswered (as tritonserver closes its connections when it exits: a pod leaving), is asked again
once on a new connection and answered; a sequence's step is not sent again. A real HTTP server on
loopback, and tritonclient's own HTTP clients (geventhttpclient, and aiohttp for asyncio)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from geventhttpclient.response import HTTPConnectionClosed

from triton_operator.client import TritonClient

CONFIG = {
    "a": {
        "maxBatchSize": 0,
        "input": [{"name": "X", "dataType": "TYPE_FP32", "dims": ["1"]}],
        "output": [{"name": "Y", "dataType": "TYPE_FP32", "dims": ["1"]}],
    }
}


@dataclass
class Server:
    """Answers each connection's first inference (the connection kept open, as HTTP/1.1 does) and
    closes the connection under its next one, unanswered: as tritonserver closes its connections when
    it exits (a pod leaving) while a client sends on one."""

    port: int = 0
    answered: list[float] = field(default_factory=list)
    dropped: list[float] = field(default_factory=list)
    connections: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _read_request(conn: socket.socket) -> float | None:
    """The value of a KServe v2 inference's one FP32 input (tritonclient sends it binary, after the
    JSON header of Inference-Header-Content-Length bytes); None when the connection closed first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    fields = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:])
    fields = {k.strip().lower(): v.strip() for k, v in fields.items()}
    while len(body) < int(fields[b"content-length"]):
        body += conn.recv(65536)
    size = int(fields.get(b"inference-header-content-length", len(body)))
    request = json.loads(body[:size])
    if size < len(body):
        (value,) = struct.unpack("<f", body[size : size + 4])
        return float(value)
    return float(request["inputs"][0]["data"][0])


@contextlib.contextmanager
def closing_server() -> Iterator[Server]:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    server = Server(port=listener.getsockname()[1])
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            server.connections += 1
            with conn:
                got = _read_request(conn)
                if got is None:
                    continue
                server.answered.append(got)
                answer = json.dumps(
                    {
                        "model_name": "a",
                        "outputs": [{"name": "Y", "datatype": "FP32", "shape": [1], "data": [got + 1]}],
                    }
                ).encode()
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(answer)}\r\n\r\n".encode()
                    + answer
                )
                got = _read_request(conn)
                if got is not None:
                    server.dropped.append(got)
                conn.shutdown(socket.SHUT_RDWR)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def test_an_inference_on_a_connection_closed_under_it_is_asked_again() -> None:
    with closing_server() as server, TritonClient(server.url, configs=CONFIG) as client:
        assert float(client.a.run([1.0]).as_numpy("Y")[0]) == 2.0
        # sent on the kept-alive connection, which the server closes unanswered: asked again on a
        # new connection, and answered there
        assert float(client.a.run([5.0]).as_numpy("Y")[0]) == 6.0
        assert server.dropped == [5.0] and server.answered == [1.0, 5.0], server
        assert server.connections == 2


def test_an_asyncio_inference_on_a_connection_closed_under_it_is_asked_again() -> None:
    async def run() -> list[float]:
        async with TritonClient(server.url, configs=CONFIG) as client:
            first = await client.a.async_run([1.0])
            second = await client.a.async_run([5.0])
            return [float(first.as_numpy("Y")[0]), float(second.as_numpy("Y")[0])]

    with closing_server() as server:
        assert asyncio.run(run()) == [2.0, 6.0]
        assert server.dropped == [5.0] and server.answered == [1.0, 5.0], server


def test_a_sequence_step_is_not_sent_again() -> None:
    with closing_server() as server, TritonClient(server.url, configs=CONFIG) as client:
        client.a.infer([[1.0]], sequence_id=7, sequence_start=True)
        with pytest.raises((HTTPConnectionClosed, ConnectionResetError, BrokenPipeError)):
            client.a.infer([[5.0]], sequence_id=7)
        assert server.dropped == [5.0] and server.answered == [1.0], server
