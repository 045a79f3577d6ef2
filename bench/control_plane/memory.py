"""The operator's own Python memory, without a cluster: start-up RSS and what a reconcile keeps per object.

This is NOT the control-plane benchmark's peak RSS. It measures two things in fresh processes:

- **start-up**: VmRSS of a process that imports what `triton-operator run` imports before kopf
  starts (kopf, triton_operator.commands.run, handlers, metrics), and how many modules that is;
- **per TritonService**: the operator's reconcile (reconcile.scheduler.Reconciler, repositories
  unpinned, no Triton reader: as bench/control_plane/run.py runs it) over MemKube, the in-memory
  KubeAPI of the unit tests, for N small TritonServices of 1 replica: one pass each that creates
  the Deployment, ConfigMap and Service, then one pod each turns Ready and every object is
  reconciled again. Under tracemalloc: what stays traced once the passes are done and MemKube (the
  "API server") is emptied, per TritonService, with the allocation sites of what stays (grouped by
  the innermost line of triton_operator), and the peak of traced memory during the passes less
  what MemKube held at the end (its store only grows, so that is about the operator's own peak).

kopf's watch caches and decoded watch bodies, aiohttp's buffers and the allocator's fragmentation
are not in these figures: they need the API server (bench/control_plane/run.py, `--tracemalloc`).

    .venv/bin/python bench/control_plane/memory.py                       # this tree, N = 100 and 1000
    .venv/bin/python bench/control_plane/memory.py --baseline /work/main/operator/src   # and another tree
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import json
import linecache
import os
import subprocess
import sys
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SUPPORT = REPO / "tests" / "support"
NAMESPACE = "bench"
OPERATOR_IMPORTS = (
    "kopf",
    "triton_operator.commands.run",
    "triton_operator.handlers",
    "triton_operator.metrics",
)
HEAVY = ("grpc", "numpy", "tritonclient.grpc._client", "boto3", "google.cloud", "azure")
PYTHON_MODEL = {
    "backend": "python",
    "maxBatchSize": 8,
    "input": [{"name": "INPUT0", "dataType": "TYPE_FP32", "dims": ["4"]}],
    "output": [{"name": "OUTPUT0", "dataType": "TYPE_FP32", "dims": ["4"]}],
}


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def tritonservice(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "triton-operator.io/v1alpha1",
        "kind": "TritonService",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": 1,
            "resources": {"cpu": "100m", "memory": "256Mi"},
            "repository": {"uri": "s3://models/bench", "endpoint": "http://store.invalid:9000"},
            "models": [{"name": "add", "config": copy.deepcopy(PYTHON_MODEL)}],
        },
    }


def ready_pod(deployment: dict[str, Any], index: int) -> dict[str, Any]:
    """A Ready pod of a Deployment's template (kwok's, as the cluster benchmark has)."""
    template = deployment["spec"]["template"]
    name = f"{deployment['metadata']['name']}-{index:05d}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": dict(template["metadata"]["labels"])},
        "spec": copy.deepcopy(template["spec"]),
        "status": {
            "phase": "Running",
            "podIP": f"10.1.{index // 250}.{index % 250 + 1}",
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
            "containerStatuses": [
                {"name": c["name"], "ready": True, "restartCount": 0, "state": {"running": {}}}
                for c in template["spec"]["containers"]
            ],
        },
    }


def innermost_operator_line(trace: tracemalloc.Trace) -> str:
    for frame in reversed(trace.traceback):  # the most recent call first
        if "/triton_operator/" in frame.filename:
            where = frame.filename.split("/triton_operator/", 1)[1]
            text = linecache.getline(frame.filename, frame.lineno).strip()[:70]
            return f"{where}:{frame.lineno} `{text}`"
    frame = trace.traceback[-1]
    return f"(outside triton_operator) {Path(frame.filename).name}:{frame.lineno}"


async def reconcile_all(count: int, frames: int, top: int) -> dict[str, Any]:
    sys.path.insert(0, str(SUPPORT))
    from memkube import MemKube  # noqa: PLC0415
    from triton_operator.adapters.triton_reader import TritonReader  # noqa: PLC0415
    from triton_operator.reconcile.analysis import TritonView  # noqa: PLC0415
    from triton_operator.reconcile.scheduler import Reconciler  # noqa: PLC0415
    from triton_operator.settings import Settings  # noqa: PLC0415

    names = [f"svc-{i:05d}" for i in range(count)]
    kube = MemKube()
    for name in names:
        kube.put(tritonservice(name))
    gc.collect()
    tracemalloc.start(frames)
    base = tracemalloc.get_traced_memory()[0]
    # The operator's Triton view, as `triton-operator run` has it, reading no pod: the kwok pods'
    # IPs are outside its CIDR (a documentation range), so nothing is sent anywhere.
    view = TritonView(TritonReader(period=30.0, cidrs=["192.0.2.0/24"]))
    reconciler = Reconciler(kube, Settings(pin_repositories=False), triton=view)
    for name in names:
        await reconciler(NAMESPACE, name)
    # kwok's part: one pod each turns Ready, its Deployment says so; each object is reconciled again.
    for index, deployment in enumerate(kube.of_kind("Deployment")):
        kube.put(ready_pod(deployment, index))
        key = deployment["metadata"]["name"]
        kube.edit(
            "Deployment",
            NAMESPACE,
            key,
            lambda d: d.update(status={"replicas": 1, "readyReplicas": 1, "availableReplicas": 1}),
        )
    for name in names:
        await reconciler(NAMESPACE, name, coalesce=True)
    traced, peak = tracemalloc.get_traced_memory()
    # What is left once the API server's copies are gone is the operator's.
    kube.objects.clear()
    kube.calls.clear()
    kube.writes.clear()
    kube.applied.clear()
    kube.events.clear()
    gc.collect()
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [
            tracemalloc.Filter(False, tracemalloc.__file__),
            tracemalloc.Filter(False, "<frozen importlib._bootstrap*>"),
        ]
    )
    kept = tracemalloc.get_traced_memory()[0] - base
    store = traced - base - kept
    tracemalloc.stop()
    sites: Counter[str] = Counter()
    if frames > 1:
        for trace in snapshot.traces:
            sites[innermost_operator_line(trace)] += trace.size
    timers = sum(1 for t in asyncio.all_tasks() if t.get_name().startswith(("requeue ", "poll ")))
    await reconciler.close()
    return {
        "count": count,
        "peak": peak - base - store,
        "kept": kept,
        "store": store,
        "timers": timers,
        "sites": sites.most_common(top),
    }


def child(args: argparse.Namespace) -> None:
    if args.mode == "imports":
        import importlib  # noqa: PLC0415

        before = rss_kib()
        for module in OPERATOR_IMPORTS:
            importlib.import_module(module)
        heavy = sorted({m.split(".")[0] for m in sys.modules if m.startswith(HEAVY)})
        print(
            json.dumps(
                {"rss_kib": rss_kib(), "python_kib": before, "modules": len(sys.modules), "heavy": heavy}
            )
        )
    else:
        print(json.dumps(asyncio.run(reconcile_all(args.count, args.frames, args.top))))


def measure(src: str, *extra: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, str(SUPPORT)])}
    out = subprocess.run(
        [sys.executable, __file__, "--child", *extra], env=env, check=True, capture_output=True, text=True
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--baseline", metavar="SRC", help="another tree's operator/src, measured alike")
    parser.add_argument(
        "--frames", type=int, default=16, help="tracemalloc frames of the smallest N's run, for its sites"
    )
    parser.add_argument("--top", type=int, default=12, help="allocation sites shown (default 12)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="imports", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    trees = {"this tree": str(REPO / "operator" / "src")}
    if args.baseline:
        trees["baseline"] = args.baseline
    rows: dict[str, list[str]] = {}
    sites: dict[str, list[tuple[str, int]]] = {}
    for label, src in trees.items():
        imports = measure(src, "--mode", "imports")
        cells = [
            f"{imports['rss_kib'] / 1024:.1f} MiB ({imports['modules']} modules"
            + (f"; {', '.join(imports['heavy'])}" if imports["heavy"] else "")
            + ")"
        ]
        for count in args.counts:
            # Deep tracebacks (slow) only where the sites are shown; the sizes do not depend on them.
            frames = args.frames if count == min(args.counts) else 1
            options = ["--count", str(count), "--frames", str(frames), "--top", str(args.top)]
            run = measure(src, "--mode", "reconcile", *options)
            cells.append(
                f"{mib(run['peak'])} / {mib(run['kept'])} / {run['kept'] / count / 1024:.1f} KiB"
                f" (store {mib(run['store'])})"
            )
            if run["sites"]:
                sites[f"{label}, N = {count}"] = [(site, size) for site, size in run["sites"]]
        rows[label] = cells
    print("Operator's own Python memory over MemKube (an in-memory API; not kopf's watch caches)\n")
    header = ["tree", "RSS after the operator's imports"] + [
        f"N = {c}: operator's traced peak / kept / kept per TritonService (MemKube's store)"
        for c in args.counts
    ]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for label, cells in rows.items():
        print(f"| {label} ({trees[label]}) | " + " | ".join(cells) + " |")
    for label, top in sites.items():
        print(f"\nWhat stays traced, {label} (innermost triton_operator line):\n")
        for site, size in top:
            print(f"- {size / 1024:>8.1f} KiB  {site}")


if __name__ == "__main__":
    main()
