"""Inference against a real tritonserver over Triton's HTTP/REST protocol (KServe v2), stdlib only.

Shared by the main job (`e2e/run.py`), the real-pod tests and `bench/real_pods`: one request
(`infer_add_sub`) and a bounded load generator (`LoadClient`) that counts every answer.

Each request opens a new TCP connection, so a Service's ClusterIP balances requests (not
connections) over the pods that are its endpoints at that moment; that is what a rollout moves.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

INPUT0 = [1.0, 2.0, 3.0, 4.0]
INPUT1 = [10.0, 20.0, 30.0, 40.0]


class InferenceError(RuntimeError):
    """A request that did not come back as a 200 with the expected outputs."""


def _post(host: str, port: int, path: str, body: Mapping[str, object], timeout: float) -> dict[str, object]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        data = json.dumps(body).encode()
        conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
        if resp.status != 200:
            raise InferenceError(f"HTTP {resp.status}: {raw[:300].decode(errors='replace')}")
        out: dict[str, object] = json.loads(raw)
        return out
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise InferenceError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()


def infer_add_sub(
    host: str,
    port: int = 8000,
    *,
    model: str = "add_sub",
    a: list[float] | None = None,
    b: list[float] | None = None,
    timeout: float = 5.0,
) -> dict[str, list[float]]:
    """One request to a model with FP32 inputs INPUT0, INPUT1 of 4 values (batch of 1); its outputs."""
    a = INPUT0 if a is None else a
    b = INPUT1 if b is None else b
    body = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, len(a)], "datatype": "FP32", "data": a},
            {"name": "INPUT1", "shape": [1, len(b)], "datatype": "FP32", "data": b},
        ]
    }
    answer = _post(host, port, f"/v2/models/{model}/infer", body, timeout)
    outputs = answer.get("outputs")
    if not isinstance(outputs, list) or not outputs:
        raise InferenceError(f"no outputs in {answer!r}")
    return {str(o["name"]): [float(x) for x in o["data"]] for o in outputs}


def offset_of(
    outputs: dict[str, list[float]], a: list[float] | None = None, b: list[float] | None = None
) -> float:
    """How far OUTPUT0 is from INPUT0 + INPUT1 (the test models add a constant to tell revisions apart)."""
    a = INPUT0 if a is None else a
    b = INPUT1 if b is None else b
    diffs = {round(o - (x + y), 3) for o, x, y in zip(outputs["OUTPUT0"], a, b, strict=True)}
    if len(diffs) != 1:
        raise InferenceError(f"OUTPUT0 {outputs['OUTPUT0']} is not INPUT0 + INPUT1 + a constant")
    return diffs.pop()


@dataclass
class LoadClient:
    """Sends requests one after another from a thread until stopped; counts answers by offset.

    Bounded: it stops by itself after ``max_seconds`` or ``max_requests``, whichever comes first.
    """

    host: str
    port: int = 8000
    model: str = "add_sub"
    interval: float = 0.02
    max_seconds: float = 600.0
    max_requests: int = 200_000
    timeout: float = 5.0
    sent: int = 0
    answers: Counter[float] = field(default_factory=Counter)
    failures: list[tuple[float, str]] = field(default_factory=list)
    failures_sent: list[float] = field(default_factory=list)
    """When each failed request was sent (seconds after the start; ``failures`` has when it failed)."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _t0: float = 0.0

    def start(self) -> LoadClient:
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="load-client", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        deadline = self._t0 + self.max_seconds
        while not self._stop.is_set() and time.monotonic() < deadline and self.sent < self.max_requests:
            self.sent += 1
            sent_at = time.monotonic() - self._t0
            try:
                outputs = infer_add_sub(self.host, self.port, model=self.model, timeout=self.timeout)
                self.answers[offset_of(outputs)] += 1
            except Exception as exc:  # every failure is counted, none ends the client
                self.failures_sent.append(round(sent_at, 2))
                self.failures.append((round(time.monotonic() - self._t0, 2), f"{type(exc).__name__}: {exc}"))
            self._stop.wait(self.interval)

    def stop(self) -> LoadClient:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout + 5)
        return self

    def summary(self) -> str:
        answers = ", ".join(f"{n} with offset {k:g}" for k, n in sorted(self.answers.items()))
        return f"{self.sent} requests sent, {len(self.failures)} failed; answers: {answers or 'none'}"
