"""Shared fixtures: a real cluster (KUBECONFIG or e2e/cluster.py), the CRD, a namespace, the operator,
and seaweedfs (a real S3 server) for the storage and cluster tests alike."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import node  # e2e/node.py (e2e/ is on pytest's pythonpath)
from module_costs import Phase, costs_table, module_costs
from testkit import TEST_FIELD_MANAGER, apply_crds, crd_document, free_port, stop_process, wait_healthy
from tritonserver import TritonInstall, TritonNotInstalledError, prepare_server

if TYPE_CHECKING:
    from storage_servers import Server

REPO = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------- markers, reports for teardown


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "operator_env(**env): extra environment of the operator fixture's process"
    )
    # SIGTERM and SIGHUP (`timeout`, a closed terminal, a CI job's cancel, e2e/test's trap) stop the
    # run as Ctrl-C does: pytest then runs every fixture's teardown (a local cluster the `cluster`
    # fixture started is brought down, servers are stopped) instead of dying with them running.
    # SIGINT too, as e2e/test starts pytest in the background, where SIGINT is ignored.
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _interrupt)


_stopping: list[int] = []


def _interrupt(signum: int, _frame: object) -> None:
    """The first signal stops the run; later ones (Ctrl-C reaches pytest and e2e/test, whose trap
    then sends SIGTERM too) must not cut the fixtures' teardown short."""
    name = signal.Signals(signum).name
    if _stopping:
        sys.stderr.write(f"{name} received: the teardown of the fixtures goes on\n")
        return
    _stopping.append(signum)
    raise KeyboardInterrupt(f"stopped by {name}")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    """Keep each phase's report on the item, so fixtures can print logs when a test failed."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


_phases: list[Phase] = []


@pytest.hookimpl
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Remember each phase's duration, for the per-module costs at the end."""
    _phases.append(Phase(report.nodeid, report.when, report.duration))


@pytest.hookimpl
def pytest_terminal_summary(terminalreporter: Any) -> None:
    """What each real-node module cost in this run (docs/testing.md quotes the table)."""
    rows = module_costs(_phases, "tests/e2e/")
    if rows:
        terminalreporter.write_sep("=", "real-node modules: wall seconds each (setup + call + teardown)")
        for line in costs_table(rows):
            terminalreporter.write_line(line)


def _failed(request: pytest.FixtureRequest) -> bool:
    report = getattr(request.node, "rep_call", None)
    return report is None or report.failed


# ----------------------------------------------------------------- helpers


def _reachable(kubeconfig: Path) -> str | None:
    """None when the API server of ``kubeconfig`` answers; else why not."""
    try:
        import httpx2  # noqa: PLC0415
        from lightkube import Client, KubeConfig  # noqa: PLC0415
        from lightkube.resources.core_v1 import Namespace  # noqa: PLC0415

        client = Client(config=KubeConfig.from_file(str(kubeconfig)), timeout=httpx2.Timeout(5))
        client.get(Namespace, "default")
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


# ----------------------------------------------------------------- the cluster


@pytest.fixture(scope="session")
def cluster() -> Iterator[Path]:
    """A kubeconfig of a real API server: $KUBECONFIG when reachable, else e2e/cluster.py's cluster.

    A cluster this fixture starts is stopped at the end of the session; one that was already up
    is left running. When neither works the test is skipped, saying why.
    """
    env = os.environ.get("KUBECONFIG")
    if env and Path(env).is_file():
        why = _reachable(Path(env))
        if why is None:
            yield Path(env)
            return
        sys.stderr.write(f"$KUBECONFIG={env} is not reachable ({why}); trying e2e/cluster.py\n")
    try:
        import cluster as local  # noqa: PLC0415  (e2e/cluster.py, optional: the test skips without it)
    except ImportError as exc:
        pytest.skip(
            f"no cluster: $KUBECONFIG unset or unreachable and e2e/cluster.py cannot be imported ({exc})"
        )
    started = False
    try:
        if local.is_up():
            kubeconfig = Path(local.kubeconfig_path())
        else:
            kubeconfig = Path(local.up())
            started = True
    except Exception as exc:
        if not local.is_up():  # what a failed up started, it does not leave behind
            try:
                local.down(quiet=True)
            except Exception as down_exc:
                sys.stderr.write(f"bringing down the half-started local cluster failed: {down_exc}\n")
        pytest.skip(f"no cluster: e2e/cluster.py could not build or start the local cluster: {exc}")
    why = _reachable(kubeconfig)
    if why is not None:
        pytest.skip(f"no cluster: the local cluster at {kubeconfig} does not answer: {why}")
    try:
        yield kubeconfig
    finally:
        if started:
            local.down()  # raises what failed, after finishing every step; the tests' results stand


@pytest.fixture(scope="session")
def kube(cluster: Path) -> Any:
    """A synchronous lightkube Client for test code (the operator uses its own async one)."""
    import httpx2  # noqa: PLC0415
    from lightkube import Client, KubeConfig  # noqa: PLC0415

    config = KubeConfig.from_file(str(cluster))
    return Client(config=config, field_manager=TEST_FIELD_MANAGER, timeout=httpx2.Timeout(30))


@pytest.fixture(scope="session")
def crd(kube: Any) -> dict[str, Any]:
    """The TritonService CRD, applied and Established."""
    doc = crd_document()
    apply_crds(kube, [doc], timeout=30)
    return doc


@pytest.fixture
def namespace(kube: Any, crd: dict[str, Any]) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards."""
    from lightkube.resources.core_v1 import Namespace  # noqa: PLC0415

    name = f"t-{uuid.uuid4().hex[:8]}"
    kube.create(Namespace.from_dict({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}))
    yield name
    try:
        kube.delete(Namespace, name)
    except Exception as exc:
        sys.stderr.write(f"could not delete namespace {name}: {exc}\n")


# ----------------------------------------------------------------- the operator


def _operator_command() -> list[str]:
    """`triton-operator run`, as this interpreter runs the CLI module."""
    return [sys.executable, "-m", "triton_operator.cli", "run"]


@dataclass
class OperatorProcess:
    """A `triton-operator run` subprocess watching one namespace."""

    namespace: str
    kubeconfig: Path
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    liveness_port: int = 0

    def start(self, timeout: float = 60.0) -> None:
        self.liveness_port = free_port()
        args = [
            *_operator_command(),
            "--namespace",
            self.namespace,
            "--standalone",
            "--metrics-port",
            "0",
            "--liveness",
            f"http://127.0.0.1:{self.liveness_port}/healthz",
        ]
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1", **self.env}
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True
        )
        log.close()
        wait_healthy(self.process, self.liveness_port, self.log_tail, timeout=timeout)

    def stop(self) -> None:
        stop_process(self.process)

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, lines: int = 80) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture
def operator(
    cluster: Path, namespace: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[OperatorProcess]:
    """The operator running against the cluster, watching the test's namespace."""
    # Without a store to list, the tests run unpinned; a test that brings one turns pinning on.
    # Triton is read only on the real node's pods: kwok's fake pod IPs answer nothing.
    env = {
        "TRITON_OPERATOR_PIN_REPOSITORIES": "false",
        "TRITON_OPERATOR_TRITON_READ_CIDRS": node.POD_CIDR,
        "TRITON_OPERATOR_TRITON_READ_SECONDS": "5",
    }
    for marker in request.node.iter_markers("operator_env"):
        env.update({k: str(v) for k, v in marker.kwargs.items()})
    proc = OperatorProcess(
        namespace=namespace, kubeconfig=cluster, log_path=tmp_path / "operator.log", env=env
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
        if _failed(request):
            sys.stdout.write(f"\n----- operator log ({proc.log_path}) -----\n{proc.log_tail(200)}\n")


@pytest.fixture(scope="session")
def kubectl(cluster: Path) -> str | None:
    """A kubectl binary: the local cluster's, else one on PATH (None when there is none)."""
    try:
        import cluster as local  # noqa: PLC0415  (optional when $KUBECONFIG is used)

        candidate = Path(local.bin_dir()) / "kubectl"
        if candidate.is_file():
            return str(candidate)
    except Exception:  # the cluster module is optional when $KUBECONFIG is used
        pass
    return shutil.which("kubectl")


# ----------------------------------------------------------------- a real S3 server


@pytest.fixture(scope="session")
def seaweedfs_on(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Server]]:
    """seaweedfs_on(host) -> a seaweedfs (S3, storage_servers' key pair) with every port on ``host``.

    One server per host for the whole session, stopped (and checked gone) at its end. Raises
    storage_servers.ServerStartError when it cannot start. ``extra`` holds "access" and "secret".
    """
    import storage_servers  # noqa: PLC0415 (boto3 is loaded only by the tests that need a store)

    servers: dict[str, Server] = {}

    def start(host: str) -> Server:
        if host not in servers:
            base = tmp_path_factory.mktemp("seaweedfs")
            server = storage_servers.start_seaweedfs(base / "data", base / "weed.log", host=host)
            server.extra["access"] = storage_servers.S3_ACCESS_KEY
            server.extra["secret"] = storage_servers.S3_SECRET_KEY
            servers[host] = server
        return servers[host]

    yield start
    for server in servers.values():
        server.stop()
        assert not server.alive, f"{server.name} (pid {server.process.pid}) still runs after stop"


@pytest.fixture(scope="session")
def seaweedfs(seaweedfs_on: Callable[[str], Server]) -> Server:
    """A real S3 server on loopback: the storage tests' S3 store, the store the operator process
    (not pods) pins repositories from in the cluster tests."""
    return seaweedfs_on("127.0.0.1")


@pytest.fixture(scope="session")
def metrics(cluster: Path) -> Any:
    """The cluster's custom metrics API (its custom-metrics-adapter), as an e2e_helpers.CustomMetrics."""
    import cluster as local_cluster  # noqa: PLC0415 (e2e/cluster.py)
    from e2e_helpers import CustomMetrics, metrics_write_url  # noqa: PLC0415

    url = metrics_write_url(cluster)
    if url is None:
        pytest.skip(
            f"the cluster of {cluster} has no metrics adapter write URL "
            f'(${local_cluster.METRICS_WRITE_URL_ENV}; `eval "$(python3 e2e/cluster.py env)"`)'
        )
    return CustomMetrics(url, cluster)


@pytest.fixture(scope="session")
def triton_install(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> TritonInstall:
    """The bundled tritonserver (the nvidia-pytriton wheel's), copied once into pytest's cache, for the
    triton and storage tests; skipped only when it is not installed."""
    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    cache_dir = cache.mkdir("tritonserver") if cache is not None else tmp_path_factory.mktemp("tritonserver")
    try:
        return prepare_server(Path(cache_dir))
    except TritonNotInstalledError as exc:
        pytest.skip(f"no tritonserver binary: {exc}")
