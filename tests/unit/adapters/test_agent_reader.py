"""adapters.agent_reader: each read of a pod's agent is bounded (time, bytes, allowed IPs), and what it
cannot read is said, never raised. The agents are stand-ins (a stdlib HTTP server on loopback
addresses, one behaviour per address): the real agent runs in the e2e tests."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from triton_operator.adapters.agent_reader import AgentReader
from triton_operator.core.rollout.inplace import AgentStatus

GOOD = {
    "base": "a",
    "revision": "b",
    "target": "b",
    "state": "Applied",
    "message": "",
    "models": {"m": "READY"},
}


class Agents:
    def __init__(self) -> None:
        self.release = threading.Event()
        agents = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                ip = self.connection.getsockname()[0]
                if ip == "127.0.0.3":  # no answer while the test reads (a reader with no timeout: 10 s)
                    agents.release.wait(10)
                body = {
                    "127.0.0.2": json.dumps(GOOD).encode(),
                    "127.0.0.3": b"{}",
                    "127.0.0.4": b"x" * 300_000,
                    "127.0.0.5": b"not json",
                }.get(ip, b"")
                self.send_response(404 if ip == "127.0.0.6" or self.path != "/v1/inplace" else 200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def agents() -> Iterator[Agents]:
    running = Agents()
    yield running
    running.release.set()
    running.server.shutdown()
    running.server.server_close()


async def test_each_read_is_bounded_and_says_why_it_failed(agents: Agents) -> None:
    reader = AgentReader(port=agents.port, timeout=2.0)  # the good answers come within it, loaded or not
    started = time.monotonic()
    try:
        got = await reader.read(
            {
                "good": "127.0.0.2",
                "slow": "127.0.0.3",
                "huge": "127.0.0.4",
                "garbled": "127.0.0.5",
                "missing": "127.0.0.6",
                "no-ip": None,
            }
        )
    finally:
        await reader.close()
    assert time.monotonic() - started < 2.0 + 3.0  # in parallel, each within its timeout (not the 10 s)
    assert got["good"] == AgentStatus(revision="b", target="b", state="Applied", models={"m": "READY"})
    assert got["slow"].error == "no complete answer within 2s"
    assert got["huge"].error == "answer larger than 262144 bytes"
    assert got["garbled"].error == "not JSON"
    assert got["missing"].error == "HTTP 404"
    assert got["no-ip"].error is not None


async def test_only_pod_ips_in_the_allowed_ranges_are_read(agents: Agents) -> None:
    reader = AgentReader(port=agents.port, cidrs=["10.0.0.0/8"])
    try:
        got = await reader.read({"good": "127.0.0.2"})
    finally:
        await reader.close()
    assert got["good"].error == "no pod IP, or one outside the allowed ranges"
    assert reader.requests == 0
