"""bench/pool/live.py at its CI size on the real node (4 models, 2 pods): both layouts serve every
model and a new one, the pool needs less declared memory, and a load on one model gives it a second
copy in the pool (a measured time). No request fails, in either layout, under the bench's churn of a
new connection a request (tests/e2e/test_service_sync_e2e.py checks the node's part of that).

TRITON_E2E_POOL_BENCH_FULL=1 runs it at its full size too, after the CI size (by hand, through the
e2e lock), and checks only that it ran and printed its table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.cluster]


def bench(args: list[str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "pool" / "live.py"), *args],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-4000:]}"
    print(proc.stdout)
    return proc


def test_the_pool_bench_compares_both_layouts_on_the_real_node(node: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "pool.json"
    proc = bench(["--small", "--json", str(out)])
    if os.environ.get("TRITON_E2E_POOL_BENCH_FULL") == "1":
        full = bench([])
        assert "| pool |" in full.stdout and "| every model everywhere |" in full.stdout
    results = {r["layout"]: r for r in json.loads(out.read_text())["results"]}
    every, pool = results["every model everywhere"], results["pool"]
    assert every["pods"] == pool["pods"] == 2
    assert pool["podMiB"] == 300 < every["podMiB"] == 400  # 4 models of 100Mi do not fit one pool pod
    for result in (every, pool):
        # No request fails: the 'No route to host' seen before came from the bench's first requests to a
        # Service kube-proxy had not synced yet (docs/benchmarks.md, "A pool on the real node").
        assert result["sent"] > 20 and result["failed"] == 0, result
        assert 0 < result["p50Ms"] <= result["p99Ms"], result
        assert result["newModelSeconds"] > 0 and result["allAnswerSeconds"] > 0, result
    assert "| pool | 2 | 300 | 600 |" in proc.stdout
    assert "| every model everywhere | 2 | 400 | 800 |" in proc.stdout
    # A load on one model gives it a second copy in the pool, READY and in its Service's endpoints,
    # with no request failing; every pod holds it everywhere.
    assert pool["secondCopySeconds"] > 0 and pool["copySent"] > 20, pool
    assert pool["copyFailed"] == 0, pool
    assert pool["hotCopies"] == 2, pool
    assert every["secondCopySeconds"] is None and every["secondCopy"] == "- (every pod holds it)"
    assert f"| {pool['secondCopySeconds']:.1f} ({pool['copySent']} / {pool['copyFailed']}) |" in proc.stdout
