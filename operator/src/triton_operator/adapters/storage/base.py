"""The ObjectStore protocol that every repository backend implements, and its typed errors."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO, Protocol, runtime_checkable

from triton_operator.adapters.redaction import redacted_cause, remember_secrets, scrub
from triton_operator.core.repository.manifest import ObjectInfo

if TYPE_CHECKING:
    import requests

__all__ = [
    "AccessDenied",
    "BucketNotFound",
    "Chunk",
    "ListingTooLarge",
    "ObjectChanged",
    "ObjectInfo",
    "ObjectStore",
    "Sink",
    "StoreConfigError",
    "StoreError",
    "StoreUnavailable",
    "mount_pool",
    "pump",
    "redacted_cause",
    "remember_secrets",
]

Chunk = bytes | memoryview
# Receives the bytes of a read in order; raising from it aborts the read. A chunk is valid only
# during the call: a store may hand a view of one buffer it fills again for the next bytes, so a
# sink that keeps bytes copies them (``bytes(chunk)``).
Sink = Callable[[Chunk], None]


def pump(readinto: Callable[[memoryview], int], sink: Sink, size: int) -> int:
    """Fill one buffer of ``size`` bytes with ``readinto`` again and again, handing each filled
    piece to ``sink``, until ``readinto`` gives 0; the bytes read. Nothing is allocated or copied
    per chunk: the bytes go from the socket into the buffer, and from there to the sink."""
    buffer = memoryview(bytearray(size))
    count = 0
    while n := readinto(buffer):
        sink(buffer[:n])
        count += n
    return count


@dataclass(frozen=True)
class TransferCheck:
    """A store's own checksum of one object, verified instead of the pinned digest (kind: crc32,
    crc32c, or their ``-composite`` forms, which need the upload's ``part_size``)."""

    kind: str
    value: str
    part_size: int | None = None


class StoreError(Exception):
    """Any failure talking to a repository store; the message names the bucket, prefix or key.

    The message is redacted (adapters.redaction.scrub: the secrets of every store opened, signed
    URL parameters, auth headers) whatever it was built from: it reaches the TritonService's status,
    Events, the operator's log and the sync container's. Raise it ``from redacted_cause(exc)``.
    """

    def __init__(self, message: str) -> None:
        super().__init__(scrub(message))


class BucketNotFound(StoreError):  # noqa: N818 - the API names these
    def __init__(self, uri: str, bucket: str) -> None:
        super().__init__(f"{uri}: bucket {bucket!r} does not exist")
        self.uri = uri
        self.bucket = bucket


class AccessDenied(StoreError):  # noqa: N818 - the API names these
    def __init__(self, uri: str, detail: str) -> None:
        super().__init__(f"{uri}: access denied: {detail}")
        self.uri = uri
        self.detail = scrub(detail)


class StoreUnavailable(StoreError):  # noqa: N818 - the API names these
    def __init__(self, uri: str, detail: str) -> None:
        super().__init__(f"{uri}: store unavailable: {detail}")
        self.uri = uri
        self.detail = scrub(detail)


class StoreConfigError(StoreError):
    """The repository settings or credentials cannot work; ``field`` names which."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = scrub(problem)


class ListingTooLarge(StoreError):  # noqa: N818 - the API names these
    """The repository's prefix holds more objects than a listing may take: the listing stopped there."""

    def __init__(self, uri: str, cap: int) -> None:
        super().__init__(
            f"{uri}: more than {cap} objects under the repository's prefix; the operator lists at most "
            f"{cap} (its maxListedObjects setting): point repository.uri at a prefix that holds the models "
            "only, or raise the setting"
        )
        self.uri = uri
        self.cap = cap


class ObjectChanged(StoreError):  # noqa: N818 - the API names these
    """A pinned object no longer has the pinned etag/generation (overwritten or deleted)."""

    def __init__(self, uri: str, key: str, pinned: str, current: str) -> None:
        super().__init__(
            f"{uri}: object {key!r} changed since it was pinned: pinned {pinned}, now {current}; "
            "the revision must be pinned again"
        )
        self.uri = uri
        self.key = key
        self.pinned = pinned
        self.current = current


@runtime_checkable
class ObjectStore(Protocol):
    """A bucket (or container, or mounted claim) holding a model repository; thread-safe."""

    uri: str  # the repository URI, for messages
    bucket: str
    prefix: str  # the repository's key prefix: "" or ends with "/"

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix`` (full keys)."""
        ...

    def head(self, key: str) -> ObjectInfo | None:
        """The object's current metadata, None when it does not exist."""
        ...

    def read_range(
        self, key: str, start: int, end: int | None, sink: Sink, *, etag: str = "", generation: str = ""
    ) -> int:
        """Push bytes [start, end) of ``key`` (end None: to the end) into ``sink``; return the count.

        With ``etag``/``generation`` the read is conditional: if the object is no longer that
        one, ObjectChanged is raised (GCS reads that generation itself).
        """
        ...

    def open_range(self, key: str, start: int, end: int, *, etag: str = "", generation: str = "") -> bytes:
        """Bytes [start, end) of ``key`` in memory; conditional like read_range."""
        ...

    def get(self, key: str, dest: BinaryIO, *, etag: str = "", generation: str = "") -> int:
        """The whole object written to ``dest``; conditional like read_range."""
        ...

    def part_size(self, key: str, etag: str) -> int | None:
        """For an S3 multipart object, the size of its first part (to recompute the ETag)."""
        ...

    def transfer_check(
        self, key: str, etag: str, generation: str, part_size: int | None, pinned: str
    ) -> TransferCheck | None:
        """A CRC the store keeps of exactly this object (the read is conditional on its ``etag`` and
        ``generation``), cheaper to compute than the pinned digest; None when it keeps none or
        cannot tell, or when it cannot bind its CRC to the pinned digest ``pinned`` (S3: the digest is
        the ETag the read is conditional on; GCS: the pinned generation's MD5 is the digest).
        ``part_size``: the upload's part size when the caller knows it already."""
        ...

    def trusted(self, objects: Sequence[ObjectInfo]) -> Sequence[ObjectInfo]:
        """``objects`` (from ``list``) as far as their checksums can be trusted, in the same order.

        S3 asks each object (HEAD) whether its ETag is an MD5 of the content (not under SSE-KMS or
        SSE-C) and for its additional checksums; other stores' listings say all there is.
        """
        ...

    def versioned(self) -> bool | None:
        """Whether the bucket keeps an overwritten object readable by its pinned version/generation.

        None when the store cannot tell (no permission to read the bucket's settings, or a store
        that records it nowhere a client can read, like Azure's account setting): the listing's
        version ids then say what is pinned.
        """
        ...

    def close(self) -> None: ...


def mount_pool(session: requests.Session, max_connections: int) -> None:
    """Mount one connection pool on ``session`` for http and https, at least ``max_connections`` deep."""
    import requests.adapters  # noqa: PLC0415 - only the stores whose SDK speaks through requests load it

    adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=max(10, max_connections))
    session.mount("http://", adapter)
    session.mount("https://", adapter)


class StoreBase:
    """Shared helpers: open_range and get in terms of read_range."""

    uri: str
    bucket: str
    prefix: str

    def __init__(
        self, uri: str, bucket: str, prefix: str, credentials: Mapping[str, str] | None = None
    ) -> None:
        if credentials is not None:
            remember_secrets(credentials)  # before anything could put one into a message
        self.uri = uri
        self.bucket = bucket
        self.prefix = prefix

    def read_range(
        self, key: str, start: int, end: int | None, sink: Sink, *, etag: str = "", generation: str = ""
    ) -> int:
        raise NotImplementedError

    def open_range(self, key: str, start: int, end: int, *, etag: str = "", generation: str = "") -> bytes:
        chunks: list[bytes] = []

        def keep(chunk: Chunk) -> None:
            chunks.append(bytes(chunk))

        self.read_range(key, start, end, keep, etag=etag, generation=generation)
        return b"".join(chunks)

    def get(self, key: str, dest: BinaryIO, *, etag: str = "", generation: str = "") -> int:
        def write(data: Chunk) -> None:
            dest.write(data)

        return self.read_range(key, 0, None, write, etag=etag, generation=generation)

    def part_size(self, key: str, etag: str) -> int | None:
        return None

    def transfer_check(
        self, key: str, etag: str, generation: str, part_size: int | None, pinned: str
    ) -> TransferCheck | None:
        return None

    def trusted(self, objects: Sequence[ObjectInfo]) -> Sequence[ObjectInfo]:
        return list(objects)

    def versioned(self) -> bool | None:
        return None

    def close(self) -> None:
        return None

    def describe(self, info: ObjectInfo | None) -> str:
        """How an object's identity is shown in ObjectChanged messages."""
        if info is None:
            return "deleted"
        return f"etag {info.etag}" + (f" generation {info.generation}" if info.generation else "")
