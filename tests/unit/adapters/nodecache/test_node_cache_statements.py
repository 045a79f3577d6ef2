"""The node cache's signed statements (adapters.nodecache.statements) and the client's use of them:
a statement is taken only with the pod's public key, for its own uid, pin and size."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from triton_operator.adapters.nodecache.client import NodeCacheClient
from triton_operator.adapters.nodecache.statements import BadKeyError, Signer, Verifier
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

    def vouched(pod: str, objects: list[tuple[str, int, str]], held: set[str]) -> dict[str, str]:
        client = NodeCacheClient("http://127.0.0.1:1", "uid-1", public_key=cache.public_key())
        client.held_keys = frozenset(held)
        answer = {"objects": {k: blob for k, _, blob in objects}, "signature": cache.sign(pod, objects)}
        client.vouched_keys = client._vouched(entries, answer)
        assert client.statements_refused == (0 if client.vouched_keys else 1)
        return {e.key: v for e in entries if (v := client.vouched(e)) is not None}

    good = [(KEY, 9, BLOB), (b, 5, OTHER)]
    assert vouched("uid-1", good, {KEY, b, c}) == {"m/1/a": BLOB, "m/1/b": OTHER}
    assert vouched("uid-2", good, {KEY, b, c}) == {}  # signed for another pod
    assert vouched("uid-1", [(KEY, 9, BLOB), (c, 8, OTHER)], {KEY, b, c}) == {}  # c is 7 bytes pinned
    assert vouched("uid-1", good, {KEY}) == {}  # b is not held
    # Without the public key, nothing is vouched: every byte is checked against its pin.
    assert NodeCacheClient("http://127.0.0.1:1", "uid-1", public_key="").verifier is None


def test_a_bad_public_key_is_named() -> None:
    with pytest.raises(ValueError, match="TRITON_NODE_CACHE_PUBLIC_KEY: an Ed25519 key is 32 bytes"):
        NodeCacheClient("http://127.0.0.1:1", "uid-1", public_key=base64.b64encode(b"k" * 16).decode())
