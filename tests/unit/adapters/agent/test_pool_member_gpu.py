"""A pooled pod's agent measuring a GPU model's memory from tritonserver's GPU metrics, over real HTTP.

No GPU runs here: tritonserver is a stand-in (test_pool_member_report's FakeTriton) and so is its
metrics page, served on loopback in the format Triton documents (triton-inference-server/server
docs/user_guide/metrics.md, "GPU Metrics": ``nv_gpu_memory_used_bytes`` and ``nv_gpu_memory_total_bytes``
per GPU, labelled ``gpu_uuid``, refreshed once per ``--metrics-interval-ms``). The stand-in's gauges
take in a load or unload only one interval after it answered, as Triton's do at worst."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from test_pool_member_report import (  # type: ignore[import-not-found,unused-ignore]
    FakeTriton,
    member_of,
    report,
)

from triton_operator.adapters.agent.gpu_metrics import GpuMetrics
from triton_operator.adapters.agent.pool_member import PoolMember
from triton_operator.core.pool.assignment import PodAssignment, Wanted, build_assignment
from triton_operator.core.pool.gpu_memory import GPU, HOST
from triton_operator.core.spec.modelconfig import build_config_pbtxt

MiB = 1 << 20
PY = 'name: "{m}"\nbackend: "python"\n'
INTERVAL = 0.2
"""The stand-in's metrics interval (Triton's default is 2 s), and the agent's --triton-metrics-interval."""
GPUS = ("GPU-c06bbf33-c250-ca45-579b-19134b518844", "GPU-5d2a7f10-8e3b-4c1e-9a4f-0b6e2d7c9a11")
TOTAL = 80 * 1024 * MiB
BASE = (700 * MiB, 500 * MiB)
"""What tritonserver holds on each GPU with no model (its CUDA contexts)."""


def groups(*kinds: str) -> str:
    blocks = "".join(f"  {{{{\n    count: 1\n    kind: {kind}\n  }}}},\n" for kind in kinds)
    return PY + "instance_group [\n" + blocks.rstrip(",\n") + "\n]\n"


PY_GPU = groups("KIND_GPU")


@dataclass
class GpuTriton(FakeTriton):  # type: ignore[misc,unused-ignore]
    """A stand-in tritonserver whose models hold GPU memory: ``held[model]``, per GPU, while it is
    loaded; ``changes`` records when each load and unload answered, for its metrics page."""

    held: dict[str, tuple[int, int]] = field(default_factory=dict)
    changes: list[tuple[float, str, bool]] = field(default_factory=list)
    metrics_url: str = ""
    reads: list[float] = field(default_factory=list)
    """When each metrics page was read."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def load(self, model: str) -> None:
        super().load(model)
        with self.lock:
            self.changes.append((time.monotonic(), model, True))

    def unload(self, model: str) -> None:
        super().unload(model)
        with self.lock:
            self.changes.append((time.monotonic(), model, False))

    def used(self, at: float) -> tuple[int, int]:
        """Each GPU's used memory as the gauges say at ``at``: the loads and unloads that answered at
        least one INTERVAL before (the stand-in's refresh lags that much)."""
        loaded: set[str] = set()
        with self.lock:
            for when, model, load in self.changes:
                if when + INTERVAL <= at:
                    (loaded.add if load else loaded.discard)(model)
        return (
            BASE[0] + sum(self.held.get(m, (0, 0))[0] for m in loaded),
            BASE[1] + sum(self.held.get(m, (0, 0))[1] for m in loaded),
        )


def metrics_page(used: tuple[int, int]) -> str:
    """tritonserver's metrics page on a node with two GPUs, as its docs show it (stand-in)."""
    lines = [
        "# HELP nv_inference_request_success Number of successful inference requests, all batch sizes",
        "# TYPE nv_inference_request_success counter",
        'nv_inference_request_success{model="other",version="1"} 12',
        "# HELP nv_gpu_memory_total_bytes GPU total memory, in bytes",
        "# TYPE nv_gpu_memory_total_bytes gauge",
        *(f'nv_gpu_memory_total_bytes{{gpu_uuid="{uuid}"}} {TOTAL}' for uuid in GPUS),
        "# HELP nv_gpu_memory_used_bytes GPU used memory, in bytes",
        "# TYPE nv_gpu_memory_used_bytes gauge",
        *(
            f'nv_gpu_memory_used_bytes{{gpu_uuid="{uuid}"}} {value}'
            for uuid, value in zip(GPUS, used, strict=True)
        ),
    ]
    return "\n".join(lines) + "\n"


@pytest.fixture
def triton() -> Iterator[GpuTriton]:
    """The stand-in tritonserver with its metrics page served on loopback (at ``metrics_url``)."""
    stand_in = GpuTriton()
    reads = stand_in.reads

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            at = time.monotonic()
            reads.append(at)
            body = metrics_page(stand_in.used(at)).encode()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    stand_in.metrics_url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    try:
        yield stand_in
    finally:
        server.shutdown()
        server.server_close()


def gpu_member(
    tmp_path: Path, triton: GpuTriton, monkeypatch: pytest.MonkeyPatch, config: str, names: tuple[str, ...]
) -> PoolMember:
    member: PoolMember = member_of(tmp_path, triton, monkeypatch, names=names, config=config)
    member.gpu = GpuMetrics(triton.metrics_url, interval=INTERVAL)
    return member


def write(member: PoolMember, **entries: Wanted) -> None:
    member.assignment_file.write_text(build_assignment(PodAssignment(models=entries)))


def test_a_gpu_model_loaded_alone_is_measured_by_the_growth_of_its_pods_gpus(
    tmp_path: Path, triton: GpuTriton, monkeypatch: pytest.MonkeyPatch
) -> None:
    """b (KIND_GPU, never measured) holds 300 MiB on one GPU and 200 MiB on the other; a (measured, per
    status.pool) holds 100 MiB and loads just before it. b loads alone, its readings wait until the
    gauges include a's load before it and its own: its figure is its 500 MiB, no more (a's 100 MiB, not
    yet in a reading taken at once, is not counted) and no less; it is reported READY while its
    gauges catch up. a, measured already, reports none."""
    triton.held.update(a=(100 * MiB, 0), b=(300 * MiB, 200 * MiB))
    member = gpu_member(tmp_path, triton, monkeypatch, PY_GPU, ("a", "b"))
    write(member, a=Wanted("va", measured=True), b=Wanted("vb"))
    passing = threading.Thread(target=member.tick)
    passing.start()
    deadline = time.monotonic() + 10
    while member.report()["models"].get("b", {}).get("state") != "READY":
        assert time.monotonic() < deadline, member.report()
        time.sleep(0.005)
    assert passing.is_alive() and report(member)["b"].memory is None  # READY; its reading to come
    passing.join(10)
    loads = {model: when for when, model, load in triton.changes if load}
    assert loads["a"] < loads["b"]
    assert report(member)["b"].memory == 500 * MiB
    assert report(member)["a"].memory is None
    # Its readings: one before (once a's load is in the gauges), one after (once b's is).
    before, after = triton.reads
    assert before >= loads["a"] + 2 * INTERVAL and after >= loads["b"] + 2 * INTERVAL


def test_models_loaded_together_are_not_measured_and_read_no_gpu_metrics(
    tmp_path: Path, triton: GpuTriton, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two GPU models status.pool has measured load together (nothing to measure, no wait on the
    gauges): the GPU metrics are not read, and neither reports a figure (status.pool's stand)."""
    triton.held.update(a=(100 * MiB, 0), b=(0, 200 * MiB))
    member = gpu_member(tmp_path, triton, monkeypatch, PY_GPU, ("a", "b"))
    write(member, a=Wanted("v", measured=True), b=Wanted("v", measured=True))
    member.tick()
    assert {m: (c.state, c.memory) for m, c in report(member).items()} == {
        "a": ("READY", None),
        "b": ("READY", None),
    }
    assert triton.reads == []


def test_a_model_on_the_gpu_and_the_cpu_is_measured_in_both(
    tmp_path: Path, triton: GpuTriton, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model with a KIND_GPU and a KIND_CPU instance group: its figure is tritonserver's host growth
    and its stubs (40 MiB + 2 MiB) plus its GPUs' growth (250 MiB)."""
    triton.held.update(m=(250 * MiB, 0))
    member = gpu_member(tmp_path, triton, monkeypatch, groups("KIND_GPU", "KIND_CPU"), ("m",))
    monkeypatch.setattr(
        member, "_memory", lambda model: ((100 + 40 * (triton.loaded.get(model) == "READY")) * MiB, 2 * MiB)
    )
    write(member, m=Wanted("v"))
    member.tick()
    assert report(member)["m"].memory == 292 * MiB


def test_no_gpu_reading_measures_nothing_and_the_model_still_serves(
    tmp_path: Path, triton: GpuTriton, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tritonserver's metrics do not answer (its port closed), or the agent reads none: the GPU model
    loads READY and reports no figure (its declared memory alone counts); a CPU model beside it is
    measured as before."""
    member = gpu_member(tmp_path, triton, monkeypatch, PY_GPU, ("g",))
    member.gpu = GpuMetrics("http://127.0.0.1:9/metrics", timeout=0.5, interval=0.01)
    write(member, g=Wanted("v"))
    member.tick()
    assert report(member)["g"].state == "READY" and report(member)["g"].memory is None
    member = gpu_member(tmp_path / "2", triton, monkeypatch, PY_GPU, ("g",))
    member.gpu = None
    files = member.agent.options.base
    assert not member._to_measure("g", Wanted("v"), files)  # nothing to measure: it need not load alone


def test_which_memory_a_model_is_measured_in_follows_its_rendered_instance_groups(
    tmp_path: Path, triton: GpuTriton, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Moved from test_pool_measured (runs_on_cpu, which it replaces): the config.pbtxt the operator
    renders, parsed. All KIND_CPU: host; all KIND_GPU: GPU; both kinds: both (a model on the CPU and the
    GPU was not measured before); KIND_AUTO (rendered with no kind line), KIND_MODEL or no group:
    nothing. An agent that reads no GPU metrics measures nothing of a model with GPU instances."""

    def pbtxt(*kinds: str) -> str:
        groups = [{"kind": k, "count": 1} for k in kinds]
        return build_config_pbtxt("m", {"backend": "python", **({"instanceGroup": groups} if groups else {})})

    member = gpu_member(tmp_path, triton, monkeypatch, PY_GPU, ("m",))
    assert member._kinds(pbtxt("KIND_CPU")) == {HOST}
    assert member._kinds(pbtxt("KIND_CPU", "KIND_CPU")) == {HOST}
    assert member._kinds(pbtxt("KIND_GPU")) == {GPU}
    assert member._kinds(pbtxt("KIND_CPU", "KIND_GPU")) == {HOST, GPU}
    assert member._kinds(pbtxt("KIND_CPU", "KIND_AUTO")) == frozenset()
    assert member._kinds(pbtxt("KIND_MODEL")) == frozenset()
    assert member._kinds(pbtxt()) == frozenset()  # Triton's default is the GPU where there is one
    assert member._kinds("not a config {") == frozenset()
    member.gpu = None
    assert member._kinds(pbtxt("KIND_CPU")) == {HOST}
    assert member._kinds(pbtxt("KIND_GPU")) == frozenset()
    assert member._kinds(pbtxt("KIND_CPU", "KIND_GPU")) == frozenset()
