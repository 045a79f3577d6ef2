"""The agent's port is bounded (a real server on loopback): --max-connections handler slots and one
kept for the kubelet's probe, a connection beyond them answered 503 at once, a request's head
bounded in bytes and in time; N+10 slow connections held open neither make the pod unready nor grow
its threads; a bad setting stops the command, naming it."""

from __future__ import annotations

import argparse
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from triton_operator.adapters.agent.status import HEAD_LIMIT, Limits, StatusServer
from triton_operator.commands import agent as agent_command
from triton_operator.core.objects.names import AGENT_READY_PATH, AGENT_STATUS_PATH

SLOTS = 4
PROBE = (
    f"GET {AGENT_READY_PATH} HTTP/1.1\r\nHost: 10.0.0.7:8009\r\nUser-Agent: kube-probe/1.31\r\n"
    "Accept: */*\r\n\r\n"
)
STATUS = f"GET {AGENT_STATUS_PATH} HTTP/1.1\r\nHost: x\r\nUser-Agent: triton-operator\r\n\r\n"


@pytest.fixture
def server() -> Iterator[tuple[StatusServer, list[bool]]]:
    probed: list[bool] = []
    served = StatusServer(
        "127.0.0.1:0",
        lambda: {"state": "Applied"},
        lambda: (True, {"ready": True}),
        probed=probed.append,
        limits=Limits(connections=SLOTS, head_seconds=3.0),
    ).start()
    yield served, probed
    served.stop()


def ask(port: int, request: str | bytes, timeout: float = 5.0) -> tuple[bytes, float]:
    """Send ``request`` on a new connection: the whole answer and the seconds it took."""
    began = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request.encode() if isinstance(request, str) else request)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    return answer, time.monotonic() - began


def status_code(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0


def slow(port: int, count: int) -> list[socket.socket]:
    """``count`` connections that send half a request line and then nothing."""
    held = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(b"GET /v1/inpl")
        held.append(sock)
    return held


def test_slow_connections_beyond_the_slots_leave_the_probe_answered_and_the_threads_bounded(
    server: tuple[StatusServer, list[bool]],
) -> None:
    served, probed = server
    threads = threading.active_count()
    held = slow(served.port, SLOTS + 10)
    try:
        time.sleep(0.3)
        # the slots and the one kept for the probe: no more threads than that, whatever is held
        assert threading.active_count() <= threads + SLOTS + 1
        # past the kept slot's head time (1 s) the slow caller holding it is let go: on a busy
        # machine that may come late, so wait (at most 3 s) for the first probe answered 200
        deadline = time.monotonic() + 3.0
        time.sleep(1.0)
        while status_code(ask(served.port, PROBE)[0]) != 200:
            assert time.monotonic() < deadline, "the kept slot was never let go"
            time.sleep(0.1)
        probed.clear()
        # from then on the kubelet's probe is answered at once, every time
        for _ in range(3):
            answer, took = ask(served.port, PROBE)
            assert status_code(answer) == 200 and b'"ready": true' in answer, answer
            assert took < 1.5
        assert probed == [True, True, True]
        # any other request meanwhile: 503 at once (the kept slot answers only the probe)
        answer, took = ask(served.port, STATUS)
        assert status_code(answer) == 503 and b"busy: 4 connections open" in answer, answer
        assert took < 1.5
        # the connections beyond the slots were answered 503 at once and closed, without a read
        refused = 0
        for sock in held[SLOTS:]:
            sock.settimeout(2)
            with contextlib.suppress(OSError):
                refused += b" 503 " in sock.recv(4096)
        assert refused >= 9
        assert threading.active_count() <= threads + SLOTS + 1
    finally:
        for sock in held:
            sock.close()


def test_a_head_that_never_ends_is_let_go_and_its_slot_serves_again(
    server: tuple[StatusServer, list[bool]],
) -> None:
    """Every slot held by a caller that sends a byte a second (each read within the old 10 s idle
    time): each is closed when its head is not whole within --header-seconds (3 s)."""
    served, _ = server
    held = slow(served.port, SLOTS)
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(0.5):
            for sock in held:
                with contextlib.suppress(OSError):
                    sock.send(b"x")

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        time.sleep(0.3)
        assert status_code(ask(served.port, STATUS)[0]) == 503  # the slots taken
        closed_at = []
        began = time.monotonic()
        for sock in held:
            sock.settimeout(6)
            try:
                while sock.recv(4096):
                    pass
            except OSError:
                pass
            closed_at.append(time.monotonic() - began)
        assert max(closed_at) < 5.0, closed_at
        answer = ask(served.port, STATUS)[0]
        assert status_code(answer) == 200 and b'"state": "Applied"' in answer
    finally:
        stop.set()
        thread.join(2)
        for sock in held:
            sock.close()


def test_a_head_over_the_limit_is_refused(server: tuple[StatusServer, list[bool]]) -> None:
    served, _ = server
    request = f"GET {AGENT_STATUS_PATH} HTTP/1.1\r\nX-Big: {'a' * HEAD_LIMIT}\r\n\r\n".encode()
    assert status_code(ask(served.port, request)[0]) == 431
    assert status_code(ask(served.port, STATUS)[0]) == 200  # its slot is free again


def test_the_probe_counts_only_the_kubelets_readiness_requests(
    server: tuple[StatusServer, list[bool]],
) -> None:
    served, probed = server
    assert status_code(ask(served.port, PROBE.replace("kube-probe/1.31", "curl/8.5.0"))[0]) == 200
    assert status_code(ask(served.port, STATUS.replace("triton-operator", "kube-probe/1.31"))[0]) == 200
    assert probed == []
    assert status_code(ask(served.port, PROBE)[0]) == 200
    assert probed == [True]


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--max-connections", "0"),
        ("--max-connections", "many"),
        ("--max-connections", "2000"),
        ("--header-seconds", "0"),
        ("--header-seconds", "soon"),
        ("--probe-failures", "-1"),
        ("--drain-timeout", "0"),
    ],
)
def test_a_bad_setting_stops_the_agent_naming_it(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser(prog="triton-operator")
    agent_command.register(parser.add_subparsers())
    args = ["agent", "--manifest", "m.json", "--configs", "c", "--base-revision", "r1", flag, value]
    with pytest.raises(SystemExit) as stopped:
        parser.parse_args(args)
    assert stopped.value.code == 2
    said = capsys.readouterr().err
    assert f"argument {flag}: {value!r} must be" in said, said


@pytest.mark.parametrize(("field", "value"), [("connections", 0), ("head_seconds", 0.0)])
def test_limits_out_of_range_name_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"^{field}: "):
        Limits(**{field: value})
