#!/usr/bin/env python3
"""`kubectl triton tune --apply` on the real node: the Service measured before and after; one table.

A TritonService serving the adder with a per-call overhead (``--delay`` seconds per execute(),
whatever the batch: `real_pods.behaving_source`, the model tests/e2e/test_tuning_e2e.py tunes) with
its own config (one CPU instance, maxBatchSize 8, no dynamic batching). Then, in order:

1. before: perf_analyzer loads Service `<name>` through its ClusterIP, as users reach it (a Job on
   the same node, `core.tuning.service_perf_job`, the same load as the sweep's), at each
   ``--concurrency``;
2. `kubectl triton tune NAME --model add_sub --queue-delay-us ... --latency-bound-ms B --apply`
   (the sweep: each candidate on a tuning pod of its own; the winner under the bound patched into
   the spec, which the operator rolls out as any spec change);
3. wait until a new stable revision serves it alone (Ready, the old revision's pods gone, the
   Service's Triton answering with the applied config);
4. after: the same perf_analyzer load on the Service again.

Printed: one markdown table (config, concurrency, throughput, p50/p95/p99, before vs after, the
best under the bound of each), then the sweep's own table as `kubectl triton tune` printed it.
No figure here is asserted; the machine's load is printed with them.

Needs the local cluster's real node (e2e/cluster.py up; started and stopped here when not up) and
the images built from this tree (the perf Jobs run perf_analyzer 2.51.0 from its perf-analyzer image).

  .venv/bin/python bench/tune/run.py                     # bound 100 ms, concurrencies 1,8
  .venv/bin/python bench/tune/run.py --latency-bound-ms 60 --concurrency 1,4,8
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for extra in (ROOT, ROOT / "e2e", ROOT / "tests" / "support", ROOT / "operator" / "src"):
    sys.path.insert(0, str(extra))

from bench.real_pods.common import say, wait  # noqa: E402
from bench.real_pods.inplace import Bench, Store  # noqa: E402

import cluster  # noqa: E402
from real_pods import ADD_SUB_CONFIG, behaving_source, on_real_node, real_node  # noqa: E402
from triton_operator.core import tuning  # noqa: E402
from triton_operator.core.objects.names import LABEL_REVISION  # noqa: E402

NAME = "tuned"
MODEL = "add_sub"
BUCKET = "tune"
KEY = "models/add_sub/1/model.py"


def csv_ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v.strip())


class TuneBench(Bench):
    """The in-place bench's session (seaweedfs, the operator, a namespace) with the tuned adder in store."""

    PREFIX = "bench-tune"

    def fill(self, s3: Any) -> Store:
        s3.create_bucket(Bucket=BUCKET)
        source = behaving_source(delay=self.args.delay)
        s3.put_object(Bucket=BUCKET, Key=KEY, Body=source)
        return Store(objects={KEY: len(source)})

    def sweep(self) -> tuning.Sweep:
        a = self.args
        return tuning.Sweep(
            model=MODEL,
            concurrencies=csv_ints(a.concurrency),
            measurement_ms=a.measurement_ms,
            max_trials=a.max_trials,
            stability_percentage=a.stability_percentage,
            candidate_seconds=a.candidate_seconds,
        )

    def serve(self) -> dict[str, Any]:
        body = on_real_node(NAME, self.namespace, bucket=BUCKET, endpoint=self.server.endpoint)
        body["spec"]["models"] = [{"name": MODEL, "config": copy.deepcopy(ADD_SUB_CONFIG)}]
        self.apply(body)
        return dict(wait(lambda: self.ready_stable(None), 300, f"{NAME} Ready"))

    def ready_stable(self, other_than: str | None) -> dict[str, Any] | None:
        """The status once Ready with a stable revision other than ``other_than`` whose pods alone are
        left (so the Service routes to it only); else None."""
        status = self.status(NAME)
        stable = status.get("stableRevision")
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
        )
        if not ready or stable in (None, other_than):
            return None
        revisions = {((p.metadata.labels or {}).get(LABEL_REVISION)) for p in self.pods(NAME)}
        return status if revisions == {stable} else None

    def served_config(self, host: str) -> dict[str, Any] | None:
        with contextlib.suppress(OSError, ValueError):
            url = f"http://{host}:8000/v2/models/{MODEL}/config"
            with urllib.request.urlopen(url, timeout=5) as response:
                got: dict[str, Any] = json.loads(response.read())
                return got
        return None

    def measure_service(self, label: str, host: str) -> list[tuning.Measurement]:
        """perf_analyzer through the Service's ClusterIP, at each concurrency (a Job, deleted after)."""
        from triton_operator.adapters.tuning_cluster import KubeTuning  # noqa: PLC0415

        tuner = KubeTuning(self.kube)
        ts_body = tuner.service(NAME, self.namespace)
        stable = str(ts_body["status"]["stableRevision"])
        configmaps = tuner.revision_configmaps(NAME, self.namespace, stable)
        image = tuning.default_perf_image(tuning.serving_image(configmaps))
        spec = tuning.stable_spec(configmaps)
        sweep = self.sweep()
        job = tuning.service_perf_job(ts_body, label, sweep, host, image, spec=spec)
        try:
            tuner.create([job])
            log = tuner.job_log(self.namespace, job["metadata"]["name"], sweep.candidate_seconds + 30)
        finally:
            tuner.delete(self.namespace, tuning.run_labels(NAME, label))
        rows = tuning.parse_perf_csv(tuning.job_output_csv(log))
        say(f"{label}: {[(m.concurrency, round(m.throughput, 1)) for m in rows]}")
        return rows

    def tune(self) -> tuple[list[str], str]:
        """`kubectl triton tune ... --apply`: its command line and what it printed."""
        a = self.args
        script = shutil.which("kubectl-triton", path=str(Path(sys.executable).parent))
        command = [script] if script else [sys.executable, "-m", "triton_operator.kubectl_plugin"]
        flags = [
            *["tune", NAME, "-n", self.namespace, "--model", MODEL, "--queue-delay-us", a.queue_delay_us],
            *["--concurrency", a.concurrency, "--measurement-ms", str(a.measurement_ms)],
            *["--max-trials", str(a.max_trials), "--stability-percentage", str(a.stability_percentage)],
            *["--candidate-seconds", str(a.candidate_seconds), "--max-seconds", "900"],
            *["--latency-bound-ms", str(a.latency_bound_ms), "--apply"],
        ]
        env = {
            **os.environ,
            "KUBECONFIG": self.kubeconfig,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(ROOT / "operator" / "src"), os.environ.get("PYTHONPATH")])
            ),
        }
        done = subprocess.run(
            [*command, *flags], env=env, capture_output=True, text=True, timeout=1200, check=False
        )
        sys.stderr.write(done.stderr)
        if done.returncode != 0:
            raise RuntimeError(f"kubectl triton tune exited {done.returncode}: {done.stderr[-2000:]}")
        return ["kubectl", "triton", *flags], done.stdout

    def record(self) -> dict[str, Any]:
        from lightkube.resources.core_v1 import ConfigMap  # noqa: PLC0415

        labels: dict[str, Any] = {tuning.LABEL_TUNING: NAME, tuning.LABEL_RESULTS: "true"}
        found = [
            tuning.read_record(c.to_dict())
            for c in self.kube.list(ConfigMap, namespace=self.namespace, labels=labels)
        ]
        (data,) = [r for r in found if r is not None]
        return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--latency-bound-ms", type=float, default=100.0, help="the sweep's p95 bound (ms)")
    ap.add_argument("--concurrency", default="1,8", help="perf_analyzer concurrencies (before, sweep, after)")
    ap.add_argument("--queue-delay-us", default="0,2000", help="the sweep's candidate queue delays")
    ap.add_argument("--delay", type=float, default=0.02, help="the model's overhead per execute() (s)")
    ap.add_argument("--measurement-ms", type=int, default=1500)
    ap.add_argument("--max-trials", type=int, default=6)
    ap.add_argument("--stability-percentage", type=int, default=50)
    ap.add_argument("--candidate-seconds", type=int, default=240)
    args = ap.parse_args(argv)
    with cluster.stop_signals_interrupt():
        return bench(args)


def bench(args: argparse.Namespace) -> int:
    """Start the cluster when it is not up, run, print the tables, then bring down what it started."""
    started = False
    rc = 0
    problems: list[str] = []
    result: dict[str, Any] = {}
    try:
        if not cluster.is_up():
            started = True
            cluster.up()
        node, why = real_node()
        if node is None:
            say(f"no real node: {why}")
            return 2
        session = TuneBench(args, node, Path(tempfile.mkdtemp(prefix="bench-tune-")))
        try:
            session.start()
            first = session.serve()
            host = session.cluster_ip(NAME)
            say(f"{NAME} Ready, stable {first['stableRevision']}, Service at {host}")
            result["before"] = session.measure_service("bench-before", host)
            result["command"], result["sweep"] = session.tune()
            result["record"] = session.record()
            t0 = time.monotonic()
            status = wait(
                lambda: session.ready_stable(first["stableRevision"]), 300, "the new stable revision alone"
            )
            wait(
                lambda: (session.served_config(host) or {}).get("dynamic_batching") is not None,
                120,
                "the applied config served",
            )
            say(
                f"stable {first['stableRevision']} -> {status['stableRevision']} "
                f"{time.monotonic() - t0:.0f} s after the sweep ended"
            )
            result["after"] = session.measure_service("bench-after", host)
        finally:
            session.stop()
            say(f"operator log and seaweedfs: {session.workdir}")
    except KeyboardInterrupt as e:
        say(f"interrupted ({e or 'Ctrl-C'})")
        rc = 130
    finally:
        with cluster.signals_deferred():
            if result.get("before"):
                print_tables(result, args)
            if started:
                problems = cluster.down_reporting()
        for line in problems:
            say(line)
    return rc or (3 if problems else 0)


def _ms(us: int) -> str:
    return f"{us / 1000:.1f}"


def print_tables(result: dict[str, Any], args: argparse.Namespace) -> None:
    record = result.get("record") or {}
    choice = record.get("choice") or {}
    own = next((c for c in record.get("candidates") or [] if c.get("default")), None)
    own_config = own["config"] if own else ADD_SUB_CONFIG
    bound_us = round(args.latency_bound_ms * 1000)
    configs = {
        "before": f"before: c0, the model's own ({tuning.describe_knobs(own_config)})",
        "after": f"after: {choice.get('candidate', '?')} applied ({choice.get('settings', '?')})",
    }
    print(
        f"\nService `{NAME}` through its ClusterIP, perf_analyzer (gRPC, random inputs) at concurrency "
        f"{args.concurrency}, before tuning and after `--apply` (the adder with {args.delay * 1000:.0f} ms "
        f"per execute(); bound p95 <= {args.latency_bound_ms:g} ms)\n"
    )
    print("| config | concurrency | infer/s | p50 ms | p95 ms | p99 ms | p95 within bound |")
    print("|---|---|---|---|---|---|---|")
    best: dict[str, tuning.Measurement | None] = {}
    for when in ("before", "after"):
        rows: list[tuning.Measurement] = result.get(when) or []
        for m in rows:
            within = "yes" if m.p95_us <= bound_us else "no"
            print(
                f"| {configs[when]} | {m.concurrency} | {m.throughput:.1f} | {_ms(m.p50_us)} | "
                f"{_ms(m.p95_us)} | {_ms(m.p99_us)} | {within} |"
            )
        under = [m for m in rows if m.p95_us <= bound_us]
        best[when] = max(under, key=lambda m: m.throughput) if under else None
    b, a = best.get("before"), best.get("after")
    if b and a:
        print(
            f"\nMost throughput within p95 <= {args.latency_bound_ms:g} ms: "
            f"before {b.throughput:.1f} infer/s "
            f"(concurrency {b.concurrency}), after {a.throughput:.1f} infer/s (concurrency {a.concurrency}): "
            f"x{a.throughput / b.throughput:.2f}"
        )
    elif result.get("after") is None:
        print("\n(after: not measured; see stderr)")
    if result.get("command"):
        print(
            f"\nThe sweep:\n\n```\n$ {' '.join(result['command'])}\n{result.get('sweep', '').rstrip()}\n```"
        )


if __name__ == "__main__":
    sys.exit(main())
