"""Content checksums as the manifest pins them: sha256, md5, sha1, crc32c, crc32 and S3 multipart ETags."""

from __future__ import annotations

import hashlib
import zlib
from pathlib import Path
from typing import Protocol

import google_crc32c

MiB = 1024 * 1024
CHUNK = MiB  # one read or write of file contents, when hashing or copying


class Hasher(Protocol):
    def update(self, data: bytes) -> None: ...

    def hexdigest(self) -> str: ...


class _Crc32c:
    def __init__(self) -> None:
        self._c = google_crc32c.Checksum()  # type: ignore[no-untyped-call]

    def update(self, data: bytes) -> None:
        self._c.update(data)  # type: ignore[no-untyped-call]

    def hexdigest(self) -> str:
        return bytes(self._c.digest()).hex()  # type: ignore[no-untyped-call]


class _Crc32:
    """CRC-32 (zlib's, S3's ChecksumCRC32) as big-endian hex."""

    def __init__(self) -> None:
        self._value = 0

    def update(self, data: bytes) -> None:
        self._value = zlib.crc32(data, self._value)

    def hexdigest(self) -> str:
        return self._value.to_bytes(4, "big").hex()


class MultipartEtag:
    """Recomputes an S3 multipart ETag: md5 of the parts' md5s, then ``-<parts>``."""

    def __init__(self, part_size: int) -> None:
        self.part_size = part_size
        self._digests: list[bytes] = []
        self._current = hashlib.md5(usedforsecurity=False)
        self._filled = 0

    def update(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            take = min(len(view), self.part_size - self._filled)
            self._current.update(view[:take])
            self._filled += take
            view = view[take:]
            if self._filled == self.part_size:
                self._digests.append(self._current.digest())
                self._current = hashlib.md5(usedforsecurity=False)
                self._filled = 0

    def hexdigest(self) -> str:
        digests = list(self._digests)
        if self._filled or not digests:
            digests.append(self._current.digest())
        return hashlib.md5(b"".join(digests), usedforsecurity=False).hexdigest() + f"-{len(digests)}"


class PartDigests:
    """An S3 multipart ETag from parts hashed independently, in any order (parallel parts)."""

    def __init__(self, part_size: int, size: int) -> None:
        self.part_size = part_size
        self.size = size
        self.digests: list[bytes | None] = [None] * max(1, -(-size // part_size))

    def hexdigest(self) -> str:
        if any(d is None for d in self.digests):
            return "incomplete"
        joined = b"".join(d for d in self.digests if d is not None)
        return hashlib.md5(joined, usedforsecurity=False).hexdigest() + f"-{len(self.digests)}"


class RangeDigests:
    """Hashes one ranged read into a PartDigests as it streams in; the range covers whole upload parts."""

    def __init__(self, parts: PartDigests, start: int) -> None:
        self.parts = parts
        self.offset = start
        self._md5 = hashlib.md5(usedforsecurity=False)

    def update(self, data: bytes) -> None:
        part_size, view = self.parts.part_size, memoryview(data)
        while view:
            boundary = (self.offset // part_size + 1) * part_size
            take = min(len(view), boundary - self.offset)
            self._md5.update(view[:take])
            view, self.offset = view[take:], self.offset + take
            # A part ends at its boundary, or (the last one) at the end of the file.
            if self.offset in (boundary, self.parts.size):
                self.parts.digests[(self.offset - 1) // part_size] = self._md5.digest()
                self._md5 = hashlib.md5(usedforsecurity=False)


def make_hasher(kind: str, multipart_part_size: int | None = None) -> Hasher | None:
    """A hasher for a checksum kind, None when the content cannot be checked."""
    if kind == "sha256":
        return hashlib.sha256()
    if kind == "md5":
        return hashlib.md5(usedforsecurity=False)
    if kind == "sha1":
        return hashlib.sha1(usedforsecurity=False)
    if kind == "crc32c":
        return _Crc32c()
    if kind == "crc32":
        return _Crc32()
    if kind == "s3-multipart" and multipart_part_size:
        return MultipartEtag(multipart_part_size)
    return None


def hash_file(path: Path, hasher: Hasher) -> str:
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()
