"""bench/control_plane/requests.py's breakdown of status writes from the TritonServices' watch events
(no cluster needed here): each event that changes the status counts once, by the set of fields and
condition types it changed; the first status of each TritonService is named as such."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from testkit import REPO, bench_module

FOLDER = REPO / "bench" / "control_plane"


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    # requests.py imports run.py as the script does
    with bench_module("bench/control_plane/requests.py", "bench_requests", path=FOLDER) as module:
        yield module


def ts(name: str, status: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": status}


def condition(kind: str, status: str, reason: str, message: str, at: str = "t0") -> dict[str, str]:
    return {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": at}


def test_status_writes_are_counted_by_what_each_changed(bench: ModuleType) -> None:
    changes = bench.StatusChanges(api=None, namespace="ns")
    first = {
        "observedGeneration": 1,
        "replicas": 0,
        "conditions": [
            condition("Ready", "False", "ReplicasNotReady", "0/1"),
            condition("PodsScheduled", "True", "NoPods", "none"),
        ],
    }
    ready = {
        "observedGeneration": 1,
        "replicas": 1,
        "conditions": [
            condition("Ready", "True", "Available", "1/1", "t1"),
            condition("PodsScheduled", "True", "Scheduled", "1"),
        ],
    }
    changes.take("ADDED", ts("a", {}))  # created: no status yet, nothing written
    changes.take("MODIFIED", ts("a", first))
    changes.take("MODIFIED", {"metadata": {"name": "a", "annotations": {"x": "1"}}, "status": first})
    changes.take("MODIFIED", ts("a", ready))
    changes.take("ADDED", ts("b", first))
    assert changes.writes == 3
    assert dict(changes.changes) == {"the first status": 2, "replicas + PodsScheduled + Ready": 1}
    assert (
        changes.summary(2) == "1.50 writes = the first status: 1.00; replicas + PodsScheduled + Ready: 0.50"
    )
