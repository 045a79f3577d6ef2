"""A pod whose sync init container fails: its own one-line reason reaches the status."""

from __future__ import annotations

from typing import Any

from triton_operator.core.decision import service_status as status
from triton_operator.core.observed.observation import deployment_state, pod_state, revision_state

REASON = (
    "the model repository needs 2.4 GiB (2576986112 bytes), /models has 1.1 GiB (1181116006 bytes) free; "
    "nothing was written"
)


def sync_pod(terminated: dict[str, Any], *, now: str = "waiting") -> dict[str, Any]:
    """A pod of revision r1 whose sync container last terminated as ``terminated`` says."""
    state: dict[str, Any] = (
        {
            "waiting": {
                "reason": "CrashLoopBackOff",
                "message": "back-off 40s restarting failed container=sync",
            }
        }
        if now == "waiting"
        else {"terminated": terminated}
    )
    sync = {"name": "sync", "restartCount": 3, "state": state, "lastState": {"terminated": terminated}}
    triton = {"name": "tritonserver", "restartCount": 0, "state": {"waiting": {"reason": "PodInitializing"}}}
    return {
        "metadata": {"name": "svc-r1-abc", "labels": {"triton-operator.io/revision": "r1"}},
        "status": {"initContainerStatuses": [sync], "containerStatuses": [triton]},
    }


def test_the_sync_s_termination_message_is_read_from_its_last_exit() -> None:
    failed = pod_state(sync_pod({"exitCode": 7, "reason": "Error", "message": REASON + "\n"}))
    assert failed.sync_failure == REASON
    assert failed.crash_looping()
    assert revision_state(
        deployment_state({"spec": {"replicas": 1}}), [pod_state(sync_pod({"exitCode": 7, "message": REASON}))]
    ).sync_failure == (REASON)


def test_a_sync_that_has_since_succeeded_or_said_nothing_has_no_failure() -> None:
    assert pod_state(sync_pod({"exitCode": 0, "message": "done"}, now="terminated")).sync_failure is None
    assert pod_state(sync_pod({"exitCode": 7, "reason": "Error"})).sync_failure is None


def test_degraded_names_the_sync_s_reason() -> None:
    failing = pod_state(sync_pod({"exitCode": 7, "reason": "Error", "message": REASON}))
    verdict = status.degraded([failing], [], ["r1"])
    assert verdict.status == "True" and verdict.reason == "PodsFailing"
    assert verdict.message.endswith(
        f"CrashLoopBackOff: container sync: back-off 40s restarting failed container=sync; sync: {REASON}"
    )
