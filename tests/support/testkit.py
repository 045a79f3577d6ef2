"""Helpers shared across the tests tree: polling, free ports, subprocesses, charts/chartlib.py, the CRD.

tests/support is on pytest's `pythonpath` (pyproject.toml), so every test module and helper imports
this one by its basename: ``from testkit import wait_for``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any, Self, TypeVar

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / "tritonservices.yaml"
TEST_FIELD_MANAGER = "triton-operator-tests"
"""The field manager of the tests' own writes (the `kube` fixture's client, CRDs applied by apply_crds)."""

T = TypeVar("T")


def wait_for(
    probe: Callable[[], T | None], *, timeout: float = 60.0, interval: float = 0.25, what: str = "condition"
) -> T:
    """Call ``probe`` until it returns something truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


class Repeating:
    """A background loop for a test: ``step`` runs every ``every`` seconds in a thread while the object
    is used as a context manager. What a step raises is kept in ``errors`` (the test reads them) and
    the loop goes on."""

    every = 0.5

    def __init__(self) -> None:
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=type(self).__name__, daemon=True)

    def step(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(self.every)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _ephemeral_start() -> int:
    """The first port the kernel hands out for a bind to port 0 or an outgoing connection."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_HANDED_OUT: set[int] = set()
_RANDOM = random.Random(os.getpid() ^ time.monotonic_ns())


def free_port() -> int:
    """A port free now, chosen at random BELOW the kernel's ephemeral range and never twice in this
    process. A port the kernel picked for a bind to port 0 is free only until the next such bind: a
    server started later with ``--metrics-port 0`` (the operator's own) got the very port handed out
    for its liveness endpoint, and the operator stopped when its health reporter could not bind."""
    top = max(_ephemeral_start(), 12000)
    while True:
        port = _RANDOM.randrange(10000, top)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
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


def run_init_sync(
    workdir: Path, credentials: dict[str, str], *, dest: str = "models", timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`triton-operator sync` as the pod's init container runs it: WORKDIR/manifest.json and the
    rendered WORKDIR/configs into WORKDIR/DEST, with the store's ``credentials`` as its only
    credentials (none of this process's AWS, Azure or Google variables)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "GOOGLE_"))}
    args = [sys.executable, "-m", "triton_operator.cli", "sync", "--manifest", str(workdir / "manifest.json")]
    args += ["--configs", str(workdir / "configs"), "--dest", str(workdir / dest)]
    return subprocess.run(
        args, env={**clean, **credentials}, capture_output=True, text=True, timeout=timeout, check=False
    )


def load_chartlib() -> ModuleType:
    """charts/chartlib.py, the module ``chartlib`` (charts/ is on pytest's pythonpath and mypy's path)."""
    import chartlib  # noqa: PLC0415  (stdlib only, but only the packaging and cluster tests need it)

    return chartlib


@contextlib.contextmanager
def bench_module(script: str, name: str, *, path: Path | None = None) -> Iterator[ModuleType]:
    """A bench script (``script``, relative to the repository: ``bench/real_pods/cpu_accounting.py``)
    loaded as the module ``name``, in sys.modules while inside (its dataclasses look their module up
    there), with ``path`` on sys.path meanwhile when a script imports its neighbours by their names."""
    spec = importlib.util.spec_from_file_location(name, REPO / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    if path is not None:
        sys.path.insert(0, str(path))
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[name]
        if path is not None:
            sys.path.remove(str(path))


# ----------------------------------------------------------------- the CRD


def crd_document() -> dict[str, Any]:
    """The CRD from crds/tritonservices.yaml, or built in-process when the file is missing."""
    if CRD_FILE.is_file():
        doc: dict[str, Any] = yaml.safe_load(CRD_FILE.read_text())
        return doc
    from triton_operator.core.spec.crd_schema import build_crd  # noqa: PLC0415  (protobuf only when the file is missing)

    return build_crd()


def crd_established(kube: Any, name: str) -> bool:
    """Whether the CRD ``name`` exists and is Established (``kube``: a lightkube Client)."""
    from lightkube import ApiError  # noqa: PLC0415
    from lightkube.resources.apiextensions_v1 import CustomResourceDefinition  # noqa: PLC0415

    try:
        obj = kube.get(CustomResourceDefinition, name).to_dict()
    except ApiError as exc:
        if exc.status.code == 404:
            return False
        raise
    return any(
        c.get("type") == "Established" and c.get("status") == "True"
        for c in obj.get("status", {}).get("conditions", [])
    )


def crd_serving(kube: Any, doc: dict[str, Any]) -> bool:
    """Whether objects of the CRD ``doc`` can be listed: right after a CRD is (re)created the API
    server answers 429 "storage is (re)initializing" for a moment even though it is Established."""
    from lightkube import ApiError  # noqa: PLC0415
    from lightkube.generic_resource import (  # noqa: PLC0415
        create_global_resource,
        create_namespaced_resource,
    )

    spec = doc["spec"]
    version = next(v["name"] for v in spec["versions"] if v.get("storage"))
    names = spec["names"]
    args = (spec["group"], version, names["kind"], names["plural"])
    namespaced = spec["scope"] == "Namespaced"
    resource = create_namespaced_resource(*args) if namespaced else create_global_resource(*args)
    try:
        list(kube.list(resource, namespace="*") if namespaced else kube.list(resource))
    except ApiError as exc:
        if exc.status.code in (404, 429, 503):
            return False
        raise
    return True


def apply_crds(kube: Any, docs: list[dict[str, Any]], *, timeout: float) -> None:
    """Server-side apply each CRD of ``docs`` (by TEST_FIELD_MANAGER, forced), then wait until every
    one is Established and its objects can be listed."""
    from lightkube.resources.apiextensions_v1 import CustomResourceDefinition  # noqa: PLC0415
    from lightkube.types import PatchType  # noqa: PLC0415

    for doc in docs:
        kube.patch(
            CustomResourceDefinition,
            doc["metadata"]["name"],
            doc,
            patch_type=PatchType.APPLY,
            field_manager=TEST_FIELD_MANAGER,
            force=True,
        )
    for doc in docs:
        name = doc["metadata"]["name"]
        wait_for(partial(crd_established, kube, name), timeout=timeout, what=f"CRD {name} to be Established")
        wait_for(partial(crd_serving, kube, doc), timeout=timeout, what=f"the objects of CRD {name} to list")
