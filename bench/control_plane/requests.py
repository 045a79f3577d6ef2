#!/usr/bin/env python3
"""API requests per TritonService, counted by the API server: a new one until its pods are Ready, and a
pass that changes nothing; this tree and ``--ref REF`` (another git ref's operator/src) in the same run.

For each tree, in turn: the operator (`triton-operator run --namespace NS`, its own ServiceAccount;
one FlowSchema per verb and resource matches only that account, as in run.py) starts in a namespace
of its own; once it is quiet, ``--count`` TritonServices of one replica (kwok pods) are created at
once; when every Deployment is Ready and the operator has sent nothing for 5 s, its requests since
the creates, divided by ``--count``, are those of a new TritonService. Then an annotation is set on
every TritonService (a pass each that changes nothing: the spec and its objects are as they were)
and, once quiet again, the requests since, divided by ``--count``, are those of such a pass; the
operator's peak RSS (VmHWM) is read before it stops. The
counts are the API server's own (`apiserver_flowcontrol_dispatched_requests_total` per
FlowSchema), so nothing but the operator is counted, whatever else uses the cluster. A watch of the
TritonServices says what each status write of a new one changed (the conditions by type, the other
fields by name; the first write of each sets them all), per TritonService: where the status writes go;
and the operator's own metrics its passes by outcome (a superseded one sent a status write that was
refused: the TritonService had changed since the pass read it).

Cluster: $KUBECONFIG (required; the shared local cluster: `eval "$(python3 e2e/cluster.py env)"`).
What it creates (namespaces, FlowSchemas, the ServiceAccount, kwok nodes) is deleted at the end.

  .venv/bin/python bench/control_plane/requests.py --count 1000 --ref main
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx2

if TYPE_CHECKING:
    from bench.control_plane import run as cp
else:  # run as a script: its folder is on the path
    import run as cp
from triton_operator import GROUP, PLURAL, VERSION

Counts = Counter[tuple[str, str]]


async def quiet(api: cp.Api, window: float = 5.0, timeout: float = 900.0) -> Counts:
    """The counts once the operator has sent nothing for ``window`` seconds."""
    deadline = time.monotonic() + timeout
    last = await cp.operator_requests(api)
    since = time.monotonic()
    while time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        now = await cp.operator_requests(api)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= window:
            return now
    raise RuntimeError(f"the operator did not go quiet for {window} s in {timeout} s")


class StatusChanges:
    """Each status change of the namespace's TritonServices, by what it changed: a watch from the
    creates on (every status write of the operator is one MODIFIED event that changes the status)."""

    def __init__(self, api: cp.Api, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.last: dict[str, dict[str, Any]] = {}
        self.changes: Counter[str] = Counter()
        self.writes = 0
        self.broken = 0
        """Watches ended by an error and resumed."""
        self.started = asyncio.Event()

    @staticmethod
    def changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
        def conditions(status: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
            return {
                str(c.get("type")): (c.get("status"), c.get("reason"), c.get("message"))
                for c in status.get("conditions") or []
            }

        keys = sorted((set(before) | set(after)) - {"conditions"})
        out = [k for k in keys if before.get(k) != after.get(k)]
        old, new = conditions(before), conditions(after)
        out += [t for t in sorted(set(old) | set(new)) if old.get(t) != new.get(t)]
        return out

    def take(self, kind: str, obj: dict[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name"))
        status = obj.get("status") or {}
        if kind == "DELETED":
            self.last.pop(name, None)
            return
        before = self.last.get(name, {})
        self.last[name] = status
        what = self.changed(before, status)
        if what:
            self.writes += 1
            self.changes["the first status" if not before else " + ".join(what)] += 1
        elif status != before:
            self.writes += 1
            self.changes["conditions' times or generations only"] += 1

    async def run(self) -> None:
        """Watch from the namespace's start and resume from the last version seen whenever the stream
        ends or is refused (a loaded API server sheds watches too), so no write is missed."""
        path = cp.ts_path(self.namespace)
        version = "0"
        while True:
            params = {"watch": "1", "resourceVersion": version, "timeoutSeconds": "3600"}
            try:
                async with self.api.http.stream("GET", path, params=params, timeout=cp.WATCH_TIMEOUT) as resp:
                    self.started.set()
                    if resp.status_code != 200:
                        await resp.aread()
                        self.broken += 1
                    else:
                        async for line in resp.aiter_lines():
                            if not line.strip():
                                continue
                            event = json.loads(line)
                            kind, obj = str(event.get("type")), event.get("object") or {}
                            if kind == "ERROR":
                                self.broken += 1
                                break
                            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                            self.take(kind, obj)
            except httpx2.HTTPError:
                self.broken += 1
            await asyncio.sleep(0.5)

    def summary(self, count: int) -> str:
        """Writes per TritonService, then each set of fields a write changed (conditions by type)."""
        parts = "; ".join(f"{k}: {n / count:.2f}" for k, n in self.changes.most_common())
        resumed = f" (the watch resumed {self.broken} times)" if self.broken else ""
        return f"{self.writes / count:.2f} writes = {parts}{resumed}"


def passes(operator: cp.Operator) -> Counter[str]:
    """The operator's reconcile passes so far, by outcome (success, superseded, ...), from its /metrics."""
    out: Counter[str] = Counter()
    try:
        url = f"http://127.0.0.1:{operator.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
    except (OSError, urllib.error.URLError):
        return out
    prefix = "triton_operator_reconcile_duration_seconds_count{"
    for line in text.splitlines():
        if line.startswith(prefix):
            labels = line[len(prefix) :].split("}", 1)[0]
            outcome = dict(p.split("=", 1) for p in labels.split(",") if "=" in p).get("outcome", "")
            out[outcome.strip('"')] += int(float(line.rsplit(" ", 1)[1]))
    return out


def delta(after: Counts, before: Counts) -> Counts:
    out = Counter(after)
    out.subtract(before)
    return Counter({k: v for k, v in out.items() if v})


async def ready(api: cp.Api, namespace: str, count: int, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        listed = await api.call("GET", f"/apis/apps/v1/namespaces/{namespace}/deployments")
        items = listed.get("items") or []
        done = sum(1 for d in items if int((d.get("status") or {}).get("readyReplicas") or 0) >= 1)
        if done >= count:
            return time.monotonic() - started
        await asyncio.sleep(2.0)
    raise RuntimeError(f"not every Deployment of {namespace} Ready after {timeout} s")


async def measure(
    api: cp.Api, kubeconfig: Path, work: Path, *, source: Path | None, count: int, label: str
) -> tuple[Counts, Counts, int, str]:
    namespace = f"cp-requests-{uuid.uuid4().hex[:6]}"
    await cp.ensure_namespace(api, namespace, {cp.RUN_LABEL: "true"})
    operator = cp.Operator(kubeconfig, work, source, scope=["--namespace", namespace])
    try:
        operator.start()
        base = await quiet(api)
        passes_before = passes(operator)
        watcher = StatusChanges(api, namespace)
        watching = asyncio.create_task(watcher.run())
        await asyncio.wait_for(watcher.started.wait(), 30.0)
        semaphore = asyncio.Semaphore(32)

        async def create(i: int) -> None:
            async with semaphore:
                body = cp.tritonservice(f"svc-{i:05d}", namespace, 1, change="initial")
                await api.call("POST", cp.ts_path(namespace), body)

        await asyncio.gather(*(create(i) for i in range(count)))
        took = await ready(api, namespace, count, 1800.0)
        cp.log(f"{label}: {count} Ready after {took:.0f} s")
        created = await quiet(api)
        new = delta(created, base)
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
        ran = passes(operator)
        ran.subtract(passes_before)
        statuses = (
            watcher.summary(count)
            + " | passes: "
            + ", ".join(f"{k} {n / count:.2f}" for k, n in sorted(ran.items()) if n)
        )
        cp.log(f"{label}: status changes per new TritonService: {statuses}")

        async def touch(i: int) -> None:
            async with semaphore:
                await api.call(
                    "PATCH",
                    f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/svc-{i:05d}",
                    {"metadata": {"annotations": {"cp-bench.triton-operator.io/touch": "1"}}},
                    content_type="application/merge-patch+json",
                )

        await asyncio.gather(*(touch(i) for i in range(count)))
        unchanged = delta(await quiet(api), created)
        return new, unchanged, operator.memory_kb().get("VmHWM", 0), statuses
    finally:
        operator.stop()
        with contextlib.suppress(cp.ApiError):
            await api.call("DELETE", f"/api/v1/namespaces/{namespace}", missing_ok=True)


def per(counts: Counts, count: int) -> str:
    verbs: Counter[str] = Counter()
    for (verb, resource), n in counts.items():
        verbs[f"{verb} {resource}"] += n
    return ", ".join(f"{k} {n / count:.2f}" for k, n in sorted(verbs.items()))


async def main_async(args: argparse.Namespace, kubeconfig: Path, work: Path) -> list[str]:
    api = cp.Api(cp.read_kubeconfig(kubeconfig), 32)
    nodes: list[str] = []
    rows: list[tuple[str, Counts, Counts, int, str]] = []
    try:
        await cp.apply_crd(api)
        operator_kubeconfig = await cp.setup_identity(api, work)
        nodes = await cp.ensure_pod_capacity(api, args.count + 4)
        trees: list[tuple[str, Path | None]] = []
        if args.ref:
            trees.append((f"--ref {cp.describe_source(args.ref)}", cp.export_source(args.ref, work)))
        trees.append((cp.describe_source(None), None))
        for label, source in trees:
            new, unchanged, peak, statuses = await measure(
                api, operator_kubeconfig, work, source=source, count=args.count, label=label
            )
            cp.log(f"{label}: new {dict(new)}; unchanged {dict(unchanged)}")
            rows.append((label, new, unchanged, peak, statuses))
    finally:
        with contextlib.suppress(cp.ApiError):
            await cp.teardown_identity(api)
        for node in nodes:
            with contextlib.suppress(cp.ApiError):
                await api.call("DELETE", f"/api/v1/nodes/{node}", missing_ok=True)
        await api.close()
    n = args.count
    out = [
        "| tree | requests per new TritonService (until Ready) | per pass that changes nothing | "
        "operator VmHWM | new: by verb and resource | unchanged: by verb and resource |",
        "|---|---:|---:|---:|---|---|",
    ]
    for label, new, unchanged, peak, _ in rows:
        out.append(
            f"| {label} | {sum(new.values()) / n:.2f} | {sum(unchanged.values()) / n:.2f} | "
            f"{peak * 1024 / 1e6:.0f} MB | "
            f"{per(new, n)} | {per(unchanged, n)} |"
        )
    out += [
        "",
        "| tree | status writes of a new TritonService, by what they changed | its passes, by outcome |",
        "|---|---|---|",
    ]
    out += [f"| {label} | {statuses} |" for label, _, _, _, statuses in rows]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=1000, help="TritonServices created (default 1000)")
    parser.add_argument("--ref", help="also measure this git ref's operator/src, first")
    args = parser.parse_args()
    env: Any = os.environ.get("KUBECONFIG")
    if not env:
        parser.error('set KUBECONFIG (the shared cluster: eval "$(python3 e2e/cluster.py env)")')
    work = Path(tempfile.mkdtemp(prefix="cp-requests-"))
    cp.log(f"work dir {work}; load average {cp.loadavg()}")
    table = asyncio.run(main_async(args, Path(env), work))
    print()
    print(f"API requests per TritonService: {args.count:,} of one kwok pod each; load {cp.loadavg()}")
    print()
    print("\n".join(table), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
