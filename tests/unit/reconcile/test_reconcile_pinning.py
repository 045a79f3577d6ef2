"""reconcile.pinning.RepositoryPinner with a fake repository listing (Bucket) and MemKube (an in-memory
fake of KubeAPI, for the credentials Secret): the fallback when a listing fails, refresh(), and the
poll-interval cache.

Bucket is a fake of the object store's listing only: the selection and the manifest are the real
core code (select_objects, build_manifest). tests/storage runs the real listing against real stores.
"""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

from e2e_helpers import tritonservice
from memkube import MemKube, run_kubelet
from triton_operator import KIND
from triton_operator.adapters import storage
from triton_operator.adapters.storage import PinResult
from triton_operator.adapters.storage.base import AccessDenied, StoreConfigError, StoreError, StoreUnavailable
from triton_operator.core.repository.manifest import (
    ObjectInfo,
    StoreRef,
    build_manifest,
    manifest_to_json,
    model_sources,
    select_objects,
)
from triton_operator.core.repository.repository_access import RepositoryAccess
from triton_operator.core.vocabulary import conditions as cond
from triton_operator.models import ModelSpec, Repository, TritonService
from triton_operator.reconcile.pinning import RepositoryError, RepositoryPinner, repository_verdict
from triton_operator.reconcile.scheduler import Reconciler
from triton_operator.settings import Settings

NS = "ml"
AMBIENT = RepositoryAccess(ambient_namespaces=(NS,))
"""These tests are about caching and fallbacks, so the test namespace may list without a Secret;
the credentials policy itself: tests/unit/core/repository/test_repository_access.py, tests/storage/."""


def make_ts(poll: int = 60, *, secret: str | None = None, uri: str = "s3://models/prod") -> TritonService:
    repository: dict[str, Any] = {"uri": uri, "pollIntervalSeconds": poll}
    if secret is not None:
        repository["credentialsSecret"] = secret
    return TritonService.model_validate(
        {
            "metadata": {"name": "svc", "namespace": NS},
            "spec": {"repository": repository, "models": [{"name": "add", "config": {"backend": "python"}}]},
        }
    )


class Bucket:
    """The repository lister: lists ``objects`` (or raises ``error``) and counts its listings."""

    def __init__(self) -> None:
        self.objects = [ObjectInfo("add/1/model.py", 10, etag="e1", generation="g1")]
        self.error: Exception | None = None
        self.listings = 0
        self.credentials: list[Mapping[str, str]] = []

    def upload(self, etag: str) -> None:
        self.objects = [ObjectInfo("add/1/model.py", 11, etag=etag, generation=f"g-{etag}")]

    def __call__(
        self, repository: Repository, models: Sequence[ModelSpec], credentials: Mapping[str, str]
    ) -> PinResult:
        self.listings += 1
        self.credentials.append(dict(credentials))
        if self.error is not None:
            raise self.error
        ref = StoreRef.from_repository(repository)
        return PinResult(build_manifest(ref, select_objects(model_sources(models), self.objects)), True)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def listed(pinner: RepositoryPinner) -> None:
    """Let the listing running in the background end (the scheduler's next pass would take it)."""
    task = pinner.listing(NS, "svc")
    assert task is not None, "no listing runs"
    await asyncio.wait({task})


@pytest.fixture
def bucket() -> Bucket:
    return Bucket()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def pinner(bucket: Bucket, clock: Clock) -> RepositoryPinner:
    return RepositoryPinner(MemKube(), clock=clock, lister=bucket, access=AMBIENT)


# ----------------------------------------------------------------- the fallback when a listing fails


async def test_a_failed_listing_keeps_the_cached_manifest_and_says_why(
    pinner: RepositoryPinner, bucket: Bucket, clock: Clock
) -> None:
    ts = make_ts(poll=60)
    before = await pinner(ts, None)
    assert before.digest is not None and before.problem is None
    bucket.error = StoreError("connection refused")
    bucket.upload("e2")  # what the store holds now cannot be seen
    clock.now += 61  # a re-list is due
    after = await pinner(ts, None)
    assert bucket.listings == 2
    assert (after.json, after.digest) == (before.json, before.digest)
    assert after.problem is not None and "connection refused" in after.problem
    verdict = repository_verdict(ts, after)
    assert (verdict.status, verdict.reason) == (cond.FALSE, cond.REPOSITORY_ERROR)
    assert "pods keep the manifest pinned before" in verdict.message


async def test_a_failed_listing_keeps_the_running_revisions_manifest_when_nothing_is_cached(
    bucket: Bucket, clock: Clock
) -> None:
    ts = make_ts(poll=60)
    # What a revision pinned before the operator restarted (read back from its ConfigMap).
    running = await RepositoryPinner(MemKube(), clock=clock, lister=bucket, access=AMBIENT)(ts, None)
    bucket.error = StoreError("access denied")
    restarted = RepositoryPinner(MemKube(), clock=clock, lister=bucket, access=AMBIENT)
    meanwhile = await restarted(ts, running.json)  # a revision runs: the listing goes on in the background
    assert meanwhile.digest == running.digest
    await listed(restarted)
    kept = await restarted(ts, running.json)
    assert kept.digest == running.digest
    assert kept.problem is not None and "access denied" in kept.problem


async def test_a_running_manifest_of_another_repository_is_no_fallback(
    pinner: RepositoryPinner, bucket: Bucket
) -> None:
    running = await pinner(make_ts(uri="s3://models/old"), None)
    bucket.error = StoreError("connection refused")
    pinner.forget(NS, "svc")
    with pytest.raises(RepositoryError) as listing:
        await pinner(make_ts(uri="s3://models/prod"), running.json)
    assert listing.value.reason == cond.REPOSITORY_LISTING  # no pin of it yet: the spec is held
    await listed(pinner)
    with pytest.raises(RepositoryError) as failed:
        await pinner(make_ts(uri="s3://models/prod"), running.json)
    assert failed.value.reason == cond.REPOSITORY_ERROR


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (StoreError("bucket 'models' does not exist"), cond.REPOSITORY_ERROR),
        (None, cond.MODELS_NOT_FOUND),  # the listing works and holds no folder for the model
    ],
)
async def test_with_nothing_pinned_before_a_failed_listing_raises_repository_error(
    pinner: RepositoryPinner, bucket: Bucket, error: Exception | None, reason: str
) -> None:
    bucket.error = error
    bucket.objects = []
    with pytest.raises(RepositoryError) as raised:
        await pinner(make_ts(), None)
    assert raised.value.reason == reason
    assert "s3://models/prod" in raised.value.message


async def test_a_missing_credentials_secret_is_a_repository_error_and_a_present_one_is_passed_on(
    bucket: Bucket, clock: Clock
) -> None:
    kube = MemKube()
    pinner = RepositoryPinner(kube, clock=clock, lister=bucket)
    with pytest.raises(RepositoryError) as raised:
        await pinner(make_ts(secret="creds"), None)
    assert raised.value.reason == cond.CREDENTIALS_MISSING
    assert bucket.listings == 0
    kube.put(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "creds", "namespace": NS},
            "data": {
                "AWS_ACCESS_KEY_ID": base64.b64encode(b"id").decode(),
                "AWS_SECRET_ACCESS_KEY": base64.b64encode(b"key").decode(),
            },
        }
    )
    assert (await pinner(make_ts(secret="creds"), None)).digest is not None
    assert bucket.credentials == [{"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "key"}]


async def test_by_default_no_secret_means_no_listing_with_the_operators_identity(
    bucket: Bucket, clock: Clock
) -> None:
    pinner = RepositoryPinner(MemKube(), clock=clock, lister=bucket)
    with pytest.raises(RepositoryError) as raised:
        await pinner(make_ts(), None)
    assert raised.value.reason == cond.CREDENTIALS_REQUIRED
    assert "spec.repository.credentialsSecret" in raised.value.message
    assert bucket.listings == 0  # refused before any request to the store


# ----------------------------------------------------------------- refresh()


async def test_refresh_tells_whether_the_pin_changed(pinner: RepositoryPinner, bucket: Bucket) -> None:
    ts = make_ts()
    assert await pinner.refresh(ts) is True  # nothing was pinned before
    assert await pinner.refresh(ts) is False  # the same objects
    bucket.upload("e2")
    assert await pinner.refresh(ts) is True
    assert await pinner.refresh(ts) is False


async def test_refresh_reports_a_change_when_the_listing_fails_and_after_it_recovers(
    pinner: RepositoryPinner, bucket: Bucket, clock: Clock
) -> None:
    ts = make_ts(poll=60)
    first = await pinner(ts, None)
    bucket.error = StoreError("timed out")
    assert await pinner.refresh(ts) is True  # a reconcile reports the problem
    clock.now += 61
    assert (await pinner(ts, None)).problem is not None  # the reconcile keeps the manifest
    bucket.error = None
    assert await pinner.refresh(ts) is True  # the same objects, but the problem is gone
    recovered = await pinner(ts, None)
    assert recovered.problem is None and recovered.digest == first.digest


# ----------------------------------------------------------------- the poll-interval cache


async def test_listings_are_cached_for_the_poll_interval(
    pinner: RepositoryPinner, bucket: Bucket, clock: Clock
) -> None:
    ts = make_ts(poll=60)
    first = await pinner(ts, None)
    bucket.upload("e2")
    clock.now += 59
    assert (await pinner(ts, None)).digest == first.digest  # pod events do not list the store
    assert bucket.listings == 1
    clock.now += 2
    later = await pinner(ts, None)
    assert bucket.listings == 2 and later.digest != first.digest


async def test_without_polling_the_running_manifest_is_reused_and_never_listed(
    pinner: RepositoryPinner, bucket: Bucket, clock: Clock
) -> None:
    ts = make_ts(poll=0)
    running = manifest_to_json(
        build_manifest(
            StoreRef("s3://models/prod"), select_objects(model_sources(ts.spec.models), bucket.objects)
        )
    )
    pinned = await pinner(ts, running)
    assert bucket.listings == 0 and pinned.json == running
    clock.now += 10_000
    await pinner(ts, running)
    assert bucket.listings == 0


async def test_without_polling_and_nothing_running_it_lists_once(
    pinner: RepositoryPinner, bucket: Bucket, clock: Clock
) -> None:
    ts = make_ts(poll=0)
    first = await pinner(ts, None)
    bucket.upload("e2")
    clock.now += 10_000
    assert (await pinner(ts, None)).digest == first.digest
    assert bucket.listings == 1


async def test_a_changed_repository_in_the_spec_lists_at_once(
    pinner: RepositoryPinner, bucket: Bucket
) -> None:
    await pinner(make_ts(poll=60, uri="s3://models/prod"), None)
    moved = await pinner(make_ts(poll=60, uri="s3://models/next"), None)
    assert bucket.listings == 2
    assert '"s3://models/next"' in moved.json


async def test_a_pvc_repository_is_never_listed(pinner: RepositoryPinner, bucket: Bucket) -> None:
    pinned = await pinner(make_ts(uri="pvc://models-claim/triton"), None)
    assert pinned.digest is None and bucket.listings == 0


def _secret(name: str, data: Mapping[str, str]) -> dict[str, Any]:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NS},
        "data": encoded,
    }


@pytest.mark.parametrize(
    ("error", "secret", "blames_the_secret"),
    [
        (AccessDenied("s3://models/prod", "InvalidAccessKeyId"), "creds", True),
        (StoreConfigError("AWS_REGION", "is not a region"), "creds", True),
        (StoreUnavailable("s3://models/prod", "connection refused"), "creds", False),
        (AccessDenied("s3://models/prod", "no role"), None, False),  # the operator's own identity
    ],
)
async def test_a_repository_error_names_the_secret_only_when_its_change_may_cure_it(
    bucket: Bucket, clock: Clock, error: StoreError, secret: str | None, blames_the_secret: bool
) -> None:
    kube = MemKube()
    kube.put(_secret("creds", {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "key"}))
    bucket.error = error
    pinner = RepositoryPinner(kube, clock=clock, lister=bucket, access=AMBIENT)
    with pytest.raises(RepositoryError) as raised:
        await pinner(make_ts(secret=secret), None)
    assert raised.value.secret == ("creds" if blames_the_secret else None)


async def test_a_refusal_names_the_secret_when_the_secret_is_what_was_refused(
    bucket: Bucket, clock: Clock
) -> None:
    kube = MemKube()
    kube.put(_secret("creds", {"note": "no keys"}))
    pinner = RepositoryPinner(kube, clock=clock, lister=bucket)
    with pytest.raises(RepositoryError) as raised:
        await pinner(make_ts(secret="creds"), None)
    assert (raised.value.reason, raised.value.secret) == (cond.CREDENTIALS_REQUIRED, "creds")
    with pytest.raises(RepositoryError) as raised:
        await pinner(make_ts(), None)  # no Secret named: only a spec edit can help
    assert (raised.value.reason, raised.value.secret) == (cond.CREDENTIALS_REQUIRED, None)


# ----------------------------------------------------------------- the listing cap


class ManyObjects:
    """An ObjectStore whose listing streams ``count`` objects of the model `add`, counting how many
    were taken and whether the listing was closed (no further page asked for)."""

    uri = "s3://models/prod"
    bucket = "models"
    prefix = "prod/"

    def __init__(self, count: int) -> None:
        self.count = count
        self.taken = 0
        self.closed = False

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        try:
            for i in range(self.count):
                self.taken += 1
                yield ObjectInfo(f"{prefix}add/1/part-{i:07d}", 1, etag=f"e{i}")
        finally:
            self.closed = True

    def trusted(self, objects: Sequence[ObjectInfo]) -> Sequence[ObjectInfo]:
        return list(objects)

    def versioned(self) -> bool:
        return True

    def close(self) -> None:
        pass


async def test_a_listing_stops_at_the_operators_cap_and_repository_ready_names_it(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ManyObjects(50_000)
    monkeypatch.setattr(storage, "open_store", lambda *args, **kwargs: store)
    settings = Settings.from_env({"TRITON_OPERATOR_MAX_LISTED_OBJECTS": "1000"})
    pinner = RepositoryPinner(MemKube(), clock=clock, access=AMBIENT, max_objects=settings.max_listed_objects)
    with pytest.raises(RepositoryError) as raised:
        await pinner(make_ts(), None)
    # streamed: one object past the cap is taken, then the listing is closed; nothing more is held
    assert (store.taken, store.closed) == (1001, True)
    assert raised.value.reason == cond.LISTING_TOO_LARGE
    assert "more than 1000 objects" in raised.value.message and "maxListedObjects" in raised.value.message
    # with a manifest pinned before, it keeps serving and RepositoryReady says why, with the same reason
    store.count = 10
    clock.now += 61
    before = await pinner(make_ts(), None)
    store.count, store.taken = 5000, 0
    clock.now += 61
    kept = await pinner(make_ts(), None)
    assert kept.digest == before.digest and store.taken == 1001
    verdict = repository_verdict(make_ts(), kept)
    assert (verdict.status, verdict.reason) == (cond.FALSE, cond.LISTING_TOO_LARGE)
    assert "more than 1000 objects" in verdict.message


@pytest.mark.parametrize("value", ["0", "-5", "lots"])
def test_the_cap_setting_must_be_a_whole_number_above_zero(value: str) -> None:
    assert Settings().max_listed_objects == Settings.from_env({}).max_listed_objects > 0
    with pytest.raises(ValueError, match="TRITON_OPERATOR_MAX_LISTED_OBJECTS"):
        Settings.from_env({"TRITON_OPERATOR_MAX_LISTED_OBJECTS": value})


# ----------------------------------------------------------------- no decision waits for a listing


class BlockingBucket(Bucket):
    """A Bucket whose listings, once ``block`` is called, wait in their thread until ``release``."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = threading.Event()

    def block(self) -> None:
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    def __call__(
        self, repository: Repository, models: Sequence[ModelSpec], credentials: Mapping[str, str]
    ) -> PinResult:
        if not self.gate.is_set():
            self.waiting.set()
            self.gate.wait()
        return super().__call__(repository, models, credentials)


def pods_of(kube: MemKube, *, crash: bool) -> None:
    """The Deployment controller and the kubelet, faked: every Deployment has its pods; with
    ``crash`` those of the newest revision crash-loop, the others are Ready."""
    deployments = sorted(kube.of_kind("Deployment"), key=lambda d: int(d["metadata"]["resourceVersion"]))
    newest = deployments[-1]["metadata"]["name"] if deployments else None
    run_kubelet(kube, NS, lambda d: crash and d["metadata"]["name"] == newest)


@pytest.mark.parametrize("change", ["listing due", "new repository"])
async def test_a_crash_looping_canary_is_aborted_while_the_repository_listing_is_still_blocked(
    clock: Clock, change: str
) -> None:
    """The listing due in a pass runs outside it: a store that does not answer never holds the
    abort of a crash-looping canary (nor a deadline) behind the per-object lock. A spec naming a
    repository not pinned yet is held meanwhile (RepositoryReady Unknown, RepositoryListing) and
    the last valid spec still decides."""
    bucket = BlockingBucket()
    kube = MemKube()
    kube.put(tritonservice("svc", NS, repository={"uri": "s3://models/prod", "pollIntervalSeconds": 60}))
    pinner = RepositoryPinner(kube, clock=clock, lister=bucket, access=AMBIENT)
    reconciler = Reconciler(kube, Settings(), pinner=pinner)
    try:
        await reconciler(NS, "svc")  # nothing runs yet: this pass waits for its listing
        pods_of(kube, crash=False)
        await reconciler(NS, "svc")  # the first revision serves
        kube.edit(KIND, NS, "svc", lambda ts: ts["spec"]["models"][0]["config"].update(maxBatchSize=4))
        await reconciler(NS, "svc")  # a canary starts (the listing is still fresh)
        pods_of(kube, crash=True)
        if change == "listing due":
            clock.now += 61
        else:
            kube.edit(KIND, NS, "svc", lambda ts: ts["spec"]["repository"].update(uri="s3://models/next"))
        bucket.block()  # ... and the store will not answer the listing until released
        result = await asyncio.wait_for(reconciler(NS, "svc"), timeout=30)  # a guard, not a timing
        assert result is not None and result.plan is not None
        assert result.plan.status.aborted_reason == cond.CANARY_CRASH_LOOPING
        if change == "new repository":
            assert result.reason == cond.REPOSITORY_LISTING
            repository_ready = cond.find_condition(
                result.status["conditions"] if result.status else [], cond.REPOSITORY_READY
            )
            assert repository_ready is not None and repository_ready["status"] == cond.UNKNOWN
        listing = pinner.listing(NS, "svc")
        assert listing is not None and not listing.done()  # decided while the listing was blocked
        bucket.waiting.wait(timeout=30)
        assert bucket.waiting.is_set() and not bucket.gate.is_set()
        stored = kube.find(KIND, NS, "svc")
        assert stored is not None and stored["status"]["abortedReason"] == cond.CANARY_CRASH_LOOPING
    finally:
        bucket.release()
        await reconciler.close()
