"""The Triton reader against a real tritonserver: its repository index and its counters, as the
operator reads them from a pod (here on loopback), bounded by a timeout."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from real_pods import behaving_source
from triton_operator.adapters.triton_reader import PodReading, PodTarget, TritonReader
from triton_operator.core.observed.observation import PodState
from triton_operator.core.rollout.canary_analysis import AnalysisResult, Counters
from triton_operator.core.rollout.engine import plan_rollout
from triton_operator.core.rollout.plan import RolloutInput
from triton_operator.core.rollout.state import RevisionState, RolloutStatus
from triton_operator.models import TritonService
from triton_operator.reconcile.analysis import TritonView
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


# ----------------------------------------------------------------- pods that answer without end

INDEX = json.dumps([{"name": "m", "version": "1", "state": "READY"}]).encode()
METRICS = b'nv_inference_request_success{model="m",version="1"} 100\n'
ENDLESS_LIMIT = 64 * 1024 * 1024
"""Where the "endless" body stops: far past the reader's bound, short of hurting the machine when a
reader reads it all (as one without the bound would)."""
TRICKLED = 4
"""The last bytes of the trickling pod's metrics page, sent one every TRICKLE_SECONDS."""
TRICKLE_SECONDS = 1.9
OWNER = ("ml", "svc")
T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


class Pod:
    """A pod's Triton on 127.0.0.1 that answers the index at once and its metrics page badly:
    ``endless`` streams a body without end (a comment line, over and over), ``trickle`` sends a
    valid page whose last bytes come one every 1.9 s. Counts the body bytes it got out."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sent = 0
        self.finished = False
        """Whether the metrics body was sent whole (the reader waited for all of it)."""
        self.server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def __aenter__(self) -> Pod:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in request.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                if request.startswith(b"POST /v2/repository/index"):
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(INDEX) + INDEX)
                    await writer.drain()
                elif self.mode == "endless":
                    await self.endless(writer)
                    return
                else:
                    await self.trickle(writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def endless(self, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n")
        line = b"# " + b"x" * 1021 + b"\n"
        chunk = line * 64
        while self.sent < ENDLESS_LIMIT:
            writer.write(chunk)
            await writer.drain()  # raises once the reader hung up
            self.sent += len(chunk)
        self.finished = True

    async def trickle(self, writer: asyncio.StreamWriter) -> None:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(METRICS)
        writer.write(head + METRICS[:-TRICKLED])
        await writer.drain()
        self.sent += len(METRICS) - TRICKLED
        for i in range(len(METRICS) - TRICKLED, len(METRICS)):
            await asyncio.sleep(TRICKLE_SECONDS)
            writer.write(METRICS[i : i + 1])
            await writer.drain()
            self.sent += 1
        self.finished = True


async def read_badly_answering_pod(mode: str) -> tuple[Pod, TritonReader, PodReading]:
    async with Pod(mode) as pod:
        reader = TritonReader(ports=(pod.port, pod.port))  # the operator's defaults otherwise
        try:
            reading = await reader.read_pod(PodTarget("uid", "127.0.0.1", "rev"), metrics=True, previous=None)
        finally:
            await reader.close()
        return pod, reader, reading


def test_an_endless_metrics_page_is_cut_off_at_the_size_bound_and_the_reading_is_missing() -> None:
    pod, reader, reading = asyncio.run(read_badly_answering_pod("endless"))
    assert reading.index is not None and reading.error is None
    assert reading.counters is None
    assert not pod.finished, f"the reader took all {pod.sent} bytes the pod sent"
    bound = reader.max_bytes  # the operator's: 4 MiB
    assert reader.bytes_read <= len(INDEX) + bound + 64 * 1024  # one socket read past it at most
    assert reading.metrics_error == f"metrics: answer larger than {bound} bytes"


def test_a_trickled_metrics_page_is_cut_off_at_the_total_timeout_and_the_reading_is_missing() -> None:
    pod, reader, reading = asyncio.run(read_badly_answering_pod("trickle"))
    assert reading.index is not None
    assert reading.counters is None, "the reader waited for the whole trickled page"
    assert not pod.finished
    assert reader.bytes_read < len(INDEX) + len(METRICS)
    assert reading.metrics_error == f"metrics: no complete answer within {reader.timeout:g}s"


def test_a_canary_whose_pods_answer_without_end_is_judged_inconclusive_and_aborted_past_the_limit() -> None:
    """The whole path: the operator's reader against a canary pod streaming without end, its
    reading missing, and the analysis following onInconclusive once the window has run long enough."""
    ts = TritonService.model_validate(
        {
            "metadata": {"name": "svc", "namespace": "ml"},
            "spec": {
                "repository": {"uri": "s3://b/m"},
                "models": [{"name": "m", "config": {"backend": "python"}}],
                "rollout": {
                    "steps": [{"setWeight": 50}],
                    "analysis": {"onInconclusive": "Abort", "inconclusiveAfterSeconds": 60},
                },
            },
        }
    )
    status = RolloutStatus(
        stable_revision="A", canary_revision="B", canary_weight=50, current_step_index=1, step_started_at=T0
    )
    pods = [PodState(name="svc-b-0", revision="B", ready=True, uid="uid-b", ip="127.0.0.1")]

    async def judged() -> tuple[AnalysisResult | None, AnalysisResult | None, TritonReader]:
        async with Pod("endless") as pod:
            view = TritonView(TritonReader(ports=(pod.port, pod.port)))
            try:
                view.keep(
                    OWNER, view.read(OWNER, ts, status, "B", pods, now=T0)
                )  # a pass hands the pods over
                view.reader.tick()  # the reader's loop starts their reads (its first tick, now)
                await view.reader.wait_reads()
                seen = view.read(OWNER, ts, status, "B", pods, now=T0)
                view.keep(OWNER, seen)
                later = view.read(OWNER, ts, status, "B", pods, now=T0 + timedelta(seconds=60))
                return seen.analysis, later.analysis, view.reader
            finally:
                await view.reader.close()

    first, later, reader = asyncio.run(judged())
    assert reader.bytes_read <= len(INDEX) + reader.max_bytes + 64 * 1024
    assert first is not None and first.verdict == "Inconclusive"
    assert later is not None and "svc-b-0 (metrics: answer larger than" in later.message
    plan = plan_rollout(
        RolloutInput(
            rollout=ts.spec.rollout,
            replicas=2,
            desired_revision="B",
            now=T0 + timedelta(seconds=60),
            status=status,
            revisions={"A": RevisionState(2, 2, 2, 2, pods=2), "B": RevisionState(1, 1, 1, 1, pods=1)},
            analysis=later,
        )
    )
    assert (plan.status.aborted_revision, plan.status.aborted_reason) == ("B", "AnalysisInconclusive")
