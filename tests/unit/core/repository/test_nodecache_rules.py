"""The node cache's pure rules (core.repository.cache_rules): which objects it keeps, leases, and what it
evicts."""

from __future__ import annotations

import base64
import json

import pytest

from triton_operator.core.repository.cache_rules import (
    AUDIENCE,
    MAX_LEASE_OBJECTS,
    NODE_NAME_EXTRA,
    POD_NAME_EXTRA,
    POD_UID_EXTRA,
    CachedObject,
    Caller,
    Lease,
    NotAllowed,
    caller_from_review,
    check_lease,
    choose_evictions,
    leased_keys,
    live_leases,
    object_key,
    parse_lease,
    parse_range,
    token_refusal,
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


# ----------------------------------------------------------------- callers and leases

REVIEWED_EXTRA = {POD_NAME_EXTRA: ["web-0"], POD_UID_EXTRA: ["uid-1"], NODE_NAME_EXTRA: ["node-a"]}


def test_a_caller_is_a_pod_of_a_namespace_as_the_review_says() -> None:
    caller = caller_from_review("system:serviceaccount:team-a:default", REVIEWED_EXTRA, "node-a")
    assert caller == Caller("team-a", "uid-1", "web-0")
    # A cluster that does not name the node in the review: accepted on its namespace and pod.
    no_node = {k: v for k, v in REVIEWED_EXTRA.items() if k != NODE_NAME_EXTRA}
    assert caller_from_review("system:serviceaccount:team-a:default", no_node, "node-a").pod == "uid-1"


@pytest.mark.parametrize(
    ("username", "extra", "status"),
    [
        ("kubernetes-admin", REVIEWED_EXTRA, 401),  # not a ServiceAccount
        ("system:serviceaccount:team-a:default", {}, 401),  # a token bound to no pod
        ("system:serviceaccount:Team_A:default", REVIEWED_EXTRA, 401),  # no namespace name
        ("system:serviceaccount:team-a:default", {**REVIEWED_EXTRA, NODE_NAME_EXTRA: ["node-b"]}, 403),
    ],
)
def test_anything_but_a_pod_of_this_node_is_refused(
    username: str, extra: dict[str, list[str]], status: int
) -> None:
    with pytest.raises(NotAllowed) as refused:
        caller_from_review(username, extra, "node-a")
    assert refused.value.status == status


def jwt(claims: dict[str, object]) -> str:
    payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"e30.{payload}.sig"


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        ("opaque", "not a JWT"),
        (
            jwt({"aud": ["https://kubernetes.default.svc"], "exp": 2e9}),
            f"not a token for audience {AUDIENCE}",
        ),
        (jwt({"aud": AUDIENCE, "exp": 10}), "expired"),
        (jwt({"aud": [AUDIENCE], "exp": 2e9}), None),  # only the TokenReview can tell
    ],
)
def test_obviously_wrong_tokens_are_refused_before_any_review(token: str, reason: str | None) -> None:
    assert token_refusal(token, AUDIENCE, now=1000.0) == reason


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"objects": "all"},
        {"objects": [["md5", "0" * 32]]},  # no size
        {"objects": [["md5", "0" * 32, -1]]},
        {"objects": [["md5", "0" * 32, True]]},
        {"objects": [[1, 2, 3]]},
    ],
)
def test_a_lease_names_kind_checksum_and_size_or_is_refused(body: object) -> None:
    with pytest.raises(NotAllowed) as refused:
        parse_lease(body)
    assert refused.value.status == 400


def test_a_lease_is_bounded_in_objects_and_bytes() -> None:
    with pytest.raises(NotAllowed) as refused:
        parse_lease({"objects": [["md5", "0" * 32, 1]] * (MAX_LEASE_OBJECTS + 1)})
    assert refused.value.status == 413
    sizes = check_lease([("md5", "0" * 32, 60), ("sha1", "1" * 40, 40), ("crc32c", "0" * 8, 10**9)], 100)
    assert sizes == {f"md5/{'0' * 32}": 60, f"sha1/{'1' * 40}": 40}  # a CRC is not cached, not counted
    with pytest.raises(NotAllowed, match="at most 99"):
        check_lease([("md5", "0" * 32, 60), ("sha1", "1" * 40, 40)], 99)


def test_a_range_is_one_span_within_the_object() -> None:
    assert parse_range(None, 100) is None
    assert parse_range("bytes=0-99", 100) == (0, 100)
    assert parse_range("bytes=10-19", 100) == (10, 20)
    assert parse_range("bytes=90-", 100) == (90, 100)
    assert parse_range("bytes=90-1000", 100) == (90, 100)  # clipped to the object, as HTTP says


@pytest.mark.parametrize(
    "header", ["bytes=100-", "bytes=5-4", "bytes=-10", "bytes=0-1,3-4", "items=0-1", "bytes=a-b", ""]
)
def test_any_other_range_is_refused_with_416(header: str) -> None:
    with pytest.raises(NotAllowed) as refused:
        parse_range(header, 100)
    assert refused.value.status == 416
    assert "Range" in str(refused.value)
