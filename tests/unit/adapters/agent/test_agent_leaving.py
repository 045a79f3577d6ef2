"""`triton-operator leave` (adapters/agent/leaving.py): a leaving pool pod waits the drain, then while a
model it holds READY is answered through its Service by itself alone, at most --seconds; then it writes the
word tritonserver's preStop waits on. Fake answers on a fake clock, then real HTTP on loopback."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from triton_operator.adapters.agent.leaving import (
    LeaveOptions,
    ask,
    leave,
    look,
    pod_name,
    service_url,
)
from triton_operator.core.objects.names import POD_NAME_ENV
from triton_operator.core.pool.assignment import Copy, PodAssignment, Wanted, build_assignment, build_report

AGENT = "http://127.0.0.1:8009"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def options(
    tmp_path: Path, services: dict[str, str], *, after: float = 2.0, seconds: float = 60.0
) -> LeaveOptions:
    assignment = PodAssignment(models={m: Wanted("v1") for m in services}, services=services)
    path = tmp_path / "pool-models"
    path.write_text(build_assignment(assignment))
    return LeaveOptions(agent=AGENT, assignment=path, done=tmp_path / "done", after=after, seconds=seconds)


def asker(
    clock: Clock, local: dict[str, Copy], answers: Callable[[str, float], str | None]
) -> Callable[[str], Any]:
    """The pod's own agent reports ``local``; a Service at address A answers as pod answers(A, now)."""

    def ask_(url: str) -> Any:
        if url.startswith(AGENT):
            return build_report(local, pod="me")
        address = url.split("//", 1)[1].split(":", 1)[0]
        pod = answers(address, clock.now)
        return None if pod is None else build_report({}, pod=pod)

    return ask_


def test_it_waits_while_its_models_only_copy_is_its_own_then_stops_once_another_pod_answers(
    tmp_path: Path,
) -> None:
    clock = Clock()
    opts = options(tmp_path, {"a": "10.96.0.1", "b": "10.96.0.2", "c": "10.96.0.3"})
    local = {m: Copy("READY", "v1") for m in "abc"}
    # a answered elsewhere at once; b by this pod until t=9; c by this pod until t=14, then nobody.
    moved = {"10.96.0.1": 0.0, "10.96.0.2": 9.0, "10.96.0.3": 14.0}
    after = {"10.96.0.1": "other", "10.96.0.2": "other", "10.96.0.3": None}

    def answers(address: str, now: float) -> str | None:
        return "me" if now < moved[address] else after[address]

    left = leave(opts, pod="me", asker=asker(clock, local, answers), clock=clock, sleep=clock.sleep)
    assert left == []
    assert clock.slept[0] == 2.0  # the drain, always
    assert clock.now == 14.0  # until the last model answered elsewhere, not longer
    assert (tmp_path / "done").read_text() == "done\n"


def test_it_leaves_at_the_bound_naming_what_it_still_served(tmp_path: Path) -> None:
    clock = Clock()
    opts = options(tmp_path, {"a": "10.96.0.1"}, after=2.0, seconds=10.0)
    left = leave(
        opts,
        pod="me",
        asker=asker(clock, {"a": Copy("READY", "v1")}, lambda _a, _n: "me"),
        clock=clock,
        sleep=clock.sleep,
    )
    assert left == ["a"]
    assert clock.now == 12.0  # drain + leaveSeconds, no more
    assert (tmp_path / "done").exists()


def test_it_says_who_answered_each_time_that_changes_and_how_the_wait_ended(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    opts = options(tmp_path, {"a": "10.96.0.1", "b": "10.96.0.2"}, after=2.0, seconds=10.0)
    local = {m: Copy("READY", "v1") for m in "ab"}

    def answers(address: str, now: float) -> str | None:
        return "me" if address == "10.96.0.1" or now < 5.0 else "other"

    with caplog.at_level("INFO", logger="triton_operator.agent"):
        left = leave(opts, pod="me", asker=asker(clock, local, answers), clock=clock, sleep=clock.sleep)
    assert left == ["a"]
    said = [r.getMessage() for r in caplog.records]
    assert said[0].startswith("leave: pod me leaves: the drain (2s), then at most 10s")
    assert said[1:3] == [
        "leave: after 2.0s: a by this pod, b by this pod",
        "leave: after 5.0s: a by this pod, b by other",  # said again only once the answers changed
    ]
    assert said[3] == (
        "leave: the bound is over (10s after the drain): a still served by this pod alone; leaving anyway"
    )
    assert len(said) == 4


def test_without_a_wait_it_serves_the_drain_alone(tmp_path: Path) -> None:
    clock = Clock()
    opts = options(tmp_path, {"a": "10.96.0.1"}, after=5.0, seconds=0.0)
    called: list[str] = []

    def ask_(url: str) -> Any:
        called.append(url)
        return None

    assert leave(opts, pod="me", asker=ask_, clock=clock, sleep=clock.sleep) == []
    assert (clock.now, called) == (5.0, [])
    assert (tmp_path / "done").exists()


def test_a_model_not_ready_here_or_without_an_address_is_not_waited_on(tmp_path: Path) -> None:
    clock = Clock()
    opts = options(tmp_path, {"a": "10.96.0.1"})
    local = {"a": Copy("LOADING", "v1"), "z": Copy("READY", "v1")}  # z: no address in the assignment
    assert look(opts, "me", asker(clock, local, lambda _a, _n: "me")).waiting == []


def test_a_bad_assignment_file_waits_on_nothing(tmp_path: Path) -> None:
    clock = Clock()
    opts = options(tmp_path, {"a": "10.96.0.1"})
    opts.assignment.write_text('{"services": {"a": "nope"}}')
    assert look(opts, "me", asker(clock, {"a": Copy("READY", "v1")}, lambda _a, _n: "me")).waiting == []


def test_the_service_url_brackets_an_ipv6_address() -> None:
    assert service_url("10.96.0.1") == "http://10.96.0.1:8009/v1/pool"
    assert service_url("fd00::1") == "http://[fd00::1]:8009/v1/pool"


class Answering:
    """A real agent-like server on loopback: /v1/pool reports model a READY, named as ``pod``."""

    def __init__(self) -> None:
        self.pod = "me"
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's name
                body = json.dumps(build_report({"a": Copy("READY", "v1")}, pod=outer.pod)).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def answering() -> Iterator[Answering]:
    server = Answering()
    yield server
    server.server.shutdown()
    server.server.server_close()


def test_over_real_http_it_tells_which_pod_answered(tmp_path: Path, answering: Answering) -> None:
    base = options(tmp_path, {"a": "127.0.0.1"})
    opts = LeaveOptions(
        agent=f"http://127.0.0.1:{answering.port}",
        assignment=base.assignment,
        done=base.done,
        after=0.0,
        seconds=5.0,
        interval=0.1,
        port=answering.port,
    )
    assert look(opts, "me", ask).waiting == ["a"]  # the "Service" answered as this very pod
    answering.pod = "other"
    assert look(opts, "me", ask).waiting == []  # now another pod answers it


def test_over_real_http_nobody_answering_is_none(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens there once closed
    assert ask(f"http://127.0.0.1:{port}/v1/pool", timeout=0.5) is None


def test_the_pod_name_comes_from_the_downward_api_else_the_host_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(POD_NAME_ENV, "pool-abc-1")
    assert pod_name() == "pool-abc-1"
    monkeypatch.delenv(POD_NAME_ENV)
    assert pod_name() == os.uname().nodename
