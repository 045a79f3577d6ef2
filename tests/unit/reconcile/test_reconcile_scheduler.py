"""reconcile.scheduler.Reconciler over MemKube (an in-memory fake of KubeAPI): coalescing, one reconcile
at a time per object, timers replaced and cleared, the retry of a failed timed reconcile, the pause.

Every reconcile starts by reading its TritonService, so the fake's count of get_tritonservice calls
counts reconciles; a hook on that call holds a reconcile mid-way until the test lets it go.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx2
import pytest

from e2e_helpers import tritonservice
from memkube import Call, MemKube
from triton_operator import KIND
from triton_operator.adapters.kube import retry_delay
from triton_operator.adapters.storage import PinResult
from triton_operator.core.repository.manifest import (
    ObjectInfo,
    StoreRef,
    build_manifest,
    model_sources,
    select_objects,
)
from triton_operator.core.vocabulary import conditions as cond
from triton_operator.models import ModelSpec, Repository, TritonService
from triton_operator.reconcile import scheduler
from triton_operator.reconcile.pinning import RepositoryPinner
from triton_operator.reconcile.scheduler import (
    REQUEUE_SLACK_SECONDS,
    SUPERSEDED_PASSES,
    SUPERSEDED_RETRY_SECONDS,
    Reconciler,
)
from triton_operator.settings import Settings

NS = "ml"
KEY = (NS, "svc")
SETTINGS = Settings()


async def until(check: Callable[[], bool], timeout: float = 2.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)


def cluster(*names: str) -> MemKube:
    kube = MemKube()
    for name in names:
        kube.put(tritonservice(name, NS))
    return kube


class Gate:
    """Holds every reconcile at its first read until ``release``; ``entered`` names who got there."""

    def __init__(self, kube: MemKube) -> None:
        self.entered: list[str] = []
        self._open = asyncio.Event()
        kube.before("get_tritonservice", self._hold, times=None)

    async def _hold(self, call: Call) -> None:
        self.entered.append(call.name)
        await self._open.wait()

    def release(self) -> None:
        self._open.set()


def reconciles(kube: MemKube, name: str = "svc") -> int:
    return kube.count("get_tritonservice", name)


def timer_tasks(key: tuple[str, str] = KEY) -> list[asyncio.Task[object]]:
    """The scheduler's timer tasks of ``key`` that may still fire (it names them "requeue <ns>/<name>")."""
    name = f"requeue {key[0]}/{key[1]}"
    return [t for t in asyncio.all_tasks() if t.get_name() == name and not t.done() and not t.cancelling()]


@pytest.fixture
async def kube() -> MemKube:
    return cluster("svc")


# ----------------------------------------------------------------- coalescing, one at a time


async def test_triggers_coalesced_while_one_runs_and_one_waits_are_dropped_a_plain_call_always_runs(
    kube: MemKube,
) -> None:
    gate = Gate(kube)
    r = Reconciler(kube, SETTINGS)
    running = asyncio.create_task(r(*KEY))
    await until(lambda: gate.entered == ["svc"])
    queued = asyncio.create_task(r(*KEY, coalesce=True))  # none queued yet: it queues
    await asyncio.sleep(0.01)
    # One runs and one waits: the waiting one reads everything afresh when it starts, so a
    # trigger now (a pod event) is dropped, at once.
    assert await asyncio.wait_for(r(*KEY, coalesce=True), timeout=0.2) is None
    assert await asyncio.wait_for(r(*KEY, coalesce=True), timeout=0.2) is None
    forced = asyncio.create_task(r(*KEY))  # a spec change: never dropped
    await asyncio.sleep(0.01)
    gate.release()
    results = await asyncio.gather(running, queued, forced)
    assert all(result is not None and result.status is not None for result in results)
    assert reconciles(kube) == 3
    await r.close()


async def test_a_coalesced_trigger_with_nothing_queued_runs(kube: MemKube) -> None:
    r = Reconciler(kube, SETTINGS)
    assert await r(*KEY, coalesce=True) is not None
    assert await r(*KEY, coalesce=True) is not None  # the first one is done: nothing is queued
    assert reconciles(kube) == 2
    await r.close()


async def test_reconciles_of_one_object_never_overlap_while_other_objects_run_concurrently() -> None:
    kube = cluster("a", "b")
    gate = Gate(kube)
    r = Reconciler(kube, SETTINGS)
    tasks = [asyncio.create_task(r(NS, name)) for name in ("a", "a", "b")]
    await until(lambda: len(gate.entered) >= 2)
    await asyncio.sleep(0.05)  # room for the second reconcile of "a" to start, were it allowed to
    assert sorted(gate.entered) == ["a", "b"]  # "b" runs beside "a"; the second "a" waits
    gate.release()
    await asyncio.gather(*tasks)
    assert sorted(gate.entered) == ["a", "a", "b"]
    await r.close()


async def test_at_most_max_passes_run_at_once_and_one_waiting_for_its_turn_counts_as_queued() -> None:
    names = [f"s{i}" for i in range(5)]
    kube = cluster(*names)
    gate = Gate(kube)
    r = Reconciler(kube, SETTINGS, max_passes=2)
    for name in names:
        r.trigger(NS, name)
    await until(lambda: len(gate.entered) == 2)
    await asyncio.sleep(0.05)  # room for a third pass to start, were it allowed to
    assert len(gate.entered) == 2
    waiting = next(name for name in names if name not in gate.entered)
    assert await asyncio.wait_for(r(NS, waiting, coalesce=True), timeout=0.2) is None  # dropped
    gate.release()
    await until(lambda: len(gate.entered) == 5)
    assert sorted(gate.entered) == names  # each once: nothing was added while they waited
    await r.close()


async def test_a_paused_reconciler_runs_nothing_whoever_asks(kube: MemKube) -> None:
    r = Reconciler(kube, SETTINGS, paused=True)
    assert await r(*KEY) is None
    assert await r(*KEY, coalesce=True) is None
    r.requeue(KEY, 0.0)
    await asyncio.sleep(0.1)
    assert kube.calls == []
    assert timer_tasks() == []
    await r.close()


def trigger_tasks(key: tuple[str, str] = KEY) -> list[asyncio.Task[object]]:
    name = f"trigger {key[0]}/{key[1]}"
    return [t for t in asyncio.all_tasks() if t.get_name() == name and not t.done()]


async def test_a_trigger_reconciles_at_once_and_events_while_one_is_queued_make_no_task(
    kube: MemKube,
) -> None:
    """What an owned object's watch event does (adapters.owned_watch): a reconcile of its owner with
    no timer's slack, one task at most waiting per object however many events come."""
    gate = Gate(kube)
    r = Reconciler(kube, SETTINGS)
    r.trigger(*KEY)
    await until(lambda: gate.entered == ["svc"])  # runs, holding the object's lock
    for _ in range(50):  # a burst of pod and Deployment events
        r.trigger(*KEY)
    assert len(trigger_tasks()) == 2  # the running one and one queued behind it; 49 dropped
    await asyncio.sleep(0.01)
    assert len(trigger_tasks()) == 2
    gate.release()
    await until(lambda: not trigger_tasks())
    assert reconciles(kube) == 2  # the queued one read everything afresh after the running one
    assert timer_tasks() == []
    await r.close()


async def test_a_trigger_while_paused_does_nothing(kube: MemKube) -> None:
    r = Reconciler(kube, SETTINGS, paused=True)
    r.trigger(*KEY)
    await asyncio.sleep(0.05)
    assert trigger_tasks() == []
    assert kube.calls == []
    await r.close()


async def test_a_triggered_reconcile_that_fails_with_a_retryable_error_is_retried_on_a_timer(
    kube: MemKube,
) -> None:
    error = OSError("connection reset by peer")
    kube.fail_next("get_tritonservice", error)
    r = Recording(kube, random=lambda: 1.0)  # the jitter's top: the first retry's ceiling
    r.trigger(*KEY)
    await until(lambda: len(r.requeued) == 1)
    assert r.requeued == [(KEY, retry_delay(error))]
    assert len(timer_tasks()) == 1
    await r.close()


async def test_a_triggered_reconcile_that_fails_for_a_bug_is_not_retried(kube: MemKube) -> None:
    kube.fail_next("get_tritonservice", KeyError("a bug, not the API server"))
    r = Recording(kube)
    r.trigger(*KEY)
    await until(lambda: reconciles(kube) == 1 and not trigger_tasks())
    assert r.requeued == []
    assert timer_tasks() == []
    await r.close()


async def test_a_failed_pass_is_said_once_in_a_warning_event_on_the_tritonservice_and_again_when_it_changes(
    kube: MemKube, caplog: pytest.LogCaptureFixture
) -> None:
    """As kopf did for a failing handler: the refusal is in the log and in a Warning Event that names
    it; the same failure again (each retry) posts nothing more, another one does."""
    forbidden = OSError('deployments.apps "svc-abc" is forbidden: User "weak" cannot patch')
    kube.fail_next("get_tritonservice", forbidden)
    r = Recording(kube)
    with caplog.at_level(logging.WARNING, logger="triton_operator.reconcile.scheduler"):
        r.trigger(*KEY)
        await until(lambda: len(r.requeued) == 1)
        await until(lambda: len(kube.events) == 1)
    (event,) = kube.events
    assert event["type"] == "Warning" and event["reason"] == "ReconcileFailed"
    assert event["involvedObject"]["name"] == KEY[1] and event["involvedObject"]["namespace"] == KEY[0]
    assert "is forbidden" in event["message"]
    assert any(
        "failed temporarily" in rec.getMessage() and "is forbidden" in rec.getMessage()
        for rec in caplog.records
    )
    kube.fail_next("get_tritonservice", forbidden)
    r.trigger(*KEY)
    await until(lambda: reconciles(kube) == 2 and not trigger_tasks())
    await asyncio.sleep(0.05)
    assert len(kube.events) == 1
    kube.fail_next("get_tritonservice", OSError("connection reset by peer"))
    r.trigger(*KEY)
    await until(lambda: len(kube.events) == 2)
    assert "connection reset" in kube.events[1]["message"]
    await r.close()


# ----------------------------------------------------------------- timers


async def test_a_requeue_replaces_the_earlier_timer_which_never_fires(kube: MemKube) -> None:
    r = Reconciler(kube, SETTINGS)
    r.requeue(KEY, 0.05)
    r.requeue(KEY, 0.1)
    assert len(timer_tasks()) == 1  # one timer per object
    await until(lambda: reconciles(kube) == 1)
    await asyncio.sleep(0.1 + 2 * REQUEUE_SLACK_SECONDS)
    assert reconciles(kube) == 1  # the replaced timer never fired
    assert timer_tasks() == []  # the reconcile it ran had nothing timed
    await r.close()


async def test_a_none_requeue_clears_the_timer(kube: MemKube) -> None:
    r = Reconciler(kube, SETTINGS)
    r.requeue(KEY, 0.05)
    r.requeue(KEY, None)
    await asyncio.sleep(0.05 + 2 * REQUEUE_SLACK_SECONDS)
    assert reconciles(kube) == 0
    assert timer_tasks() == []
    await r.close()


async def test_a_reconcile_with_nothing_timed_clears_the_timer_an_earlier_one_left(kube: MemKube) -> None:
    r = Reconciler(kube, SETTINGS)
    r.requeue(KEY, 0.1)  # as an earlier reconcile with a timed step would have
    result = await r(*KEY)  # the spec changed meanwhile: nothing is timed now
    assert result is not None and result.requeue_after is None
    await asyncio.sleep(0.1 + 2 * REQUEUE_SLACK_SECONDS)
    assert reconciles(kube) == 1
    await r.close()


class Recording(Reconciler):
    """A Reconciler that notes every requeue, since a retry is due seconds later (no test waits)."""

    def __init__(self, kube: MemKube, **kwargs: Any) -> None:
        super().__init__(kube, SETTINGS, **kwargs)
        self.requeued: list[tuple[tuple[str, str], float | None]] = []

    def requeue(self, key: tuple[str, str], delay: float | None) -> None:
        self.requeued.append((key, delay))
        super().requeue(key, delay)


async def test_a_timed_reconcile_that_fails_with_a_retryable_error_requeues_after_retry_delay(
    kube: MemKube,
) -> None:
    error = OSError("connection reset by peer")
    kube.fail_next("get_tritonservice", error)
    r = Recording(kube, random=lambda: 1.0)  # the jitter's top: the first retry's ceiling
    r.requeue(KEY, 0.0)
    await until(lambda: len(r.requeued) == 2)
    assert r.requeued == [(KEY, 0.0), (KEY, retry_delay(error))]
    assert retry_delay(error) == 5.0
    assert len(timer_tasks()) == 1  # the retry's timer
    await r.close()


async def test_a_timed_reconcile_that_fails_for_a_bug_is_not_retried(kube: MemKube) -> None:
    kube.fail_next("get_tritonservice", KeyError("a bug, not the API server"))
    r = Recording(kube)
    r.requeue(KEY, 0.0)
    await until(lambda: reconciles(kube) == 1)
    await asyncio.sleep(2 * REQUEUE_SLACK_SECONDS)
    assert r.requeued == [(KEY, 0.0)]
    assert timer_tasks() == []
    await r.close()


# ----------------------------------------------------------------- a status write superseded


def new_generation(kube: MemKube, batch: int) -> None:
    """A user's spec change (a new generation and a new revision)."""
    kube.edit(KIND, NS, "svc", lambda ts: ts["spec"]["models"][0]["config"].update(maxBatchSize=batch))


def stored_status(kube: MemKube) -> dict[str, Any]:
    stored = kube.find(KIND, NS, "svc")
    assert stored is not None
    return dict(stored.get("status") or {})


async def test_a_replica_that_loses_its_peering_mid_pass_never_writes_an_older_status(kube: MemKube) -> None:
    """Replica A reads generation 2 and, before its status write, loses its peering; B (the newer
    replica) reconciles generation 3 and writes its status; A's write must be refused, not land."""
    a, b = Reconciler(kube, SETTINGS), Reconciler(kube, SETTINGS, paused=True)
    first = await a(*KEY)
    assert first is not None and stored_status(kube)["observedGeneration"] == 1
    new_generation(kube, 4)
    release = asyncio.Event()
    held: list[Call] = []

    async def hold(call: Call) -> None:
        held.append(call)
        await release.wait()

    kube.before("apply_status", hold)  # A's status write, decided from generation 2, waits
    mid_pass = asyncio.create_task(a(*KEY))
    await until(lambda: len(held) == 1)
    # the handover: A is paused (its peering lost), the user changes the spec again, B takes over
    a.set_paused(True, "a peer of a higher priority")
    new_generation(kube, 8)
    b.set_paused(False)
    taken_over = await b(*KEY)  # kopf's resume handler on the replica that took over
    assert taken_over is not None and taken_over.written
    newer = stored_status(kube)
    assert newer["observedGeneration"] == 3
    mark = len(kube.writes)
    release.set()
    superseded = await mid_pass
    assert stored_status(kube) == newer, "the paused replica wrote the status of an older generation"
    assert superseded is None  # and it is not tried again while paused
    assert kube.writes[mark:] == []  # no status, and nothing the older decision would have scaled
    # A's status write was tried once (A's first, A's held one, B's) and refused (two writes)
    assert kube.count("apply_status") == 3
    assert [w.method for w in kube.writes].count("apply_status") == 2
    assert reconciles(kube) == 3  # A's first, A's superseded one, B's: nothing re-read on the paused A
    await a.close()
    await b.close()


async def test_a_status_write_overtaken_by_an_annotation_reads_again_and_writes_once(kube: MemKube) -> None:
    """The single-replica case: kopf's own annotations (its diff base, written after a handler)
    or a control request written between a pass's read and its status write cost one more pass."""
    r = Reconciler(kube, SETTINGS)

    def diff_base(ts: dict[str, Any]) -> None:
        ts["metadata"].setdefault("annotations", {})["triton-operator.io/last-handled-configuration"] = "{}"

    def kopf_annotates(call: Call) -> None:
        kube.edit(KIND, NS, "svc", diff_base)

    kube.before("apply_status", kopf_annotates)
    result = await r(*KEY)
    assert result is not None and result.written
    assert reconciles(kube) == 2
    assert [w.method for w in kube.writes].count("apply_status") == 1
    assert stored_status(kube)["observedGeneration"] == 1
    await r.close()


async def test_passes_superseded_again_and_again_stop_and_leave_it_to_a_timer(kube: MemKube) -> None:
    """Something writing the TritonService between every read and write: no storm of passes."""
    r = Recording(kube)
    kube.before("apply_status", lambda call: kube.edit(KIND, NS, "svc", lambda ts: None), times=None)
    assert await r(*KEY) is None
    assert reconciles(kube) == SUPERSEDED_PASSES
    assert r.requeued == [(KEY, SUPERSEDED_RETRY_SECONDS)]
    assert "apply_status" not in [w.method for w in kube.writes]


# ----------------------------------------------------------------- a spec waiting for its credentials Secret

S3_KEYS = {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "key"}


def secret(data: dict[str, str]) -> dict[str, Any]:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "creds", "namespace": NS},
        "data": encoded,
    }


class Bucket:
    """The lister: one object, and the credentials of every listing."""

    def __init__(self) -> None:
        self.credentials: list[dict[str, str]] = []

    def __call__(
        self, repository: Repository, models: Sequence[ModelSpec], credentials: Mapping[str, str]
    ) -> PinResult:
        self.credentials.append(dict(credentials))
        listing = [ObjectInfo("add/1/model.py", 11, etag="e1", generation="g1")]
        manifest = build_manifest(
            StoreRef.from_repository(repository), select_objects(model_sources(models), listing)
        )
        return PinResult(manifest, True)


def repository_reason(kube: MemKube) -> str | None:
    body = kube.find("TritonService", NS, "svc") or {}
    conditions = (body.get("status") or {}).get("conditions") or []
    return next((c["reason"] for c in conditions if c["type"] == cond.REPOSITORY_READY), None)


@pytest.fixture
def quick_secret_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduler, "SECRET_RETRY_FIRST_SECONDS", 0.01, raising=False)
    monkeypatch.setattr(scheduler, "SECRET_RETRY_MAX_SECONDS", 0.04, raising=False)


@pytest.mark.usefixtures("quick_secret_retry")
@pytest.mark.parametrize(
    ("before", "reason"),
    [
        ({"note": "fill me in"}, cond.CREDENTIALS_REQUIRED),  # no store keys: the operator's identity
        (None, cond.CREDENTIALS_MISSING),  # no Secret yet
    ],
)
async def test_a_spec_held_for_its_secret_converges_once_the_secret_is_fixed(
    before: dict[str, str] | None, reason: str
) -> None:
    """No spec edit, no restart: the Secret alone is fixed, and the reconciler's backoff finds it."""
    kube = MemKube()
    kube.put(tritonservice("svc", NS, repository={"uri": "s3://models/prod", "credentialsSecret": "creds"}))
    if before is not None:
        kube.put(secret(before))
    bucket = Bucket()
    r = Reconciler(kube, SETTINGS, pinner=RepositoryPinner(kube, lister=bucket))
    first = await r(*KEY)
    assert first is not None and (first.reason, repository_reason(kube)) == (reason, reason)
    assert bucket.credentials == []
    kube.put(secret(S3_KEYS))
    await until(lambda: repository_reason(kube) == cond.MANIFEST_PINNED)
    assert bucket.credentials == [S3_KEYS]
    assert len(kube.of_kind("Deployment")) == 1
    await r.close()


@pytest.mark.usefixtures("quick_secret_retry")
async def test_the_secret_retry_backs_off_to_its_ceiling_and_only_a_secret_can_fix_earns_it() -> None:
    kube = MemKube()
    kube.put(tritonservice("svc", NS, repository={"uri": "s3://models/prod", "credentialsSecret": "creds"}))
    kube.put(secret({"note": "fill me in"}))
    kube.put(tritonservice("ambient", NS, repository={"uri": "s3://models/prod"}))
    r = Recording(kube, pinner=RepositoryPinner(kube, lister=Bucket()))
    first = await r(*KEY)
    assert first is not None and first.reason == cond.CREDENTIALS_REQUIRED
    await until(lambda: r.requeued.count((KEY, 0.04)) >= 2, timeout=5.0)
    delays = [d for k, d in r.requeued if k == KEY]
    assert delays[:4] == [0.01, 0.02, 0.04, 0.04]
    # no Secret named: only a spec edit (or the operator's settings) can change the verdict
    ambient = await r(NS, "ambient")
    assert ambient is not None and ambient.reason == cond.CREDENTIALS_REQUIRED
    assert [d for k, d in r.requeued if k == (NS, "ambient")] == [None]
    await r.close()


# ----------------------------------------------------------------- what is kept per object


def live_tritonservices() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, TritonService))


async def test_an_object_whose_repository_is_not_polled_leaves_no_spec_kept_after_its_pass() -> None:
    kube = cluster("svc", "other")
    r = Reconciler(kube, SETTINGS)  # no pinner: nothing polls (repositories unpinned)
    before = live_tritonservices()
    for name in ("svc", "other"):
        result = await r(NS, name)
        assert result is not None and result.ts is not None
    del result
    assert live_tritonservices() == before
    await r.close()


async def test_a_polled_repository_keeps_its_spec_for_the_poller_until_the_object_is_forgotten() -> None:
    kube = MemKube()
    repository = {"uri": "s3://models/prod", "credentialsSecret": "creds", "pollIntervalSeconds": 3600}
    kube.put(tritonservice("svc", NS, repository=repository))
    kube.put(secret(S3_KEYS))
    r = Reconciler(kube, SETTINGS, pinner=RepositoryPinner(kube, lister=Bucket()))
    before = live_tritonservices()
    result = await r(*KEY)
    assert result is not None and repository_reason(kube) == cond.MANIFEST_PINNED
    del result
    assert live_tritonservices() == before + 1
    assert [t for t in asyncio.all_tasks() if t.get_name() == "poll ml/svc" and not t.done()]
    r.forget(*KEY)
    assert live_tritonservices() == before
    await r.close()


async def test_a_change_of_the_tritonservice_takes_a_free_slot_before_owned_objects_passes() -> None:
    """1,000 TritonServices created at once: their first passes must not wait behind the passes their
    pods' events ask for; nor must a user's spec change."""
    names = [f"s{i}" for i in range(6)]
    kube = cluster(*names)
    gate = Gate(kube)
    r = Reconciler(kube, SETTINGS, max_passes=1)
    r.trigger(NS, "s0")  # runs, holding the only slot
    await until(lambda: gate.entered == ["s0"])
    for name in ("s1", "s2", "s3"):  # pods' and Deployments' events
        r.trigger(NS, name)
    r.trigger(NS, "s4", first=True)  # created
    await until(lambda: r._slots.waiting == [(NS, "s4"), (NS, "s1"), (NS, "s2"), (NS, "s3")])
    r.trigger(NS, "s2", first=True)  # queued for its pods, then its spec changed: moves up
    r.trigger(NS, "s5", first=True)
    await until(lambda: len(r._slots.waiting) == 5)
    assert r._slots.waiting == [(NS, "s4"), (NS, "s2"), (NS, "s5"), (NS, "s1"), (NS, "s3")]
    gate.release()  # one slot: each runs when the one before it ends
    await until(lambda: len(gate.entered) == 6)
    assert gate.entered == ["s0", "s4", "s2", "s5", "s1", "s3"]
    await r.close()


async def test_a_pass_cancelled_while_waiting_for_a_slot_gives_back_nothing_it_did_not_take() -> None:
    names = ["a", "b", "c"]
    kube = cluster(*names)
    gate = Gate(kube)
    r = Reconciler(kube, SETTINGS, max_passes=1)
    first = asyncio.create_task(r(NS, "a"))
    await until(lambda: gate.entered == ["a"])
    waiting = asyncio.create_task(r(NS, "b"))
    await until(lambda: r._slots.waiting == [(NS, "b")])
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert r._slots.waiting == []
    gate.release()
    await first
    await asyncio.wait_for(r(NS, "c"), timeout=2)  # the one slot was handed back: "c" runs
    assert gate.entered == ["a", "c"]
    await r.close()


# ----------------------------------------------------------------- what a replica knows absent


async def test_the_scheduler_passes_its_absences_on_and_forgets_them_when_paused() -> None:
    """Passes of one Reconciler share what they found absent (a one-replica service's second pass
    looks up no PodDisruptionBudget); paused, it knows nothing absent any more (another replica may
    write one meanwhile), nor for a TritonService gone."""
    kube = MemKube()
    kube.put(tritonservice("svc", NS, replicas=1))
    r = Reconciler(kube, SETTINGS)
    await r(*KEY)
    await r(*KEY)
    assert not [c for c in kube.calls if (c.method, c.kind) == ("get", "PodDisruptionBudget")]
    assert not r.absences.may_exist(*KEY)
    r.pause()
    assert r.absences.may_exist(*KEY)
    r.resume()
    r.absences.absent(*KEY)
    r.forget(*KEY)
    assert r.absences.may_exist(*KEY)
    await r.close()


# ----------------------------------------------------------------- retries back off, jittered


async def test_failures_in_a_row_back_off_and_a_success_starts_again(kube: MemKube) -> None:
    """On main every retry of a failing pass came after the same 5 s: a thousand TritonServices that
    failed together (an API server restart) came back together, every 5 s, for ever."""
    error = OSError("connection reset by peer")
    r = Reconciler(kube, SETTINGS, random=lambda: 1.0)
    delays = [await r._failed(KEY, error) for _ in range(9)]
    assert delays == [5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0, 300.0]  # doubling, capped
    await r._pass_on_task(KEY)  # a pass that succeeds resets the count
    assert await r._failed(KEY, error) == 5.0
    await r.close()


async def test_two_services_that_fail_together_do_not_retry_together(kube: MemKube) -> None:
    error = OSError("connection reset by peer")
    delays = set()
    for seed in range(20):
        r = Reconciler(kube, SETTINGS, random=random.Random(seed).random)
        delay = await r._failed(KEY, error)
        assert delay is not None and 0.0 <= delay <= 5.0
        delays.add(delay)
        await r.close()
    assert len(delays) == 20


async def test_the_api_servers_retry_after_is_waited_out(kube: MemKube) -> None:
    request = httpx2.Request("GET", "https://api/apis/triton-operator.io/v1alpha1")
    response = httpx2.Response(429, headers={"Retry-After": "42"}, request=request)
    throttled = httpx2.HTTPStatusError("too many requests", request=request, response=response)
    r = Reconciler(kube, SETTINGS, random=lambda: 0.0)
    assert await r._failed(KEY, throttled) == 42.0
    await r.close()
