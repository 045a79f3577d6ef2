"""Signed statements of the node cache: "the bytes whose SHA-256 (or BLAKE3) is S match pin P", to a pod."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from triton_operator.core.repository.cache_rules import STATEMENT_TAG, statement

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey


class BadKeyError(ValueError):
    """A signing or public key that cannot be read; the message names what is wrong."""


class Signer:
    """The node cache's Ed25519 key: signs statements for the pods (``--signing-key``)."""

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key

    @classmethod
    def from_file(cls, path: Path) -> Signer:
        """An Ed25519 private key from ``path``: PEM (PKCS#8, e.g. `openssl genpkey -algorithm
        ed25519`) or the base64 of its 32 raw bytes."""
        from cryptography.hazmat.primitives import serialization  # noqa: PLC0415
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: PLC0415

        try:
            data = path.read_bytes()
        except OSError as exc:
            raise BadKeyError(f"{path}: {exc.strerror or exc}") from exc
        if b"-----BEGIN" in data:
            try:
                key = serialization.load_pem_private_key(data, password=None)
            except (ValueError, TypeError) as exc:
                raise BadKeyError(f"{path}: not a PEM private key without a password: {exc}") from exc
            if not isinstance(key, Ed25519PrivateKey):
                raise BadKeyError(f"{path}: an Ed25519 key is needed, not {type(key).__name__}")
            return cls(key)
        raw = _raw_key(data.decode("ascii", "replace").strip(), f"{path}")
        return cls(Ed25519PrivateKey.from_private_bytes(raw))

    def public_key(self) -> str:
        """The public key as the pods are given it: base64 of its 32 raw bytes."""
        from cryptography.hazmat.primitives import serialization  # noqa: PLC0415

        raw = self._key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return base64.b64encode(raw).decode()

    def sign(self, pod: str, objects: Iterable[tuple[str, int, str]], tag: str = STATEMENT_TAG) -> str:
        """The base64 signature of the statement (``tag``: which digest it names) for ``pod`` that
        each (key, size, digest) holds: one signature a lease answer, whatever its number of objects."""
        return base64.b64encode(self._key.sign(statement(pod, objects, tag))).decode()


class Verifier:
    """A pod's check of the cache's statements with the public key the operator gave it."""

    def __init__(self, key: Ed25519PublicKey) -> None:
        self._key = key

    @classmethod
    def from_text(cls, text: str, where: str) -> Verifier:
        """The public key from base64 of its 32 raw bytes (``where`` names the setting)."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey  # noqa: PLC0415

        return cls(Ed25519PublicKey.from_public_bytes(_raw_key(text.strip(), where)))

    def verify(
        self, pod: str, objects: Iterable[tuple[str, int, str]], signature: str, tag: str = STATEMENT_TAG
    ) -> bool:
        """Whether ``signature`` is this key's over the statement (anything malformed: False)."""
        from cryptography.exceptions import InvalidSignature  # noqa: PLC0415

        try:
            sig = base64.b64decode(signature, validate=True)
            self._key.verify(sig, statement(pod, objects, tag))
        except (InvalidSignature, binascii.Error, ValueError):
            return False
        return True


def _raw_key(text: str, where: str) -> bytes:
    try:
        raw = base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise BadKeyError(f"{where}: not base64 ({exc})") from exc
    if len(raw) != 32:
        raise BadKeyError(f"{where}: an Ed25519 key is 32 bytes, this is {len(raw)}")
    return raw
