"""Plays Prometheus and prometheus-adapter for the autoscaling tests: Triton's per-pod rates, written
to the custom metrics test adapter that the local cluster runs.

In production, Prometheus scrapes each tritonserver pod's `:8002/metrics` and prometheus-adapter
serves `rate()`s of it as per-pod custom metrics (examples/autoscaling/prometheus-adapter-rules.yaml).
Neither runs here; this pump does that arithmetic itself over the same counters, read from the real
pods, and writes each pod's value to the real metrics API server (sigs.k8s.io/custom-metrics-apiserver's
test adapter), which the real HPA controller then reads through the API server's aggregation layer.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

INFERENCE_RATE = "triton_inferences_per_second"
QUEUE_TIME = "triton_queue_time_per_request_microseconds"


@dataclass(frozen=True)
class Totals:
    """One pod's counters, summed over models and versions."""

    inferences: float
    successes: float
    queue_us: float


def totals(text: str) -> Totals:
    """nv_inference_count, nv_inference_request_success and nv_inference_queue_duration_us, summed."""
    sums = {
        "nv_inference_count": 0.0,
        "nv_inference_request_success": 0.0,
        "nv_inference_queue_duration_us": 0.0,
    }
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in sums:
                sums[sample.name] += float(sample.value)
    return Totals(
        sums["nv_inference_count"],
        sums["nv_inference_request_success"],
        sums["nv_inference_queue_duration_us"],
    )


def scrape(ip: str, port: int = 8002, timeout: float = 2.0) -> Totals:
    with urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=timeout) as response:
        return totals(response.read().decode())


@dataclass
class Pump:
    """Every ``period`` seconds: each pod's rates over the last period, written per pod.

    ``pods()`` names the pods to read and their IPs (the TritonService's status.selector, as the
    HPA reads them); ``write(pod, metric, value)`` stores a value in the metrics API server.
    """

    pods: Callable[[], Iterable[tuple[str, str]]]
    write: Callable[[str, str, str], None]
    period: float = 2.0
    last: dict[str, tuple[float, Totals]] = field(default_factory=dict)
    written: dict[str, dict[str, float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Pump:
        self._thread = threading.Thread(target=self._loop, name="metrics-pump", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as exc:  # the test reads errors; the pump goes on
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(self.period)

    def tick(self) -> None:
        now = time.monotonic()
        for name, ip in list(self.pods()):
            try:
                current = scrape(ip)
            except OSError as exc:  # a pod still starting, or going
                self.errors.append(f"{name}: {exc}")
                continue
            before = self.last.get(name)
            self.last[name] = (now, current)
            if before is None:
                continue
            seconds = max(now - before[0], 1e-3)
            inferences = max(current.inferences - before[1].inferences, 0.0)
            successes = max(current.successes - before[1].successes, 0.0)
            queued = max(current.queue_us - before[1].queue_us, 0.0)
            values = {
                INFERENCE_RATE: inferences / seconds,
                # An idle pod waits for nothing: 0, not a missing value (the adapter rules agree).
                QUEUE_TIME: queued / successes if successes else 0.0,
            }
            for metric, value in values.items():
                self.write(name, metric, f"{round(value * 1000)}m")
            self.written[name] = values
