"""Repository pinning: list a TritonService's object store and pin what its models select."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from triton_operator.adapters.kube import (
    KubeAPI,
)
from triton_operator.adapters.redaction import scrub
from triton_operator.adapters.storage import PinResult, pin_with_versioning
from triton_operator.adapters.storage.base import AccessDenied, ListingTooLarge, StoreConfigError, StoreError
from triton_operator.core.repository.manifest import (
    Manifest,
    ManifestError,
    SelectionFailed,
    StoreRef,
    json_digest,
    manifest_from_json,
    manifest_to_json,
    model_sources,
    unpinned_manifest,
)
from triton_operator.core.repository.repository_access import (
    CREDENTIALS_FIELD,
    RepositoryAccess,
    access_refusal,
)
from triton_operator.core.spec.field_error import ModelConfigError
from triton_operator.core.spec.validation.ensemble import ensemble_version_errors
from triton_operator.core.spec.validation.errors import SpecError
from triton_operator.core.vocabulary import conditions as cond
from triton_operator.metrics import METRICS
from triton_operator.models import ModelSpec, Repository, TritonService
from triton_operator.settings import DEFAULT_MAX_LISTED_OBJECTS

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PinnedManifest:
    """The manifest a revision's pods sync: its JSON, and its digest (None when it pins nothing)."""

    json: str
    digest: str | None
    objects: int = 0
    total_bytes: int = 0
    problem: str | None = None
    """Set when the last listing failed and this is the manifest pinned before it."""
    problem_reason: str | None = None
    """RepositoryReady's reason for ``problem`` (None: RepositoryError)."""
    unversioned: bool = False
    """Objects pinned by ETag alone (no object version, or S3's "null" one), or in a bucket that
    keeps no old versions (GCS without versioning): an upload to the same key breaks them."""
    versions_kept: bool | None = None
    """What the store said when it listed: the bucket keeps old object versions (None: not known)."""
    versions: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    """The versions pinned of each model that has version folders (pinned_version_errors reads
    them on every reconcile: computed once a listing, never by parsing ``json`` again)."""


class RepositoryError(Exception):
    """The repository cannot be listed and nothing was pinned before: no revision can be made.

    ``secret``: the credentials Secret whose change may make it listable (it is missing, holds no
    usable credentials, or names an endpoint the operator may not reach); None when only a spec or
    settings change can (the scheduler retries the former with a backoff: no Secret is watched).
    """

    def __init__(self, reason: str, message: str, secret: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.secret = secret


# The storage seam: pin the manifest a TritonService's pods will sync. ``current`` is the
# manifest JSON of the newest running revision (reused until a re-list is due). Raises
# RepositoryError when nothing can be pinned.
ManifestPinner = Callable[[TritonService, str | None], Awaitable[PinnedManifest]]


def summarize(
    manifest: Manifest,
    problem: str | None = None,
    versioned: bool | None = None,
    problem_reason: str | None = None,
) -> PinnedManifest:
    """``versioned``: what the store said of the bucket when it was listed (None: not known)."""
    text = manifest_to_json(manifest)
    return PinnedManifest(
        json=text,
        digest=json_digest(text) if manifest.pinned else None,
        objects=len(manifest.entries),
        total_bytes=manifest.total_bytes,
        problem=problem,
        problem_reason=problem_reason,
        unversioned=manifest.pinned
        and (versioned is False or any(not e.version_pinned for e in manifest.entries)),
        versions_kept=versioned,
        versions={
            m.name: tuple(int(v) for v in m.versions if v.isdigit()) for m in manifest.models if m.versions
        },
    )


def parse_manifest(text: str | None) -> Manifest | None:
    if not text:
        return None
    try:
        return manifest_from_json(text)
    except (ManifestError, ValueError):
        return None


def _same_source(manifest: Manifest, wanted: Manifest) -> bool:
    """Whether ``manifest`` was pinned from the repository and models that ``wanted`` names."""

    def models(m: Manifest) -> list[tuple[str, str, object]]:
        return sorted((x.name, x.folder.strip("/"), x.policy) for x in m.models)

    return manifest.repository == wanted.repository and models(manifest) == models(wanted)


@dataclasses.dataclass(frozen=True)
class _Listing:
    when: float
    manifest: Manifest
    problem: str | None = None
    versioned: bool | None = None
    problem_reason: str | None = None
    summary: PinnedManifest = dataclasses.field(init=False, compare=False)
    """Computed once a listing: its JSON and digest take a second for 50,000 objects."""

    def __post_init__(self) -> None:
        summary = summarize(self.manifest, self.problem, self.versioned, self.problem_reason)
        object.__setattr__(self, "summary", summary)


@dataclasses.dataclass
class _Job:
    """A listing running in the background for one TritonService, and the source it lists."""

    wanted: Manifest
    task: asyncio.Task[None]


RepositoryLister = Callable[[Repository, Sequence[ModelSpec], Mapping[str, str]], PinResult]
"""Lists a repository with these credentials and pins what the models select (blocking: it runs in a
thread). Raises SelectionFailed, a StoreError or ModelConfigError; pin_with_versioning is the real one."""


class RepositoryPinner:
    """Lists a TritonService's object store and pins what its models select (core.repository.manifest).

    Listings are cached per object for repository.pollIntervalSeconds, so reconciles driven by
    pod events do not list the store; ``refresh`` lists now and tells whether the pin changed.
    A pvc:// claim is never listed here (the pod links it): its manifest is unpinned.
    When a listing fails, the manifest pinned before (cached, else the running revision's) is
    kept with the problem noted; with nothing pinned before, RepositoryError.

    A listing never holds a rollout decision: while a revision of the TritonService runs
    (``current`` is set), a listing that is due runs in a task of its own, outside the reconcile
    and its per-object lock; the pass goes on with what was pinned before (the cached listing, else
    the running revision's manifest), or, for a repository or models it has no pin of yet, raises
    RepositoryError(RepositoryListing) so that the pass holds the spec and still carries out the
    last valid one (aborts, deadlines). When the listing ends, ``on_listed`` asks for a pass, which
    takes its result. Only a TritonService with nothing running waits for its listing in the pass:
    it has no rollout to decide. A listing takes at most ``max_objects`` objects (ListingTooLarge).
    """

    def __init__(
        self,
        kube: KubeAPI,
        *,
        clock: Callable[[], float] = time.monotonic,
        lister: RepositoryLister | None = None,
        access: RepositoryAccess | None = None,
        max_objects: int = DEFAULT_MAX_LISTED_OBJECTS,
        on_listed: Callable[[tuple[str, str]], None] | None = None,
    ) -> None:
        self.kube = kube
        self.clock = clock
        self.max_objects = max_objects
        self.lister: RepositoryLister = lister or functools.partial(
            pin_with_versioning, max_objects=max_objects
        )
        self.access = access or RepositoryAccess()  # by default no namespace gets our identity
        self.on_listed = on_listed
        """Called with (namespace, name) when a background listing ended (the scheduler reconciles)."""
        self._listings: dict[tuple[str, str], _Listing] = {}
        self._jobs: dict[tuple[str, str], _Job] = {}
        self._awaited: set[tuple[str, str]] = set()
        """Keys whose pass waits for its listing itself (it takes the result: no pass to ask for)."""
        self._failures: dict[tuple[str, str], tuple[Manifest, RepositoryError]] = {}
        """A listing that failed with nothing to fall back on, for the next pass to report (once)."""

    def forget(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        self._listings.pop(key, None)
        self._failures.pop(key, None)
        job = self._jobs.pop(key, None)
        if job is not None:
            job.task.cancel()

    def listing(self, namespace: str, name: str) -> asyncio.Task[None] | None:
        """The listing running in the background for a TritonService, if any (tests, shutdown)."""
        job = self._jobs.get((namespace, name))
        return job.task if job is not None else None

    async def close(self) -> None:
        tasks = [job.task for job in self._jobs.values()]
        self._jobs.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def __call__(self, ts: TritonService, current: str | None) -> PinnedManifest:
        wanted = unpinned_manifest(
            StoreRef.from_repository(ts.spec.repository), model_sources(ts.spec.models)
        )
        if ts.spec.repository.scheme == "pvc":
            return summarize(wanted)
        key = (ts.namespace, ts.name)
        running = parse_manifest(current)
        if running is not None and (not running.pinned or not _same_source(running, wanted)):
            running = None
        pinned = self._pinned(key, ts, wanted, running)
        if pinned is not None:
            return pinned
        job = self._start(key, ts, wanted, running)
        if current is None:
            # Nothing of this TritonService runs: no rollout decision waits on the listing.
            self._awaited.add(key)
            try:
                await asyncio.wait({job.task})  # never cancels it: it is the TritonService's listing
            finally:
                self._awaited.discard(key)
            pinned = self._pinned(key, ts, wanted, running, settled=True)
            if pinned is not None:
                return pinned
            raise RepositoryError(
                cond.REPOSITORY_ERROR, f"{ts.spec.repository.uri}: the listing ended unread"
            )
        cached = self._listings.get(key)
        if cached is not None and _same_source(cached.manifest, wanted):
            return cached.summary  # the listing that is due runs in the background
        if running is not None:
            # What the running revision pinned serves until the listing ends (due at once).
            listing = self._listings[key] = _Listing(self._due(ts), running)
            return listing.summary
        raise RepositoryError(
            cond.REPOSITORY_LISTING,
            f"{ts.spec.repository.uri}: listing the repository; the spec is applied once it is pinned "
            "(meanwhile the rollout goes on under the last valid spec)",
        )

    def _due(self, ts: TritonService) -> float:
        """A cache time that is already due for a listing."""
        return self.clock() - max(ts.spec.repository.poll_interval_seconds, 1) - 1

    def _pinned(
        self,
        key: tuple[str, str],
        ts: TritonService,
        wanted: Manifest,
        running: Manifest | None,
        *,
        settled: bool = False,
    ) -> PinnedManifest | None:
        """What is pinned already and may serve without a listing now; raises the failure of the
        last listing when nothing was pinned before it. ``settled``: a listing just ended."""
        failure = self._failures.pop(key, None)
        if failure is not None and _same_source(failure[0], wanted):
            raise failure[1]
        poll = ts.spec.repository.poll_interval_seconds
        cached = self._listings.get(key)
        fresh = cached is not None and (settled or poll == 0 or self.clock() - cached.when < poll)
        if cached is not None and fresh and _same_source(cached.manifest, wanted):
            return cached.summary
        if running is not None and poll == 0:
            listing = self._listings[key] = _Listing(self.clock(), running)
            return listing.summary
        return None

    def _start(
        self, key: tuple[str, str], ts: TritonService, wanted: Manifest, running: Manifest | None
    ) -> _Job:
        """The listing of ``wanted`` for ``key``, started unless it runs already (one of another
        source is cancelled: its result would be for a spec that is gone)."""
        job = self._jobs.get(key)
        if job is not None and not job.task.done() and _same_source(job.wanted, wanted):
            return job
        if job is not None:
            job.task.cancel()
        task = asyncio.create_task(self._listed(key, ts, wanted, running), name=f"list {key[0]}/{key[1]}")
        job = self._jobs[key] = _Job(wanted, task)
        return job

    async def _listed(
        self, key: tuple[str, str], ts: TritonService, wanted: Manifest, running: Manifest | None
    ) -> None:
        """List in the background; the result is cached (or the failure kept) for the next pass."""
        try:
            pin = await self._list(ts)
        except Exception as caught:  # a bug too: reported, and the next pass may list again
            exc = caught if isinstance(caught, RepositoryError) else _unexpected(ts, caught)
            cached = self._listings.get(key)
            fallback = (
                cached.manifest if cached is not None and _same_source(cached.manifest, wanted) else running
            )
            if fallback is None:
                self._failures[key] = (wanted, exc)
            else:
                # Keep serving what was pinned; try again after the poll interval.
                versioned = cached.versioned if cached is not None and fallback is cached.manifest else None
                self._listings[key] = _Listing(self.clock(), fallback, exc.message, versioned, exc.reason)
        else:
            self._listings[key] = _Listing(self.clock(), pin.manifest, versioned=pin.versioned)
        finally:
            if key in self._jobs and self._jobs[key].task is asyncio.current_task():
                del self._jobs[key]
        if self.on_listed is not None and key not in self._awaited:
            self.on_listed(key)

    async def refresh(self, ts: TritonService) -> bool:
        """List now; True when the pinned manifest differs from the cached one (or the listing failed)."""
        key = (ts.namespace, ts.name)
        before = self._listings.get(key)
        try:
            pin = await self._list(ts)
        except RepositoryError as exc:
            logger.warning("listing the repository of %s/%s failed: %s", *key, exc.message)
            return True
        after = self._listings[key] = _Listing(self.clock(), pin.manifest, versioned=pin.versioned)
        return before is None or before.problem is not None or before.summary.digest != after.summary.digest

    async def _list(self, ts: TritonService) -> PinResult:
        repository = ts.spec.repository
        credentials: dict[str, str] = {}
        if repository.credentials_secret:
            secret = await self.kube.get_secret_data(ts.namespace, repository.credentials_secret)
            if secret is None:
                raise RepositoryError(
                    cond.CREDENTIALS_MISSING,
                    f"spec.repository.credentialsSecret: Secret {repository.credentials_secret!r} "
                    f"not found in namespace {ts.namespace}",
                    repository.credentials_secret,
                )
            credentials = secret
        # The operator's policy before any request: its own identity and network position are not
        # lent to a namespace its settings do not name (core.repository.repository_access). Redacted like any
        # store error: the message may quote an endpoint taken from the Secret.
        ref = StoreRef.from_repository(repository)
        refusal = access_refusal(
            self.access,
            namespace=ts.namespace,
            uri=ref.uri,
            endpoint=ref.endpoint,
            credentials_secret=repository.credentials_secret,
            credentials=credentials,
        )
        if refusal is not None:
            from_secret = refusal.field.startswith(CREDENTIALS_FIELD) and repository.credentials_secret
            raise RepositoryError(refusal.reason, scrub(refusal.message), from_secret or None)
        started = time.perf_counter()
        try:
            pin = await asyncio.to_thread(self.lister, repository, ts.spec.models, credentials)
        except SelectionFailed as exc:
            raise RepositoryError(cond.MODELS_NOT_FOUND, f"{repository.uri}: {exc}") from exc
        except ListingTooLarge as exc:
            raise RepositoryError(cond.LISTING_TOO_LARGE, str(exc)) from exc
        except (AccessDenied, StoreConfigError) as exc:
            # Credentials the store refused, or that cannot work: a fixed Secret may cure it.
            secret_named = repository.credentials_secret
            raise RepositoryError(cond.REPOSITORY_ERROR, f"{repository.uri}: {exc}", secret_named) from exc
        except (StoreError, ModelConfigError) as exc:
            raise RepositoryError(cond.REPOSITORY_ERROR, f"{repository.uri}: {exc}") from exc
        METRICS.record_repository_listing(
            ts.namespace,
            ts.name,
            scheme=repository.scheme,
            seconds=time.perf_counter() - started,
            objects=len(pin.manifest.entries),
            total_bytes=pin.manifest.total_bytes,
        )
        return pin


def _unexpected(ts: TritonService, exc: Exception) -> RepositoryError:
    """A listing that failed for a bug, not the store: logged, and reported like a store's failure."""
    logger.error("listing the repository of %s/%s failed", ts.namespace, ts.name, exc_info=exc)
    return RepositoryError(
        cond.REPOSITORY_ERROR, f"{ts.spec.repository.uri}: the listing failed ({type(exc).__name__})"
    )


def pinned_version_errors(ts: TritonService, pinned: PinnedManifest | None) -> list[SpecError]:
    """Ensemble steps asking for a version the pinned manifest does not hold (Triton would refuse
    to load the ensemble): judged once the repository is pinned (a pvc:// claim is not read)."""
    if pinned is None or not pinned.digest:
        return []
    return ensemble_version_errors(ts.spec, pinned.versions)


def repository_verdict(ts: TritonService, pinned: PinnedManifest | None) -> cond.Verdict:
    if pinned is not None and pinned.problem is not None:
        return cond.Verdict(
            cond.FALSE,
            pinned.problem_reason or cond.REPOSITORY_ERROR,
            f"{pinned.problem}; pods keep the manifest pinned before",
        )
    if ts.spec.repository.scheme == "pvc":
        return cond.Verdict(
            cond.TRUE, cond.VOLUME_MOUNTED, f"pods link the models of {ts.spec.repository.uri}"
        )
    if pinned is None or pinned.digest is None:
        return cond.Verdict(cond.TRUE, cond.UNPINNED, "repository not pinned (no storage adapter configured)")
    message = f"{pinned.objects} objects, {pinned.total_bytes} bytes pinned (manifest {pinned.digest[:12]})"
    if pinned.unversioned:
        message += (
            "; the bucket keeps no object versions, so rollback is not exact: after an upload to a"
            " pinned key, new pods of earlier revisions cannot sync (enable bucket versioning)"
        )
    return cond.Verdict(cond.TRUE, cond.MANIFEST_PINNED, message)
