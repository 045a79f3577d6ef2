#!/usr/bin/env python3
"""What reading Triton costs the operator at scale: the per-model reads behind status.models and canary
analysis, for ``--count`` TritonServices of ``--pods`` pods each; prints one markdown table.

The control-plane benchmark's pods are kwok's (no tritonserver answers on them), so this one points
the operator's own reader (adapters.triton_reader.TritonReader, as `triton-operator run` makes it) at
one real tritonserver from the nvidia-pytriton wheel on loopback that stands in for every pod: each
"pod" is a distinct target, read on its own schedule, exactly as pods are. It measures, in this
process (the reader runs in the operator's event loop):

* index reads: requests per second at ``--period`` (the operator's TRITON_OPERATOR_TRITON_READ_SECONDS),
  their latency (median, p99), and the CPU the reader and its parsing took, as a share of one core;
* metrics reads for ``--canaries`` of them under analysis (every pod of a canary and its stable,
  each ``--interval`` seconds), the same figures;
* one reconcile's Triton step (TritonView.look + judge + models_status) per TritonService, median;
* the reader's memory: the RSS growth of this process while it holds every reading.

  .venv/bin/python bench/control_plane/triton_reads.py                 # 1,000 TritonServices x 2 pods, ~2 min
  .venv/bin/python bench/control_plane/triton_reads.py --count 100 --seconds 20   # quick
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "operator" / "src"), str(ROOT / "tests" / "support"), str(ROOT / "e2e")]

from real_pods import ADD_SUB_CONFIG, behaving_source  # noqa: E402
from triton_operator.adapters.triton_reader import PodTarget, TritonReader  # noqa: E402
from triton_operator.core.observed.observation import PodState  # noqa: E402
from triton_operator.core.rollout.state import RolloutStatus  # noqa: E402
from triton_operator.core.spec.modelconfig import build_config_pbtxt  # noqa: E402
from triton_operator.models import TritonService  # noqa: E402
from triton_operator.reconcile.analysis import TritonView, models_status  # noqa: E402
from tritonserver import prepare_server, start_server  # noqa: E402


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Timed(TritonReader):
    """The operator's reader, timing each read_pod (index, and metrics when asked)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.index_ms: list[float] = []
        self.metrics_ms: list[float] = []

    async def read_pod(self, target: PodTarget, *, metrics: bool, previous: Any) -> Any:
        started = time.perf_counter()
        reading = await super().read_pod(target, metrics=metrics, previous=previous)
        (self.metrics_ms if metrics else self.index_ms).append((time.perf_counter() - started) * 1000)
        return reading


def service(name: str, analysis: bool) -> TritonService:
    rollout: dict[str, Any] = {"steps": [{"setWeight": 50}]}
    if analysis:
        rollout["analysis"] = {"intervalSeconds": 10}
    return TritonService.model_validate(
        {
            "metadata": {"name": name, "namespace": "bench"},
            "spec": {
                "repository": {"uri": "s3://bench/models"},
                "models": [{"name": "add_sub", "config": ADD_SUB_CONFIG}],
                "rollout": rollout,
            },
        }
    )


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(args: argparse.Namespace, ports: tuple[int, int]) -> list[tuple[str, str, str]]:
    reader = Timed(period=args.period, ports=ports, concurrency=32)
    view = TritonView(reader)
    rss0 = rss_kib()
    services = []
    for i in range(args.count):
        canary = i < args.canaries
        ts = service(f"ts-{i}", canary)
        status = RolloutStatus(
            stable_revision="stable",
            canary_revision="canary" if canary else None,
            canary_weight=50 if canary else None,
        )
        pods = [
            PodState(
                name=f"ts-{i}-{p}",
                revision="canary" if canary and p == 0 else "stable",
                uid=f"{i}-{p}",
                ip="127.0.0.1",
            )
            for p in range(args.pods)
        ]
        services.append(((ts.namespace, ts.name), ts, status, pods))
    step_ms: list[float] = []

    def one_pass() -> None:
        for owner, ts, status, pods in services:
            started = time.perf_counter()
            seen = view.read(owner, ts, status, "stable", pods, now=datetime.now(UTC))
            view.keep(owner, seen)
            models_status(ts, status, seen.readings)
            step_ms.append((time.perf_counter() - started) * 1000)

    one_pass()  # hands every pod to the reader, as the first reconciles do
    cpu0, t0 = time.process_time(), time.monotonic()
    while time.monotonic() - t0 < args.seconds:
        await asyncio.sleep(1.0)
    cpu = time.process_time() - cpu0
    elapsed = time.monotonic() - t0
    one_pass()
    rss = rss_kib() - rss0
    await reader.close()
    pods = args.count * args.pods
    analysed = args.canaries * args.pods
    return [
        ("TritonServices x pods", f"{args.count} x {args.pods}", f"{args.canaries} canaries under analysis"),
        ("index reads / s", f"{len(reader.index_ms) / elapsed:.1f}", f"{pods} pods every {args.period:g}s"),
        (
            "index read latency ms (median / p99)",
            f"{statistics.median(reader.index_ms):.1f} / {pct(reader.index_ms, 0.99):.1f}",
            "loopback, one tritonserver standing in for every pod",
        ),
        ("metrics reads / s", f"{len(reader.metrics_ms) / elapsed:.1f}", f"{analysed} pods every 10s"),
        (
            "metrics read latency ms (median / p99)",
            f"{statistics.median(reader.metrics_ms or [0]):.1f} / {pct(reader.metrics_ms, 0.99):.1f}",
            "the index read and GET :8002/metrics, parsed by prometheus_client",
        ),
        (
            "reader CPU, share of one core",
            f"{100 * cpu / elapsed:.1f}%",
            f"over {elapsed:.0f}s (this process: reads, parsing, the loop)",
        ),
        (
            "a reconcile's Triton step ms (median)",
            f"{statistics.median(step_ms):.3f}",
            "look + judge + models_status, per TritonService",
        ),
        ("reader memory (RSS growth)", f"{rss / 1024:.1f} MiB", "every reading held"),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=2)
    parser.add_argument("--canaries", type=int, default=50)
    parser.add_argument("--period", type=float, default=30.0)
    parser.add_argument("--seconds", type=float, default=90.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        model = base / "models" / "add_sub"
        (model / "1").mkdir(parents=True)
        (model / "1" / "model.py").write_bytes(behaving_source())
        (model / "config.pbtxt").write_text(build_config_pbtxt("add_sub", ADD_SUB_CONFIG))
        install = prepare_server(Path.home() / ".cache" / "triton-operator" / "tritonserver")
        server = start_server(install, base / "models", ["add_sub"], base / "tritonserver.log")
        try:
            rows = asyncio.run(measure(args, (server.http_port, server.metrics_port)))
        finally:
            server.stop()
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    print("| what | value | how |\n|---|---|---|")
    for row in rows:
        print(f"| {' | '.join(row)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
