#!/usr/bin/env python3
"""Where the local cluster's API server spends its CPU: perf samples of kube-apiserver, by request.

Run it beside `bench/control_plane/run.py` (or anything else that loads the cluster): it waits until
``--after`` TritonServices exist, records the API server's stacks with `perf record -g` for
``--seconds``, symbolizes them with `go tool addr2line` (the binary is stripped; Go keeps its own
line table), and prints one markdown table: the share of the API server's CPU samples by request
verb and resource, and a few places inside them (ClusterIP allocation, label selectors matched by
lists, managedFields, the garbage collector).

  .venv/bin/python bench/control_plane/run.py --count 5000 --changes 20 --idle-seconds 30 --canary-trials 3 &
  .venv/bin/python bench/control_plane/apiserver_profile.py --after 1000 --seconds 60

Needs `perf` (linux-perf) and Go (which `e2e/cluster.py` builds the cluster with), and the right to
profile another process (root, or kernel.perf_event_paranoid <= 1).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEXT_BASE = 0x400000
"""Where a non-PIE Go binary's text is mapped: perf reports its addresses as offsets from it."""

VERBS = (
    ("garbage collector", ("runtime.gcBgMarkWorker",)),
    ("create (POST)", ("handlers.CreateResource",)),
    ("apply or patch (PATCH)", ("patcher).patchResource", "handlers.PatchResource")),
    ("update (PUT)", ("handlers.UpdateResource",)),
    ("delete", ("handlers.DeleteResource", "handlers.DeleteCollection")),
    ("list", ("handlers.handleList",)),
    ("watch", ("handlers.handleWatch", "cacher.(*cacheWatcher)", "cacher.(*Cacher).dispatchEvent")),
    ("get", ("handlers.GetResource", "handlers.getResourceHandler")),
    ("etcd watch decoding", ("etcd3.(*watchChan)",)),
    (
        "request filters before a handler (authentication, authorization, fairness)",
        ("filters.(*timeoutHandler)",),
    ),
    ("HTTP serving (HTTP/2 frames, TLS)", ("net/http.(*conn).serve", "http2.(*serverConn)")),
    ("etcd client (gRPC transport)", ("grpc/internal/transport.",)),
    ("goroutine stacks, scheduling, sweeping", ("runtime.newstack", "runtime.bgsweep", "runtime.schedule")),
)
"""Request kinds, each by the frames that mark it (the first that matches a stack names it)."""

PLACES = (
    ("ClusterIP allocation (Service create)", ("ipallocator.",)),
    ("label selectors matched by lists", ("SelectionPredicate).MatchesObjectAttributes",)),
    ("managedFields (server-side apply and update tracking)", ("managedfields/internal.",)),
    ("admission", ("admission.(*chainAdmissionHandler)",)),
    ("writing to etcd", ("etcd3.(*store).GuaranteedUpdate", "etcd3.(*store).Create")),
    (
        "encoding responses and watch events",
        ("serializer/json.(*Serializer).Encode", "protobuf.(*Serializer).Encode"),
    ),
)
"""Places inside requests, each counted wherever it appears in a stack."""

RESOURCE = re.compile(
    r"k8s\.io/kubernetes/pkg/registry/\w+/(\w+)|apiextensions-apiserver/pkg/registry/(customresource)"
)


def api_server_pid() -> int:
    found = subprocess.run(
        ["pgrep", "-x", "kube-apiserver"], check=False, capture_output=True, text=True
    ).stdout.split()
    if not found:
        raise SystemExit("no kube-apiserver process is running here (start the cluster: e2e/cluster.py)")
    return int(found[0])


def tritonservices(kubeconfig: str) -> int:
    """How many TritonServices the API server holds (a list of one: its remainingItemCount)."""
    done = subprocess.run(
        [
            "kubectl",
            "--kubeconfig",
            kubeconfig,
            "get",
            "--raw",
            "/apis/triton-operator.io/v1alpha1/tritonservices?limit=1",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        return 0
    body = json.loads(done.stdout)
    return len(body.get("items") or []) + int((body.get("metadata") or {}).get("remainingItemCount") or 0)


def stacks(data: Path, binary: Path) -> list[list[str]]:
    """perf's sampled stacks, leaf first, each frame a function name ("[kernel]" outside the binary)."""
    script = subprocess.run(
        ["perf", "script", "-i", str(data), "-F", "ip,dso"], capture_output=True, text=True, check=True
    ).stdout
    raw: list[list[tuple[int, bool]]] = []
    current: list[tuple[int, bool]] = []
    for line in script.splitlines():
        text = line.strip()
        if not text:
            if current:
                raw.append(current)
                current = []
            continue
        address, _, dso = text.partition(" ")
        current.append((int(address, 16), binary.name in dso))
    if current:
        raw.append(current)
    addresses = sorted({a for stack in raw for a, ours in stack if ours})
    names = symbolize(binary, [a + TEXT_BASE for a in addresses])
    by_address = dict(zip(addresses, names, strict=True))
    return [[by_address[a] if ours else "[kernel]" for a, ours in stack] for stack in raw]


def symbolize(binary: Path, addresses: Sequence[int]) -> list[str]:
    """Function names for ``addresses`` (go tool addr2line answers two lines each: name, file:line)."""
    done = subprocess.run(
        ["go", "tool", "addr2line", str(binary)],
        input="".join(f"{a:#x}\n" for a in addresses),
        capture_output=True,
        text=True,
        check=True,
    )
    lines = done.stdout.splitlines()
    if len(lines) != 2 * len(addresses):
        raise SystemExit(f"go tool addr2line answered {len(lines)} lines for {len(addresses)} addresses")
    return lines[0::2]


def resource_of(stack: Iterable[str]) -> str:
    for frame in stack:
        match = RESOURCE.search(frame)
        if match:
            return match.group(1) or match.group(2)
    return ""


def table(samples: list[list[str]]) -> list[tuple[str, float]]:
    """(row, share of samples) for each request kind and resource, then each place."""
    total = len(samples)
    kinds: collections.Counter[str] = collections.Counter()
    for stack in samples:
        joined = "\n".join(stack)
        verb = next((name for name, marks in VERBS if any(m in joined for m in marks)), "other")
        resource = resource_of(stack) if verb not in ("garbage collector", "other") else ""
        kinds[f"{verb}: {resource}" if resource else verb] += 1
    rows = [(name, count / total) for name, count in kinds.most_common()]
    for name, marks in PLACES:
        count = sum(1 for stack in samples if any(m in frame for frame in stack for m in marks))
        rows.append((f"within the above: {name}", count / total))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--after", type=int, default=0, help="start once this many TritonServices exist")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to record (default 60)")
    parser.add_argument("--frequency", type=int, default=99, help="samples per second per CPU (default 99)")
    parser.add_argument("--min-share", type=float, default=0.5, help="rows under this percentage are summed")
    parser.add_argument("--kubeconfig", help="the cluster's (default: e2e/cluster.py's)")
    args = parser.parse_args()
    for tool in ("perf", "go", "kubectl"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed here")
    kubeconfig = args.kubeconfig or os.environ.get("KUBECONFIG")
    if not kubeconfig:
        sys.path.insert(0, str(REPO / "e2e"))
        import cluster  # noqa: PLC0415  (e2e/cluster.py, on the path only from here on)

        kubeconfig = str(cluster.kubeconfig_path())
    while args.after and tritonservices(kubeconfig) < args.after:
        time.sleep(2)
    pid = api_server_pid()
    binary = Path(os.readlink(f"/proc/{pid}/exe"))
    held = tritonservices(kubeconfig)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="apiserver-profile-") as work:
        data = Path(work) / "perf.data"
        subprocess.run(
            [
                "perf",
                "record",
                "-q",
                "-F",
                str(args.frequency),
                "-g",
                "-p",
                str(pid),
                "-o",
                str(data),
                "--",
                "sleep",
                str(args.seconds),
            ],
            check=True,
            capture_output=True,
        )
        samples = stacks(data, binary)
    if not samples:
        raise SystemExit("perf recorded no samples of the API server")
    print(
        f"kube-apiserver (pid {pid}): {len(samples)} samples in {args.seconds:g} s at {args.frequency} Hz "
        f"({len(samples) / args.frequency / args.seconds:.2f} CPUs busy on average), {held} TritonServices "
        f"when it started, load average {load:.1f}"
    )
    print()
    print("| where the API server's CPU went | share |")
    print("|---|---:|")
    rows = table(samples)
    kinds = [(name, share) for name, share in rows if not name.startswith("within")]
    small = sum(share for _, share in kinds if share * 100 < args.min_share)
    for name, share in kinds:
        if share * 100 >= args.min_share:
            print(f"| {name} | {share * 100:.1f} % |")
    if small:
        print(f"| the rest, each under {args.min_share:g} % | {small * 100:.1f} % |")
    for name, share in rows[len(kinds) :]:
        print(f"| {name} | {share * 100:.1f} % |")
    print()
    print(
        "A request's resource is named where its registry's code is on the sampled stack (a Service's "
        "ClusterIP, a custom resource's status); otherwise the row has the verb alone."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
