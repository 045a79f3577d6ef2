"""Helpers shared across the tests tree: polling, free ports, subprocesses, charts/chartlib.py.

tests/support is on pytest's `pythonpath` (pyproject.toml), so every test module and helper imports
this one by its basename: ``from testkit import wait_for``.
"""

from __future__ import annotations

import importlib.util
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import pytest

REPO = Path(__file__).resolve().parents[2]

T = TypeVar("T")


def wait_for(
    probe: Callable[[], T | None], *, timeout: float = 60.0, interval: float = 0.25, what: str = "condition"
) -> T:
    """Call ``probe`` until it returns something truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def sh(
    *cmd: str | Path, stdin: str | None = None, check: bool = True, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``; with ``check``, fail the test with its output when it exits non-zero."""
    proc = subprocess.run(
        [str(c) for c in cmd], input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        pytest.fail(f"`{' '.join(map(str, cmd))}` exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def wait_healthy(
    process: subprocess.Popen[bytes], port: int, log: Callable[[], str], *, timeout: float = 60.0
) -> None:
    """Wait for an operator ``process`` to answer on its liveness ``port``; fail with ``log()``
    when it exits first."""

    def alive() -> bool:
        if process.poll() is not None:
            pytest.fail(f"the operator exited with {process.returncode}:\n{log()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    wait_for(alive, timeout=timeout, what="the operator's liveness endpoint")


def stop_process(process: subprocess.Popen[bytes] | None) -> None:
    """SIGINT (the operator's clean shutdown), then kill it after 15 s; nothing when it is not running."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


def load_chartlib() -> ModuleType:
    """charts/chartlib.py as the module ``chartlib`` (loaded once)."""
    if "chartlib" in sys.modules:
        return sys.modules["chartlib"]
    spec = importlib.util.spec_from_file_location("chartlib", REPO / "charts" / "chartlib.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["chartlib"] = module
    spec.loader.exec_module(module)
    return module
