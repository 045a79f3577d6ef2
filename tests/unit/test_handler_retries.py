"""The TritonService event handler (level-based: which events wake a pass) and when the Reconciler
tries a held spec again (a repository that could not be read: after REPOSITORY_RETRY_SECONDS;
a spec no retry can help: never, until something changes)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from memkube import MemKube
from triton_operator import handlers
from triton_operator.adapters.cached_kube import CachedKube
from triton_operator.adapters.owned_watch import OwnedCache
from triton_operator.core.rollout.requests import control_annotations
from triton_operator.core.vocabulary import conditions as cond
from triton_operator.reconcile.reconcile_pass import Result
from triton_operator.reconcile.scheduler import REPOSITORY_RETRY_SECONDS, Reconciler
from triton_operator.settings import Settings


class Triggers(Reconciler):
    """A Reconciler that notes each trigger and runs none (the handler's part is to ask)."""

    def __init__(self) -> None:
        super().__init__(MemKube(), Settings())
        self.triggered: list[tuple[str, str]] = []
        self.first: list[bool] = []

    def trigger(self, namespace: str, name: str, *, first: bool = False) -> None:
        self.triggered.append((namespace, name))
        self.first.append(first)


def meta(generation: int = 1, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "name": "svc",
        "namespace": "ml",
        "uid": "first",
        "generation": generation,
        "resourceVersion": "7",
        "labels": {"team": "a"},
        "annotations": dict(annotations or {}),
    }


async def event(memo: dict[str, Any], kind: str | None, metadata: dict[str, Any], status: Any = None) -> None:
    handler: Any = handlers.tritonservice  # kopf's decorator hides the plain signature from mypy
    await handler(
        type=kind,
        body={"metadata": metadata, "status": status or {}},
        meta=metadata,
        status=status or {},
        namespace=metadata["namespace"],
        name=metadata["name"],
        memo=memo,
    )


@pytest.fixture
def memo() -> dict[str, Any]:
    return {"reconciler": Triggers()}


def triggered(memo: dict[str, Any]) -> int:
    return len(memo["reconciler"].triggered)


async def test_listed_created_and_changed_specs_wake_a_pass_status_writes_do_not(
    memo: dict[str, Any],
) -> None:
    await event(memo, None, meta())  # listed at start: every TritonService is reconciled
    assert triggered(memo) == 1
    written = meta()
    written["resourceVersion"] = "8"  # our status write: a new version, the same generation
    await event(memo, "MODIFIED", written, status={"observedGeneration": 1})
    assert triggered(memo) == 1
    await event(memo, "MODIFIED", meta(generation=2))  # a spec change
    assert triggered(memo) == 2
    relabelled = meta(generation=2)
    relabelled["labels"] = {"team": "b"}  # a label (a GitOps tool's): reconciled, as before
    await event(memo, "MODIFIED", relabelled)
    assert triggered(memo) == 3
    await event(memo, "MODIFIED", copy.deepcopy(relabelled))
    assert triggered(memo) == 3
    # Each asked for a change of the TritonService itself: ahead of owned objects' passes for a slot.
    assert memo["reconciler"].first == [True, True, True]


async def test_a_control_request_wakes_a_pass_and_every_event_does_until_the_status_records_it(
    memo: dict[str, Any],
) -> None:
    await event(memo, "ADDED", meta())
    request = {k: v for k, v in control_annotations("promote", "r1").items() if v is not None}
    await event(memo, "MODIFIED", meta(annotations=request))
    assert triggered(memo) == 2
    # A status write that does not record it yet (a pass superseded before it did): again.
    await event(memo, "MODIFIED", meta(annotations=request), status={"observedGeneration": 1})
    assert triggered(memo) == 3
    handled = {"handledRequests": {"promote": "r1"}}
    await event(memo, "MODIFIED", meta(annotations=request), status=handled)
    assert triggered(memo) == 3


async def test_a_deleted_tritonservice_is_reconciled_once_more_and_its_fingerprint_dropped(
    memo: dict[str, Any],
) -> None:
    await event(memo, "ADDED", meta())
    await event(memo, "DELETED", meta())
    assert triggered(memo) == 2  # that pass finds it gone and forgets everything kept for it
    assert memo["reconciler"].first == [True, False]  # forgetting waits its turn
    assert memo["reconciler"].fingerprints == {}


async def test_a_tritonservice_made_again_under_its_name_is_reconciled_though_its_deletion_was_missed(
    memo: dict[str, Any],
) -> None:
    """A DELETED event a paused replica never saw, then the same spec created again: another uid."""
    await event(memo, None, meta())
    again = meta()
    again["uid"] = "second"
    await event(memo, None, again)  # listed (after a pause): not an ADDED event
    assert triggered(memo) == 2


async def test_the_fingerprint_of_a_tritonservice_a_pass_found_gone_is_dropped(memo: dict[str, Any]) -> None:
    await event(memo, "ADDED", meta())
    memo["reconciler"].forget("ml", "svc")
    assert memo["reconciler"].fingerprints == {}


async def test_every_event_hands_its_body_to_the_passes_and_a_deletion_takes_it_back(
    memo: dict[str, Any],
) -> None:
    """The passes read the TritonService kopf handed over (adapters.cached_kube), a status write's
    event included, and not an older one; once deleted, from the API server."""
    kube = MemKube()
    cached = CachedKube(kube, OwnedCache())
    memo["cached_kube"] = cached
    await event(memo, None, meta())
    written = meta()
    written["resourceVersion"] = "8"
    await event(memo, "MODIFIED", written, status={"observedGeneration": 1})
    await event(memo, "MODIFIED", meta(), status={})  # a late event of version 7
    body = await cached.get_tritonservice("ml", "svc")
    assert body is not None and body["metadata"]["resourceVersion"] == "8"
    assert body["status"] == {"observedGeneration": 1}
    assert kube.calls == []
    await event(memo, "DELETED", written)
    assert await cached.get_tritonservice("ml", "svc") is None
    assert [c.method for c in kube.calls] == ["get_tritonservice"]


@pytest.mark.parametrize(
    "reason",
    [
        cond.INVALID_SPEC,
        # a new spec or a new pin from the repository poll reconciles again
        cond.MANIFEST_TOO_LARGE,
        # the operator's policy: a new spec, or a restart with other settings, reconciles again
        cond.REFUSED_BY_POLICY,
        cond.CREDENTIALS_REQUIRED,
        cond.ENDPOINT_NOT_ALLOWED,
    ],
)
def test_retrying_cannot_help(reason: str) -> None:
    held = Result(status={}, invalid=f"held: {reason}", reason=reason)
    assert Reconciler(MemKube(), Settings())._due(("ml", "svc"), held) is None


@pytest.mark.parametrize(
    "reason",
    [cond.REPOSITORY_ERROR, cond.CREDENTIALS_MISSING, cond.MODELS_NOT_FOUND, cond.REPOSITORY_LISTING],
)
def test_an_unreadable_repository_is_tried_again(reason: str) -> None:
    held = Result(status={}, invalid=f"held: {reason}", reason=reason)
    assert Reconciler(MemKube(), Settings())._due(("ml", "svc"), held) == REPOSITORY_RETRY_SECONDS
    sooner = Result(status={}, invalid=f"held: {reason}", reason=reason, requeue_after=3.0)
    assert Reconciler(MemKube(), Settings())._due(("ml", "svc"), sooner) == 3.0
