#!/usr/bin/env python3
"""Time to serve a repository of a real size on the real node, case by case and phase by phase; one table.

The repository is tests/support/realrepo.py's (``--big`` model in ``--shard`` shards, a ``--medium``
one, ``--small`` small ones and an ensemble; Python-backend models that read and check every shard at
load), uploaded to seaweedfs on the pod bridge's gateway, with versions 2 and 3 of the medium model
(``encoder``) beside the first (version 3 is the in-place case's: not in the node cache yet). The node
cache runs as `triton-operator node-cache` on the node's address (the real node is this machine; the
chart's DaemonSet does the same on a real cluster), and the operator points every sync at it. As the
chart does by default (``nodeCache.signingKey.enabled``), the cache signs its statements with a new key
and the operator hands the pods its public key: a pod checks the BLAKE3 the cache signed instead of the
pin (``--unsigned``: no key, each pod checks the pin of every object it reads from the cache).
Cases, in this order:

1. new service: a TritonService of 1 pod (the node cache cold);
2. scale-up: replicas 1 -> ``--replicas`` (the node's cache now warm);
3. pod restart: one pod deleted, its replacement started by the ReplicaSet;
4. new revision, new pods: encoder's versionPolicy 1 -> 2 (``modelUpdates: NewPods``);
5. new service, in place: a second TritonService of ``--replicas`` pods with ``modelUpdates: InPlace``;
6. new revision, in place: encoder 1 -> 3 in its running pods.

For each: seconds from the apply (the delete, for the restart) until every pod (as many as
spec.replicas, none being deleted, the new ones where the case starts pods) is Ready and answers the expected
constant of encoder and of the big model on its own IP and the Service's ClusterIP answers encoder's
three times in a row; the phases of the pod that was last to be Ready; the bytes the case read from
the store (each new pod's `triton-operator sync` summary, or each agent's fetchedBytes); the bytes the
node cache handed out (its own counter). Where each phase comes from is printed under the table.
Beside it, the CPU seconds each case spent (cpu_accounting.py): the case's pods' tritonserver and
agent (their cgroups), the node cache, the store, the operator, the cluster's components, the bench,
the rest of the machine (/proc/stat), and the floor: every busy CPU second over the node's cores.

Targets (PASS/MISS): the scale-up pod reads 0 bytes from the store; a new revision changing encoder
answers within (the download of encoder's new version + its load + 2 s), both measured in this run (each
in-place pod's agent: its fetch, then Triton's load of encoder).

Needs the local cluster's real node (e2e/cluster.py up; started and stopped here when not up).

  .venv/bin/python bench/real_pods/realsize.py                                   # full size: ~2.6 GiB
  .venv/bin/python bench/real_pods/realsize.py --ref main                        # main first, then this tree
  .venv/bin/python bench/real_pods/realsize.py --ref main --in-place-only        # cases 5-6 only
  .venv/bin/python bench/real_pods/realsize.py --ref main --new-pods-only        # cases 1-4 only
  .venv/bin/python bench/real_pods/realsize.py --new-pods-only --page-reporting-off  # root: the VM's
                                                                   # free page reporting off for the run
  .venv/bin/python bench/real_pods/realsize.py --big 8MiB --medium 4MiB --shard 2MiB --json out.json
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.node_cache.page_reporting import OFF_ORDER, PARAMETERS, Reporting, back_free_memory
from bench.real_pods import cpu_accounting
from bench.real_pods.common import (
    ROOT,
    Session,
    Tree,
    agent_applied,
    agent_fetched,
    agent_status,
    ref_tree,
    run_with_cluster,
    say,
    sync_summary,
    triton_ready,
    wait,
)

import realrepo
from real_pods import on_real_node
from testkit import free_port
from triton_operator.core.objects.names import AGENT_CONTAINER, TRITON_CONTAINER
from triton_operator.core.pod.startup import IN_PLACE_PHASES, describe_phases
from triton_operator.core.pod.startup import PHASES as STARTUP_PHASES
from triton_operator.core.repository.shared_files import DRIVER

BUCKET = "realsize"
PREFIX = "models"
CHANGED = realrepo.MEDIUM
X = [1.0, 2.0, 3.0, 4.0]
PHASES = ("to pod", "sync", "load", "probes", "routing")
THIS_TREE = "this tree"
SHARED_SUFFIX = ", shared files"
SHARED_TREE = f"{THIS_TREE}{SHARED_SUFFIX}"
"""This tree once more with the node cache's shared files (--shared-files): pods link, not copy."""
SHARED_ENV = {"TRITON_OPERATOR_NODE_CACHE_SHARED_FILES": "true"}
OPERATOR_SERIES = ("triton_operator_time_to_serve_", "triton_operator_in_place_update_")
"""The operator's histograms the bench reads (sums and counts): pods' starts, in-place changes."""
SOURCES = {
    "to pod": "bench poll: apply -> the pod bound to the node (the operator, the ReplicaSet, the scheduler)",
    "sync": "bench poll: bound -> the sync init container terminated (sandbox, image, `triton-operator "
    "sync`); a pod of the one shape: bound -> its agent's status says every model's bytes are in (the loads "
    "overlap this); in place: the agent's log, 'applying revision' -> 'loading model'",
    "load": "bench poll: sync done -> Triton's /v2/health/ready on the pod IP (tritonserver start, every "
    "model's load); a pod of the one shape: -> its agent's first fill done (every model READY: what is left "
    "of the loads after the last byte); in place: the agent's log, 'loading model' -> 'applied revision' "
    "(Triton's load API)",
    "probes": "bench poll: Triton ready -> the pod's Ready condition (startup and readiness probe periods)",
    "routing": "bench poll: the last pod Ready (in place: applied) -> every pod and the Service answer "
    "(Endpoints, kube-proxy; for new pods the operator's flip of the Service)",
}


@dataclass
class Case:
    name: str
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    pods: int = 0
    store_bytes: list[int] = field(default_factory=list)
    cache_hit_bytes: int = 0
    vouched: list[tuple[int, int]] = field(default_factory=list)
    shared: list[int] = field(default_factory=list)
    """Each new pod's files linked in its view of the node cache's files (--shared-files), not copied."""
    """Each new pod's (node cache hits, of them checked by the digest the cache signed) by its summary."""
    recorded: list[str] = field(default_factory=list)
    """status.timeToServe of the case's revision, in words (the operator's record of its first pod)."""
    served: list[dict[str, Any]] = field(default_factory=list)
    """The same status.timeToServe entries, as the status has them."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The operator's metrics of the case's new pods: mean seconds per phase, bytes fetched (sum)."""
    in_place_metrics: dict[str, float] = field(default_factory=dict)
    """In place: the operator's in-place metrics of the case's changes (mean seconds per phase, bytes)."""
    fetch_load: list[tuple[float, float]] = field(default_factory=list)
    """In place: each pod's (fetch, load) seconds of the changed model, from its agent's log."""
    weights_check: list[float] = field(default_factory=list)
    """Each pod's model's own check of encoder's shards at load (its log line), seconds."""
    timeline: list[tuple[str, dict[str, float]]] = field(default_factory=list)
    """In place: each pod's agent's record of the change (its ``inPlace``), seconds after the apply."""
    fills: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """New pods of the one shape: each pod's first fill from its agent's log (fill_marks), seconds
    after the apply."""
    cpu: cpu_accounting.CpuRow | None = None
    """CPU seconds spent during the case (apply -> every pod answers), by who spent them."""


@dataclass
class Marks:
    created: float | None = None
    scheduled: float | None = None
    synced: float | None = None
    loaded: float | None = None
    ready: float | None = None


# ---------------------------------------------------------------- inference


def is_ready(pod: Any) -> bool:
    """The pod's Ready condition is True (so it is among its Service's endpoints)."""
    conditions = (pod.status.conditions or []) if pod.status else []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def added(host: str, model: str, timeout: float = 2.0) -> float | None:
    """What ``model`` adds to its input on ``host`` (OUTPUT0 - INPUT0), or None when it does not answer."""
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": X}]})
    conn = http.client.HTTPConnection(host, 8000, timeout=timeout)
    try:
        conn.request(
            "POST", f"/v2/models/{model}/infer", body=body, headers={"Content-Type": "application/json"}
        )
        response = conn.getresponse()
        raw = response.read()
        if response.status != 200:
            return None
        out = next(o for o in json.loads(raw)["outputs"] if o["name"] == "OUTPUT0")
        diffs = {round(float(o) - x, 3) for o, x in zip(out["data"], X, strict=True)}
        return diffs.pop() if len(diffs) == 1 else None
    except (OSError, http.client.HTTPException, ValueError, KeyError, StopIteration):
        return None
    finally:
        conn.close()


# ---------------------------------------------------------------- the session


class RealSize(Session):
    def __init__(
        self, args: argparse.Namespace, node: dict[str, Any], workdir: Path, tree: Tree | None = None
    ) -> None:
        self.cache_port = free_port()
        self.metrics_port = free_port()
        tree = tree or Tree("this tree")
        super().__init__(
            node,
            workdir,
            "bench-realsize",
            {"TRITON_OPERATOR_NODE_CACHE_PORT": str(self.cache_port), **tree.env},
            ("--metrics-port", str(self.metrics_port)),
            tree=tree.root,
        )
        self.args = args
        self.signing_key = signing_key_for(args, workdir)
        self.operator_env.update(signing_env(self.signing_key))
        self.cache: subprocess.Popen[bytes] | None = None
        self.shared = tree.env.get("TRITON_OPERATOR_NODE_CACHE_SHARED_FILES") == "true"
        """The node cache serves its CSI driver (registered with the real node's kubelet)."""
        self.repo: realrepo.GeneratedRepository | None = None
        self.v2: realrepo.GeneratedRepository | None = None
        self.victim = ""
        self.cpu: cpu_accounting.Sampler | None = None
        self.cpu_before: cpu_accounting.Sample | None = None

    # ------------------------------------------------------------------ set-up and tear-down
    def start(self) -> None:
        self.start_store()
        shape = realrepo.RepoShape(
            big_bytes=realrepo.parse_size(self.args.big),
            medium_bytes=realrepo.parse_size(self.args.medium),
            small_count=self.args.small,
            small_bytes=realrepo.parse_size(self.args.small_size),
            shard_bytes=realrepo.parse_size(self.args.shard),
        )
        self.s3.create_bucket(Bucket=BUCKET)
        began = time.monotonic()
        self.repo = realrepo.upload_repository(self.s3, BUCKET, PREFIX, shape)
        only_encoder = realrepo.RepoShape(
            big_bytes=0,
            medium_bytes=shape.medium_bytes,
            small_count=0,
            shard_bytes=shape.shard_bytes,
            versions=(2, 3),
            ensemble=False,
        )
        self.v2 = realrepo.upload_repository(self.s3, BUCKET, PREFIX, only_encoder)
        say(
            f"uploaded {realrepo.format_size(self.repo.total_bytes + self.v2.total_bytes)} "
            f"in {time.monotonic() - began:.1f} s"
        )
        log = (self.workdir / "node-cache.log").open("wb")
        if self.signing_key is not None:
            write_signing_key(self.signing_key)
        self.cache = subprocess.Popen(
            cache_command(
                self.workdir / "node-cache",
                self.args.cache_limit,
                self.node["ip"],
                self.cache_port,
                self.signing_key,
                shared_files=kubelet_root(self.node) if self.shared else None,
                node_name=str(self.node["name"]),
                one_download=self.args.one_download and self.tree == ROOT,
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # The cache checks the pods' tokens with this cluster's TokenReview; it runs the measured
            # tree's code, as the operator does.
            env={
                **os.environ,
                "KUBECONFIG": self.kubeconfig,
                "PYTHONPATH": self.tree_pythonpath(),
            },
        )
        log.close()
        wait(lambda: self.cache_metrics() is not None, 30, "node cache /metrics", interval=0.2)
        if self.shared:
            self.kube.apply(csi_driver(), field_manager="bench")
        super().start()
        self.start_cpu_accounting()

    # ------------------------------------------------------------------ CPU accounting
    def start_cpu_accounting(self) -> None:
        """The sampler of the CPU each case spends: the node cache's, the store's, the operator's and
        the cluster's components' sessions (each started in a session of its own), the pods' cgroups."""
        import cluster  # noqa: PLC0415

        try:
            components = cluster.status()["processes"]
            leaders = {
                "node cache": [self.cache.pid] if self.cache is not None else [],
                "store": [self.server.process.pid] if self.server is not None else [],
                "operator": [self.operator.pid] if self.operator is not None else [],
                "cluster": sorted(int(p["pid"]) for p in components.values() if p.get("alive")),
            }
            self.cpu = cpu_accounting.Sampler(leaders)
        except Exception as e:  # accounting never fails the bench
            say(f"CPU accounting off: {e!r}")

    def cpu_sample(self) -> cpu_accounting.Sample | None:
        if self.cpu is None:
            return None
        try:
            return self.cpu.sample()
        except Exception as e:
            self.cpu.note(f"a sample failed: {e!r}")
            return None

    def begin(self) -> float:
        """A case's start: the CPU counters read, then its clock."""
        self.cpu_before = self.cpu_sample()
        return time.monotonic()

    def account_cpu(
        self, case: Case, pods: list[Any], old: set[str], after: cpu_accounting.Sample | None
    ) -> None:
        """case.cpu from the sample at the case's start and ``after`` (at its end): the case's pods are
        its new ones (all its pods where it starts none: in place)."""
        before, self.cpu_before = self.cpu_before, None
        if self.cpu is None or before is None or after is None:
            return
        try:
            mine = [p for p in pods if p.metadata.uid not in old] or pods
            described = []
            for p in mine:
                statuses = [
                    *(p.status.containerStatuses or []),
                    *(p.status.initContainerStatuses or []),
                ]
                names = {TRITON_CONTAINER: "tritonserver", AGENT_CONTAINER: "agent"}
                ids = {
                    str(s.containerID).rpartition("://")[2]: names.get(str(s.name), str(s.name))
                    for s in statuses
                    if s.containerID
                }
                described.append((str(p.metadata.name), str(p.metadata.uid), ids))
            case.cpu = cpu_accounting.account(case.name, case.seconds, before, after, described)
        except Exception as e:
            self.cpu.note(f"{case.name}: accounting failed: {e!r}")

    def stop(self) -> None:
        import cluster  # noqa: PLC0415

        try:
            super().stop()
            if self.shared:
                # The kubelet unmounts the pods' views through the cache: it goes after them.
                wait(lambda: not self.all_pods(), 180, "the pods gone", interval=0.5)
        finally:
            if self.cache is not None:
                cluster.stop_group(self.cache)
            if self.shared:  # the cluster as the bench found it (the e2e test installs its own)
                from lightkube.resources.storage_v1 import CSIDriver  # noqa: PLC0415

                with contextlib.suppress(Exception):
                    self.kube.delete(CSIDriver, DRIVER)

    # ------------------------------------------------------------------ what to expect
    def constant(self, model: str, version: int = 1) -> float:
        assert self.repo is not None and self.v2 is not None
        if model == CHANGED and version > 1:
            return self.v2.added(CHANGED, version)
        return self.repo.added(model, version)

    def pinned_bytes(self, repo: realrepo.GeneratedRepository, folder: str = "") -> int:
        """Bytes of the files a pod syncs under ``folder`` (the operator renders config.pbtxt itself)."""
        return sum(
            f.size for f in repo.files if f.path.startswith(folder) and not f.path.endswith("/config.pbtxt")
        )

    def distinct_bytes(self, repo: realrepo.GeneratedRepository) -> int:
        """Bytes of the distinct contents a pod syncs: what the store gives at least (a copy of an
        object the node cache holds, such as the models' shared model.py, may come from there)."""
        files = [f for f in repo.files if not f.path.endswith("/config.pbtxt")]
        return sum({f.sha256: f.size for f in files}.values())

    def body(self, name: str, replicas: int, mode: str, version: int) -> dict[str, Any]:
        assert self.repo is not None
        b = on_real_node(
            name,
            self.namespace,
            bucket=BUCKET,
            endpoint=self.server.endpoint,
            replicas=replicas,
            resources={"cpu": "100m", "memory": self.args.pod_memory},
            shmSize="256Mi",
            startupTimeoutSeconds=900,
            rollout={"modelUpdates": mode, "progressDeadlineSeconds": 900},
        )
        models = copy.deepcopy(self.repo.spec_models)
        for m in models:
            if m["name"] == CHANGED:
                m["config"]["versionPolicy"] = {"specific": {"versions": [str(version)]}}
        b["spec"]["models"] = models
        return b

    def cache_metrics(self) -> dict[str, float] | None:
        try:
            with contextlib.closing(
                http.client.HTTPConnection(self.node["ip"], self.cache_port, timeout=2)
            ) as conn:
                conn.request("GET", "/metrics")
                text = conn.getresponse().read().decode()
        except OSError:
            return None
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("triton_node_cache_") and " " in line and "{" not in line:
                key, value = line.rsplit(" ", 1)
                with contextlib.suppress(ValueError):
                    out[key] = float(value)
        return out

    def operator_metrics(self) -> dict[str, float]:
        """The operator's time-to-serve histograms' sums and counts (its /metrics), by series."""
        out: dict[str, float] = {}
        with (
            contextlib.suppress(OSError),
            contextlib.closing(http.client.HTTPConnection("127.0.0.1", self.metrics_port, timeout=5)) as conn,
        ):
            conn.request("GET", "/metrics")
            text = conn.getresponse().read().decode()
            for line in text.splitlines():
                kept = line.startswith(OPERATOR_SERIES)
                if kept and ("_sum" in line or "_count" in line):
                    key, _, value = line.rpartition(" ")
                    with contextlib.suppress(ValueError):
                        out[key] = float(value)
        return out

    def recorded_starts(self, before: dict[str, float], pods: int) -> dict[str, float]:
        """Per phase, the mean seconds the operator's metrics recorded for the ``pods`` pods that
        started since ``before`` (and 'fetched bytes': their sum); {} when it has not seen them."""
        return self._recorded("time_to_serve", STARTUP_PHASES, before, pods, "the new pods")

    def recorded_in_place(self, before: dict[str, float], pods: int) -> dict[str, float]:
        """Per phase, the mean seconds the operator's in-place metrics recorded for the ``pods``
        changes applied since ``before`` (and 'fetched bytes': their sum); {} when it has not seen them."""
        if 'triton_operator_in_place_update_seconds_count{phase="total"}' not in before:
            return {}  # an operator without these metrics (a --ref tree before them)
        return self._recorded("in_place_update", IN_PLACE_PHASES, before, pods, "the in-place changes")

    def _recorded(
        self, metric: str, phases: Sequence[str], before: dict[str, float], pods: int, what: str
    ) -> dict[str, float]:
        """``triton_operator_<metric>_seconds`` per phase: the mean of what it recorded since ``before``
        once ``pods`` more are counted, and ``triton_operator_<metric>_fetched_bytes``' sum."""
        total = f'triton_operator_{metric}_seconds_count{{phase="total"}}'

        def probe() -> dict[str, float] | None:
            now = self.operator_metrics()
            return now if now.get(total, 0) - before.get(total, 0) >= pods else None

        try:
            after = wait(probe, 30, f"the operator's metrics of {what}", interval=0.5)
        except TimeoutError:
            return {}
        out: dict[str, float] = {}
        for phase in (*phases, "total"):
            key = f'triton_operator_{metric}_seconds_{{}}{{{{phase="{phase}"}}}}'
            count = after.get(key.format("count"), 0) - before.get(key.format("count"), 0)
            if count:
                out[phase] = (after.get(key.format("sum"), 0) - before.get(key.format("sum"), 0)) / count
        fetched = f"triton_operator_{metric}_fetched_bytes_sum"
        out["fetched bytes"] = after.get(fetched, 0) - before.get(fetched, 0)
        return out

    def hit_bytes(self) -> int:
        return int((self.cache_metrics() or {}).get("triton_node_cache_hit_bytes_total", 0))

    # ------------------------------------------------------------------ watching a case
    def every_pod_answers(
        self, name: str, replicas: int, version: int, host: str, gone: set[str]
    ) -> list[Any] | None:
        """The pods, when there are ``replicas`` of them not being deleted, none of them in ``gone``
        (uids), each Ready (an endpoint of the Service) and answering encoder at ``version`` and the
        big model on its own IP, and the Service answers encoder three times in a row; else None."""
        pods = self.pods(name)
        if len(pods) != replicas or any(p.metadata.uid in gone for p in pods):
            return None
        if any(not (p.status and p.status.podIP and is_ready(p)) for p in pods):
            return None  # a pod that answers on its IP before it is Ready gets no traffic yet
        want = self.constant(CHANGED, version)
        for p in pods:
            if added(p.status.podIP, CHANGED) != want or added(p.status.podIP, realrepo.BIG) != self.constant(
                realrepo.BIG
            ):
                return None
        if any(added(host, CHANGED) != want for _ in range(3)):
            return None
        return pods

    def watch(
        self, case: Case, name: str, *, replicas: int, version: int, host: str, old: set[str], t0: float
    ) -> list[Any]:
        """Poll until every pod answers; the new pods' marks (pods not in ``old``) give the case's
        phases. Pods of ``old`` may answer unless the case replaces them all (a new revision)."""
        gone = old if case.name.startswith("new revision, new pods") else set()
        if case.name.startswith("pod restart"):
            gone = {self.victim}
        marks: dict[str, Marks] = {}
        deadline = t0 + self.args.timeout
        while True:
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"{case.name}: not every pod answered within {self.args.timeout:.0f} s")
            for pod in self.pods(name):
                if pod.metadata.uid in old:
                    continue
                m = marks.setdefault(pod.metadata.uid, Marks(created=now))
                status = pod.status
                if pod.spec.nodeName and m.scheduled is None:
                    m.scheduled = now
                init = (status.initContainerStatuses or []) if status else []
                ip = status.podIP if status else None
                done = (
                    init
                    and init[0].state
                    and init[0].state.terminated
                    and init[0].state.terminated.exitCode == 0
                ) or (not init and m.synced is None and bool(ip) and agent_fetched(str(ip)))
                if done and m.synced is None:
                    m.synced = now
                # one pod shape: loaded once the agent's fill is done (every model READY)
                loaded = bool(ip) and m.synced is not None and m.loaded is None
                if loaded and ip:
                    loaded = triton_ready(ip) if init else bool((agent_status(ip) or {}).get("summary"))
                if loaded:
                    m.loaded = time.monotonic()
                if m.ready is None and is_ready(pod):
                    m.ready = now
            pods = self.every_pod_answers(name, replicas, version, host, gone)
            if pods is not None:
                end = time.monotonic()
                break
            time.sleep(self.args.poll)
        case.seconds = end - t0
        self.account_cpu(case, pods, old, self.cpu_sample())
        new = [marks[p.metadata.uid] for p in pods if p.metadata.uid in marks]
        case.pods = len(new)
        if new:
            last = max(new, key=lambda m: m.ready or end)
            points = [t0, last.scheduled, last.synced, last.loaded, last.ready, end]
            for i in range(1, len(points)):  # a phase shorter than one poll
                if points[i] is None:
                    points[i] = points[i - 1]
            for i, phase in enumerate(PHASES):
                later, earlier = points[i + 1], points[i]
                assert later is not None and earlier is not None
                case.phases[phase] = max(later - earlier, 0.0)
        return pods

    def recorded(self, name: str, old_revision: str | None) -> list[dict[str, Any]]:
        """status.timeToServe of the revision that serves now (once it is not ``old_revision``): the
        operator's record of the revision's first Ready pod ([] when none within 30 s)."""

        def probe() -> list[dict[str, Any]] | None:
            status = self.status(name)
            stable = status.get("stableRevision")
            if not stable or stable == old_revision:
                return None
            entries = [e for e in status.get("timeToServe") or [] if e.get("revision") == stable]
            return entries or None

        with contextlib.suppress(TimeoutError):
            return list(wait(probe, 30, "status.timeToServe"))
        return []

    def recorded_in_place_entry(self, name: str, old_revision: str | None) -> list[dict[str, Any]]:
        """status.timeToServe of the revision served in place (status.servedRevision, once it is not
        ``old_revision``): the operator's record of its first pod's agent ([] when none within 30 s: an
        operator that records none, as before it did)."""

        def probe() -> list[dict[str, Any]] | None:
            status = self.status(name)
            served = status.get("servedRevision")
            if not served or served == old_revision:
                return None
            entries = [e for e in status.get("timeToServe") or [] if e.get("revision") == served]
            return entries or None

        with contextlib.suppress(TimeoutError):
            return list(wait(probe, 30, "status.timeToServe of the revision served in place"))
        return []

    def weights_check(self, pod: str, version: int) -> float | None:
        """Seconds the pod's encoder took to read and check its shards (its own log line)."""
        marker = f"realrepo: {CHANGED} version {version}: checked "
        for line in self.logs(pod, TRITON_CONTAINER).splitlines():
            if marker in line:
                with contextlib.suppress(ValueError, IndexError):
                    return float(line.split(" bytes in ", 1)[1].split(" s", 1)[0])
        return None

    # ------------------------------------------------------------------ the cases
    def new_pods_case(
        self,
        case: Case,
        name: str,
        *,
        replicas: int,
        version: int,
        host: str,
        old: set[str],
        t0: float,
        new_revision: bool = False,
        old_revision: str | None = None,
    ) -> list[Any]:
        """Watch a case that starts pods; ``new_revision``: it starts a revision after
        ``old_revision`` (the status records the new one's time to serve)."""
        hits = self.hit_bytes()
        before = self.operator_metrics()
        wall0 = time.time() - (time.monotonic() - t0)
        pods = self.watch(case, name, replicas=replicas, version=version, host=host, old=old, t0=t0)
        case.cache_hit_bytes = self.hit_bytes() - hits
        fresh = [p for p in pods if p.metadata.uid not in old]
        case.metrics = self.recorded_starts(before, len(fresh))
        for p in fresh:
            summary = sync_summary(p)
            if summary is None:
                raise RuntimeError(f"{case.name}: pod {p.metadata.name} has no sync summary")
            case.store_bytes.append(summary.fetched)
            case.vouched.append((summary.node_cache_hits or 0, summary.node_cache_vouched))
            case.shared.append(summary.node_cache_shared)
            if not (p.status.initContainerStatuses or []):
                fill = fill_marks(self.logs(p.metadata.name, AGENT_CONTAINER), wall0)
                if fill:
                    case.fills.append((str(p.metadata.name), fill))
            check = self.weights_check(p.metadata.name, version)
            if check is not None:
                case.weights_check.append(check)
        if new_revision:
            case.served = self.recorded(name, old_revision)
            case.recorded = [
                f"revision {e['revision']}, pod {e['pod']}: {describe_phases(e)}" for e in case.served
            ] or ["(no status.timeToServe entry for the new revision within 30 s)"]
        return pods

    def run(self, cases: list[Case]) -> None:
        if not self.args.in_place_only:
            self.run_new_pods(cases)
        if not self.args.new_pods_only:
            self.run_in_place(cases)

    def run_new_pods(self, cases: list[Case]) -> None:
        """Cases 1-4: one TritonService with new pods."""
        replicas = self.args.replicas
        name = "newpods"
        case = Case("new service (cold node cache)")
        t0 = self.begin()
        self.apply(self.body(name, 1, "NewPods", 1))
        host = self.cluster_ip(name)
        pods = self.new_pods_case(
            case, name, replicas=1, version=1, host=host, old=set(), t0=t0, new_revision=True
        )
        cases.append(case)
        say(f"{case.name}: {case.seconds:.2f} s, {case.store_bytes} bytes from the store{vouched(case)}")

        case = Case(f"scale-up 1 -> {replicas} (warm node)")
        old = {p.metadata.uid for p in pods}
        t0 = self.begin()
        self.apply(self.body(name, replicas, "NewPods", 1))
        pods = self.new_pods_case(case, name, replicas=replicas, version=1, host=host, old=old, t0=t0)
        cases.append(case)
        say(f"{case.name}: {case.seconds:.2f} s, {case.store_bytes} bytes from the store{vouched(case)}")

        case = Case("pod restart (a pod deleted)")
        victim = pods[0]
        self.victim = str(victim.metadata.uid)
        old = {p.metadata.uid for p in pods}
        from lightkube.resources.core_v1 import Pod  # noqa: PLC0415

        t0 = self.begin()
        self.kube.delete(Pod, victim.metadata.name, namespace=self.namespace)
        pods = self.new_pods_case(case, name, replicas=replicas, version=1, host=host, old=old, t0=t0)
        cases.append(case)
        say(f"{case.name}: {case.seconds:.2f} s, {case.store_bytes} bytes from the store{vouched(case)}")

        case = Case(f"new revision, new pods ({CHANGED} 1 -> 2)")
        old = {p.metadata.uid for p in pods}
        stable = self.status(name).get("stableRevision")
        t0 = self.begin()
        self.apply(self.body(name, replicas, "NewPods", 2))
        self.new_pods_case(
            case,
            name,
            replicas=replicas,
            version=2,
            host=host,
            old=old,
            t0=t0,
            new_revision=True,
            old_revision=stable,
        )
        cases.append(case)
        say(f"{case.name}: {case.seconds:.2f} s, {case.store_bytes} bytes from the store{vouched(case)}")
        self.gone(name)

    def run_in_place(self, cases: list[Case]) -> None:
        """Cases 5-6: a TritonService updated in place (the node warm only after cases 1-4)."""
        replicas = self.args.replicas
        name = "inplace"
        warm = "cold node" if self.args.in_place_only else "warm node"
        case = Case(f"new service, in place, {replicas} pods ({warm})")
        t0 = self.begin()
        self.apply(self.body(name, replicas, "InPlace", 1))
        host = self.cluster_ip(name)
        pods = self.new_pods_case(
            case, name, replicas=replicas, version=1, host=host, old=set(), t0=t0, new_revision=True
        )
        cases.append(case)
        say(f"{case.name}: {case.seconds:.2f} s, {case.store_bytes} bytes from the store{vouched(case)}")

        case = Case(f"new revision, in place ({CHANGED} 1 -> 3)")
        old_revision = self.status(name).get("stableRevision")
        hits = self.hit_bytes()
        before = self.operator_metrics()
        t0 = self.begin()
        wall0 = time.time()
        self.apply(self.body(name, replicas, "InPlace", 3))
        pods = self.watch(
            case, name, replicas=replicas, version=3, host=host, old={p.metadata.uid for p in pods}, t0=t0
        )
        case.cache_hit_bytes = self.hit_bytes() - hits
        case.pods = 0
        case.in_place_metrics = self.recorded_in_place(before, len(pods))
        case.served = self.recorded_in_place_entry(name, old_revision)
        case.recorded = [
            f"revision {e['revision']} in place (in the pods of {e.get('host')}), pod {e['pod']}: "
            f"{describe_phases(e)}"
            for e in case.served
        ] or ["(no status.timeToServe entry for the revision served in place within 30 s)"]
        applied_at: list[float] = []
        starts: list[float] = []
        for p in pods:
            agent = agent_applied(p.status.podIP, old_revision)
            case.store_bytes.append(int(agent["fetchedBytes"]))
            marks = in_place_marks(agent.get("inPlace"), wall0)
            if marks:
                case.timeline.append((str(p.metadata.name), marks))
            times = agent_times(self.logs(p.metadata.name, AGENT_CONTAINER))
            if times is not None:
                began, loading, applied = times
                starts.append(began)
                applied_at.append(applied)
                case.fetch_load.append((loading - began, applied - loading))
            check = self.weights_check(p.metadata.name, 3)
            if check is not None:
                case.weights_check.append(check)
        if starts and applied_at:  # the agents' wall clock (the node is this machine) against the apply's
            last = applied_at.index(max(applied_at))
            fetch, load = case.fetch_load[last]
            case.phases = {
                "to pod": max(starts[last] - wall0, 0.0),
                "sync": fetch,
                "load": load,
                "probes": 0.0,
                "routing": max(case.seconds - (max(applied_at) - wall0), 0.0),
            }
        cases.append(case)
        say(f"{case.name}: {case.seconds:.2f} s, {case.store_bytes} bytes from the store{vouched(case)}")
        self.gone(name)


IN_PLACE_MARKS = (
    ("startedAt", "began"),
    ("fetchedAt", "last byte"),
    ("drainedAt", "out of the Service"),
    ("loadedAt", "loaded"),
)
"""An agent's in-place record's moments, and their names in the timeline."""


def in_place_marks(record: Any, wall0: float) -> dict[str, float]:
    """Seconds from the apply (``wall0``, this machine's clock, the node's) to each moment of an agent's
    ``inPlace`` record that it has; {} for anything else."""
    if not isinstance(record, dict):
        return {}
    out: dict[str, float] = {}
    for key, label in IN_PLACE_MARKS:
        text = record.get(key)
        if isinstance(text, str):
            at = datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
            out[label] = at - wall0
    return out


def log_lines(log: str) -> list[tuple[float, str]]:
    """An agent's log lines as (wall-clock time, message), those with the agent's own time stamp
    (``<asctime> agent <level> <message>``)."""
    out: list[tuple[float, str]] = []
    for line in log.splitlines():
        parts = line.split(" agent ", 1)
        if len(parts) != 2:
            continue
        with contextlib.suppress(ValueError):
            at = datetime.strptime(parts[0], "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC).timestamp()
            out.append((at, parts[1].partition(" ")[2]))  # after its level
    return out


def fill_marks(log: str, wall0: float) -> dict[str, Any]:
    """A pod's first fill from its agent's log, in seconds after ``wall0``: when it began ('filling
    revision') and ended ('filled revision'), the order it fetched in (the last 'fetch ...' it
    logged: after the node cache's lease, where it orders again), and per model when its bytes were
    in ('every file in'), its load began ('loading model') and ended ('model ... loaded'; an agent
    that does not log it: the next load's start); {} without a fill."""
    out: dict[str, Any] = {}
    models: dict[str, dict[str, float]] = {}
    last_loading: str | None = None
    for at, text in log_lines(log):
        t = round(at - wall0, 2)
        words = text.split()
        if text.startswith("filling revision"):
            out["began"] = t
            out["order"] = text.split("fetch ", 1)[1].split(" (", 1)[0] if "fetch " in text else ""
        elif "objects: fetch " in text:
            out["order"] = text.split("objects: fetch ", 1)[1]
        elif text.startswith("model ") and text.endswith(": every file in"):
            models.setdefault(words[1].rstrip(":"), {})["in"] = t
        elif text.startswith("loading model "):
            if last_loading is not None:
                models[last_loading].setdefault("loaded", t)
            last_loading = words[2]
            models.setdefault(last_loading, {})["loading"] = t
        elif text.startswith("model ") and text.endswith(" loaded"):
            models.setdefault(words[1], {})["loaded"] = t
            last_loading = None
        elif text.startswith("filled revision"):
            out["filled"] = t
            if last_loading is not None:
                models[last_loading].setdefault("loaded", t)
                last_loading = None
    if "began" not in out:
        return {}
    out["models"] = models
    return out


def agent_times(log: str) -> tuple[float, float, float] | None:
    """Wall-clock times of the last change in an agent's log: 'applying revision', the first
    'loading model' after it and 'applied revision'; None when they are not all there."""
    began = loading = applied = None
    for at, text in log_lines(log):
        if "applying revision" in text:
            began, loading, applied = at, None, None
        elif "loading model" in text and began is not None and loading is None:
            loading = at
        elif "applied revision" in text and began is not None:
            applied = at
    if began is None or applied is None:
        return None
    return began, loading if loading is not None else applied, applied


# ---------------------------------------------------------------- the table


def mib(n: float) -> str:
    """Bytes for the table: exact below 1 MiB (0 B is the figure to see), else MiB."""
    return f"{int(n):,} B" if n < realrepo.MiB else f"{n / realrepo.MiB:,.1f} MiB"


def vouched(case: Case) -> str:
    """ ", node cache hits checked by its signed digest: 4 of 4 + ..." for a case whose pods read it."""
    if not any(hits for hits, _ in case.vouched):
        return ""
    linked = f", linked (not copied): {' + '.join(str(n) for n in case.shared)}" if any(case.shared) else ""
    return (
        ", node cache hits checked by its signed digest: "
        + " + ".join(f"{v} of {h}" for h, v in case.vouched)
        + linked
    )


def signing_key_for(args: argparse.Namespace, workdir: Path) -> Path | None:
    """Where the node cache's signing key is written (None: ``--unsigned``, no key)."""
    return None if args.unsigned else workdir / "node-cache-signing.key"


def write_signing_key(path: Path) -> None:
    """A new Ed25519 key for the node cache (base64 of its 32 bytes), readable by this user only."""
    path.write_text(base64.b64encode(os.urandom(32)).decode())
    path.chmod(0o600)


def signing_env(key: Path | None) -> dict[str, str]:
    """The operator's setting that hands new revisions' pods the cache's public key (none: unsigned)."""
    return {} if key is None else {"TRITON_OPERATOR_NODE_CACHE_SIGNING_KEY_FILE": str(key)}


def kubelet_root(node: Mapping[str, Any]) -> Path:
    """The real node's kubelet --root-dir (e2e/node.py: beside its containerd socket)."""
    return Path(str(node["containerd_socket"])).parent / "kubelet"


def csi_driver() -> Any:
    """The node cache's CSIDriver, as the chart's (charts/triton-operator/templates/node-cache.yaml)."""
    from lightkube.models.meta_v1 import ObjectMeta  # noqa: PLC0415
    from lightkube.models.storage_v1 import CSIDriverSpec  # noqa: PLC0415
    from lightkube.resources.storage_v1 import CSIDriver  # noqa: PLC0415

    spec = CSIDriverSpec(
        attachRequired=False, podInfoOnMount=True, volumeLifecycleModes=["Ephemeral"], fsGroupPolicy="None"
    )
    return CSIDriver(metadata=ObjectMeta(name=DRIVER), spec=spec)


def cache_command(
    root: Path,
    limit: str,
    address: str,
    port: int,
    key: Path | None,
    *,
    shared_files: Path | None = None,
    node_name: str = "",
    one_download: bool = False,
) -> list[str]:
    """`triton-operator node-cache` on ``address``:``port``, signing its statements with ``key``;
    with ``shared_files`` (the kubelet's root), also the CSI driver of the pods' views; with
    ``one_download``, claims (one download a node)."""
    shared = ["--shared-files", str(shared_files), "--node-name", node_name] if shared_files else []
    return [
        *_cache_base(root, limit, address, port, key),
        *shared,
        *(["--one-download"] if one_download else []),
    ]


def _cache_base(root: Path, limit: str, address: str, port: int, key: Path | None) -> list[str]:
    return [
        sys.executable,
        "-m",
        "triton_operator.cli",
        "node-cache",
        "--root",
        str(root),
        "--size-limit",
        limit,
        "--address",
        address,
        "--port",
        str(port),
        *(["--signing-key", str(key)] if key is not None else []),
    ]


def report(
    runs: dict[str, list[Case]],
    sessions: dict[str, RealSize],
    args: argparse.Namespace,
    touched: Sequence[str] = (),
) -> None:
    """Each tree's tables (this tree's alone without --ref), then, with --ref, the two side by side;
    the JSON: this tree's figures, and the other ref's under "ref"."""
    measured = [label for label, cases in runs.items() if cases]
    order = Reporting(PARAMETERS).order()
    reporting = (
        "none on this machine"
        if order is None
        else f"off for the run (order {OFF_ORDER}; {'; '.join(touched) or 'no memory touched first'})"
        if args.page_reporting_off
        else f"on (page_reporting_order {order})"
    )
    print(f"\nThis VM's free page reporting: {reporting}")
    out: dict[str, Any] = {"page_reporting": reporting}
    for label in measured:
        if len(runs) > 1:
            print(f"\n## {label}")
        figures = report_tree(runs[label], sessions.get(label), args)
        if label == THIS_TREE:
            out.update(figures)
        elif label == SHARED_TREE:
            out["shared"] = figures
        elif label.endswith(SHARED_SUFFIX):
            out["refShared"] = {"label": label, **figures}
        else:
            out["ref"] = {"label": label, **figures}
    if len(measured) > 1:
        side_by_side(runs, measured)
    print(json.dumps(out))
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


def side_by_side(runs: dict[str, list[Case]], labels: list[str]) -> None:
    """One row a case: each tree's apply -> every pod answers, then each tree's sync / load."""
    print("\nSide by side (seconds; apply -> every pod answers, then the last pod's sync / load):\n")
    print(
        "| case | "
        + " | ".join(f"`{t}`" for t in labels)
        + " | "
        + " | ".join(f"`{t}` sync / load" for t in labels)
        + " |"
    )
    print("|---|" + "---:|" * (2 * len(labels)))
    names = list(dict.fromkeys(c.name for t in labels for c in runs[t]))
    for name in names:
        got = [next((c for c in runs[t] if c.name == name), None) for t in labels]
        totals = [f"{c.seconds:.2f}" if c else "-" for c in got]
        phases = [
            f"{c.phases.get('sync', 0):.2f} / {c.phases.get('load', 0):.2f}" if c and c.phases else "-"
            for c in got
        ]
        print(f"| {name} | " + " | ".join(totals) + " | " + " | ".join(phases) + " |")


def print_fills(cases: list[Case]) -> None:
    """Each case's new pods' first fills (Case.fills), a line a pod."""
    for c in cases:
        if c.fills:
            print(
                f"\nEach new pod's first fill in {c.name} (its agent's log), seconds after the apply; "
                "per model: bytes in / load began - load ended:"
            )
            for pod, fill in sorted(c.fills, key=lambda t: t[1].get("began", 0.0)):
                models = sorted(fill["models"].items(), key=lambda kv: kv[1].get("in", 1e9))
                cells = [
                    f"{m} {v.get('in', float('nan')):.2f} / "
                    f"{v.get('loading', float('nan')):.2f}-{v.get('loaded', float('nan')):.2f}"
                    for m, v in models
                ]
                print(
                    f"- {pod}: began {fill['began']:.2f} (fetch {fill.get('order') or '-'}); "
                    + "; ".join(cells)
                    + f"; filled {fill.get('filled', float('nan')):.2f}"
                )


def print_cpu(cases: list[Case], session: RealSize | None) -> None:
    """The CPU seconds each case spent, by who spent them (Case.cpu), and why a column is "-"."""
    rows = [c.cpu for c in cases if c.cpu is not None]
    problems = session.cpu.problems if session is not None and session.cpu is not None else []
    if not rows and not problems:
        return
    print(
        "\nCPU seconds spent during each case (apply -> every pod answers), by who spent them; the floor "
        "is every busy CPU second over the node's cores (this machine: the real node is it):\n"
    )
    for line in cpu_accounting.table(rows):
        print(line)
    print(
        "\n- tritonserver, agent, rest of the pods: the case's pods' cgroups (its new pods; in place its "
        "pods), kubelet's pod<uid>/<container ID> folders; rest of the pods: the sandbox and the sync init "
        "container\n- other pods: kubepods' own counter less the case's pods (the pods a case deletes "
        "included)\n- node cache, store (seaweedfs), operator, cluster (etcd, kube-apiserver, scheduler, "
        "controller-manager, containerd, kubelet, kube-proxy, DNS, kwok, metrics adapter): every process of "
        "each one's session, /proc/PID/stat utime+stime of its live processes\n- bench: this process and the "
        "children it waited for (kubectl); rest of the machine: /proc/stat's busy time (not idle, not "
        "iowait) less every column before it (the containerd shims, anything else running here)\n"
        "- needed: every column but the bench and the rest of the machine, over the cores"
    )
    for c in cases:
        if c.cpu is not None and c.cpu.per_pod:
            print(
                f"- {c.name}, each pod's tritonserver / agent: "
                + "; ".join(f"{name} {t:.1f} / {a:.1f}" for name, t, a in c.cpu.per_pod)
            )
    for c in cases:
        if c.cpu is not None and c.cpu.rest_top:
            print(
                f"- {c.name}, the rest of the machine's largest (processes outside the pods and the "
                "columns' sessions): " + "; ".join(f"`{cmd}` {s:.1f}" for cmd, s in c.cpu.rest_top)
            )
    for why in problems:
        print(f"- not measured: {why}")


def cpu_figures(row: cpu_accounting.CpuRow | None) -> dict[str, Any] | None:
    if row is None:
        return None
    return {
        "columns": {k: None if v is None else round(v, 2) for k, v in row.columns.items()},
        "busy": None if row.busy is None else round(row.busy, 2),
        "cores": row.cores,
        "floor": None if row.floor is None else round(row.floor, 2),
        "needed": None if row.own is None else round(row.own, 2),
        "perPod": [list(p) for p in row.per_pod],
        "restLargest": [list(p) for p in row.rest_top],
    }


def report_tree(cases: list[Case], session: RealSize | None, args: argparse.Namespace) -> dict[str, Any]:
    """One tree's tables and targets, printed; its figures for the JSON."""
    out: dict[str, Any] = {}
    repo = session.repo if session is not None else None
    v2 = session.v2 if session is not None else None
    print()
    if repo is not None and v2 is not None and session is not None:
        print(
            f"Repository: {len(repo.models)} models, {mib(repo.total_bytes)} "
            f"({', '.join(f'{m.name} {mib(m.weight_bytes)}' for m in repo.models if m.weight_bytes)}); "
            f"{CHANGED} version 2 and 3: {mib(session.pinned_bytes(v2, f'{CHANGED}/2/'))} each. "
            f"Replicas {args.replicas}, "
            f"node cache {'unsigned' if args.unsigned else 'signed'}, "
            f"poll {args.poll * 1000:.0f} ms."
        )
    print(
        "\n| case | new pods | bytes from the store | bytes from the node cache | "
        + " | ".join(PHASES)
        + " | apply -> every pod answers |"
    )
    print("|---|---:|---:|---:|" + "---:|" * (len(PHASES) + 1))
    for c in cases:
        cells = [f"{c.phases[p]:.2f}" if p in c.phases else "-" for p in PHASES]
        store = " + ".join(mib(b) for b in c.store_bytes) if c.store_bytes else "-"
        from_cache = (
            f"{mib(c.cache_hit_bytes)}, {sum(c.shared)} files linked"
            if any(c.shared)
            else mib(c.cache_hit_bytes)
        )
        print(
            f"| {c.name} | {c.pods} | {store} | {from_cache} | "
            + " | ".join(cells)
            + f" | **{c.seconds:.2f}** |"
        )
    print("\nSeconds. Where each phase comes from:")
    for phase, source in SOURCES.items():
        print(f"- {phase}: {source}")
    print(
        "- bytes from the store: each new pod's sync summary (its termination message, what "
        "status.timeToServe[].bytesFetched shows); in place each pod's agent, "
        "GET :8009/v1/inplace fetchedBytes"
    )
    print(
        "- bytes from the node cache: the cache's own triton_node_cache_hit_bytes_total, "
        "its change over the case (bytes it sent); files linked: the new pods' agents' summaries "
        "(their view of the cache's files: read in place, nothing sent)"
    )
    print_cpu(cases, session)
    recorded = [c for c in cases if c.metrics]
    if recorded:
        print(
            "\nThe operator's own record of the same pod starts (its metrics "
            "triton_operator_time_to_serve_seconds{phase} and _fetched_bytes, their change over the case: "
            "the mean over the case's new pods; from the pods' status times, whole seconds apart; "
            "created -> Ready, so without the operator's part and the routing):"
        )
        print("\n| case | " + " | ".join(STARTUP_PHASES) + " | created -> Ready | bytes fetched (sum) |")
        print("|---|" + "---:|" * (len(STARTUP_PHASES) + 2))
        for c in recorded:
            cells = [f"{c.metrics[p]:.1f}" if p in c.metrics else "-" for p in (*STARTUP_PHASES, "total")]
            print(f"| {c.name} | " + " | ".join(cells) + f" | {mib(c.metrics.get('fetched bytes', 0))} |")
    for c in cases:
        if c.in_place_metrics:
            print(
                f"\nThe operator's record of {c.name} (triton_operator_in_place_update_seconds{{phase}}, "
                "the mean over the pods, from each agent's own record): "
                + ", ".join(
                    f"{p} {c.in_place_metrics[p]:.2f} s"
                    for p in (*IN_PLACE_PHASES, "total")
                    if p in c.in_place_metrics
                )
                + f"; {mib(c.in_place_metrics.get('fetched bytes', 0))} fetched (sum)"
            )
    for c in cases:
        if c.timeline:
            print(f"\nEach pod's agent in {c.name} (its inPlace record), seconds after the apply:")
            for pod, marks in sorted(c.timeline, key=lambda t: t[1].get("began", 0.0)):
                print(f"- {pod}: " + ", ".join(f"{label} {at:.2f}" for label, at in marks.items()))
    print_fills(cases)
    lines = [(c.name, line) for c in cases for line in c.recorded]
    if lines:
        print(
            "\nstatus.timeToServe of each new revision (its first Ready pod), "
            "as the RevisionServed Event says it:"
        )
        for name, line in lines:
            print(f"- {name}: {line}")
    if any(c.weights_check for c in cases):
        print(f"\n{CHANGED}'s own check of its shards at load (its log line in tritonserver's log):")
    for c in cases:
        if c.weights_check:
            print(f"- {c.name}: " + ", ".join(f"{s:.2f} s" for s in c.weights_check))
    verdicts: dict[str, Any] = {}
    scale = next((c for c in cases if c.name.startswith("scale-up")), None)
    if scale is not None:
        ok = bool(scale.store_bytes) and all(b == 0 for b in scale.store_bytes)
        verdicts["scaleUpZeroBytes"] = ok
        print(
            f"\nTarget: the scale-up pod on a warm node reads 0 bytes from the store: "
            f"{'PASS' if ok else 'MISS'} ({scale.store_bytes})"
        )
    in_place = next((c for c in cases if c.name.startswith("new revision, in place")), None)
    if in_place is not None and in_place.fetch_load:
        download = max(f for f, _ in in_place.fetch_load)
        load = max(ld for _, ld in in_place.fetch_load)
        bound = max(f + ld for f, ld in in_place.fetch_load) + 2.0
        verdicts["bound"] = bound
        print(
            f"Target: a new revision changing {CHANGED} answers within the download of its new version "
            f"+ its load + 2 s = {bound:.2f} s (per pod, the slowest; download up to {download:.2f} s and "
            f"load up to {load:.2f} s, each in-place pod's agent):"
        )
        for c in cases:
            if c.name.startswith("new revision"):
                ok = c.seconds <= bound
                verdicts[c.name] = ok
                print(f"- {c.name}: {c.seconds:.2f} s: {'PASS' if ok else 'MISS'}")
    out.update(
        {
            "cases": [
                {
                    "name": c.name,
                    "seconds": round(c.seconds, 3),
                    "pods": c.pods,
                    "storeBytes": c.store_bytes,
                    "nodeCacheHitsVouched": [list(v) for v in c.vouched],
                    "nodeCacheShared": list(c.shared),
                    "cacheHitBytes": c.cache_hit_bytes,
                    "phases": {k: round(v, 3) for k, v in c.phases.items()},
                    "fetchLoad": c.fetch_load,
                    "timeline": c.timeline,
                    "fills": c.fills,
                    "recorded": c.recorded,
                    "timeToServe": c.served,
                    "operatorMetrics": c.metrics,
                    "inPlaceMetrics": c.in_place_metrics,
                    "cpuSeconds": cpu_figures(c.cpu),
                }
                for c in cases
            ],
            "verdicts": verdicts,
        }
    )
    if repo is not None and v2 is not None and session is not None:
        out["repository"] = {
            "pinnedBytes": session.pinned_bytes(repo),
            "distinctBytes": session.distinct_bytes(repo),
            "changedBytes": session.pinned_bytes(v2, f"{CHANGED}/2/"),
            "changedShardBytes": v2.model(CHANGED).weight_bytes // 2,
        }
    return out


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's settings (a bad one exits, naming it)."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--big", default="2GiB", help="weights of the big model (llm)")
    ap.add_argument("--medium", default="500MiB", help="weights of the model that changes (encoder)")
    ap.add_argument("--small", type=int, default=3, help="small models (the ensemble chains two)")
    ap.add_argument("--small-size", default="1MiB")
    ap.add_argument("--shard", default="256MiB", help="largest weight shard")
    ap.add_argument(
        "--replicas", type=int, default=2, help="pods after the scale-up, and of the in-place service"
    )
    ap.add_argument("--pod-memory", default="3Gi", help="the tritonserver container's memory")
    ap.add_argument("--cache-limit", default="20Gi", help="the node cache's size limit")
    ap.add_argument("--poll", type=float, default=0.1, help="seconds between polls")
    ap.add_argument("--timeout", type=float, default=600, help="seconds a case may take")
    ap.add_argument("--json", type=Path, help="also write the figures here as JSON")
    ap.add_argument(
        "--in-place-only",
        action="store_true",
        help="only cases 5-6 (the in-place service and its new revision; its first pods on a cold node)",
    )
    ap.add_argument("--new-pods-only", action="store_true", help="only cases 1-4 (the service with new pods)")
    ap.add_argument(
        "--unsigned",
        action="store_true",
        help="run the node cache without a signing key (the chart's nodeCache.signingKey.enabled=false): "
        "each pod checks the pin (MD5 of an S3 ETag) of every object it reads from the cache",
    )
    ap.add_argument(
        "--shared-files",
        action="store_true",
        help="measure this tree twice, copying (as the chart's default) and then with the node cache's "
        "shared files (nodeCache.sharedFiles.enabled: its CSI driver registered with the real node's "
        "kubelet, the pods linking to its files), each with a cold node cache, and print both side by side; "
        "with --ref, the ref's tree too",
    )
    ap.add_argument(
        "--one-download",
        action="store_true",
        help="run this tree's node cache with --one-download (nodeCache.oneDownload; a --ref tree's as it "
        "was): pods starting together read a file the node lacks from the store once, the others waiting "
        "for its upload",
    )
    ap.add_argument(
        "--shared-only",
        action="store_true",
        help="with --shared-files: measure each tree with shared files only (no copying runs)",
    )
    ap.add_argument(
        "--ref",
        metavar="REF",
        help="also measure git ref REF in the same run, first (a temporary worktree of it, its operator "
        "image built from its Dockerfile and loaded under a tag of its own, its operator run from its "
        "operator/src; each tree with a cold node cache of its own), and print both side by side",
    )
    ap.add_argument(
        "--page-reporting-off",
        action="store_true",
        help="turn this VM's free page reporting off for the run (root; page_reporting_order "
        f"{OFF_ORDER}, put back after) and touch its free memory once first: pages a deleted pod freed "
        "stay backed by the host, as on a machine without it (bench/node_cache/page_reporting.py)",
    )
    args = ap.parse_args(argv)
    if args.shared_only and not args.shared_files:
        ap.error("--shared-only needs --shared-files")
    if args.in_place_only and args.new_pods_only:
        ap.error("--in-place-only and --new-pods-only leave no case")
    if args.replicas < 2:
        ap.error("--replicas must be at least 2 (the scale-up adds pods to one)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    runs: dict[str, list[Case]] = {}
    sessions: dict[str, RealSize] = {}
    touched: list[str] = []

    def measure(node: dict[str, Any]) -> None:
        with contextlib.ExitStack() as stack:
            if args.page_reporting_off:
                reporting = Reporting(PARAMETERS)
                stack.enter_context(reporting.set_order(OFF_ORDER))
                gib, seconds, system = back_free_memory()
                touched.append(
                    f"{gib} GiB of free memory touched once first: {seconds:.1f} s, {system:.1f} s system CPU"
                )
                say(f"free page reporting off (page_reporting_order {reporting.order()}); {touched[0]}")
            trees = [] if args.shared_only else [Tree(THIS_TREE)]
            if args.shared_files:  # the same tree again, its pods linking to the cache's files
                trees.append(Tree(SHARED_TREE, env=SHARED_ENV))
            if args.ref:
                ref = stack.enter_context(ref_tree(args.ref, node))
                if args.shared_files:  # the ref's pods link too: each tree as the other
                    trees.insert(0, Tree(f"{ref.label}{SHARED_SUFFIX}", ref.root, {**ref.env, **SHARED_ENV}))
                if not args.shared_only:
                    trees.insert(0, ref)
            for tree in trees:
                say(f"measuring {tree.label}")
                workdir = Path(tempfile.mkdtemp(prefix="bench-realsize-"))
                session = RealSize(args, node, workdir, tree)
                sessions[tree.label] = session
                try:
                    session.start()
                    session.run(runs.setdefault(tree.label, []))
                finally:
                    session.stop()
                    shutil.rmtree(workdir / "weed", ignore_errors=True)
                    shutil.rmtree(workdir / "node-cache", ignore_errors=True)
                    say(f"logs: {workdir} (the store's and the node cache's data removed)")

    return run_with_cluster(
        measure,
        lambda: report(runs, sessions, args, touched),
        measured=lambda: sum(len(cases) for cases in runs.values()),
    )


if __name__ == "__main__":
    sys.exit(main())
