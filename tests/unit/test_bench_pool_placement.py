"""bench/pool/placement.py at a small size: the pool fits pods every-model-everywhere cannot, in fewer MiB."""

from __future__ import annotations

import subprocess
import sys

from testkit import REPO


def test_the_pool_table_compares_both_layouts_on_the_same_models() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "pool" / "placement.py"), "--small"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    rows = [line.strip("| ").split(" | ") for line in done.stdout.splitlines() if line.startswith("| ")]
    assert rows[0][:4] == ["models", "load", "layout", "pods"]
    body = {(r[1], r[2]): r for r in rows[1:]}
    assert len(body) == 4 and all(r[0] == "40" for r in rows[1:])
    for load in ("one copy each", "1 in 10 wants 4"):
        everywhere, pool = body[(load, "every model everywhere")], body[(load, "pool")]
        assert everywhere[6] == "no" and pool[6] == "yes"
        assert int(pool[4].replace(",", "")) <= 1200 < int(everywhere[4].replace(",", ""))
    assert body[("one copy each", "pool")][3] == "4"  # 40 models of ~100 MiB in pods of 1200 MiB
    skewed = body[("1 in 10 wants 4", "pool")], body[("1 in 10 wants 4", "every model everywhere")]
    assert int(skewed[0][5].replace(",", "")) < int(skewed[1][5].replace(",", ""))
