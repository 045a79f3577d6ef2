"""Fixtures for a real tritonserver serving a model repository rendered from a TritonService spec."""

from __future__ import annotations

from collections.abc import Generator, Iterator

import pytest

from triton_operator.models import TritonServiceSpec
from triton_specs import BROKEN_SPEC, SERVICE_SPEC, build_repository, validated_spec
from tritonserver import (
    RunningServer,
    TritonInstall,
    start_server,
)


@pytest.fixture(scope="session")
def service_spec() -> TritonServiceSpec:
    return validated_spec(SERVICE_SPEC)


@pytest.fixture(scope="session")
def triton_server(
    triton_install: TritonInstall, service_spec: TritonServiceSpec, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    """One tritonserver loading every model of SERVICE_SPEC; fails with its log tail if it does not start."""
    base = tmp_path_factory.mktemp("triton")
    repository = build_repository(service_spec, base / "models")
    server = start_server(
        triton_install, repository, [m.name for m in service_spec.models], base / "tritonserver.log"
    )
    print(f"tritonserver ready in {server.startup_seconds:.2f} s ({len(service_spec.models)} models)")
    yield server
    server.stop()
    assert server.processes() == [], f"processes left after stop: {server.processes()}"


@pytest.fixture(scope="module")
def broken_server(
    triton_install: TritonInstall, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    """A second tritonserver over BROKEN_SPEC's repository with nothing loaded, so failed loads do not
    touch the shared server's readiness."""
    base = tmp_path_factory.mktemp("triton-broken")
    repository = build_repository(validated_spec(BROKEN_SPEC), base / "models")
    server = start_server(triton_install, repository, [], base / "tritonserver.log")
    yield server
    server.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach the tail of every tritonserver log a failed test used."""
    report: pytest.TestReport = yield
    if report.failed:
        funcargs = getattr(item, "funcargs", {})
        for name in ("triton_server", "broken_server"):
            server = funcargs.get(name)
            if isinstance(server, RunningServer):
                report.sections.append((f"{name} log (tail)", server.log_tail()))
    return report
