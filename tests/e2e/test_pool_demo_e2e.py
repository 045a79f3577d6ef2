"""bench/pool/demo.py, issue 41's demonstration, on the real node: 40 Python models of ~120 MiB in a pool of
4 pods of 1400Mi beside every model everywhere, with clients counting every answer. It runs for 11 minutes
or more, so it is skipped unless TRITON_E2E_POOL_DEMO=1 (by hand, through the e2e lock).

Checked from its JSON: every model answered in the pool; the new model answered; the busy model got its
second copy; its new version went in place with no other model's copy loaded again; the hot models grew to
4 copies; a deleted pod's models were READY again; and no request failed but for the node's 'No route to
host' (counted apart: docs/benchmarks.md, "A pool on the real node")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        os.environ.get("TRITON_E2E_POOL_DEMO") != "1", reason="the full demonstration: TRITON_E2E_POOL_DEMO=1"
    ),
]


def test_the_pool_demonstration_serves_40_models_on_4_pods(node: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "demo.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "pool" / "demo.py"), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=3000,
        check=False,
        cwd=ROOT,
    )
    print(proc.stdout)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-4000:]}"
    layouts = {x["layout"]: x for x in json.loads(out.read_text())["layouts"]}
    pool = layouts["pool"]
    steps = pool["steps"]
    assert pool["pods"] == 4 and pool["podMiB"] == 1400, pool
    assert not pool["notes"], pool["notes"]  # every step ended within its time
    assert pool["allAnswerSeconds"] > 0 and pool["newModelSeconds"] > 0 and pool["secondCopySeconds"] > 0
    assert steps["in place: copies of other models loaded again"] == 0, steps
    assert steps["in place: copies of other models compared"] > 30, steps
    for model in ("m0", "m1", "m2"):
        assert steps[f"{model}: 4 copies, s"] > 0, steps
    assert steps["a pod deleted: every model READY again, s"] > 0, steps
    loads = [
        "counting client, every model throughout",
        "busy model's load (second copy, in place)",
        "skewed load while copies grew",
        next(k for k in steps if k.startswith("skewed load while a pod (") and not k.endswith("errors")),
    ]
    for key in loads:
        sent, failed = steps[key].split(" (")[0].split(" / ")
        assert int(sent) > 100 and int(failed) == 0, (key, steps[key])
    assert pool["sent"] > 100 and pool["failed"] == 0, pool
