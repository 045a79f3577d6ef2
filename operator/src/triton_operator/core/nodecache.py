"""The node cache's rules: which pinned objects it may keep, their keys, leases and what to evict.

The node cache (`triton-operator node-cache`, one per node) keeps objects by content: the key of an
object is its checksum kind and value, ``sha256/<64 hex>``. Only kinds that are cryptographic digests
of the bytes qualify, so that the cache can check an upload itself and no pod can make it hand
another pod bytes that the other pod's pinned checksum would accept:

- ``sha256``, ``sha1`` and ``md5`` (S3's single-part ETag, GCS's md5Hash, Azure's Content-MD5): no
  one can make other bytes with the digest of a given object (a second preimage), for any of the three;
- ``s3-multipart`` (an S3 multipart upload's ETag, the MD5 of its parts' MD5s, and their count): the
  uploader names the part size it checked with, the cache checks with it too, and a reader checks
  with the part size its store gives; other bytes with the same ETag, at any part size, would need
  an MD5 second preimage as well;
- not ``crc32c``/``crc32``: a CRC is linear, anyone can make bytes with a chosen CRC, so a pod could
  upload its own bytes under another model's CRC and the other pod's check would pass;
- not ``none``: nothing to check the bytes against.

Leases: a pod that syncs a revision names the objects it holds (POST /v1/leases); an object named by
a lease younger than the lease TTL is never evicted. Eviction takes the least recently used of the
rest until what is kept, plus what is being written, fits the size limit.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

CACHEABLE_KINDS: Mapping[str, re.Pattern[str]] = {
    "sha256": re.compile(r"^[0-9a-f]{64}$"),
    "sha1": re.compile(r"^[0-9a-f]{40}$"),
    "md5": re.compile(r"^[0-9a-f]{32}$"),
    "s3-multipart": re.compile(r"^[0-9a-f]{32}-[1-9][0-9]{0,4}$"),
}
"""The checksum kinds the node cache keeps, with the form of their value."""
PART_SIZED_KINDS = frozenset({"s3-multipart"})
"""Kinds whose check needs the upload's part size besides the bytes."""

HOST_ENV = "TRITON_NODE_CACHE_HOST"
"""The sync container's variable holding the node's address (the downward API's status.hostIP)."""
PORT_ENV = "TRITON_NODE_CACHE_PORT"
"""The sync container's variable holding the node cache's port; set only when the cache is on."""
POD_ENV = "TRITON_NODE_CACHE_POD"
"""The sync container's variable holding its pod's uid (metadata.uid): the name of its lease."""

MAX_LEASE_OBJECTS = 200_000
"""The most objects one lease may name (a manifest holds at most 100 000 by default)."""


def object_key(kind: str, checksum: str) -> str | None:
    """``kind/checksum`` for an object the cache may keep, None for any other (a CRC, no checksum, a
    value that is not the kind's lower-case hex form).

    >>> object_key("md5", "0" * 32), object_key("crc32c", "0" * 8), object_key("sha1", "AB" * 20)
    ('md5/00000000000000000000000000000000', None, None)
    """
    form = CACHEABLE_KINDS.get(kind)
    if form is None or not form.fullmatch(checksum):
        return None
    return f"{kind}/{checksum}"


@dataclass(frozen=True)
class CachedObject:
    """One object the cache keeps: its key, its size in bytes and when it was last used (stored or
    read), in seconds since the epoch."""

    key: str
    size: int
    last_used: float


@dataclass(frozen=True)
class Lease:
    """A pod's claim on objects: none of ``keys`` is evicted before ``expires`` (epoch seconds)."""

    pod: str
    keys: frozenset[str]
    expires: float


def leased_keys(leases: Iterable[Lease], now: float) -> frozenset[str]:
    """The keys of every lease still live at ``now``."""
    out: set[str] = set()
    for lease in leases:
        if lease.expires > now:
            out |= lease.keys
    return frozenset(out)


def live_leases(leases: Mapping[str, Lease], now: float) -> dict[str, Lease]:
    """``leases`` (by pod) without those expired at ``now``."""
    return {pod: lease for pod, lease in leases.items() if lease.expires > now}


def choose_evictions(
    objects: Sequence[CachedObject], leased: frozenset[str], used: int, limit: int, incoming: int
) -> list[str] | None:
    """The keys to evict, least recently used first, so that ``incoming`` more bytes fit ``limit``
    with ``used`` bytes taken (kept objects and writes in progress); leased objects are never chosen.
    None when it cannot fit even after evicting every object that is not leased (or ``incoming``
    alone is over the limit): then nothing is to be evicted, and the write is refused.

    >>> objs = [CachedObject("a", 4, 1.0), CachedObject("b", 4, 2.0), CachedObject("c", 4, 0.5)]
    >>> choose_evictions(objs, frozenset({"c"}), used=12, limit=12, incoming=5)
    ['a', 'b']
    >>> choose_evictions(objs, frozenset({"c", "b"}), used=12, limit=12, incoming=5) is None
    True
    """
    if incoming > limit:
        return None
    excess = used + incoming - limit
    if excess <= 0:
        return []
    chosen: list[str] = []
    for obj in sorted(objects, key=lambda o: (o.last_used, o.key)):
        if obj.key in leased:
            continue
        chosen.append(obj.key)
        excess -= obj.size
        if excess <= 0:
            return chosen
    return None
