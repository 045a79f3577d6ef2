"""The node cache's signed statements (adapters.nodecache.statements) and the client's use of them:
a statement is taken only with the pod's public key, for its own uid, pin and size."""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

import blake3
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from triton_operator.adapters.nodecache.client import NodeCacheClient
from triton_operator.adapters.nodecache.statements import BadKeyError, Signer, Verifier
from triton_operator.adapters.sync.hashing import make_hasher
from triton_operator.core.repository.cache_rules import BLAKE3_STATEMENT_TAG
from triton_operator.core.repository.manifest import ManifestEntry

BLOB = hashlib.sha256(b"the bytes").hexdigest()
OTHER = hashlib.sha256(b"other bytes").hexdigest()
KEY = "md5/" + hashlib.md5(b"the bytes", usedforsecurity=False).hexdigest()
OTHER_KEY = "md5/" + hashlib.md5(b"other bytes", usedforsecurity=False).hexdigest()


def signer() -> Signer:
    return Signer(Ed25519PrivateKey.generate())


def test_a_statement_verifies_only_as_signed() -> None:
    cache = signer()
    pod = Verifier.from_text(cache.public_key(), "test")
    said = [(KEY, 9, BLOB), (OTHER_KEY, 11, OTHER)]
    sig = cache.sign("uid-1", said)
    assert pod.verify("uid-1", said, sig)
    assert pod.verify("uid-1", list(reversed(said)), sig)  # one statement, whatever the order
    # Another pod (of any namespace), pin, size or SHA-256, one object more or less: refused.
    assert not pod.verify("uid-2", said, sig)
    assert not pod.verify("uid-1", [("md5/" + "0" * 32, 9, BLOB), said[1]], sig)
    assert not pod.verify("uid-1", [(KEY, 10, BLOB), said[1]], sig)
    assert not pod.verify("uid-1", [(KEY, 9, OTHER), said[1]], sig)
    assert not pod.verify("uid-1", said[:1], sig)
    assert not pod.verify("uid-1", [*said, ("md5/" + "e" * 32, 1, BLOB)], sig)
    # Another key's signature (an impostor's), or no signature at all.
    assert not pod.verify("uid-1", said, signer().sign("uid-1", said))
    assert not pod.verify("uid-1", said, "not base64!")
    assert not pod.verify("uid-1", said, base64.b64encode(b"x" * 64).decode())


def test_keys_are_read_from_pem_or_base64_and_bad_ones_named(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    pem = tmp_path / "key.pem"
    pem.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    raw = tmp_path / "key.b64"
    raw.write_text(
        base64.b64encode(
            key.private_bytes(
                serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
            )
        ).decode()
    )
    assert Signer.from_file(pem).public_key() == Signer.from_file(raw).public_key()
    short = tmp_path / "short"
    short.write_text(base64.b64encode(b"x" * 31).decode())
    with pytest.raises(BadKeyError, match="32 bytes"):
        Signer.from_file(short)
    with pytest.raises(BadKeyError, match="missing"):
        Signer.from_file(tmp_path / "missing")
    with pytest.raises(BadKeyError, match="TRITON_NODE_CACHE_PUBLIC_KEY: not base64"):
        Verifier.from_text("***", "TRITON_NODE_CACHE_PUBLIC_KEY")


def test_the_client_takes_statements_only_for_its_pod_held_pins_and_sizes() -> None:
    cache = signer()
    b, c = "md5/" + "b" * 32, "md5/" + "c" * 32
    entries = [
        ManifestEntry("m/1/a", "m/1/a", 9, "md5", KEY.removeprefix("md5/")),
        ManifestEntry("m/1/b", "m/1/b", 5, "md5", "b" * 32),
        ManifestEntry("m/1/c", "m/1/c", 7, "md5", "c" * 32),
    ]

    def vouched(pod: str, objects: list[tuple[str, int, str]], held: set[str]) -> dict[str, tuple[str, str]]:
        client = NodeCacheClient("http://127.0.0.1:1", "uid-1", public_key=cache.public_key())
        client.held_keys = frozenset(held)
        answer = {"objects": {k: blob for k, _, blob in objects}, "signature": cache.sign(pod, objects)}
        client.vouched_keys = client._vouched(entries, answer)
        assert client.statements_refused == (0 if client.vouched_keys else 1)
        return {e.key: v for e in entries if (v := client.vouched(e)) is not None}

    good = [(KEY, 9, BLOB), (b, 5, OTHER)]
    assert vouched("uid-1", good, {KEY, b, c}) == {"m/1/a": ("sha256", BLOB), "m/1/b": ("sha256", OTHER)}
    assert vouched("uid-2", good, {KEY, b, c}) == {}  # signed for another pod
    assert vouched("uid-1", [(KEY, 9, BLOB), (c, 8, OTHER)], {KEY, b, c}) == {}  # c is 7 bytes pinned
    assert vouched("uid-1", good, {KEY}) == {}  # b is not held
    # Without the public key, nothing is vouched: every byte is checked against its pin.
    assert NodeCacheClient("http://127.0.0.1:1", "uid-1", public_key="").verifier is None


def test_a_bad_public_key_is_named() -> None:
    with pytest.raises(ValueError, match="TRITON_NODE_CACHE_PUBLIC_KEY: an Ed25519 key is 32 bytes"):
        NodeCacheClient("http://127.0.0.1:1", "uid-1", public_key=base64.b64encode(b"k" * 16).decode())


B3 = blake3.blake3(b"the bytes").hexdigest()
OTHER_B3 = blake3.blake3(b"other bytes").hexdigest()


def test_a_blake3_statement_and_a_sha256_one_never_pass_for_each_other() -> None:
    cache = signer()
    pod = Verifier.from_text(cache.public_key(), "test")
    said = [(KEY, 9, B3)]
    sig = cache.sign("uid-1", said, BLAKE3_STATEMENT_TAG)
    assert pod.verify("uid-1", said, sig, BLAKE3_STATEMENT_TAG)
    assert not pod.verify("uid-1", said, sig)  # the same lines under the SHA-256 tag
    assert not pod.verify("uid-1", said, cache.sign("uid-1", said), BLAKE3_STATEMENT_TAG)
    assert not pod.verify("uid-2", said, sig, BLAKE3_STATEMENT_TAG)
    assert not pod.verify("uid-1", [(KEY, 9, OTHER_B3)], sig, BLAKE3_STATEMENT_TAG)


def test_the_client_checks_the_blake3_the_cache_signed_else_the_sha256() -> None:
    """A lease answer with both statements: BLAKE3 for the objects the /2 statement names, SHA-256
    for the rest; without a /2 statement (an older cache), or with one that fails, SHA-256."""
    cache = signer()
    b = "md5/" + "b" * 32
    entries = [
        ManifestEntry("m/1/a", "m/1/a", 9, "md5", KEY.removeprefix("md5/")),
        ManifestEntry("m/1/b", "m/1/b", 5, "md5", "b" * 32),
    ]
    sha = [(KEY, 9, BLOB), (b, 5, OTHER)]
    v1 = {"objects": {k: d for k, _, d in sha}, "signature": cache.sign("uid-1", sha)}

    def vouched(answer: Mapping[str, object]) -> tuple[dict[str, tuple[str, str]], int]:
        client = NodeCacheClient("http://127.0.0.1:1", "uid-1", public_key=cache.public_key())
        client.held_keys = frozenset({KEY, b})
        client.vouched_keys = client._vouched(entries, answer)
        fast = answer.get("blake3")
        client.blake3_keys = client._vouched(entries, fast, BLAKE3_STATEMENT_TAG) if fast else {}
        out = {e.key: v for e in entries if (v := client.vouched(e)) is not None}
        return out, client.statements_refused

    only_a = [(KEY, 9, B3)]  # b's blob kept from before BLAKE3: none computed yet
    v2 = {"objects": {KEY: B3}, "signature": cache.sign("uid-1", only_a, BLAKE3_STATEMENT_TAG)}
    assert vouched({**v1, "blake3": v2}) == ({"m/1/a": ("blake3", B3), "m/1/b": ("sha256", OTHER)}, 0)
    assert vouched(v1) == ({"m/1/a": ("sha256", BLOB), "m/1/b": ("sha256", OTHER)}, 0)
    forged = {"objects": {KEY: OTHER_B3}, "signature": v2["signature"]}
    assert vouched({**v1, "blake3": forged}) == ({"m/1/a": ("sha256", BLOB), "m/1/b": ("sha256", OTHER)}, 1)
    other_key = {"objects": {KEY: B3}, "signature": signer().sign("uid-1", only_a, BLAKE3_STATEMENT_TAG)}
    assert vouched({**v1, "blake3": other_key})[0]["m/1/a"] == ("sha256", BLOB)


def test_blake3_hashes_as_its_reference() -> None:
    hasher = make_hasher("blake3")
    assert hasher is not None
    data = os.urandom(3 * 1024 * 1024 + 7)
    for i in range(0, len(data), 1024 * 1024):
        hasher.update(memoryview(data)[i : i + 1024 * 1024])
    assert hasher.hexdigest() == blake3.blake3(data).hexdigest()
    empty = make_hasher("blake3")
    assert empty is not None
    # The empty input's BLAKE3-256 from the BLAKE3 paper's test vectors.
    assert empty.hexdigest() == "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
