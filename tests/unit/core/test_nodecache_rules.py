"""The node cache's pure rules (core.nodecache): which objects it keeps, leases, and what it evicts."""

from __future__ import annotations

import pytest

from triton_operator.core.nodecache import (
    CachedObject,
    Lease,
    choose_evictions,
    leased_keys,
    live_leases,
    object_key,
)

SHA256 = "ab" * 32


@pytest.mark.parametrize(
    ("kind", "checksum", "key"),
    [
        ("sha256", SHA256, f"sha256/{SHA256}"),
        ("sha1", "0" * 40, f"sha1/{'0' * 40}"),
        ("md5", "f" * 32, f"md5/{'f' * 32}"),
        # CRCs are no digests: bytes with any chosen CRC are easy to make.
        ("crc32c", "0a1b2c3d", None),
        ("crc32", "0a1b2c3d", None),
        # A multipart ETag (checked with the part size the uploader names); "none": nothing to check.
        ("s3-multipart", "0" * 32 + "-3", f"s3-multipart/{'0' * 32}-3"),
        ("s3-multipart", "0" * 32 + "-0", None),
        ("s3-multipart", "0" * 32, None),
        ("none", "", None),
        # Values that are not the kind's digest: wrong length, upper case, a path.
        ("sha256", SHA256[:-1], None),
        ("md5", "F" * 32, None),
        ("md5", "../" + "0" * 29, None),
        ("sha1", "0" * 39 + "/", None),
        ("SHA256", SHA256, None),
    ],
)
def test_only_digests_of_the_content_are_keys(kind: str, checksum: str, key: str | None) -> None:
    assert object_key(kind, checksum) == key


def objs(*spec: tuple[str, int, float]) -> list[CachedObject]:
    return [CachedObject(k, size, used) for k, size, used in spec]


@pytest.mark.parametrize(
    ("objects", "leased", "sizes", "evicted"),
    [
        # It fits: nothing goes.
        (objs(("a", 10, 1.0)), frozenset(), (10, 100, 90), []),
        # The least recently used go first, only as many as needed.
        (objs(("a", 10, 3.0), ("b", 10, 1.0), ("c", 10, 2.0)), frozenset(), (30, 30, 15), ["b", "c"]),
        (objs(("a", 10, 3.0), ("b", 10, 1.0), ("c", 10, 2.0)), frozenset(), (30, 30, 10), ["b"]),
        # A leased object is passed over, however old.
        (objs(("a", 10, 3.0), ("b", 10, 1.0), ("c", 10, 2.0)), frozenset({"b"}), (30, 30, 10), ["c"]),
        # Writes in progress count as used: here 20 bytes are reserved beyond the kept 20.
        (objs(("a", 10, 1.0), ("b", 10, 2.0)), frozenset(), (40, 40, 10), ["a"]),
        # It cannot fit without a leased object: refused, nothing evicted.
        (objs(("a", 10, 1.0), ("b", 10, 2.0)), frozenset({"a"}), (20, 20, 15), None),
        # Bigger than the whole cache: refused.
        (objs(), frozenset(), (0, 100, 101), None),
        # Same last use: by key, so the choice does not depend on the order given.
        (objs(("b", 10, 1.0), ("a", 10, 1.0)), frozenset(), (20, 20, 5), ["a"]),
    ],
)
def test_eviction_takes_the_least_recently_used_unleased_objects(
    objects: list[CachedObject],
    leased: frozenset[str],
    sizes: tuple[int, int, int],
    evicted: list[str] | None,
) -> None:
    """``sizes``: bytes used (kept and being written), the limit, the bytes of the write to fit."""
    used, limit, incoming = sizes
    assert choose_evictions(objects, leased, used, limit, incoming) == evicted


def test_a_lease_holds_its_objects_until_it_expires() -> None:
    leases = {"p1": Lease("p1", frozenset({"a", "b"}), 100.0), "p2": Lease("p2", frozenset({"c"}), 50.0)}
    assert leased_keys(leases.values(), 10.0) == {"a", "b", "c"}
    assert leased_keys(leases.values(), 50.0) == {"a", "b"}  # p2 expired at 50
    assert leased_keys(leases.values(), 100.0) == frozenset()
    assert set(live_leases(leases, 60.0)) == {"p1"}
