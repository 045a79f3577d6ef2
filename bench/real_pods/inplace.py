#!/usr/bin/env python3
"""One model of several changes: in place versus new pods, on the real node; one table.

A TritonService of three Python models (CPU tritonserver, 2 replicas), all adders told apart by a
constant added to the sum: ``add_sub`` (the one that changes: model.py and a ``--changed-mib``
weights file per version), ``big`` (model.py and ``--big-mib`` of weight files, never changes) and
``other`` (model.py alone). One change: add_sub's versionPolicy goes from version 1 (offset 0) to
version 2 (offset 100), whose folder is in the store from the start (not pinned before the change).

Two cases, each ``--runs`` times, each run on a fresh TritonService serving version 1:

* in place: ``spec.rollout.modelUpdates: InPlace`` (no steps: every pod, in batches, never all at once);
* new pods: ``modelUpdates: NewPods`` (the default; no steps: a canary at full replicas, then the flip).

For each run: the seconds from the apply returning until every pod of the TritonService (the pods
not being deleted, as many as spec.replicas) answers version 2 when asked on its own IP, and the
Service's ClusterIP answers version 2 three times in a row (polled every ``--poll`` seconds); the
bytes read from the store by the pods for the change, summed over the pods (in place: each pod's
agent, ``GET http://<pod IP>:8009/v1/inplace`` ``fetchedBytes``, once it reports the new revision
``Applied``; new pods: each new pod's `triton-operator sync` termination message, the figure
status.timeToServe[].bytesFetched is read from); and the failed requests of a client sending one
request every 20 ms through the Service from before the apply until 2 s after the end.

Needs the local cluster's real node (e2e/cluster.py up; started and stopped here when not up).
A real S3 server (seaweedfs) on the pod bridge's gateway holds the models; the operator runs on this
machine (`triton-operator run`), pinning the repository.

  .venv/bin/python bench/real_pods/inplace.py              # 3 runs of each case
  .venv/bin/python bench/real_pods/inplace.py --runs 1 --big-mib 4
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.real_pods.common import Session, agent_applied, run_with_cluster, say, sync_summary, wait

from inference import InferenceError, LoadClient, infer_add_sub, offset_of
from real_pods import ADD_SUB_CONFIG, adder_source, on_real_node

CASES = {"in place": "InPlace", "new pods": "NewPods"}
REPLICAS = 2
OLD, NEW = 0.0, 100.0  # add_sub's offsets in versions 1 and 2
MIB = 1024 * 1024
BUCKET = "inplace"


@dataclass
class Run:
    case: str
    seconds: float = 0.0
    bytes_read: int = 0
    per_pod: list[int] = field(default_factory=list)
    sent: int = 0
    failed: int = 0
    answers: dict[float, int] = field(default_factory=dict)
    same_pods: bool = False
    rollout_kind: str = ""
    failures: list[tuple[float, str]] = field(default_factory=list)


@dataclass
class Store:
    """What the bench put in the store: the bytes of add_sub version 2 and of the whole new revision."""

    changed_bytes: int = 0
    revision_bytes: int = 0
    objects: dict[str, int] = field(default_factory=dict)


def weights(seed: int, size: int) -> bytes:
    """``size`` bytes that do not compress and differ by ``seed``."""
    return random.Random(seed).randbytes(size)


def fill_store(s3: Any, args: argparse.Namespace) -> Store:
    """add_sub versions 1 and 2 (model.py + weights.bin each), big version 1 (model.py + weight
    shards of at most 4 MiB), other version 1 (model.py)."""
    objects: dict[str, bytes] = {
        "models/add_sub/1/model.py": adder_source(OLD),
        "models/add_sub/1/weights.bin": weights(1, int(args.changed_mib * MIB)),
        "models/add_sub/2/model.py": adder_source(NEW),
        "models/add_sub/2/weights.bin": weights(2, int(args.changed_mib * MIB)),
        "models/big/1/model.py": adder_source(7),
        "models/other/1/model.py": adder_source(3),
    }
    left, shard = int(args.big_mib * MIB), 0
    while left > 0:
        size = min(left, 4 * MIB)
        objects[f"models/big/1/weights-{shard}.bin"] = weights(10 + shard, size)
        left, shard = left - size, shard + 1
    s3.create_bucket(Bucket=BUCKET)
    for key, body in objects.items():
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    store = Store(objects={k: len(v) for k, v in objects.items()})
    store.changed_bytes = sum(n for k, n in store.objects.items() if k.startswith("models/add_sub/2/"))
    store.revision_bytes = store.changed_bytes + sum(
        n for k, n in store.objects.items() if not k.startswith("models/add_sub/")
    )
    return store


def body(name: str, namespace: str, endpoint: str, mode: str, version: int) -> dict[str, Any]:
    """The TritonService: add_sub at ``version`` (its version policy), big and other; 2 replicas."""
    b = on_real_node(
        name,
        namespace,
        bucket=BUCKET,
        endpoint=endpoint,
        replicas=REPLICAS,
        resources={"cpu": "100m", "memory": "512Mi"},
        rollout={"modelUpdates": mode, "progressDeadlineSeconds": 300},
    )
    add_sub = {**copy.deepcopy(ADD_SUB_CONFIG), "versionPolicy": {"specific": {"versions": [str(version)]}}}
    b["spec"]["models"] = [
        {"name": "add_sub", "config": add_sub},
        {"name": "big", "config": copy.deepcopy(ADD_SUB_CONFIG)},
        {"name": "other", "config": copy.deepcopy(ADD_SUB_CONFIG)},
    ]
    return b


def answer(host: str, timeout: float = 1.0) -> float | None:
    """add_sub's offset from ``host``, or None when it does not answer."""
    try:
        return offset_of(infer_add_sub(host, timeout=timeout))
    except InferenceError:
        return None


class Bench(Session):
    """One cluster session: the store, the operator, one namespace; ``measure`` runs one case once.

    bench/tune/run.py uses its session too (``PREFIX`` names the namespace, ``fill`` the store)."""

    PREFIX = "bench-inplace"

    def __init__(self, args: argparse.Namespace, node: dict[str, Any], workdir: Path) -> None:
        super().__init__(node, workdir, self.PREFIX)
        self.args = args
        self.store = Store()

    def fill(self, s3: Any) -> Store:
        return fill_store(s3, self.args)

    def start(self) -> None:
        self.start_store()
        self.store = self.fill(self.s3)
        super().start()

    def all_answer(self, name: str, host: str, offset: float) -> list[Any] | None:
        """The pods, when there are spec.replicas of them, each answers ``offset`` on its own IP and the
        Service answers it three times in a row; else None."""
        pods = self.pods(name)
        if len(pods) != REPLICAS or any(not (p.status and p.status.podIP) for p in pods):
            return None
        if any(answer(p.status.podIP) != offset for p in pods):
            return None
        if any(answer(host) != offset for _ in range(3)):
            return None
        return pods

    # ------------------------------------------------------------------ one measured run
    def measure(self, case: str, index: int) -> Run:
        mode = CASES[case]
        name = f"{'inplace' if mode == 'InPlace' else 'newpods'}-{index}"
        endpoint = self.server.endpoint
        run = Run(case)
        self.apply(body(name, self.namespace, endpoint, mode, 1))
        host = self.cluster_ip(name)
        before = wait(lambda: self.all_answer(name, host, OLD), 300, f"{name}: every pod on version 1")
        old_revision = self.status(name).get("stableRevision")
        before_uids = {p.metadata.uid for p in before}
        client = LoadClient(host, max_seconds=600).start()
        time.sleep(1)
        try:
            started = time.monotonic()
            self.apply(body(name, self.namespace, endpoint, mode, 2))
            applied = time.monotonic()
            deadline = applied + 300
            while (after := self.all_answer(name, host, NEW)) is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name}: not every pod on version 2 within 300 s")
                time.sleep(self.args.poll)
            run.seconds = time.monotonic() - applied
            say(
                f"{name}: apply call {applied - started:.2f} s; "
                f"every pod on version 2 {run.seconds:.2f} s later"
            )
            time.sleep(2)
        finally:
            client.stop()
        run.sent, run.failed, run.failures = client.sent, len(client.failures), client.failures[:5]
        run.answers = dict(client.answers)
        run.same_pods = {p.metadata.uid for p in after} == before_uids
        run.rollout_kind = str(self.status(name).get("rolloutKind") or "")
        if mode == "InPlace":
            run.per_pod = [self.agent_bytes(p.status.podIP, old_revision) for p in after]
        else:
            run.per_pod = [self.sync_bytes(p) for p in after]
        run.bytes_read = sum(run.per_pod)
        self.gone(name)
        return run

    def agent_bytes(self, ip: str, old_revision: str | None) -> int:
        """fetchedBytes of the pod's agent once it reports a revision other than ``old_revision`` Applied."""
        return int(agent_applied(ip, old_revision)["fetchedBytes"])

    def sync_bytes(self, pod: Any) -> int:
        """Bytes the pod's `triton-operator sync` init container read from the store (its summary)."""
        summary = sync_summary(pod)
        if summary is None:
            raise RuntimeError(f"{pod.metadata.name}: no sync summary")
        return summary.fetched


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--poll", type=float, default=0.1, help="seconds between polls of the pods")
    ap.add_argument("--big-mib", type=float, default=8.0, help="weights of the model that stays (MiB)")
    ap.add_argument("--changed-mib", type=float, default=1.0, help="weights of each version of add_sub (MiB)")
    args = ap.parse_args(argv)
    runs: list[Run] = []
    store = Store()

    def measure(node: dict[str, Any]) -> None:
        nonlocal store
        session = Bench(args, node, Path(tempfile.mkdtemp(prefix="bench-inplace-")))
        try:
            session.start()
            store = session.store
            for i in range(args.runs):
                order = list(CASES) if i % 2 == 0 else list(reversed(CASES))
                for case in order:
                    runs.append(session.measure(case, i))
                    r = runs[-1]
                    say(
                        f"run {i + 1}/{args.runs} {case}: {r.seconds:.2f} s, {r.bytes_read} bytes "
                        f"{r.per_pod}, {r.failed}/{r.sent} failed, answers {r.answers}"
                    )
        finally:
            session.stop()
            say(f"operator log and seaweedfs: {session.workdir}")

    return run_with_cluster(measure, lambda: print_table(runs, store, args), measured=lambda: len(runs))


def print_table(runs: list[Run], store: Store, args: argparse.Namespace) -> None:
    measured = max(sum(1 for r in runs if r.case == case) for case in CASES)
    count = f"{args.runs}" if measured == args.runs else f"{measured} of {args.runs} (stopped early)"
    print(
        f"\nOne model of three changes (add_sub version 1 -> 2), {REPLICAS} replicas on the real node, "
        f"{count} runs per case (poll {args.poll * 1000:.0f} ms)"
    )
    print(
        f"Store: add_sub version 2 = {store.changed_bytes} bytes; the whole new revision "
        f"(add_sub 2, big, other) = {store.revision_bytes} bytes"
    )
    print(
        "\n| case | apply -> every pod answers version 2, s (median / worst) | bytes read from the store "
        "(sum over pods, median) | failed / sent requests through the Service (answers old / new) | pods |"
    )
    print("|---|---|---|---|---|")
    for case, mode in CASES.items():
        mine = [r for r in runs if r.case == case]
        if not mine:
            continue
        seconds = [r.seconds for r in mine]
        read = [r.bytes_read for r in mine]
        spread = "" if min(read) == max(read) else f" ({min(read)}-{max(read)})"
        pods = (
            "the same pods"
            if all(r.same_pods for r in mine)
            else "new pods"
            if not any(r.same_pods for r in mine)
            else "mixed"
        )
        kinds = {r.rollout_kind or "unset" for r in mine}
        old = sum(r.answers.get(OLD, 0) for r in mine)
        new = sum(r.answers.get(NEW, 0) for r in mine)
        print(
            f"| {case} ({mode}) | {statistics.median(seconds):.2f} / {max(seconds):.2f} | "
            f"{int(statistics.median(read))}{spread} ({statistics.median(read) / MIB:.2f} MiB) | "
            f"{sum(r.failed for r in mine)} / {sum(r.sent for r in mine)} ({old} / {new}) | {pods} "
            f"(status.rolloutKind {'/'.join(sorted(kinds))}) |"
        )
    in_place = [r for r in runs if r.case == "in place"]
    if in_place:
        want = REPLICAS * store.changed_bytes
        ok = all(r.bytes_read == want for r in in_place)
        print(
            f"\nIn place reads only the changed model "
            f"({REPLICAS} pods x {store.changed_bytes} bytes = {want}): "
            f"{'MET' if ok else 'MISSED'}"
        )
    new_pods = [r for r in runs if r.case == "new pods"]
    if new_pods:
        want = REPLICAS * store.revision_bytes
        print(
            f"New pods read the whole revision ({REPLICAS} pods x {store.revision_bytes} bytes = {want}): "
            f"{'yes' if all(r.bytes_read == want for r in new_pods) else 'no'}"
        )
    if in_place and new_pods:
        faster = statistics.median(r.seconds for r in in_place) < statistics.median(
            r.seconds for r in new_pods
        )
        print(f"In place beats new pods (median seconds): {'MET' if faster else 'MISSED'}")
    for r in runs:
        if r.failures:
            print(f"{r.case}: first failures {r.failures}")
    print(
        json.dumps(
            {
                "store": {"changed": store.changed_bytes, "revision": store.revision_bytes},
                "runs": [
                    {
                        "case": r.case,
                        "seconds": round(r.seconds, 3),
                        "bytes": r.per_pod,
                        "sent": r.sent,
                        "failed": r.failed,
                        "answers": {f"{k:g}": v for k, v in r.answers.items()},
                        "same_pods": r.same_pods,
                        "rolloutKind": r.rollout_kind,
                    }
                    for r in runs
                ],
            }
        )
    )


if __name__ == "__main__":
    sys.exit(main())
