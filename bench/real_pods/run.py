#!/usr/bin/env python3
"""Time to serve on the real node: apply -> first successful inference, split into phases; one table.

Two cases, each ``--runs`` times:

* new: a new TritonService (examples/tiny.yaml's shape, model add_sub) from the apply call returning
  to the first inference answered through its Service;
* revision: a new revision of a serving TritonService (versionPolicy 1 -> 2; version 2 answers with
  an offset, so the client can tell it from version 1) from the apply to the first answer of the
  new revision through the Service.

Each run's pod is watched by polling (every ``--poll`` seconds, from this script): the phases are
operator (apply -> pod created), scheduling (-> pod bound to the node), sync (-> the `triton-operator
sync` init container finished: sandbox, image, Python start-up and the download), tritonserver load
(-> Triton's own /v2/health/ready answers 200 on the pod IP), probe delay (-> the pod's Ready
condition) and routing (-> the first answer through the Service's ClusterIP).

Needs the local cluster's real node (e2e/cluster.py up; started and stopped here when not up).
A real S3 server (seaweedfs) on the pod bridge's gateway holds the model; the operator runs on this
machine (`triton-operator run`).

  .venv/bin/python bench/real_pods/run.py              # 5 runs of each case
  .venv/bin/python bench/real_pods/run.py --runs 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.real_pods.common import Session, run_with_cluster, say, triton_ready

from inference import InferenceError, infer_add_sub, offset_of
from real_pods import adder_source, on_real_node

PHASES = ("operator", "scheduling", "sync", "tritonserver load", "probe delay", "routing")
TARGET_REVISION_SECONDS = 8.0


@dataclass
class Run:
    case: str
    marks: dict[str, float] = field(default_factory=dict)

    def phases(self) -> dict[str, float]:
        order = ["apply", "created", "scheduled", "synced", "loaded", "ready", "answered"]
        return {PHASES[i]: self.marks[order[i + 1]] - self.marks[order[i]] for i in range(len(PHASES))}

    def total(self) -> float:
        return self.marks["answered"] - self.marks["apply"]


def watch_pod(session: Session, revision_of: Any, run: Run, *, host: str, offset: float, poll: float) -> None:
    """Poll the new revision's pod and the Service until the first answer with ``offset``."""
    deadline = time.monotonic() + 180
    while "answered" not in run.marks:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{run.case}: no answer within 180 s; got {sorted(run.marks)}")
        now = time.monotonic()
        pod = next((p for p in session.all_pods() if revision_of(p)), None)
        if pod is not None:
            run.marks.setdefault("created", now)
            status = pod.status
            if pod.spec.nodeName:
                run.marks.setdefault("scheduled", now)
            init = (status.initContainerStatuses or []) if status else []
            if init and init[0].state and init[0].state.terminated and init[0].state.terminated.exitCode == 0:
                run.marks.setdefault("synced", now)
            if "synced" in run.marks and status and status.podIP and triton_ready(status.podIP):
                run.marks.setdefault("loaded", time.monotonic())
            conditions = (status.conditions or []) if status else []
            if any(c.type == "Ready" and c.status == "True" for c in conditions):
                run.marks.setdefault("ready", now)
        if "ready" in run.marks:
            with contextlib.suppress(InferenceError):
                if offset_of(infer_add_sub(host, timeout=2)) == offset:
                    run.marks["answered"] = time.monotonic()
                    break
        time.sleep(poll)
    for later, earlier in (("loaded", "synced"), ("ready", "loaded"), ("synced", "scheduled")):
        run.marks.setdefault(earlier, run.marks[later])  # a phase shorter than one poll


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--poll", type=float, default=0.05, help="seconds between polls of the pod")
    args = ap.parse_args(argv)
    runs: list[Run] = []
    return run_with_cluster(
        lambda node: measure(args, node, runs), lambda: print_table(runs, args), measured=lambda: len(runs)
    )


def measure(args: argparse.Namespace, node: dict[str, Any], runs: list[Run]) -> None:
    """Measure args.runs runs of each case into runs (each appended when it finished)."""
    session = Session(node, Path(tempfile.mkdtemp(prefix="bench-real-pods-")), "bench")
    try:
        session.start_store()
        session.s3.create_bucket(Bucket="bench")
        session.s3.put_object(Bucket="bench", Key="models/add_sub/1/model.py", Body=adder_source(0))
        session.s3.put_object(Bucket="bench", Key="models/add_sub/2/model.py", Body=adder_source(100))
        session.start()
        namespace = session.namespace

        def body(name: str, version: int) -> dict[str, Any]:
            b = on_real_node(name, namespace, bucket="bench", endpoint=session.server.endpoint)
            b["spec"]["models"][0]["config"]["versionPolicy"] = {"specific": {"versions": [str(version)]}}
            return b

        for i in range(args.runs):
            name = f"b{i}"
            # new TritonService
            run = Run("new")
            run.marks["apply"] = time.monotonic()
            session.apply(body(name, 1))
            host = session.cluster_ip(name)
            watch_pod(
                session,
                lambda p, n=name: p.metadata.name.startswith(f"{n}-"),
                run,
                host=host,
                offset=0,
                poll=args.poll,
            )
            runs.append(run)
            # a new revision of it
            old = session.status(name)["stableRevision"]
            run = Run("revision")
            run.marks["apply"] = time.monotonic()
            session.apply(body(name, 2))
            watch_pod(
                session,
                lambda p, n=name, o=old: (
                    p.metadata.name.startswith(f"{n}-")
                    and f"{n}-{o}-" not in p.metadata.name
                    and p.metadata.deletionTimestamp is None
                ),
                run,
                host=host,
                offset=100,
                poll=args.poll,
            )
            runs.append(run)
            say(f"run {i + 1}/{args.runs}: new {runs[-2].total():.2f}s, revision {runs[-1].total():.2f}s")
            session.kube.delete(session.ts, name, namespace=namespace)
    finally:
        session.stop()


def print_table(runs: list[Run], args: argparse.Namespace) -> None:
    measured = max(sum(1 for r in runs if r.case == case) for case in ("new", "revision"))
    count = f"{args.runs}" if measured == args.runs else f"{measured} of {args.runs} (stopped early)"
    print(
        f"\nTime to serve on the real node ({count} runs per case, poll {args.poll * 1000:.0f} ms), seconds"
    )
    print("\n| case | " + " | ".join(PHASES) + " | apply -> first answer |")
    print("|---|" + "---|" * (len(PHASES) + 1))
    for case in ("new", "revision"):
        mine = [r for r in runs if r.case == case]
        if not mine:
            continue
        cells = []
        for phase in PHASES:
            values = [r.phases()[phase] for r in mine]
            cells.append(f"{statistics.median(values):.2f} / {max(values):.2f}")
        totals = [r.total() for r in mine]
        cells.append(f"**{statistics.median(totals):.2f} / {max(totals):.2f}**")
        print(f"| {case} | " + " | ".join(cells) + " |")
    print("\nEach cell: median / worst.")
    revision = [r.total() for r in runs if r.case == "revision"]
    if revision:
        verdict = "MET" if max(revision) <= TARGET_REVISION_SECONDS else "MISSED"
        print(
            f"Target: a new revision answers within {TARGET_REVISION_SECONDS:.0f} s of the apply "
            "(worst run): "
            f"{verdict} ({max(revision):.2f} s)."
        )
    print(json.dumps({"runs": [{"case": r.case, "phases": r.phases(), "total": r.total()} for r in runs]}))


if __name__ == "__main__":
    sys.exit(main())
