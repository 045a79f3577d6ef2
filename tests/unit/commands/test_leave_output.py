"""`triton-operator leave` run as the kubelet runs a preStop: its lines reach the agent's own stdout
(/proc/<pid>/fd/1, the container's log), else its own stderr, as a separate process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from testkit import free_port
from triton_operator.core.pool.assignment import Copy, PodAssignment, Wanted, build_assignment, build_report


@pytest.fixture
def agent() -> Iterator[str]:
    """The pod's own agent on loopback: it reports model a READY, named as pod "me"."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server's name
            body = json.dumps(build_report({"a": Copy("READY", "v1")}, pod="me")).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def leave(tmp_path: Path, agent: str, *extra: str) -> subprocess.CompletedProcess[str]:
    # Model a's Service is a loopback port where nothing listens (refused): nobody answers.
    assignment = tmp_path / "pool-models"
    assignment.write_text(build_assignment(PodAssignment({"a": Wanted("v1")}, services={"a": "127.0.0.1"})))
    command = [sys.executable, "-m", "triton_operator.cli", "leave", "--after", "0", "--seconds", "5"]
    command += ["--port", str(free_port())]
    command += ["--interval", "0.1", "--agent", agent, "--assignment", str(assignment)]
    command += ["--done", str(tmp_path / "done"), *extra]
    env = {**os.environ, "TRITON_OPERATOR_POD_NAME": "me", "TRITON_OPERATOR_LOG_FORMAT": "text"}
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, check=False)


def test_its_lines_go_to_the_agent_process_stdout(tmp_path: Path, agent: str) -> None:
    log = tmp_path / "container.log"
    with log.open("w") as out:  # the agent container's main process, whose stdout is the container's log
        main = subprocess.Popen(["sleep", "60"], stdout=out)
    try:
        (tmp_path / "agent.pid").write_text(f"{main.pid}\n")
        done = leave(tmp_path, agent, "--pid-file", str(tmp_path / "agent.pid"))
    finally:
        main.kill()
        main.wait()
    assert done.returncode == 0, done.stderr
    lines = log.read_text()
    assert "leave: pod me leaves: the drain (0s), then at most 5s" in lines
    assert "a by nobody" in lines  # which model it asked about, who answered
    assert "done after" in lines and "no model is served by this pod alone" in lines
    assert "leave" not in done.stderr  # nothing left for the kubelet to drop
    assert (tmp_path / "done").read_text() == "done\n"


def test_without_the_agent_pid_its_lines_go_to_its_own_stderr(tmp_path: Path, agent: str) -> None:
    done = leave(tmp_path, agent, "--pid-file", str(tmp_path / "absent.pid"))
    assert done.returncode == 0, done.stderr
    assert f"no agent pid in {tmp_path / 'absent.pid'}: its lines go to its own stderr" in done.stderr
    assert "a by nobody" in done.stderr
    assert (tmp_path / "done").exists()


def test_log_names_another_file(tmp_path: Path, agent: str) -> None:
    log = tmp_path / "leave.log"
    done = leave(tmp_path, agent, "--log", str(log), "--pid-file", str(tmp_path / "absent.pid"))
    assert done.returncode == 0, done.stderr
    assert "a by nobody" in log.read_text()


@pytest.mark.parametrize("bad", ["0", "65536", "http"])
def test_a_bad_port_stops_the_command_naming_the_option(tmp_path: Path, bad: str) -> None:
    command = [
        sys.executable,
        "-m",
        "triton_operator.cli",
        "leave",
        "--port",
        bad,
        "--done",
        str(tmp_path / "d"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "--port" in done.stderr and "from 1 to 65535" in done.stderr, done.stderr
    assert not (tmp_path / "d").exists()
