"""bench/pool/demo.py --plan: the operator's placement says before a run whether its pool holds the copies."""

from __future__ import annotations

import subprocess
import sys

from testkit import REPO

DEMO = REPO / "bench" / "pool" / "demo.py"


def plan(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DEMO), "--plan", *flags],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_default_pool_holds_every_model_at_rest_and_the_hot_models_copies() -> None:
    done = plan()
    assert done.returncode == 0, done.stderr
    assert "for 41 models of 120Mi" in done.stdout
    assert "4 at rest (--pods 4), 6 at the peak (--max-pods 6)" in done.stdout


def test_a_pool_too_small_for_what_the_models_take_stops_naming_the_settings() -> None:
    # The models as they measure (120 MiB) in the demo's former pods of 1200Mi: 10 a pod, so 41 models
    # need 5 pods and the hot models' copies 7 (the run that stopped with MemoryShort).
    done = plan("--memory", "120Mi", "--budget", "1200Mi")
    assert done.returncode != 0
    assert "5 at rest (--pods 4), 7 at the peak (--max-pods 6)" in done.stdout
    assert "--pods: 41 models of 120Mi need 5 pods of 1200Mi, not 4" in done.stderr
    assert "--max-pods: " in done.stderr and "need 7 pods of 1200Mi" in done.stderr
