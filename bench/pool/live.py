#!/usr/bin/env python3
"""A pool against every model everywhere on the real node, on the same models: one table.

``--models`` Python models, each holding ``--hold`` MiB once loaded (a Python stub's own memory comes on
top) and declaring ``--memory``, served two ways by ``--pods`` pods each:

* every model everywhere: a TritonService without spec.pool; every pod loads every model, so each pod's
  models need the sum of their memory;
* pool: the same models under spec.pool, ``--budget`` a pod, one copy each (minCopies 1; the first model
  maxCopies 2), copies following load with short waits (``SCALING``).

For each: the pods and the memory the layout needs (declared: what one pod's models add up to, and in
all; measured: the tritonserver containers' working set, from the kubelet's stats summary, once every
model answers), the seconds from the apply to every model answering, the seconds from adding one more
model to the spec to its first answer (through the main Service everywhere, the model's own Service in
the pool), and the latency under a skewed load (``--clients`` clients for ``--seconds`` s, each waiting
``--interval`` s between its requests, ``--hot`` percent of the requests to one model, the rest
spread over the others; through the same Services): requests, failed, p50 and p99. In the pool, before
the skewed load, a busy model's second copy: ``--clients`` clients sending only to the first model (its
maxCopies 2) until status.pool says it has 2 READY copies and its Service's EndpointSlices have 2 ready
endpoints, with the pool's scaling waits short (``SCALING``: busy above 50 inferences a second per copy,
averaged over 10 s, no wait before a copy is added); every model everywhere has one on every pod already.

Needs the local cluster's real node (e2e/cluster.py up; started and stopped here when not up);
seaweedfs on the pod bridge's gateway holds the models, the operator runs on this machine. Each
request is a new connection from this machine to a Service's ClusterIP, asked from the moment the
Service has one; the node drops a connection kube-proxy has no rule for yet, which the waits retry
(docs/benchmarks.md, "A pool on the real node": without that, such a request's conntrack entry
failed later requests from its source port). A failed request is counted, and the first five are
printed with their time (UTC) and how long they took.

  .venv/bin/python bench/pool/live.py               # 12 models, 3 pods of 500Mi
  .venv/bin/python bench/pool/live.py --small       # 4 models, 2 pods of 300Mi (CI)
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.real_pods.common import Session, run_with_cluster, say, wait

import cluster
from inference import InferenceError, infer_add_sub, offset_of
from real_pods import ADD_SUB_CONFIG, adder_source, on_real_node
from triton_operator.core.pool.assignment import ASSIGNMENT_ANNOTATION, parse_assignment
from triton_operator.core.pool.labels import READY, model_label_key

MiB = 1024 * 1024
EVERY_POD_HOLDS_IT = "- (every pod holds it)"
LAYOUTS = ("every model everywhere", "pool")
SCALING: dict[str, Any] = {
    "busyInferencesPerSecond": "50",
    "windowSeconds": 10,
    "scaleUpStabilizationSeconds": 0,
}
"""The bench pool's spec.pool.scaling: a model is busy above 50 inferences a second per copy (the skewed
load's cold models stay well below), averaged over the shortest window, and gets its copy at once."""


def holding_source(offset: float, mib: int) -> bytes:
    """The adder (plus ``offset``: an answer names its model) holding ``mib`` MiB, touched, once loaded."""
    text = adder_source(offset).decode()
    head = "    def initialize(self, args):\n"
    assert head in text
    return text.replace(head, f"{head}        self.hold = b'\\x01' * ({mib} << 20)\n").encode()


def mib_of(quantity: str) -> int:
    if not quantity.endswith("Mi") or not quantity[:-2].isdigit():
        raise SystemExit(f"--memory/--budget: {quantity!r} is not a whole number of Mi (e.g. 100Mi)")
    return int(quantity[:-2])


@dataclass
class Result:
    layout: str
    pods: int
    pod_mib: int
    """What one pod's models need, declared."""
    measured_mib: float | None = None
    """The tritonserver containers' working set, all pods together (None: not read)."""
    all_answer_s: float = 0.0
    new_model_s: float = 0.0
    sent: int = 0
    failed: int = 0
    unreachable: int = 0
    """Of ``failed``: connections the node answered 'No route to host' (EHOSTUNREACH). On the local
    node that was a request's source port caught by the conntrack entry of an earlier request sent
    before kube-proxy had the Service's rules, which the node now drops (e2e/node.py
    add_services_guard; docs/benchmarks.md, "A pool on the real node")."""
    latencies_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """The first failed requests' errors (model, when on the load's clock and in UTC, after how long:
    error)."""
    failure_times: list[float] = field(default_factory=list)
    """When each failed request failed (seconds since the epoch)."""
    second_copy_s: float | None = None
    """From the start of a load on one model to its second copy READY and in its Service's endpoints
    (None: every pod holds every model)."""
    copy_sent: int = 0
    copy_failed: int = 0
    copy_unreachable: int = 0
    hot_copies: int | None = None
    """The busy model's copies after the skewed load (status.pool; None: not a pool)."""

    @property
    def second_copy(self) -> str:
        if self.second_copy_s is None:
            return EVERY_POD_HOLDS_IT
        return f"{self.second_copy_s:.1f} ({self.copy_sent} / {self.copy_failed})"

    def p(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def row(self) -> list[str]:
        measured = f"{self.measured_mib:,.0f}" if self.measured_mib is not None else "not read"
        return [
            self.layout,
            str(self.pods),
            f"{self.pod_mib:,}",
            f"{self.pods * self.pod_mib:,}",
            measured,
            f"{self.all_answer_s:.1f}",
            f"{self.new_model_s:.1f}",
            f"{self.sent} / {self.failed}",
            f"{self.p(0.50):.1f}",
            f"{self.p(0.99):.1f}",
            self.second_copy,
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "layout": self.layout,
            "pods": self.pods,
            "podMiB": self.pod_mib,
            "measuredMiB": self.measured_mib,
            "allAnswerSeconds": self.all_answer_s,
            "newModelSeconds": self.new_model_s,
            "sent": self.sent,
            "failed": self.failed,
            "unreachable": self.unreachable,
            "p50Ms": self.p(0.50),
            "p99Ms": self.p(0.99),
            "secondCopy": self.second_copy,
            "secondCopySeconds": self.second_copy_s,
            "copySent": self.copy_sent,
            "copyFailed": self.copy_failed,
            "copyUnreachable": self.copy_unreachable,
            "hotCopies": self.hot_copies,
            "errors": self.errors,
            "failureTimes": self.failure_times,
        }


HEADER = [
    "layout",
    "pods",
    "MiB a pod needs",
    "MiB in all",
    "measured MiB (working set)",
    "apply to every model answering, s",
    "a new model answers, s",
    "skewed load: requests / failed",
    "p50 ms",
    "p99 ms",
    "a busy model's second copy, s (requests / failed)",
]


class Bench:
    def __init__(self, session: Session, args: argparse.Namespace) -> None:
        self.session = session
        self.args = args
        self.models = [f"m{i}" for i in range(args.models)]
        self.new_model = f"m{args.models}"
        self.results: list[Result] = []

    # ------------------------------------------------------------------ bodies

    def offset(self, model: str) -> float:
        return float(10 * (int(model[1:]) + 1))

    def body(self, name: str, models: list[str], *, pool: bool) -> dict[str, Any]:
        args = self.args
        entries: list[dict[str, Any]] = []
        for model in models:
            entry: dict[str, Any] = {"name": model, "config": copy.deepcopy(ADD_SUB_CONFIG)}
            if pool:
                entry.update({"memory": args.memory, "minCopies": 1})
                if model == self.models[0]:
                    entry["maxCopies"] = 2
            entries.append(entry)
        per_pod = len(models) if not pool else mib_of(args.budget) // mib_of(args.memory)
        # the container's limit: its models' stubs and what they hold, and tritonserver itself
        limit = per_pod * (args.hold + 96) + 512
        spec: dict[str, Any] = {
            "resources": {"cpu": "100m", "memory": f"{limit}Mi"},
            "models": entries,
            "startupTimeoutSeconds": 600,
        }
        if pool:
            spec["pool"] = {"memoryPerPod": args.budget, "scaling": SCALING}
        return on_real_node(
            name,
            self.session.namespace,
            bucket=self.bucket,
            endpoint=self.session.server.endpoint,
            replicas=args.pods,
            **spec,
        )

    # ------------------------------------------------------------------ reading

    def host_of(self, name: str, model: str, pool: bool) -> str:
        return self.session.cluster_ip(f"{name}-m-{model}" if pool else name)

    def answers(self, host: str, model: str) -> bool:
        with contextlib.suppress(InferenceError):
            return offset_of(infer_add_sub(host, model=model, timeout=3)) == self.offset(model)
        return False

    def working_set_mib(self, name: str) -> float | None:
        """The tritonserver containers' working set of ``name``'s pods, from the kubelet's stats summary."""
        path = f"/api/v1/nodes/{self.session.node['name']}/proxy/stats/summary"
        proc = subprocess.run(
            [
                str(cluster.bin_dir() / "kubectl"),
                f"--kubeconfig={self.session.kubeconfig}",
                "get",
                "--raw",
                path,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if proc.returncode != 0:
            say(f"stats summary not read: {proc.stderr.strip()[:200]}")
            return None
        pods = {p.metadata.name for p in self.session.pods(name)}
        total = 0
        for pod in json.loads(proc.stdout).get("pods") or []:
            ref = pod.get("podRef") or {}
            if ref.get("namespace") != self.session.namespace or ref.get("name") not in pods:
                continue
            for container in pod.get("containers") or []:
                if container.get("name") == "tritonserver":
                    total += int((container.get("memory") or {}).get("workingSetBytes") or 0)
        return total / MiB

    def at_rest(self, name: str, pool: bool) -> bool:
        """Nothing moves any more: the TritonService Ready, and in a pool each pod holds exactly the
        models it is labelled ready for, none of them draining."""
        status = self.session.status(name)
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
        )
        if not ready or not pool:
            return ready
        for pod in self.session.pods(name):
            metadata = pod.metadata
            text = (metadata.annotations or {}).get(ASSIGNMENT_ANNOTATION) if metadata else None
            assignment = parse_assignment(text)
            labels = (metadata.labels or {}) if metadata else {}
            routed = {m for m in assignment.models if labels.get(model_label_key(m)) == READY}
            if assignment.draining or routed != set(assignment.models):
                return False
        return True

    # ------------------------------------------------------------------ the load

    def pool_entry(self, name: str, model: str) -> dict[str, Any]:
        """``model``'s entry in status.pool.models ({} when none)."""
        entries: list[dict[str, Any]] = (self.session.status(name).get("pool") or {}).get("models") or []
        return next((e for e in entries if e.get("name") == model), {})

    def copies_ready(self, name: str, model: str, copies: int) -> bool:
        """status.pool gives ``model`` ``copies`` READY copies on as many pods, and its Service's
        EndpointSlices have as many ready endpoints (it answers there)."""
        from lightkube.resources.discovery_v1 import EndpointSlice  # noqa: PLC0415

        entry = self.pool_entry(name, model)
        if entry.get("readyCopies") != copies or len(entry.get("pods") or []) != copies:
            return False
        service = f"{name}-m-{model}"
        slices = self.session.kube.list(
            EndpointSlice,
            namespace=self.session.namespace,
            labels={"kubernetes.io/service-name": service},
        )
        ready = {
            address
            for s in slices
            for e in s.endpoints or []
            if e.conditions is not None and e.conditions.ready
            for address in e.addresses
        }
        return len(ready) == copies

    def second_copy(self, name: str, hosts: dict[str, str], result: Result) -> None:
        """``--clients`` threads sending only to the first model until it has a second copy READY
        and in its Service's endpoints."""
        hot = self.models[0]
        started = time.monotonic()
        done = threading.Event()
        counts = Result(result.layout, result.pods, result.pod_mib)
        runner = threading.Thread(
            target=self.load, args=(hosts, counts, lambda _rng: hot, done.is_set), daemon=True
        )
        runner.start()
        try:
            wait(lambda: self.copies_ready(name, hot, 2), self.args.timeout, f"a second copy of {hot}", 0.5)
            result.second_copy_s = time.monotonic() - started
        finally:
            done.set()
            runner.join(60)
        result.copy_sent, result.copy_failed = counts.sent, counts.failed
        result.copy_unreachable = counts.unreachable
        result.errors.extend(f"(second copy's load) {e}" for e in counts.errors)
        result.failure_times.extend(counts.failure_times)

    def skewed(self, hosts: dict[str, str], result: Result) -> None:
        """``--clients`` threads for ``--seconds`` s: ``--hot`` percent to the first model, the rest
        spread over the others."""
        args = self.args
        hot, cold = self.models[0], self.models[1:]
        stop = time.monotonic() + args.seconds

        def pick(rng: random.Random) -> str:
            return hot if not cold or rng.random() * 100 < args.hot else rng.choice(cold)

        self.load(hosts, result, pick, lambda: time.monotonic() >= stop)

    def load(
        self,
        hosts: dict[str, str],
        result: Result,
        pick: Callable[[random.Random], str],
        over: Callable[[], bool],
    ) -> None:
        """``--clients`` threads asking the model ``pick`` names, ``--interval`` s apart, until ``over``;
        each answer's latency and each failure counted in ``result``."""
        args = self.args
        start = time.monotonic()
        lock = threading.Lock()

        def client(seed: int) -> None:
            rng = random.Random(seed)
            while not over():
                model = pick(rng)
                started = time.perf_counter()
                error = ""
                try:
                    got = offset_of(infer_add_sub(hosts[model], model=model, timeout=10))
                    error = "" if got == self.offset(model) else f"offset {got:g}"
                except InferenceError as exc:
                    error = str(exc)
                took = (time.perf_counter() - started) * 1000
                with lock:
                    result.sent += 1
                    if not error:
                        result.latencies_ms.append(took)
                    else:
                        result.failed += 1
                        result.unreachable += "[Errno 113]" in error
                        result.failure_times.append(time.time())
                        if len(result.errors) < 5:
                            utc = time.strftime("%H:%M:%S", time.gmtime())
                            result.errors.append(
                                f"{model} at {time.monotonic() - start:.2f} s ({utc} UTC, after "
                                f"{took:.0f} ms): {error}"
                            )
                time.sleep(args.interval)

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(args.clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    # ------------------------------------------------------------------ one layout

    def layout(self, layout: str) -> Result:
        pool = layout == "pool"
        name = "pool" if pool else "every"
        args = self.args
        per_pod = mib_of(args.budget) if pool else len(self.models) * mib_of(args.memory)
        result = Result(layout, args.pods, per_pod)
        say(f"{layout}: {len(self.models)} models on {args.pods} pods")
        started = time.monotonic()
        self.session.apply(self.body(name, self.models, pool=pool))
        hosts = {m: self.host_of(name, m, pool) for m in self.models}
        for model in self.models:
            answering = functools.partial(self.answers, hosts[model], model)
            wait(answering, args.timeout, f"{layout}: {model} answering", 0.2)
        result.all_answer_s = time.monotonic() - started
        wait(lambda: self.at_rest(name, pool), args.timeout, f"{layout}: at rest", 0.5)
        time.sleep(3)  # the last loads' CPU settles
        result.measured_mib = self.working_set_mib(name)
        if pool:
            self.second_copy(name, hosts, result)
            say(f"{layout}: a second copy {result.second_copy}")
        self.skewed(hosts, result)
        if pool:
            result.hot_copies = self.pool_entry(name, self.models[0]).get("readyCopies")
        say(f"{layout}: {result.sent} requests, {result.failed} failed, p99 {result.p(0.99):.1f} ms")
        started = time.monotonic()
        self.session.apply(self.body(name, [*self.models, self.new_model], pool=pool))
        host = self.host_of(name, self.new_model, pool)
        wait(
            lambda: self.answers(host, self.new_model),
            args.timeout,
            f"{layout}: the new model answering",
            0.2,
        )
        result.new_model_s = time.monotonic() - started
        self.session.gone(name, timeout=args.timeout)
        return result

    def measure(self) -> None:
        self.bucket = f"poolbench-{random.randrange(1 << 30):x}"
        self.session.s3.create_bucket(Bucket=self.bucket)
        for model in [*self.models, self.new_model]:
            key = f"models/{model}/1/model.py"
            body = holding_source(self.offset(model), self.args.hold)
            self.session.s3.put_object(Bucket=self.bucket, Key=key, Body=body)
        for layout in LAYOUTS:
            self.results.append(self.layout(layout))

    def report(self) -> None:
        args = self.args
        print(
            f"{args.models} Python models holding {args.hold} MiB each, declaring {args.memory}; "
            f"{args.pods} pods; the pool's budget {args.budget} a pod; skewed load: {args.clients} clients "
            f"for {args.seconds:g} s, {args.interval * 1000:g} ms between requests, {args.hot}% to one model"
        )
        print("| " + " | ".join(HEADER) + " |")
        print("|" + "---|" * len(HEADER))
        for result in self.results:
            print("| " + " | ".join(result.row()) + " |")
        for result in self.results:
            for error in result.errors:
                print(f"{result.layout}: a failed request: {error}")
        if len(self.results) == len(LAYOUTS):
            every, pool = self.results
            print(
                f"The pool needs {pool.pods * pool.pod_mib:,} MiB of declared memory where every model "
                f"everywhere needs {every.pods * every.pod_mib:,}; "
                f"p99 {pool.p(0.99):.1f} ms against {every.p(0.99):.1f} ms "
                f"(the busy model has {pool.hot_copies} READY copies in the pool, {every.pods} everywhere); "
                f"its second copy in the pool answered {pool.second_copy_s or 0:.1f} s into a load on it "
                "alone."
            )
        if args.json:
            Path(args.json).write_text(json.dumps({"results": [r.to_json() for r in self.results]}, indent=2))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=12)
    parser.add_argument("--hold", type=int, default=20, help="MiB each model holds once loaded")
    parser.add_argument(
        "--memory", default="100Mi", help="each model's declared memory (spec.models[].memory)"
    )
    parser.add_argument("--pods", type=int, default=3)
    parser.add_argument("--budget", default="500Mi", help="spec.pool.memoryPerPod")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--hot", type=int, default=80, help="percent of the skewed load to one model")
    parser.add_argument(
        "--interval", type=float, default=0.005, help="seconds each client waits between its requests"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for each step")
    parser.add_argument(
        "--small", action="store_true", help="CI size: 4 models, 2 pods of 300Mi, 8 s of load"
    )
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    if args.small:
        args.models, args.pods, args.budget, args.seconds, args.clients = 4, 2, "300Mi", 8.0, 2
    if args.models < 2 or args.pods < 1:
        raise SystemExit("--models must be 2 or more and --pods 1 or more")
    if (args.models + 1) * mib_of(args.memory) > args.pods * mib_of(args.budget):
        raise SystemExit(
            f"--models {args.models} and one more of {args.memory} do not fit {args.pods} pods of "
            f"{args.budget} (--budget)"
        )
    with tempfile.TemporaryDirectory(prefix="pool-bench-") as tmp:
        bench: Bench | None = None

        def measure(node: dict[str, Any]) -> None:
            nonlocal bench
            session = Session(node, Path(tmp), "poolbench")
            bench = Bench(session, args)
            session.start()
            try:
                bench.measure()
            finally:
                session.stop()

        return run_with_cluster(
            measure,
            lambda: bench.report() if bench is not None else None,
            measured=lambda: len(bench.results) if bench is not None else 0,
        )


if __name__ == "__main__":
    sys.exit(main())
