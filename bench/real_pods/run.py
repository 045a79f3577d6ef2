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
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for extra in (ROOT / "e2e", ROOT / "tests" / "support"):
    sys.path.insert(0, str(extra))

import cluster  # noqa: E402
from inference import InferenceError, infer_add_sub, offset_of  # noqa: E402
from real_pods import adder_source, on_real_node, real_node  # noqa: E402

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


def say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def triton_ready(ip: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{ip}:8000/v2/health/ready", timeout=0.5) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def watch_pod(
    kube: Any, namespace: str, revision_of: Any, run: Run, *, host: str, offset: float, poll: float
) -> None:
    """Poll the new revision's pod and the Service until the first answer with ``offset``."""
    from lightkube.resources.core_v1 import Pod  # noqa: PLC0415

    deadline = time.monotonic() + 180
    while "answered" not in run.marks:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{run.case}: no answer within 180 s; got {sorted(run.marks)}")
        now = time.monotonic()
        pod = next((p for p in kube.list(Pod, namespace=namespace) if revision_of(p)), None)
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
    # SIGTERM and SIGHUP stop it as Ctrl-C does: the runs measured so far are printed, and a
    # cluster started here is brought down
    with cluster.stop_signals_interrupt():
        return bench(args)


def bench(args: argparse.Namespace) -> int:
    """Start the cluster when it is not up, measure, print the table, then bring down what it started.

    The table comes first, whatever happens after (an interrupt, a failed run, a failed teardown):
    a teardown failure is reported after the figures, which stand."""
    runs: list[Run] = []
    started = False
    rc = 0
    problems: list[str] = []
    try:
        if not cluster.is_up():
            started = True  # before up: an interrupted up is brought down too
            cluster.up()
        node, why = real_node()
        if node is None:
            say(f"no real node: {why}")
            rc = 2
        else:
            measure(args, node, runs)
    except KeyboardInterrupt as e:
        say(f"interrupted ({e or 'Ctrl-C'}) after {len(runs)} measured runs")
        rc = 130
    finally:
        with cluster.signals_deferred():  # a second Ctrl-C does not cut this short
            if runs:
                print_table(runs, args)
            if started:
                problems = cluster.down_reporting()
        for line in problems:
            say(line)
        if problems:
            say("the figures above stand; bringing the local cluster down FAILED (see above)")
    return rc or (3 if problems else 0)


def measure(args: argparse.Namespace, node: dict[str, Any], runs: list[Run]) -> None:
    """Measure args.runs runs of each case into runs (each appended when it finished)."""
    import httpx2  # noqa: PLC0415
    from lightkube import Client, KubeConfig  # noqa: PLC0415
    from lightkube.generic_resource import create_namespaced_resource  # noqa: PLC0415
    from lightkube.models.meta_v1 import ObjectMeta  # noqa: PLC0415
    from lightkube.resources.core_v1 import Namespace, Secret, Service  # noqa: PLC0415
    from lightkube.types import PatchType  # noqa: PLC0415

    import storage_servers  # noqa: PLC0415

    workdir = Path(tempfile.mkdtemp(prefix="bench-real-pods-"))
    server = storage_servers.start_seaweedfs(workdir / "weed", workdir / "weed.log", host=node["ip"])
    operator = None
    kubeconfig = str(cluster.kubeconfig_path())
    kube = Client(config=KubeConfig.from_file(kubeconfig), field_manager="bench", timeout=httpx2.Timeout(30))
    ts_resource = create_namespaced_resource(
        "triton-operator.io", "v1alpha1", "TritonService", "tritonservices"
    )
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    try:
        subprocess.run(
            [
                str(cluster.bin_dir() / "kubectl"),
                f"--kubeconfig={kubeconfig}",
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                str(ROOT / "crds" / "tritonservices.yaml"),
            ],
            check=True,
            capture_output=True,
        )
        s3 = storage_servers.s3_client(server.endpoint)
        s3.create_bucket(Bucket="bench")
        s3.put_object(Bucket="bench", Key="models/add_sub/1/model.py", Body=adder_source(0))
        s3.put_object(Bucket="bench", Key="models/add_sub/2/model.py", Body=adder_source(100))
        kube.create(Namespace(metadata=ObjectMeta(name=namespace)))
        kube.create(
            Secret(
                metadata=ObjectMeta(name="store", namespace=namespace),
                stringData={
                    "AWS_ACCESS_KEY_ID": storage_servers.S3_ACCESS_KEY,
                    "AWS_SECRET_ACCESS_KEY": storage_servers.S3_SECRET_KEY,
                },
            )
        )
        log = (workdir / "operator.log").open("wb")
        operator = subprocess.Popen(
            [str(Path(sys.executable).parent / "triton-operator"), "run", "-n", namespace, "--no-metrics"],
            env={**os.environ, "KUBECONFIG": kubeconfig, "TRITON_OPERATOR_PIN_REPOSITORIES": "true"},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        time.sleep(3)

        def body(name: str, version: int) -> dict[str, Any]:
            b = on_real_node(name, namespace, bucket="bench", endpoint=server.endpoint)
            b["spec"]["models"][0]["config"]["versionPolicy"] = {"specific": {"versions": [str(version)]}}
            return b

        def apply(doc: dict[str, Any]) -> None:
            kube.patch(
                ts_resource,
                doc["metadata"]["name"],
                doc,
                namespace=namespace,
                patch_type=PatchType.APPLY,
                field_manager="bench",
                force=True,
            )

        for i in range(args.runs):
            name = f"b{i}"
            # new TritonService
            run = Run("new")
            run.marks["apply"] = time.monotonic()
            apply(body(name, 1))
            host = ""
            while not host:
                with contextlib.suppress(Exception):
                    spec = kube.get(Service, name, namespace=namespace).spec
                    host = str(spec.clusterIP or "") if spec else ""
                time.sleep(0.02)
            watch_pod(
                kube,
                namespace,
                lambda p, n=name: p.metadata.name.startswith(f"{n}-"),
                run,
                host=host,
                offset=0,
                poll=args.poll,
            )
            runs.append(run)
            # a new revision of it
            obj = kube.get(ts_resource, name, namespace=namespace)
            old = obj["status"]["stableRevision"]  # a generic resource is a dict
            run = Run("revision")
            run.marks["apply"] = time.monotonic()
            apply(body(name, 2))
            watch_pod(
                kube,
                namespace,
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
            kube.delete(ts_resource, name, namespace=namespace)
    finally:
        with cluster.signals_deferred():  # each step whatever the one before did
            if operator is not None:
                cluster.stop_group(operator)
            with contextlib.suppress(Exception):
                kube.delete(Namespace, namespace)
            server.stop()


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
