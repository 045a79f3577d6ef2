"""The Triton reader against a real tritonserver: its repository index and its counters, as the
operator reads them from a pod (here on loopback), bounded by a timeout."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from real_pods import behaving_source
from triton_operator.adapters.triton_reader import PodTarget, TritonReader
from triton_operator.core.analysis import Counters
from triton_specs import ADD_SUB_CONFIG_PBTXT
from tritonserver import RunningServer, TritonInstall, start_server

CONFIG = ADD_SUB_CONFIG_PBTXT
BODY = json.dumps(
    {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
            {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]},
        ]
    }
).encode()


@pytest.fixture(scope="module")
def server(
    triton_install: TritonInstall, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    """Two models: `steady` answers every request, `flaky` raises in execute for 3 of every 10."""
    base = tmp_path_factory.mktemp("reader")
    for name, source in (("steady", behaving_source()), ("flaky", behaving_source(fail_in_ten=3))):
        (base / "models" / name / "1").mkdir(parents=True)
        (base / "models" / name / "config.pbtxt").write_text(CONFIG.format(name=name))
        (base / "models" / name / "1" / "model.py").write_bytes(source)
    running = start_server(triton_install, base / "models", ["steady", "flaky"], base / "tritonserver.log")
    yield running
    running.stop()


def infer(server: RunningServer, model: str) -> bool:
    request = urllib.request.Request(f"{server.http_url}/v2/models/{model}/infer", data=BODY, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return bool(response.status == 200)
    except urllib.error.HTTPError:
        return False


def reader_for(server: RunningServer) -> TritonReader:
    return TritonReader(ports=(server.http_port, server.metrics_port))


def test_the_index_and_the_counters_are_triton_s_own(server: RunningServer) -> None:
    answered = [infer(server, "flaky") for _ in range(20)] + [infer(server, "steady") for _ in range(7)]
    assert answered.count(False) == 6  # 3 of every 10 flaky requests

    async def read() -> object:
        reader = reader_for(server)
        try:
            return await reader.read_pod(PodTarget("uid", "127.0.0.1", "rev"), metrics=True, previous=None)
        finally:
            await reader.close()

    reading = asyncio.run(read())
    assert reading.error is None  # type: ignore[attr-defined]
    states = {(s.model, s.version, s.state) for s in reading.index}  # type: ignore[attr-defined]
    assert states == {("flaky", "1", "READY"), ("steady", "1", "READY")}
    counters = reading.counters  # type: ignore[attr-defined]
    assert (counters["flaky"].success, counters["flaky"].failure) == (14, 6)
    assert counters["steady"].success == 7 and counters["steady"].failure == 0
    assert counters["steady"].request_us >= counters["steady"].compute_us > 0
    assert isinstance(counters["steady"], Counters)


def test_a_pod_that_does_not_answer_is_an_error_within_the_timeout_not_a_wait() -> None:
    async def read() -> object:
        reader = TritonReader(timeout=0.5, ports=(9, 9))  # the discard port: nothing listens there
        try:
            return await reader.read_pod(PodTarget("uid", "127.0.0.1", "rev"), metrics=True, previous=None)
        finally:
            await reader.close()

    reading = asyncio.run(read())
    assert reading.index is None and reading.counters is None  # type: ignore[attr-defined]
    assert reading.error is not None and reading.error.startswith("repository index: ")  # type: ignore[attr-defined]


def test_only_pods_in_the_allowed_ranges_are_read() -> None:
    reader = TritonReader(cidrs=["10.77.0.0/24"])
    assert reader.allowed("10.77.0.9") and not reader.allowed("10.244.0.3") and not reader.allowed(None)
    assert TritonReader().allowed("192.0.2.1")
