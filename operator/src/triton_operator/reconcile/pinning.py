"""Repository pinning: list a TritonService's object store and pin what its models select."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from triton_operator.adapters.kube import (
    KubeAPI,
)
from triton_operator.adapters.redaction import scrub
from triton_operator.adapters.storage import PinResult, pin_with_versioning
from triton_operator.adapters.storage.base import AccessDenied, StoreConfigError, StoreError
from triton_operator.core import conditions as cond
from triton_operator.core.manifest import (
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
from triton_operator.core.modelconfig import ModelConfigError
from triton_operator.core.repository_access import CREDENTIALS_FIELD, RepositoryAccess, access_refusal
from triton_operator.core.validation.ensemble import ensemble_version_errors
from triton_operator.core.validation.errors import SpecError
from triton_operator.metrics import METRICS
from triton_operator.models import ModelSpec, Repository, TritonService

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
    manifest: Manifest, problem: str | None = None, versioned: bool | None = None
) -> PinnedManifest:
    """``versioned``: what the store said of the bucket when it was listed (None: not known)."""
    text = manifest_to_json(manifest)
    return PinnedManifest(
        json=text,
        digest=json_digest(text) if manifest.pinned else None,
        objects=len(manifest.entries),
        total_bytes=manifest.total_bytes,
        problem=problem,
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
    summary: PinnedManifest = dataclasses.field(init=False, compare=False)
    """Computed once a listing: its JSON and digest take a second for 50,000 objects."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "summary", summarize(self.manifest, self.problem, self.versioned))


RepositoryLister = Callable[[Repository, Sequence[ModelSpec], Mapping[str, str]], PinResult]
"""Lists a repository with these credentials and pins what the models select (blocking: it runs in a
thread). Raises SelectionFailed, a StoreError or ModelConfigError; pin_with_versioning is the real one."""


class RepositoryPinner:
    """Lists a TritonService's object store and pins what its models select (core.manifest).

    Listings are cached per object for repository.pollIntervalSeconds, so reconciles driven by
    pod events do not list the store; ``refresh`` lists now and tells whether the pin changed.
    A pvc:// claim is never listed here (the pod links it): its manifest is unpinned.
    When a listing fails, the manifest pinned before (cached, else the running revision's) is
    kept with the problem noted; with nothing pinned before, RepositoryError.
    """

    def __init__(
        self,
        kube: KubeAPI,
        *,
        clock: Callable[[], float] = time.monotonic,
        lister: RepositoryLister = pin_with_versioning,
        access: RepositoryAccess | None = None,
    ) -> None:
        self.kube = kube
        self.clock = clock
        self.lister = lister
        self.access = access or RepositoryAccess()  # by default no namespace gets our identity
        self._listings: dict[tuple[str, str], _Listing] = {}

    def forget(self, namespace: str, name: str) -> None:
        self._listings.pop((namespace, name), None)

    async def __call__(self, ts: TritonService, current: str | None) -> PinnedManifest:
        wanted = unpinned_manifest(
            StoreRef.from_repository(ts.spec.repository), model_sources(ts.spec.models)
        )
        if ts.spec.repository.scheme == "pvc":
            return summarize(wanted)
        key = (ts.namespace, ts.name)
        poll = ts.spec.repository.poll_interval_seconds
        cached = self._listings.get(key)
        fresh = cached is not None and (poll == 0 or self.clock() - cached.when < poll)
        if cached is not None and fresh and _same_source(cached.manifest, wanted):
            return cached.summary
        running = parse_manifest(current)
        if running is not None and (not running.pinned or not _same_source(running, wanted)):
            running = None
        if running is not None and poll == 0:
            listing = self._listings[key] = _Listing(self.clock(), running)
            return listing.summary
        try:
            pin = await self._list(ts)
        except RepositoryError as exc:
            fallback = (
                cached.manifest if cached is not None and _same_source(cached.manifest, wanted) else running
            )
            if fallback is None:
                raise
            # Keep serving what was pinned; try again after the poll interval.
            versioned = cached.versioned if cached is not None and fallback is cached.manifest else None
            listing = self._listings[key] = _Listing(self.clock(), fallback, exc.message, versioned)
            return listing.summary
        listing = self._listings[key] = _Listing(self.clock(), pin.manifest, versioned=pin.versioned)
        return listing.summary

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
        # lent to a namespace its settings do not name (core.repository_access). Redacted like any
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


def pinned_version_errors(ts: TritonService, pinned: PinnedManifest | None) -> list[SpecError]:
    """Ensemble steps asking for a version the pinned manifest does not hold (Triton would refuse
    to load the ensemble): judged once the repository is pinned (a pvc:// claim is not read)."""
    if pinned is None or not pinned.digest:
        return []
    return ensemble_version_errors(ts.spec, pinned.versions)


def repository_verdict(ts: TritonService, pinned: PinnedManifest | None) -> cond.Verdict:
    if pinned is not None and pinned.problem is not None:
        return cond.Verdict(
            cond.FALSE, cond.REPOSITORY_ERROR, f"{pinned.problem}; pods keep the manifest pinned before"
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
