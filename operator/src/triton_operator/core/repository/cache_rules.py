"""The node cache's rules: which pinned objects it may keep, their keys, callers, leases and eviction.

The node cache (`triton-operator node-cache`, one per node) keeps each object's bytes once, named by
the SHA-256 it computed over them when it took them (a *blob*). A namespace reaches a blob only
through its own index, ``(namespace, kind/checksum) -> sha256``, written when a pod of that namespace
uploaded the bytes and the cache checked them against ``kind/checksum``. So no key, weak or strong,
crosses a namespace: bytes a pod of X uploads under ``md5(A)`` are never found by a pod of Y, and
identical files of two namespaces share one blob on disk. The public key of an object is its
checksum kind and value, ``md5/<32 hex>``; only kinds that are digests of the bytes qualify, so that
the cache can check an upload itself:

- ``sha256``, ``sha1`` and ``md5`` (S3's single-part ETag, GCS's md5Hash, Azure's Content-MD5);
  MD5 and SHA-1 collisions can be made, which is why their keys stay inside one namespace;
- ``s3-multipart`` (an S3 multipart upload's ETag, the MD5 of its parts' MD5s, and their count): the
  uploader names the part size it checked with, the cache checks with it too and records it with
  the index entry, and a reader checks with the part size its store gives;
- not ``crc32c``/``crc32``: a CRC is linear, anyone can make bytes with a chosen CRC;
- not ``none``: nothing to check the bytes against.

Callers: every request but health and metrics carries a pod-bound ServiceAccount token of audience
``AUDIENCE``; a TokenReview gives the namespace and pod (``caller_from_review``).

Leases: a pod names the objects it holds, with their sizes (POST /v1/leases); a blob named through
a live lease is never evicted, and a pod uploads only objects its live lease names, of the leased
size. A lease is bounded in objects and bytes (``check_lease``) and ends at the earliest of its TTL
and its token's expiry. Eviction takes the least recently used of the rest until what is kept, plus
what is being written, fits the size limit.

Claims: a lease that names the objects its pod reads from its store where the node lacks them
(``"fetch": [key, ...]``) claims each that the namespace does not hold and no other pod claims;
another such lease of the namespace is told those objects are ``coming`` and waits (POST /v1/waits)
for the upload instead of reading its store too. A claim ends with an upload of its object, with
its pod's lease, or at its deadline (``claim_seconds``), so a claimant that never uploads only
delays its own namespace.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

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
TOKEN_ENV = "TRITON_NODE_CACHE_TOKEN"
"""The sync container's variable holding the path of its projected token for the node cache."""
PUBLIC_KEY_ENV = "TRITON_NODE_CACHE_PUBLIC_KEY"
"""The sync container's variable holding the node cache's public key (base64 of its 32 Ed25519
bytes): with it, a sync checks the cache's bytes against a SHA-256 the cache signed (``statement``)."""
STATEMENT_TAG = "triton-node-cache-statement/1"
"""The first line's tag of a statement naming each object's SHA-256 (the blob's name)."""
BLAKE3_STATEMENT_TAG = "triton-node-cache-statement/2"
"""The tag of a statement naming each object's BLAKE3 (computed by the cache with its SHA-256): a
pod checks the bytes against that, four times cheaper than SHA-256. Another tag, so that neither
statement's signature passes for the other."""
AUDIENCE = "triton-operator-node-cache"
"""The audience of the pods' projected token: the node cache's TokenReview asks for it, so a token
made for the API server (or anything else) is refused."""
TOKEN_VOLUME = "node-cache-token"
TOKEN_DIR = "/var/run/secrets/triton-operator/node-cache"
TOKEN_PATH = f"{TOKEN_DIR}/token"
TOKEN_SECONDS = 86400
"""The projected token's life asked of the kubelet (it renews it at 80 %); a lease ends with it."""

MAX_LEASE_OBJECTS = 100_000
"""The most objects one lease may name (a manifest holds at most 100 000 by default)."""
MAX_LEASE_BODY = 16 * 1024 * 1024
"""The largest lease body (100 000 sha256 entries with sizes take about 9 MiB)."""

POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
NAMESPACE_FORM = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
BLOB_FORM = re.compile(r"^[0-9a-f]{64}$")


def statement(pod: str, objects: Iterable[tuple[str, int, str]], tag: str = STATEMENT_TAG) -> bytes:
    """What the cache signs for pod ``pod`` (its lease's uid) in one lease answer: for each
    ``(key, size, digest)``, the bytes whose SHA-256 (``tag`` STATEMENT_TAG: the blob's name) or
    BLAKE3 (BLAKE3_STATEMENT_TAG) is ``digest`` are the ``size`` bytes of ``key`` (``<kind>/<pin>``),
    as the cache checked them when it took them. Bound to the pod, so that no pod of another
    namespace takes it; one line an object, in key order (no field holds a space).

    >>> statement("u1", [("md5/" + "0" * 32, 5, "ab")], BLAKE3_STATEMENT_TAG).decode().split()[:2]
    ['triton-node-cache-statement/2', 'u1']
    """
    lines = "".join(f"{key} {size} {digest}\n" for key, size, digest in sorted(objects))
    return f"{tag} {pod}\n{lines}".encode()


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
    """A pod's claim on objects: none of ``keys`` (public keys, inside ``namespace``) is evicted
    before ``expires`` (epoch seconds); ``sizes``: the size the pod declared for each key."""

    pod: str
    keys: frozenset[str]
    expires: float
    namespace: str = ""
    sizes: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Caller:
    """Who asks: a pod, as the API server's TokenReview of its token said."""

    namespace: str
    pod: str  # the pod's uid
    pod_name: str


class NotAllowed(Exception):  # noqa: N818 - an answer to a caller
    """A caller or request the cache refuses; ``status``: the HTTP status it answers with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


RANGE_FORM = re.compile(r"bytes=([0-9]{1,19})-([0-9]{0,19})")


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The bytes ``start``..``end`` (end excluded) that a ``Range`` header asks of an object of
    ``size`` bytes; None without one (the whole object). One range ``bytes=a-b`` or ``bytes=a-``
    only (what the pod's client sends); anything else, or a range outside the object: NotAllowed
    416."""
    if header is None:
        return None
    match = RANGE_FORM.fullmatch(header.strip())
    if match is None:
        raise NotAllowed(416, "Range: one range 'bytes=START-END' or 'bytes=START-' only")
    start = int(match[1])
    end = int(match[2]) + 1 if match[2] else size
    if start >= size or end <= start:
        raise NotAllowed(416, f"Range: {header.strip()} is not within the object's {size} bytes")
    return start, min(end, size)


def _first(extra: Mapping[str, Sequence[str]], name: str) -> str:
    values = extra.get(name) or []
    return str(values[0]) if values else ""


def caller_from_review(username: str, extra: Mapping[str, Sequence[str]], node: str = "") -> Caller:
    """The caller a successful TokenReview names: a ServiceAccount's pod-bound token (namespace from
    the username, pod from the extras), of this ``node`` when the review names one; else NotAllowed.

    >>> caller_from_review("system:serviceaccount:team-a:default",
    ...     {POD_NAME_EXTRA: ["p"], POD_UID_EXTRA: ["u1"]})
    Caller(namespace='team-a', pod='u1', pod_name='p')
    """
    if not username.startswith(SERVICE_ACCOUNT_PREFIX):
        raise NotAllowed(401, "the node cache takes only a pod's ServiceAccount token")
    namespace = username.removeprefix(SERVICE_ACCOUNT_PREFIX).split(":", 1)[0]
    pod, pod_name = _first(extra, POD_UID_EXTRA), _first(extra, POD_NAME_EXTRA)
    if not NAMESPACE_FORM.fullmatch(namespace) or not pod or not pod_name:
        raise NotAllowed(401, "the node cache takes only a token bound to a pod (a projected token)")
    token_node = _first(extra, NODE_NAME_EXTRA)
    if node and token_node and token_node != node:
        raise NotAllowed(403, f"pod {namespace}/{pod_name} runs on node {token_node}, not on {node}")
    return Caller(namespace, pod, pod_name)


def token_claims(token: str) -> dict[str, object]:
    """The unverified claims of a JWT (only to refuse the obviously wrong before a TokenReview, and
    to read the expiry of one the review accepted); {} when it is not a JWT."""
    parts = token.split(".")
    if len(parts) != 3 or len(token) > 16 * 1024:
        return {}
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, UnicodeDecodeError):
        return {}
    return claims if isinstance(claims, dict) else {}


def token_refusal(token: str, audience: str, now: float) -> str | None:
    """Why a token cannot pass the review, read from its unverified claims (no API call spent on
    it), or None when only the review can tell.

    >>> token_refusal("not-a-jwt", AUDIENCE, 0.0)
    'not a JWT'
    """
    claims = token_claims(token)
    if not claims:
        return "not a JWT"
    aud = claims.get("aud")
    audiences = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
    if audience not in audiences:
        return f"not a token for audience {audience}"
    exp = claims.get("exp")
    if isinstance(exp, int | float) and exp <= now:
        return "expired"
    return None


def token_expiry(token: str) -> float | None:
    exp = token_claims(token).get("exp")
    return float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None


def parse_lease(body: object) -> list[tuple[str, str, int]]:
    """The objects a lease body names, ``{"objects": [[kind, checksum, size], ...]}`` (a ``pod``
    field, if any, is checked by the caller); NotAllowed (400/413) naming what is wrong.

    >>> parse_lease({"objects": [["md5", "0" * 32, 5]]})
    [('md5', '00000000000000000000000000000000', 5)]
    """
    if not isinstance(body, dict) or not isinstance(body.get("objects"), list):
        raise NotAllowed(400, 'a lease is {"pod": uid, "objects": [[kind, checksum, size], ...]}')
    objects = body["objects"]
    if len(objects) > MAX_LEASE_OBJECTS:
        raise NotAllowed(413, f"objects: {len(objects)} objects, a lease names at most {MAX_LEASE_OBJECTS}")
    out: list[tuple[str, str, int]] = []
    for i, item in enumerate(objects):
        if (
            not isinstance(item, list)
            or len(item) != 3
            or not isinstance(item[0], str)
            or not isinstance(item[1], str)
            or not isinstance(item[2], int)
            or isinstance(item[2], bool)
            or item[2] < 0
        ):
            raise NotAllowed(400, f"objects[{i}]: expected [kind, checksum, size in bytes]")
        out.append((item[0], item[1], item[2]))
    return out


def check_lease(objects: Sequence[tuple[str, str, int]], max_bytes: int) -> dict[str, int]:
    """The keys a lease holds with their sizes (objects that are not cacheable are left out);
    NotAllowed (413) when they add up to more than ``max_bytes``, the most one pod may hold.

    >>> check_lease([("md5", "0" * 32, 5), ("crc32c", "0" * 8, 7)], 10)
    {'md5/00000000000000000000000000000000': 5}
    """
    sizes: dict[str, int] = {}
    for kind, checksum, size in objects:
        key = object_key(kind, checksum)
        if key is not None:
            sizes[key] = size
    total = sum(sizes.values())
    if total > max_bytes:
        raise NotAllowed(413, f"a lease of {total} bytes: one pod may hold at most {max_bytes}")
    return sizes


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


CLAIM_BASE_SECONDS = 15.0
CLAIM_BYTES_PER_SECOND = 25 * 1024 * 1024
"""A claim lasts ``CLAIM_BASE_SECONDS`` plus its object's size at this rate (its pod's read from its
store and its upload), then ends whether or not the bytes came."""
MAX_WAIT_BODY = 1024 * 1024
"""A wait's body (the keys it waits for) is at most this many bytes."""
WAIT_SECONDS = 20.0
"""The longest one wait is answered after (nothing settled: an empty answer; the pod asks again)."""


@dataclass(frozen=True)
class Claim:
    """``pod`` reads an object its namespace's index lacks from its store and will upload it; others
    of the namespace wait for that until ``until`` (epoch seconds)."""

    pod: str
    until: float


def claim_seconds(size: int) -> float:
    """How long a claim on an object of ``size`` bytes lasts.

    >>> claim_seconds(0), claim_seconds(500 * 1024 * 1024)
    (15.0, 35.0)
    """
    return CLAIM_BASE_SECONDS + size / CLAIM_BYTES_PER_SECOND


def claim_holds(claim: Claim, lease: Lease | None, key: str, now: float) -> bool:
    """Whether ``claim`` on ``key`` still holds at ``now``: before its deadline, with its pod's
    ``lease`` live and naming the key.

    >>> lease, claim = Lease("p", frozenset({"md5/x"}), 100.0), Claim("p", 50.0)
    >>> claim_holds(claim, lease, "md5/x", 10.0), claim_holds(claim, lease, "md5/x", 60.0)
    (True, False)
    >>> claim_holds(claim, lease, "md5/y", 10.0), claim_holds(claim, None, "md5/x", 10.0)
    (False, False)
    """
    return claim.until > now and lease is not None and lease.expires > now and key in lease.keys


def parse_wait(body: object) -> list[str]:
    """The keys a wait body names, ``{"keys": ["kind/checksum", ...]}``; NotAllowed (400) naming
    what is wrong (whether the pod's lease names them is the caller's to check).

    >>> parse_wait({"keys": ["md5/" + "0" * 32]})
    ['md5/00000000000000000000000000000000']
    >>> parse_wait({"keys": []})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    triton_operator.core.repository.cache_rules.NotAllowed: a wait is {"keys": [...]}, at least one
    """
    if not isinstance(body, dict) or not isinstance(body.get("keys"), list) or not body["keys"]:
        raise NotAllowed(400, 'a wait is {"keys": ["kind/checksum", ...]}, at least one')
    return parse_keys(body["keys"], "keys")


def parse_keys(value: object, name: str) -> list[str]:
    """``value``, a list of keys the cache keeps (field ``name`` of a body); NotAllowed (400) naming
    the first that is not one.

    >>> parse_keys(["crc32c/00000000"], "fetch")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    triton_operator.core.repository.cache_rules.NotAllowed: fetch[0]: 'crc32c/00000000' is not a key...
    """
    if not isinstance(value, list):
        raise NotAllowed(400, f'{name}: expected a list of keys, ["kind/checksum", ...]')
    out: list[str] = []
    for i, key in enumerate(value):
        kind, _, checksum = key.partition("/") if isinstance(key, str) else ("", "", "")
        if object_key(kind, checksum) != key:
            raise NotAllowed(400, f"{name}[{i}]: {key!r} is not a key the cache keeps")
        out.append(key)
    return out


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
