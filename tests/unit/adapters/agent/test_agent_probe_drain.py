"""The agent drains by the kubelet's probe, not by a fixed time: with --probe-failures N it unloads a
model only once its real status server has answered the kubelet's readiness probe (User-Agent
kube-probe/...) 503 N times in a row, then --drain-seconds; other readers of /v1/ready do not count;
a probe that never comes is waited for --drain-timeout at most, said in the status and the log."""

from __future__ import annotations

import hashlib
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from triton_operator.adapters.agent.runner import Agent, AgentOptions
from triton_operator.adapters.agent.status import StatusServer
from triton_operator.core.objects.names import AGENT_READY_PATH
from triton_operator.core.pod.agent_plan import RevisionFiles
from triton_operator.core.repository.manifest import Manifest, ManifestModel, StoreRef, VersionPolicy
from triton_operator.core.vocabulary.triton_state import ModelVersionState

PY = 'name: "{m}"\nbackend: "python"\nparameters {{ key: "offset" value {{ string_value: "{o}" }} }}\n'
KUBELET = "kube-probe/1.31"


def revision(name: str, offset: int) -> RevisionFiles:
    models = (ManifestModel("adder", "adder", VersionPolicy(), ("1",)),)
    return RevisionFiles(
        name, Manifest(StoreRef("s3://bucket/repo"), models, ()), {"adder": PY.format(m="adder", o=offset)}
    )


@dataclass
class Triton:
    """Triton's model control, each unload and load with the moment it came."""

    url: str = "http://fake"
    timeout: float = 1.0
    load_timeout: float = 5.0
    loaded: dict[str, str] = field(default_factory=lambda: {"adder": "READY"})
    calls: list[tuple[float, str]] = field(default_factory=list)

    def live(self) -> bool:
        return True

    def unload(self, model: str) -> None:
        self.calls.append((time.monotonic(), f"unload {model}"))
        self.loaded[model] = "UNAVAILABLE"

    def load(self, model: str) -> None:
        self.calls.append((time.monotonic(), f"load {model}"))
        self.loaded[model] = "READY"

    def index(self) -> tuple[ModelVersionState, ...]:
        return tuple(ModelVersionState(m, "1", s, "") for m, s in sorted(self.loaded.items()))

    def ready(self, model: str, version: str = "") -> bool:
        return self.loaded.get(model) == "READY"


def sidecar(tmp_path: Path, triton: Triton, *, drain: float, timeout: float, failures: int = 2) -> Agent:
    options = AgentOptions(
        dest=tmp_path / "models",
        state_dir=tmp_path / "state",
        base=revision("r1", 0),
        triton=triton,  # type: ignore[arg-type]
        drain_seconds=drain,
        probe_failures=failures,
        drain_timeout=timeout,
        proc=tmp_path / "no-proc",
    )
    Agent(options).once()  # the init container: r1 recorded
    agent = Agent(options)
    assert agent.check().ready
    return agent


@pytest.fixture
def triton() -> Triton:
    return Triton()


def get_ready(port: int, agent: str) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{AGENT_READY_PATH}", headers={"User-Agent": agent}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def probe_closed(port: int) -> int:
    """The kubelet's probe on a connection of its own, read until the agent closes it: the status code.
    The agent frees the probe's slot before it closes the connection, so the next probe finds it free
    (a reply read by its Content-Length alone may come before that, on a loaded machine long before)."""
    head = f"GET {AGENT_READY_PATH} HTTP/1.1\r\nHost: x\r\nUser-Agent: {KUBELET}\r\n\r\n"
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(head.encode())
        while chunk := sock.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


class Caller:
    """GET /v1/ready every ``period`` s from ``start`` s on, as ``agent``: each answer and the moment its
    request was sent (the agent counted the answer after that; on a loaded machine the reply can arrive
    a tenth of a second after the agent's moment, so the time of arrival is no bound for the drain)."""

    def __init__(self, port: int, agent: str, start: float, period: float) -> None:
        self.port, self.agent, self.start, self.period = port, agent, start, period
        self.answers: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        if self.stop.wait(self.start):
            return
        while not self.stop.is_set():
            sent = time.monotonic()
            code = get_ready(self.port, self.agent)
            self.answers.append((sent, code))
            self.stop.wait(self.period)

    def __enter__(self) -> Caller:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(5)


@pytest.fixture
def served(tmp_path: Path, triton: Triton) -> Iterator[tuple[Agent, int]]:
    agent = sidecar(tmp_path, triton, drain=0.3, timeout=20)

    def ready() -> tuple[bool, dict[str, object]]:
        result = agent.ready()
        return result.ready, result.to_json()

    server = StatusServer("127.0.0.1:0", agent.status, ready, probed=agent.probe_answered).start()
    yield agent, server.port
    server.stop()


def test_a_late_probe_is_waited_for_and_other_readers_do_not_count(
    served: tuple[Agent, int], triton: Triton, caplog: pytest.LogCaptureFixture
) -> None:
    """The kubelet's first probe comes 1.5 s after the drain began (a loaded node); the operator and
    a curl read /v1/ready all along. The unload comes only after the probe's second 503, plus the
    drain; before, a fixed 0.3 s after readiness went false."""
    agent, port = served
    caplog.set_level(logging.INFO, logger="triton_operator.agent")
    began = time.monotonic()
    with (
        Caller(port, "triton-operator/0.1", start=0.0, period=0.05) as reader,
        Caller(port, "curl/8.5.0", start=0.0, period=0.07),
        Caller(port, KUBELET, start=1.5, period=0.4) as kubelet,
    ):
        agent.target = "r2"
        agent.apply(revision("r2", 10))
    touched = [(at, what) for at, what in triton.calls if what.startswith(("unload", "load"))]
    assert [what for _, what in touched] == ["unload adder", "load adder"]
    failed = [at for at, code in kubelet.answers if code == 503]
    assert len(failed) >= 2, kubelet.answers
    unloaded = touched[0][0]
    assert unloaded - began > 1.5  # not before the kubelet's probe came
    assert unloaded >= failed[1] + 0.3 - 0.05, (unloaded - began, [t - began for t in failed])
    # Every probe before the unload was answered 503 (no sooner: two of them, above); a loaded machine
    # may slip the unload past a third probe, 0.4 s after the second, which is also 503.
    before = [code for at, code in kubelet.answers if at < unloaded]
    assert len(before) >= 2 and set(before) == {503}, before
    assert sum(1 for at, code in reader.answers if code == 503 and at < unloaded) > 10  # never counted
    assert agent.status()["state"] == "Applied" and agent.check().ready
    said = [r.getMessage() for r in caplog.records]
    assert "the kubelet's readiness probe was answered 503 2 times in a row (its failureThreshold: 2)" in said


def test_a_probe_answered_ready_in_between_starts_the_count_again(served: tuple[Agent, int]) -> None:
    agent, port = served
    agent.probe_answered(False)
    assert get_ready(port, KUBELET) == 200  # the kubelet saw it ready: the 503 before no longer counts
    agent.probe_answered(False)
    assert agent._probe_out_at is None
    agent.probe_answered(False)
    assert agent._probe_out_at is not None


def test_a_probe_that_never_comes_is_waited_for_at_most_the_timeout_and_said(
    tmp_path: Path, triton: Triton, caplog: pytest.LogCaptureFixture
) -> None:
    agent = sidecar(tmp_path, triton, drain=0.2, timeout=1.0)
    messages: list[str] = []
    waited_at: list[float] = []  # the moment of each wait: the first is when waiting for the probe began
    wait = agent.options.wait

    def waiting(seconds: float) -> object:
        messages.append(agent.message)
        waited_at.append(time.monotonic())
        return wait(seconds)

    agent.options = AgentOptions(**{**agent.options.__dict__, "wait": waiting})
    began = time.monotonic()
    with caplog.at_level(logging.INFO, logger="triton_operator.agent"):
        agent.target = "r2"
        agent.apply(revision("r2", 10))
    unloaded = next(at for at, what in triton.calls if what == "unload adder")
    assert unloaded - began >= 1.0 + 0.2 - 0.05
    # at most the timeout and the drain, counted from when the wait for the probe began, not from the
    # test's start: on a loaded machine the fetch before it took up to 1.5 s. Waiting twice the
    # timeout (2.2 s) fails.
    assert unloaded - waited_at[0] < 2.0, (unloaded - began, waited_at[0] - began)
    assert any("waiting for the kubelet's readiness probe to fail 2 times (0 so far" in m for m in messages)
    bound = [m for m in messages if "within 1 s" in m]
    assert bound and "answered 503 0 of 2 times" in bound[0] and "may fail" in bound[0], messages[-3:]
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warned and "probes late or not at all" in warned[0].getMessage()
    assert agent.status()["state"] == "Applied"


def test_with_the_quick_probe_the_first_503_takes_the_pod_out(tmp_path: Path, triton: Triton) -> None:
    """What the operator renders now (core.objects.builders.readiness_timing): the kubelet probes
    every second (here from 0.2 s into the drain, and every 2 s, so that on a loaded machine too the
    second probe comes only after the unload) and takes the pod out at the first failure; the agent
    (--probe-failures 1) unloads right after that one 503 and the drain, not a period later."""
    agent = sidecar(tmp_path, triton, drain=0.3, timeout=20, failures=1)
    period = 2.0

    def ready() -> tuple[bool, dict[str, object]]:
        result = agent.ready()
        return result.ready, result.to_json()

    server = StatusServer("127.0.0.1:0", agent.status, ready, probed=agent.probe_answered).start()
    try:
        began = time.monotonic()
        with Caller(server.port, KUBELET, start=0.2, period=period) as kubelet:
            agent.target = "r2"
            agent.apply(revision("r2", 10))
    finally:
        server.stop()
    unloaded = next(at for at, what in triton.calls if what == "unload adder")
    before = [(at, code) for at, code in kubelet.answers if at < unloaded]
    assert [code for _, code in before] == [503], (unloaded - began, kubelet.answers)
    assert before[0][1] == 503 and unloaded >= before[0][0] + 0.3 - 0.05
    # one probe and the drain: the kubelet's second probe is not waited for (it is sent a period after
    # the first's answer came, and counted after it is sent, so waited for, it puts the unload at least
    # a period and the drain after the first was sent). Bound by the probe's moment, not the test's
    # start: on a loaded machine the first probe itself may come late.
    assert unloaded < before[0][0] + period + 0.3, (unloaded - began, kubelet.answers)
    assert agent.status()["state"] == "Applied" and agent.check().ready


def test_the_probe_is_answered_at_once_while_the_agent_works(served: tuple[Agent, int]) -> None:
    """A single failure takes the pod out, so a busy agent must not time the probe out: it answers from
    memory on the handler slot kept for it, while threads hash (GIL released) and run Python (GIL
    held) and every other slot is taken by a caller that sends nothing. The probe's timeout is 5 s."""
    _, port = served
    stop = threading.Event()

    def python_work() -> None:
        n = 0
        while not stop.is_set():
            n = (n * 31 + 7) % 1_000_003

    def hashing() -> None:
        data = b"x" * (8 << 20)
        while not stop.is_set():
            hashlib.sha256(data).digest()

    workers = [threading.Thread(target=f, daemon=True) for f in (python_work, python_work, hashing)]
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(16)]  # every slot, no request
    for worker in workers:
        worker.start()
    took = []
    try:
        for _ in range(20):
            at = time.monotonic()
            assert probe_closed(port) == 200
            took.append(time.monotonic() - at)
            time.sleep(0.05)
    finally:
        stop.set()
        for conn in idle:
            conn.close()
        for worker in workers:
            worker.join(5)
    # well within the probe's timeout (half of it): a round trip here takes the GIL from three busy
    # threads many times, so on a loaded machine it is slow (up to 1.2 s seen) without any fault of
    # the agent's; a probe waiting for a slot waits a head's time (5 s) or is answered 503
    assert max(took) < 2.5, took
