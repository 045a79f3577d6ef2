"""adapters.pool_reader: the pool agents' reports read on a task of their own, each read bounded; a pod
whose agent does not answer keeps its last report, and a change calls on_change. The agents are
stand-ins (a stdlib HTTP server on loopback addresses, one behaviour per address)."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from triton_operator.adapters.pool_reader import PoolReader
from triton_operator.core.pool.assignment import Copy, build_report


class Agents:
    def __init__(self) -> None:
        self.bodies: dict[str, bytes] = {
            "127.0.0.2": json.dumps(build_report({"a": Copy("READY", "v1")})).encode(),
            "127.0.0.4": b"x" * 300_000,
            "127.0.0.5": b"not json",
        }
        self.release = threading.Event()
        agents = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                ip = self.connection.getsockname()[0]
                if ip == "127.0.0.3":  # no answer while the test reads (a reader with no timeout: 10 s)
                    agents.release.wait(10)
                body = agents.bodies.get(ip, b"{}")
                self.send_response(200 if self.path == "/v1/pool" else 404)
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


async def settle(reader: PoolReader) -> None:
    """Until the reads asked for are done (each ends within the reader's timeout; 30 s: a guard)."""
    async with asyncio.timeout(30):
        while not all(t.done() for t in reader._tasks.values()):
            await asyncio.sleep(0.01)


async def test_reports_are_read_in_the_background_and_kept_when_unreadable(agents: Agents) -> None:
    # the reader's own timeout (2 s): the good agent's answer must come within it on a loaded machine
    reader = PoolReader(port=agents.port, timeout=2.0, max_bytes=256 * 1024)
    changed: list[tuple[str, str]] = []
    reader.on_change = changed.append
    assert reader.latest("ml", "pool") == {}
    pods = {"p2": "127.0.0.2", "p3": "127.0.0.3", "p4": "127.0.0.4", "p5": "127.0.0.5", "none": None}
    reader.want("ml", "pool", pods)
    assert reader.latest("ml", "pool") == {}  # nothing waits on the read
    await settle(reader)
    assert reader.latest("ml", "pool") == {"p2": {"a": Copy("READY", "v1")}}  # slow, large, not JSON: none
    assert changed == [("ml", "pool")]
    agents.bodies["127.0.0.2"] = b"not json"  # p2's agent goes bad: its last report stays
    reader.want("ml", "pool", pods)
    await settle(reader)
    assert reader.latest("ml", "pool") == {"p2": {"a": Copy("READY", "v1")}}
    assert changed == [("ml", "pool")]  # nothing new
    reader.want("ml", "pool", {})  # no pool pods: forgotten
    assert reader.latest("ml", "pool") == {}
    await reader.close()


async def test_only_allowed_ips_are_read(agents: Agents) -> None:
    reader = PoolReader(port=agents.port, cidrs=["10.0.0.0/8"])
    reader.want("ml", "pool", {"p2": "127.0.0.2"})
    await settle(reader)
    assert reader.latest("ml", "pool") == {}
    assert reader.requests == 0
    await reader.close()
