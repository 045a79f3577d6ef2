"""The agent's status server (GET /v1/inplace on a real loopback socket) and Triton's model control
when no tritonserver answers."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from triton_operator.adapters.agent.model_control import ModelControl, TritonUnreachable
from triton_operator.adapters.agent.processes import python_stubs, stub_instances, tritonserver_running
from triton_operator.adapters.agent.status import StatusServer, parse_listen
from triton_operator.core.objects.names import AGENT_READY_PATH, AGENT_STATUS_PATH


@pytest.fixture
def served() -> Iterator[tuple[StatusServer, list[dict[str, Any]]]]:
    states: list[dict[str, Any]] = [{"state": "Applying", "revision": "r1"}]
    server = StatusServer("127.0.0.1:0", lambda: states[-1]).start()
    yield server, states
    server.stop()


def get(port: int, path: str) -> tuple[int, dict[str, Any], str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, json.loads(reply.read()), reply.headers["Content-Type"]
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), exc.headers["Content-Type"]


def test_the_status_is_the_latest_snapshot_as_json(served: tuple[StatusServer, list[dict[str, Any]]]) -> None:
    server, states = served
    assert get(server.port, AGENT_STATUS_PATH) == (
        200,
        {"state": "Applying", "revision": "r1"},
        "application/json",
    )
    states.append({"state": "Applied", "revision": "r2"})
    assert get(server.port, AGENT_STATUS_PATH + "?x=1")[1] == {"state": "Applied", "revision": "r2"}


@pytest.mark.parametrize("path", ["/", "/v1/inplace/x", "/v2/health/ready"])
def test_other_paths_are_not_found(served: tuple[StatusServer, list[dict[str, Any]]], path: str) -> None:
    code, body, _ = get(served[0].port, path)
    assert code == 404 and AGENT_STATUS_PATH in body["error"]


def test_only_get_is_served(served: tuple[StatusServer, list[dict[str, Any]]]) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{served[0].port}{AGENT_STATUS_PATH}", data=b"{}")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=5)
    assert caught.value.code == 501


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0.0.0.0:8009", ("0.0.0.0", 8009)), ("[::]:8009", ("::", 8009)), (":8009", ("", 8009))],
)
def test_listen_addresses(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["8009", "host:", "host:port", "host:70000"])
def test_bad_listen_addresses(text: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_listen(text)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_no_tritonserver_is_not_live_and_its_calls_say_so() -> None:
    control = ModelControl(f"http://127.0.0.1:{closed_port()}", timeout=2, load_timeout=2)
    assert control.live() is False
    with pytest.raises(TritonUnreachable):
        control.load("adder")
    with pytest.raises(TritonUnreachable):
        control.index()


def test_a_silent_tritonserver_times_out() -> None:
    """A socket that accepts and never answers (a hung server): every call ends within its timeout."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        control = ModelControl(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout=0.5, load_timeout=0.5)
        with pytest.raises(TritonUnreachable, match="timed out"):
            control.load("adder")
        assert control.live() is False


def test_the_readiness_is_200_only_when_ready_and_503_with_the_reason() -> None:
    answers: list[tuple[bool, dict[str, Any]]] = [(False, {"ready": False, "reason": "draining"})]
    server = StatusServer("127.0.0.1:0", lambda: {}, lambda: answers[-1]).start()
    try:
        assert get(server.port, AGENT_READY_PATH)[:2] == (503, {"ready": False, "reason": "draining"})
        answers.append((True, {"ready": True, "reason": "every model of revision r1 is READY"}))
        assert get(server.port, AGENT_READY_PATH)[0] == 200
    finally:
        server.stop()


def test_the_stub_processes_of_each_model_from_proc(tmp_path: Path) -> None:
    """Live stubs by model (argv[1]: its model.py under the repository); zombies, other processes and
    other repositories are not counted."""

    def process(pid: int, argv: list[str], state: str = "S") -> None:
        folder = tmp_path / "proc" / str(pid)
        folder.mkdir(parents=True)
        (folder / "cmdline").write_bytes("\0".join(argv).encode() + b"\0")
        (folder / "stat").write_text(f"{pid} (triton_python_b) {state} 1 2 3")

    stub = "/opt/tritonserver/backends/python/triton_python_backend_stub"
    process(
        10, [stub, "/models/adder/1/model.py", "shm", "1048576", "1048576", "7", "/b", "336", "adder_0_0"]
    )
    process(
        11, [stub, "/models/adder/1/model.py", "shm", "1048576", "1048576", "7", "/b", "336", "adder_0_1"]
    )
    process(12, [stub, "/models/other/1/model.py"], state="Z")
    process(13, [stub, "/elsewhere/x/1/model.py"])
    process(14, ["tritonserver", "--model-repository=/models"])
    (tmp_path / "proc" / "self").mkdir()
    assert python_stubs(Path("/models"), tmp_path / "proc") == {"adder": 2}
    assert stub_instances(Path("/models"), tmp_path / "proc") == {"adder": {"adder_0_0", "adder_0_1"}}
    assert python_stubs(Path("/models"), tmp_path / "nothing") == {}


def test_a_tritonserver_process_over_the_models_folder_from_proc(tmp_path: Path) -> None:
    """tritonserver's own process over /models (either spelling of its repository flag, a trailing
    slash); a zombie, another repository, another program or an unreadable /proc is none."""

    def proc(name: str, processes: dict[int, tuple[list[str], str]]) -> Path:
        root = tmp_path / name
        for pid, (argv, state) in processes.items():
            (root / str(pid)).mkdir(parents=True)
            (root / str(pid) / "cmdline").write_bytes("\0".join(argv).encode() + b"\0")
            (root / str(pid) / "stat").write_text(f"{pid} (tritonserver) {state} 1 2 3")
        root.mkdir(exist_ok=True)
        return root

    server = "/opt/tritonserver/bin/tritonserver"
    running = {
        "equals": proc("a", {5: ([server, "--load-model=*", "--model-repository=/models"], "S")}),
        "apart": proc("b", {5: ([server, "--model-repository", "/models/"], "R")}),
        "store": proc("c", {5: (["tritonserver", "--model-store=/models"], "S")}),
    }
    for name, root in running.items():
        assert tritonserver_running(Path("/models"), root), name
    idle = {
        "zombie": proc("d", {5: ([server, "--model-repository=/models"], "Z")}),
        "elsewhere": proc("e", {5: ([server, "--model-repository=/other"], "S")}),
        "other program": proc("f", {5: (["python", "tritonserver", "--model-repository=/models"], "S")}),
        "no flag": proc("g", {5: ([server], "S")}),
        "none": tmp_path / "nothing",
    }
    for name, root in idle.items():
        assert not tritonserver_running(Path("/models"), root), name
