"""The agent's read-only HTTP: GET /v1/inplace (status), /v1/ready (readiness), /v1/pool; stdlib."""

from __future__ import annotations

import io
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from triton_operator.core.objects.names import AGENT_READY_PATH, AGENT_STATUS_PATH

logger = logging.getLogger("triton_operator.agent")

Ready = Callable[[], tuple[bool, dict[str, Any]]]
"""Whether the pod is ready, and why (the body of GET AGENT_READY_PATH)."""
Probed = Callable[[bool], None]
"""Told each answer to the kubelet's readiness probe (True: 200, False: 503), just before it is sent."""

PROBE_AGENT = "kube-probe/"
"""How the kubelet's HTTP probes name themselves (User-Agent: kube-probe/<major>.<minor>)."""
HEAD_LIMIT = 8192
"""The most bytes of a request's line and headers the agent reads; a longer head is answered 431."""


@dataclass(frozen=True)
class Limits:
    """What one caller can hold of the agent's port: ``connections`` handler slots (one connection
    each, one request a connection), plus one kept for the kubelet's readiness probe; a connection
    beyond them is answered 503 at once. A request's head must arrive whole within ``head_seconds``
    and HEAD_LIMIT bytes."""

    connections: int = 16
    head_seconds: float = 5.0

    def __post_init__(self) -> None:
        if not 1 <= self.connections <= 1024:
            raise ValueError(f"connections: {self.connections} is not from 1 to 1024")
        if not 0.05 <= self.head_seconds <= 60:
            raise ValueError(f"head_seconds: {self.head_seconds:g} is not from 0.05 to 60")


PROBE_HEAD_SECONDS = 1.0
"""How long the slot kept for the probe waits for a request's head (the kubelet sends it at once)."""


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::]:8009`` for IPv6, ``:8009`` for every address) as (host, port).

    >>> parse_listen("0.0.0.0:8009"), parse_listen("[::]:8009"), parse_listen(":8009")
    (('0.0.0.0', 8009), ('::', 8009), ('', 8009))
    """
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def _canned(code: int, reason: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body, sort_keys=True).encode()
    head = (
        f"HTTP/1.0 {code} {reason}\r\nServer: triton-operator-agent\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + data


class _Server(HTTPServer):
    """An HTTPServer with at most ``limits.connections`` handler threads, and one more kept for the
    kubelet's probe: a connection that finds them all taken is answered 503 at once, from the
    accepting thread, without a read."""

    request_queue_size = 16
    allow_reuse_address = True

    def __init__(
        self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], limits: Limits
    ) -> None:
        super().__init__(address, handler)
        self.limits = limits
        self._slots = threading.BoundedSemaphore(limits.connections)
        self._probe_slot = threading.BoundedSemaphore(1)
        self.busy = _canned(
            503,
            "Service Unavailable",
            {"error": f"busy: {limits.connections} connections open; try again"},
        )

    def process_request(self, request: Any, client_address: Any) -> None:  # socketserver's name
        if self._slots.acquire(blocking=False):
            slot, probe_only = self._slots, False
        elif self._probe_slot.acquire(blocking=False):
            slot, probe_only = self._probe_slot, True
        else:
            self._refuse(request)
            return
        thread = threading.Thread(
            target=self._work,
            args=(request, client_address, slot, probe_only),
            name="agent-http",
            daemon=True,
        )
        thread.start()

    def _work(
        self, request: Any, client_address: Any, slot: threading.BoundedSemaphore, probe_only: bool
    ) -> None:
        try:
            handler: Any = self.RequestHandlerClass
            handler(request, client_address, self, probe_only=probe_only)
        except OSError:
            pass  # the peer left mid-answer: nothing to tell anyone
        except Exception:  # a bug: said, and the connection closed
            logger.exception("answering %s failed", client_address)
        finally:
            # The slot is free before the peer sees the connection close: a caller that asks again
            # at once (a probe right after a probe) finds it free, not "busy".
            slot.release()
            self.shutdown_request(request)

    def _refuse(self, request: socket.socket) -> None:
        try:
            request.setblocking(False)
            request.send(self.busy)
        except OSError:
            pass
        self.shutdown_request(request)


class _Server6(_Server):
    address_family = socket.AF_INET6


POOL_PATH = "/v1/pool"
"""A pooled pod's report (adapters.agent.pool_member; read by adapters.pool_reader)."""


def _read_head(sock: socket.socket, seconds: float) -> bytes | None:
    """A request's line and headers, read within ``seconds`` and HEAD_LIMIT bytes: b"" when it took
    longer or the peer left, None when it is longer."""
    deadline = time.monotonic() + seconds
    data = b""
    while b"\r\n\r\n" not in data and b"\n\n" not in data:
        if len(data) > HEAD_LIMIT:
            return None
        left = deadline - time.monotonic()
        if left <= 0:
            return b""
        sock.settimeout(left)
        try:
            chunk = sock.recv(4096)
        except OSError:
            return b""
        if not chunk:
            return b""
        data += chunk
    end = data.find(b"\r\n\r\n")
    end = end + 4 if end >= 0 else data.find(b"\n\n") + 2
    return data[:end] if end <= HEAD_LIMIT else None


def _handler(
    status: Callable[[], dict[str, Any]],
    ready: Ready | None,
    pool: Callable[[], dict[str, Any]] | None,
    probed: Probed | None,
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "triton-operator-agent"
        server: _Server

        def __init__(
            self, request: Any, client_address: Any, server: Any, *, probe_only: bool = False
        ) -> None:
            self.probe_only = probe_only
            self.head: bytes | None = b""
            super().__init__(request, client_address, server)

        def setup(self) -> None:
            super().setup()
            limits = self.server.limits
            seconds = min(limits.head_seconds, PROBE_HEAD_SECONDS) if self.probe_only else limits.head_seconds
            self.head = _read_head(self.connection, seconds)
            self.connection.settimeout(limits.head_seconds)  # the answer's writes
            self.rfile = io.BytesIO(self.head or b"")

        def handle(self) -> None:
            if self.head is None:
                self.wfile.write(
                    _canned(
                        431,
                        "Request Header Fields Too Large",
                        {"error": f"a request head over {HEAD_LIMIT} bytes"},
                    )
                )
                return
            if self.head:
                self.close_connection = True
                self.handle_one_request()

        def do_GET(self) -> None:  # http.server's name
            path = self.path.split("?", 1)[0]
            probe = path == AGENT_READY_PATH and self.headers.get("User-Agent", "").startswith(PROBE_AGENT)
            if self.probe_only and not probe:
                self.wfile.write(self.server.busy)
                return
            if path == AGENT_READY_PATH and ready is not None:
                ok, body = ready()
                if probe and probed is not None:
                    probed(ok)  # before it is sent: counted no later than the kubelet counts it
                self._send(200 if ok else 503, body)
                return
            if path == POOL_PATH and pool is not None:
                self._send(200, pool())
                return
            if path != AGENT_STATUS_PATH:
                self._send(404, {"error": f"not found; the status is at {AGENT_STATUS_PATH}"})
                return
            self._send(200, status())

        def _send(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body, sort_keys=True).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return  # the operator polls every second: no log line a request

    return Handler


class StatusServer:
    """Serves ``status()`` (a JSON-able dict, built fresh on each request) at GET AGENT_STATUS_PATH
    and, when given, ``ready()`` at GET AGENT_READY_PATH (200 when ready, else 503; each answer to
    the kubelet's probe told to ``probed``) and ``pool()`` at GET POOL_PATH, within ``limits``."""

    def __init__(
        self,
        listen: str,
        status: Callable[[], dict[str, Any]],
        ready: Ready | None = None,
        pool: Callable[[], dict[str, Any]] | None = None,
        *,
        probed: Probed | None = None,
        limits: Limits | None = None,
    ) -> None:
        host, port = parse_listen(listen)
        server = _Server6 if ":" in host else _Server
        self._server = server((host, port), _handler(status, ready, pool, probed), limits or Limits())
        self._thread = threading.Thread(target=self._server.serve_forever, name="agent-status", daemon=True)

    @property
    def port(self) -> int:
        port: int = self._server.server_address[1]
        return port

    def start(self) -> StatusServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
