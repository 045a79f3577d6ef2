"""A pod's start read from its own status (core.pod.startup through core.observed.observation.pod_state), and
the sync container's summary line, written and read back."""

from __future__ import annotations

from typing import Any

import pytest

from pod_bodies import SUMMARY, at, started_pod
from triton_operator.core.observed.observation import pod_state
from triton_operator.core.pod.startup import (
    PHASES,
    SyncSummary,
    describe_phases,
    format_summary,
    parse_summary,
    served_entry,
)

ALL = {"scheduling": 0, "imageAndSandbox": 1, "sync": 2, "tritonserverStart": 1, "tritonserverLoad": 5}


@pytest.mark.parametrize(
    ("pod", "phases", "total"),
    [
        pytest.param(started_pod(), ALL, 9, id="cold-start"),
        pytest.param(
            started_pod(
                scheduled=2, sandbox=3, sync_started=5, sync_finished=65, triton_started=66, ready=70
            ),
            {
                "scheduling": 2,
                "imageAndSandbox": 3,
                "sync": 60,
                "tritonserverStart": 1,
                "tritonserverLoad": 4,
            },
            70,
            id="slow-sync",
        ),
        # Not Ready yet: the phases so far, no total.
        pytest.param(
            started_pod(ready=None),
            {k: v for k, v in ALL.items() if k != "tritonserverLoad"},
            None,
            id="loading",
        ),
        pytest.param(
            started_pod(sync_finished=None, triton_started=None, ready=None),
            {"scheduling": 0, "imageAndSandbox": 1},
            None,
            id="syncing",
        ),
        pytest.param(
            started_pod(
                scheduled=None,
                sandbox=None,
                sync_started=None,
                sync_finished=None,
                triton_started=None,
                ready=None,
            ),
            {},
            None,
            id="unschedulable",
        ),
        # An init container by another name (not the sync container): its phases are unknown, the
        # rest is read.
        pytest.param(
            started_pod(sync_name="agent"),
            {"scheduling": 0, "tritonserverLoad": 5},
            9,
            id="no-sync-container",
        ),
        # The store refused twice: the phase before the last (successful) sync start includes the
        # failed attempts and their back-off; the restarts are counted.
        pytest.param(
            started_pod(sync_started=21, sync_finished=23, triton_started=24, ready=29, sync_restarts=2),
            {
                "scheduling": 0,
                "imageAndSandbox": 21,
                "sync": 2,
                "tritonserverStart": 1,
                "tritonserverLoad": 5,
            },
            29,
            id="sync-restarted",
        ),
        # A sync of 0.84 s that started and finished within one second of Kubernetes' times: its
        # own summary says how long it ran.
        pytest.param(
            started_pod(sync_started=3, sync_finished=3, summary=format_summary(1, 512, 0, 0.84)),
            {
                "scheduling": 0,
                "imageAndSandbox": 3,
                "sync": 0.84,
                "tritonserverStart": 1,
                "tritonserverLoad": 5,
            },
            9,
            id="sub-second-sync",
        ),
        # The node's clock a second behind the API server's: a gap never goes negative.
        pytest.param(
            started_pod(scheduled=1, sandbox=0, sync_started=0, sync_finished=3, triton_started=4, ready=9),
            {"scheduling": 1, "imageAndSandbox": 0, "sync": 3, "tritonserverStart": 1, "tritonserverLoad": 5},
            9,
            id="clock-skew",
        ),
    ],
)
def test_phases_from_a_pods_status(
    pod: dict[str, Any], phases: dict[str, float], total: float | None
) -> None:
    start = pod_state(pod).start
    assert start.phases() == phases
    assert list(start.phases()) == [p for p in PHASES if p in phases]  # in order
    assert start.total == total


def test_a_pod_that_is_not_ready_has_no_ready_time_even_after_a_transition() -> None:
    pod = started_pod()
    for condition in pod["status"]["conditions"]:
        if condition["type"] == "Ready":
            condition["status"] = "False"  # it was Ready, then a readiness probe failed
    state = pod_state(pod)
    assert not state.ready and state.start.ready is None and state.start.total is None


def test_restarts_are_counted_and_a_failed_sync_is_no_start() -> None:
    restarted = pod_state(started_pod(sync_restarts=2, triton_restarts=1))
    assert restarted.start.restarts == 3
    assert restarted.sync_failure is None  # it has since succeeded
    failing = started_pod(sync_finished=None, triton_started=None, ready=None, sync_restarts=1)
    failing["status"]["initContainerStatuses"][0]["state"] = {
        "terminated": {"exitCode": 5, "reason": "Error", "message": "the store is unavailable\n",
                       "startedAt": at(1), "finishedAt": at(2)}
    }  # fmt: skip
    state = pod_state(failing)
    assert state.start.sync is None and state.start.sync_finished is None
    assert state.sync_failure == "the store is unavailable"  # the failure parser reads it, as before


@pytest.mark.parametrize(
    ("objects", "fetched", "present", "seconds"),
    [(3, 536870912, 0, 1.84), (0, 0, 0, 0.0), (120_000, 2 * 1024**4, 17, 3599.99), (1, 0, 4096, 12.0)],
)
def test_the_summary_line_round_trips(objects: int, fetched: int, present: int, seconds: float) -> None:
    line = format_summary(objects, fetched, present, seconds)
    assert "\n" not in line and len(line.encode()) < 4096
    assert parse_summary(line + "\n") == SyncSummary(objects, fetched, present, seconds)


@pytest.mark.parametrize(
    "message",
    [
        None,
        "",
        "the model repository needs 2.4 GiB (2576986112 bytes), /models has 1.1 GiB free; "
        "nothing was written",
        "synced 3 objects, 536870912 bytes fetched from the st",  # cut short
        "done",
        42,
    ],
)
def test_anything_but_a_summary_reads_as_none(message: Any) -> None:
    assert parse_summary(message) is None


def test_the_summary_of_a_successful_sync_reaches_the_start() -> None:
    assert pod_state(started_pod()).start.sync == SyncSummary(3, 536870912, 0, 1.84)
    assert pod_state(started_pod(summary=None)).start.sync is None  # an older sync image says nothing
    assert SUMMARY.strip() == format_summary(3, 536870912, 0, 1.84)


def test_the_status_entry_and_its_words() -> None:
    entry = served_entry("r1", "svc-r1-7d9c8b6f5-x2x9k", pod_state(started_pod()).start)
    assert entry == {
        "revision": "r1",
        "pod": "svc-r1-7d9c8b6f5-x2x9k",
        "readyAt": "2026-11-27T10:00:09Z",
        "seconds": 9.0,
        "phases": ALL,
        "objects": 3,
        "bytesFetched": 536870912,
        "bytesPresent": 0,
    }
    assert describe_phases(entry) == (
        "9 s: scheduling 0 s, image and sandbox 1 s, sync 2 s (512 MiB fetched), tritonserver start 1 s, "
        "tritonserver load 5 s"
    )
    warm = {**entry, "bytesFetched": 0, "bytesPresent": 3 * 1024**3, "restarts": 1, "seconds": 7.44}
    assert describe_phases(warm).startswith("7.4 s: ")
    assert "sync 2 s (0 B fetched, 3 GiB already present)" in describe_phases(warm)
    assert describe_phases(warm).endswith("tritonserver load 5 s (after 1 container restart)")
    older = {k: v for k, v in entry.items() if not k.startswith("bytes")}
    assert "sync 2 s, tritonserver start" in describe_phases(older)


def test_the_entry_rounds_to_tenths() -> None:
    pod = started_pod(sync_started=3, sync_finished=3, summary=format_summary(1, 512, 0, 0.84))
    entry = served_entry("r1", "p", pod_state(pod).start)
    assert entry is not None and entry["phases"]["sync"] == 0.8


def test_no_entry_without_the_creation_or_ready_time() -> None:
    assert served_entry("r1", "p", pod_state(started_pod(ready=None)).start) is None
    pod = started_pod()
    del pod["metadata"]["creationTimestamp"]
    assert served_entry("r1", "p", pod_state(pod).start) is None


def test_a_sync_that_checked_the_caches_signed_statements_says_how_many_objects() -> None:
    """`vouched`: objects from the node cache checked by its signed SHA-256 (the public key given);
    a line without it (no key, or an older sync image) reads as 0."""
    line = format_summary(2, 0, 1024, 0.5, node_cache=(2, 0), vouched=2)
    assert line.endswith("node cache: 2 hits, 0 misses, 2 vouched")
    summary = parse_summary(line)
    assert summary is not None
    assert (summary.node_cache_hits, summary.node_cache_misses, summary.node_cache_vouched) == (2, 0, 2)
    unsigned = parse_summary(format_summary(2, 0, 1024, 0.5, node_cache=(2, 0)))
    assert unsigned is not None and unsigned.node_cache_vouched == 0
    assert "vouched" not in format_summary(2, 0, 1024, 0.5, node_cache=(2, 0), vouched=0)


def test_a_sync_that_linked_the_caches_shared_files_says_how_many() -> None:
    """`shared`: of the vouched objects, the files linked in the pod's view of the node cache's
    files (none copied); a line without it (no view, or an older sync image) reads as 0."""
    line = format_summary(3, 0, 1024, 0.5, node_cache=(3, 0), vouched=3, shared=2)
    assert line.endswith("node cache: 3 hits, 0 misses, 3 vouched, 2 shared")
    summary = parse_summary(line)
    assert summary is not None and (summary.node_cache_vouched, summary.node_cache_shared) == (3, 2)
    copied = parse_summary(format_summary(3, 0, 1024, 0.5, node_cache=(3, 0), vouched=3))
    assert copied is not None and copied.node_cache_shared == 0
