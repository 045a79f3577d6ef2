"""bench/real_pods/realsize.py at a few MiB on the real node, as CI runs it: the bytes each case reads
from the store, never its seconds.

The bench's own cases on real pods (the local cluster's real node, a CPU tritonserver, seaweedfs on
the pod bridge's gateway, `triton-operator node-cache` on the node's address, the operator on this
machine): a new service on a cold node reads the whole repository; a scale-up pod and a restarted pod
on the warm node read 0 bytes from the store; a new revision changing one model reads only that
model's bytes (new pods: each new pod; in place: each pod's agent); a new in-place service on the warm
node reads 0 bytes. The table is printed and the targets named.

Needs the real node of e2e/cluster.py and the images built from this tree; without them it skips.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--big", "6MiB", "--medium", "3MiB", "--small", "3", "--small-size", "64KiB", "--shard", "2MiB"]

pytestmark = [pytest.mark.cluster]


def case(result: dict[str, Any], prefix: str) -> dict[str, Any]:
    return next(c for c in result["cases"] if c["name"].startswith(prefix))


def test_the_real_size_cases_read_only_what_the_node_lacks(node: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "realsize.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "real_pods" / "realsize.py"), *SMALL, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-4000:]}"
    result = json.loads(out.read_text())
    repo = result["repository"]
    whole, changed, shards = repo["pinnedBytes"], repo["changedBytes"], repo["changedShardBytes"]
    assert shards < changed < whole

    # One pod shape: the agent fetches the whole revision in one sync; a copy of an object the node
    # cache holds by then (the models' shared model.py) may come from there: the store gives each
    # content at least once, and no more than all.
    distinct = repo["distinctBytes"]
    assert distinct < whole
    (cold,) = case(result, "new service (cold")["storeBytes"]
    assert distinct <= cold <= whole, (distinct, cold, whole)
    scale_up = case(result, "scale-up")
    assert scale_up["storeBytes"] == [0]
    assert scale_up["cacheHitBytes"] == whole  # the node cache gave the new pod every byte
    assert case(result, "pod restart")["storeBytes"] == [0]
    # A new revision changing one model: no pod reads more than that model's new version (its
    # model.py has the bytes of version 1's, which the node holds), and the store gave its weights at
    # least once (a pod that starts after another gave them to the node reads them from the cache).
    for prefix in ("new revision, new pods", "new revision, in place"):
        reads = case(result, prefix)["storeBytes"]
        assert len(reads) == 2, (prefix, reads)
        assert all(read <= changed for read in reads), (prefix, reads)
        assert sum(reads) >= shards, (prefix, reads)
    assert case(result, "new service, in place")["storeBytes"] == [0, 0]
    # The operator's record (status.timeToServe of each new revision's first Ready pod, and its
    # time-to-serve metrics of every new pod) has the bench's phases: a pod of the one shape's sync is
    # its agent's start -> the last byte in (the agent's record of its fill), the loads left after it
    # tritonserverLoad; the bytes are those the pod read from the store.
    for prefix in ("new service (cold", "new revision, new pods"):
        c = case(result, prefix)
        (entry,) = c["timeToServe"]
        phases = entry["phases"]
        assert set(phases) == {"scheduling", "imageAndSandbox", "sync", "tritonserverLoad"}, entry
        # in words (the RevisionServed Event, `kubectl triton status`), in the bench's order
        words = c["recorded"][0]
        named = ("scheduling", "image and sandbox", "sync", "tritonserver load")
        order = [words.index(f" {w} ") for w in named]
        assert order == sorted(order), words
        assert phases["sync"] > 0, entry
        assert entry["bytesFetched"] in c["storeBytes"], (entry, c["storeBytes"])
        assert entry["bytesFetched"] + entry["bytesPresent"] <= whole + changed, entry
    (first,) = case(result, "new service (cold")["timeToServe"]
    assert first["bytesFetched"] + first["bytesPresent"] == whole, first  # every byte, once
    for c in result["cases"]:
        metrics = c["operatorMetrics"]
        if not metrics:
            continue  # in place: no new pod
        assert metrics.get("sync", 0) > 0, (c["name"], metrics)
        assert metrics["fetched bytes"] == sum(c["storeBytes"]), (c["name"], metrics, c["storeBytes"])
    # Each pod's change in place: the operator observed it once (its agent's own record), with a sync,
    # the drain and the loads, and the bytes the agents said they fetched.
    in_place = case(result, "new revision, in place")
    metrics = in_place["inPlaceMetrics"]
    assert metrics.get("sync", 0) > 0 and metrics.get("tritonserverLoad", 0) > 0, metrics
    assert "drain" in metrics, metrics
    assert metrics["fetched bytes"] == sum(in_place["storeBytes"]), metrics
    assert result["verdicts"]["scaleUpZeroBytes"] is True
    assert "| scale-up 1 -> 2 (warm node) |" in proc.stdout
    assert "Target: the scale-up pod on a warm node reads 0 bytes from the store: PASS" in proc.stdout
