"""Repository stores (s3://, gs://, as://, pvc://) behind one ObjectStore protocol, and pinning."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triton_operator.adapters.storage.base import (
    AccessDenied,
    BucketNotFound,
    ListingTooLarge,
    ObjectChanged,
    ObjectStore,
    StoreConfigError,
    StoreError,
    StoreUnavailable,
)
from triton_operator.core.repository.manifest import (
    Manifest,
    ModelSource,
    ObjectInfo,
    StoreRef,
    build_manifest,
    model_sources,
    parse_repository_uri,
    select_objects,
    unpinned_manifest,
)

__all__ = [
    "AccessDenied",
    "BucketNotFound",
    "ListingTooLarge",
    "ObjectChanged",
    "ObjectStore",
    "PinResult",
    "StoreConfigError",
    "StoreError",
    "StoreUnavailable",
    "open_store",
    "pin_repository",
    "pin_with_versioning",
]


def _ref(repository: Any) -> StoreRef:
    return repository if isinstance(repository, StoreRef) else StoreRef.from_repository(repository)


def open_store(
    repository: Any,
    credentials: Mapping[str, str],
    *,
    pvc_root: str | Path | None = None,
    max_connections: int = 16,
    timeout: float = 60.0,
    max_attempts: int = 3,
    reads_only: bool = False,
) -> ObjectStore:
    """The store for a ``Repository`` (or a manifest's ``StoreRef``).

    ``credentials`` is the credentials Secret's data (or the pod's environment); an empty mapping
    uses the platform's default chain (IRSA, GKE workload identity, Azure identity).
    ``pvc_root`` is where a pvc:// claim is mounted; without it a pvc:// store cannot be opened.
    ``reads_only``: the caller reads pinned objects (a sync): an S3 store with static keys and an
    endpoint then reads over its own HTTP connections, without loading botocore
    (storage.s3_http.http_refusal says when it cannot); listing still goes through boto3.
    """
    ref = _ref(repository)
    loc = parse_repository_uri(ref.uri)
    if loc.scheme == "s3":

        def boto3_store() -> ObjectStore:
            from triton_operator.adapters.storage.s3 import S3Store  # noqa: PLC0415 - load one SDK only

            return S3Store(
                ref.uri,
                loc.bucket,
                loc.prefix,
                credentials=credentials,
                endpoint=ref.endpoint,
                addressing_style=ref.s3_addressing_style,
                region=ref.s3_region,
                max_connections=max_connections,
                read_timeout=timeout,
                max_attempts=max_attempts,
            )

        if reads_only:
            from triton_operator.adapters.storage import s3_http  # noqa: PLC0415 - S3 only

            env_region = credentials.get("AWS_REGION", "") or credentials.get("AWS_DEFAULT_REGION", "")
            region = ref.s3_region or env_region
            if not s3_http.http_refusal(credentials, ref.endpoint, region, os.environ):
                return s3_http.S3HttpReader(
                    ref.uri,
                    loc.bucket,
                    loc.prefix,
                    credentials=credentials,
                    endpoint=ref.endpoint,
                    region=region,
                    addressing_style=ref.s3_addressing_style,
                    full=boto3_store,
                    ca_bundle=os.environ.get(s3_http.CA_BUNDLE_ENV, ""),
                    read_timeout=timeout,
                    max_attempts=max_attempts,
                )
        return boto3_store()
    if loc.scheme == "gs":
        from triton_operator.adapters.storage.gcs import GCSStore  # noqa: PLC0415 - load one SDK only

        return GCSStore(
            ref.uri,
            loc.bucket,
            loc.prefix,
            credentials=credentials,
            endpoint=ref.endpoint,
            max_connections=max_connections,
            timeout=timeout,
            retry_timeout=timeout,
        )
    if loc.scheme == "as":
        from triton_operator.adapters.storage.azure import AzureStore  # noqa: PLC0415 - load one SDK only

        return AzureStore(
            ref.uri,
            loc.account,
            loc.bucket,
            loc.prefix,
            credentials=credentials,
            endpoint=ref.endpoint,
            max_connections=max_connections,
            timeout=timeout,
            max_attempts=max_attempts,
        )
    from triton_operator.adapters.storage.pvc import PvcStore  # noqa: PLC0415 - load one SDK only

    if pvc_root is None:
        raise StoreConfigError(
            "repository.uri",
            f"{ref.uri}: a pvc:// claim is read only where it is mounted; "
            "the pod mounts it, the operator does not",
        )
    return PvcStore(ref.uri, loc.bucket, loc.prefix, pvc_root)


@dataclass(frozen=True)
class PinResult:
    """A pinned manifest and whether its store keeps the pinned versions readable after an overwrite.

    ``versioned`` is never part of the manifest (its JSON and digest are the revision's): it is
    what the store says now, None when it cannot tell (see ``ObjectStore.versioned``).
    """

    manifest: Manifest
    versioned: bool | None


def pin_with_versioning(
    repository: Any,
    models: Sequence[Any],
    credentials: Mapping[str, str],
    *,
    store: ObjectStore | None = None,
    pvc_root: str | Path | None = None,
    max_objects: int | None = None,
) -> PinResult:
    """``pin_repository``, and whether the bucket keeps object versions (one more request).

    An unpinned pvc:// manifest reads nothing: ``versioned`` is None. The operator's policy on
    whose identity may list (core.repository.repository_access) is the caller's: the operator's pinner
    applies it before it calls this; the CLI lists with the caller's own identity.
    """
    return _pin(repository, models, credentials, store, pvc_root, versioning=True, max_objects=max_objects)


def pin_repository(
    repository: Any,
    models: Sequence[Any],
    credentials: Mapping[str, str],
    *,
    store: ObjectStore | None = None,
    pvc_root: str | Path | None = None,
    max_objects: int | None = None,
) -> Manifest:
    """List the repository and pin what the models' version policies select.

    ``models`` are the spec's ModelSpecs (or ModelSources). Raises SelectionFailed (errors as
    data: ModelFolderMissing, VersionMissing, UnsafeKey), a StoreError subclass for the store's
    failures, or ModelConfigError for a bad versionPolicy. A pvc:// repository without a mount
    gives an unpinned manifest. Blocking: the operator calls it in a thread. ``max_objects``:
    the listing stops at one object more and raises ListingTooLarge (None: no cap).
    """
    return _pin(
        repository, models, credentials, store, pvc_root, versioning=False, max_objects=max_objects
    ).manifest


def _pin(
    repository: Any,
    models: Sequence[Any],
    credentials: Mapping[str, str],
    store: ObjectStore | None,
    pvc_root: str | Path | None,
    *,
    versioning: bool,
    max_objects: int | None = None,
) -> PinResult:
    ref = _ref(repository)
    sources = [m for m in models if isinstance(m, ModelSource)]
    if len(sources) != len(models):
        sources = model_sources(models)
    if parse_repository_uri(ref.uri).scheme == "pvc" and store is None and pvc_root is None:
        return PinResult(unpinned_manifest(ref, sources), None)
    own = store is None
    opened = store or open_store(ref, credentials, pvc_root=pvc_root)
    try:
        listing = capped(opened.list(opened.prefix), max_objects, opened.uri)
        selection = select_objects(sources, listing, prefix=opened.prefix)
        if selection.ok:
            # Only the selected objects: an S3 store asks each one what its ETag stands for.
            selection = selection.with_objects(
                opened.trusted([s.obj for m in selection.models for s in m.objects])
            )
        manifest = build_manifest(ref, selection)
        versioned = opened.versioned() if versioning else None
    finally:
        if own:
            opened.close()
    return PinResult(manifest, versioned)


def capped(listing: Iterator[ObjectInfo], max_objects: int | None, uri: str) -> list[ObjectInfo]:
    """The objects of a streamed listing, taking at most one more than ``max_objects``: past it the
    listing is closed (no further page is asked for) and ListingTooLarge raised. None: no cap."""
    if max_objects is None:
        return list(listing)
    taken = list(itertools.islice(listing, max_objects + 1))
    if len(taken) > max_objects:
        close = getattr(listing, "close", None)
        if close is not None:
            close()
        raise ListingTooLarge(uri, max_objects)
    return taken
