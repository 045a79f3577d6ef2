"""The agent's read-only HTTP: GET /v1/inplace (status), /v1/ready (readiness), /v1/pool; stdlib."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from triton_operator.core.objects.names import AGENT_READY_PATH, AGENT_STATUS_PATH

Ready = Callable[[], tuple[bool, dict[str, Any]]]
"""Whether the pod is ready, and why (the body of GET AGENT_READY_PATH)."""


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::]:8009`` for IPv6, ``:8009`` for every address) as (host, port).

    >>> parse_listen("0.0.0.0:8009"), parse_listen("[::]:8009"), parse_listen(":8009")
    (('0.0.0.0', 8009), ('::', 8009), ('', 8009))
    """
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 16


class _Server6(_Server):
    address_family = socket.AF_INET6


POOL_PATH = "/v1/pool"
"""A pooled pod's report (adapters.agent.pool_member; read by adapters.pool_reader)."""


def _handler(
    status: Callable[[], dict[str, Any]], ready: Ready | None, pool: Callable[[], dict[str, Any]] | None
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "triton-operator-agent"
        timeout = 10  # a client that sends nothing is let go

        def do_GET(self) -> None:  # http.server's name
            path = self.path.split("?", 1)[0]
            if path == AGENT_READY_PATH and ready is not None:
                ok, body = ready()
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

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return  # the operator polls every second: no log line a request

    return Handler


class StatusServer:
    """Serves ``status()`` (a JSON-able dict, built fresh on each request) at GET AGENT_STATUS_PATH
    and, when given, ``ready()`` at GET AGENT_READY_PATH (200 when ready, else 503) and ``pool()`` at
    GET POOL_PATH."""

    def __init__(
        self,
        listen: str,
        status: Callable[[], dict[str, Any]],
        ready: Ready | None = None,
        pool: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        host, port = parse_listen(listen)
        server = _Server6 if ":" in host else _Server
        self._server = server((host, port), _handler(status, ready, pool))
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
