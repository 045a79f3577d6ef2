"""Content checksums: the manifest's (sha256, md5, sha1, crc32c, crc32, S3 multipart ETags), S3's CRCs
and BLAKE3 (the node cache's signed digest)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Protocol

import blake3
import google_crc32c
from isal import isal_zlib

MiB = 1024 * 1024
CHUNK = MiB  # one read or write of file contents, when hashing or copying


class Hasher(Protocol):
    def update(self, data: bytes | memoryview) -> None: ...

    def hexdigest(self) -> str: ...


class PartHasher(Protocol):
    """A hasher of one upload part (or of one range): its digest in bytes."""

    def update(self, data: bytes | memoryview) -> None: ...

    def digest(self) -> bytes: ...


class _Crc:
    """CRC-32 (zlib's, S3's ChecksumCRC32: ISA-L's carry-less multiply, 4-5 times faster than
    zlib's here) or CRC-32C (Castagnoli; GCS's crc32c, S3's ChecksumCRC32C), as big-endian hex."""

    def __init__(self, kind: str) -> None:
        self._crc32c = kind == "crc32c"
        self._value = 0

    def update(self, data: bytes | memoryview) -> None:
        if not self._crc32c:
            self._value = isal_zlib.crc32(data, self._value)
            return
        if isinstance(data, memoryview):  # google_crc32c takes bytes only
            data = data.tobytes()
        self._value = google_crc32c.extend(self._value, data)

    def value(self) -> int:
        return self._value

    def digest(self) -> bytes:
        return self._value.to_bytes(4, "big")

    def hexdigest(self) -> str:
        return self.digest().hex()


# The reflected polynomials of the two CRCs S3 and GCS give, for crc_combine.
CRC_POLYNOMIALS = {"crc32": 0xEDB88320, "crc32c": 0x82F63B78}
# S3's composite checksums of a multipart upload: the CRC of its parts' CRCs (big-endian), ``-<parts>``.
COMPOSITE_KINDS = {"crc32-composite": "crc32", "crc32c-composite": "crc32c"}
PART_SIZED_KINDS = frozenset({"s3-multipart", *COMPOSITE_KINDS})
"""Kinds whose check needs the upload's part size besides the bytes."""


def _gf2_times(matrix: list[int], vector: int) -> int:
    total, i = 0, 0
    while vector:
        if vector & 1:
            total ^= matrix[i]
        vector >>= 1
        i += 1
    return total


def _gf2_square(matrix: list[int]) -> list[int]:
    return [_gf2_times(matrix, row) for row in matrix]


def crc_combine(kind: str, crc1: int, crc2: int, len2: int) -> int:
    """The CRC of A+B from the CRC of A, the CRC of B and B's length (zlib's crc32_combine, for
    either polynomial): ranges hashed in parallel give the whole file's CRC without reading it again.

    >>> import zlib
    >>> crc_combine("crc32", zlib.crc32(b"ab"), zlib.crc32(b"cd"), 2) == zlib.crc32(b"abcd")
    True
    """
    if len2 <= 0:
        return crc1
    zeros = [CRC_POLYNOMIALS[kind]] + [1 << n for n in range(31)]  # appends one zero bit
    for _ in range(3):
        zeros = _gf2_square(zeros)  # then 2, 4, 8 zero bits: one zero byte
    while True:  # append len2 zero bytes to crc1, a power of two at a time
        if len2 & 1:
            crc1 = _gf2_times(zeros, crc1)
        len2 >>= 1
        if not len2:
            break
        zeros = _gf2_square(zeros)
    return crc1 ^ crc2


class _PartScheme:
    """How a part-sized kind hashes one part and joins the parts' digests into the checksum."""

    def __init__(self, kind: str) -> None:
        self.crc = COMPOSITE_KINDS.get(kind, "")

    def new(self) -> PartHasher:
        if self.crc:
            return _Crc(self.crc)
        return hashlib.md5(usedforsecurity=False)

    def join(self, digests: list[bytes]) -> str:
        joined = b"".join(digests)
        if self.crc:
            whole = _Crc(self.crc)
            whole.update(joined)
            return whole.hexdigest() + f"-{len(digests)}"
        return hashlib.md5(joined, usedforsecurity=False).hexdigest() + f"-{len(digests)}"


class MultipartEtag:
    """Recomputes an S3 multipart ETag (md5 of the parts' md5s, then ``-<parts>``), or with a
    composite kind S3's composite CRC of the parts."""

    def __init__(self, part_size: int, kind: str = "s3-multipart") -> None:
        self.part_size = part_size
        self._scheme = _PartScheme(kind)
        self._digests: list[bytes] = []
        self._current = self._scheme.new()
        self._filled = 0

    def update(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            take = min(len(view), self.part_size - self._filled)
            self._current.update(data if take == len(data) else view[:take])
            self._filled += take
            view = view[take:]
            if self._filled == self.part_size:
                self._digests.append(self._current.digest())
                self._current = self._scheme.new()
                self._filled = 0

    def hexdigest(self) -> str:
        digests = list(self._digests)
        if self._filled or not digests:
            digests.append(self._current.digest())
        return self._scheme.join(digests)


class PartDigests:
    """A part-sized checksum (S3 multipart ETag, composite CRC) from parts hashed independently, in
    any order (parallel ranges, each covering whole upload parts)."""

    def __init__(self, part_size: int, size: int, kind: str = "s3-multipart") -> None:
        self.part_size = part_size
        self.size = size
        self.scheme = _PartScheme(kind)
        self.digests: list[bytes | None] = [None] * max(1, -(-size // part_size))

    def range(self, start: int, end: int) -> Hasher:
        return RangeDigests(self, start)

    def hexdigest(self) -> str:
        if any(d is None for d in self.digests):
            return "incomplete"
        return self.scheme.join([d for d in self.digests if d is not None])


class RangeCrcs:
    """A whole-object CRC from ranges hashed independently, in any order, joined by crc_combine."""

    def __init__(self, kind: str, size: int) -> None:
        self.kind = kind
        self.size = size
        self.ranges: dict[int, tuple[int, int]] = {}  # start -> (end, crc of the range)

    def range(self, start: int, end: int) -> Hasher:
        return _RangeCrc(self, start, end)

    def hexdigest(self) -> str:
        value, offset = 0, 0
        while offset < self.size:
            got = self.ranges.get(offset)
            if got is None or got[0] <= offset:
                return "incomplete"
            end, crc = got
            value = crc_combine(self.kind, value, crc, end - offset) if offset else crc
            offset = end
        return value.to_bytes(4, "big").hex()


class _RangeCrc:
    """One range's CRC as it streams in; recorded in its RangeCrcs once the range is complete."""

    def __init__(self, whole: RangeCrcs, start: int, end: int) -> None:
        self.whole, self.start, self.end = whole, start, end
        self.offset = start
        self._crc = _Crc(whole.kind)

    def update(self, data: bytes | memoryview) -> None:
        self._crc.update(data)
        self.offset += len(data)
        if self.offset == self.end:
            self.whole.ranges[self.start] = (self.end, self._crc.value())

    def hexdigest(self) -> str:
        return self._crc.hexdigest()


class RangeDigests:
    """Hashes one ranged read into a PartDigests as it streams in; the range covers whole upload parts."""

    def __init__(self, parts: PartDigests, start: int) -> None:
        self.parts = parts
        self.offset = start
        self._md5 = parts.scheme.new()

    def update(self, data: bytes | memoryview) -> None:
        part_size, view = self.parts.part_size, memoryview(data)
        while view:
            boundary = (self.offset // part_size + 1) * part_size
            take = min(len(view), boundary - self.offset)
            self._md5.update(data if take == len(data) else view[:take])
            view, self.offset = view[take:], self.offset + take
            # A part ends at its boundary, or (the last one) at the end of the file.
            if self.offset in (boundary, self.parts.size):
                self.parts.digests[(self.offset - 1) // part_size] = self._md5.digest()
                self._md5 = self.parts.scheme.new()

    def hexdigest(self) -> str:
        return "partial"


class Blake3:
    """BLAKE3-256 (the node cache's statements: about 7 GiB/s a core here, SHA-256 1.9), one thread."""

    def __init__(self) -> None:
        self._hash = blake3.blake3()

    def update(self, data: bytes | memoryview) -> None:
        self._hash.update(data)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


BLAKE3 = "blake3"
"""The kind of a BLAKE3-256 digest (never a pin: only what the node cache signs)."""


def make_hasher(kind: str, multipart_part_size: int | None = None) -> Hasher | None:
    """A hasher for a checksum kind, None when the content cannot be checked."""
    if kind == "sha256":
        return hashlib.sha256()
    if kind == BLAKE3:
        return Blake3()
    if kind == "md5":
        return hashlib.md5(usedforsecurity=False)
    if kind == "sha1":
        return hashlib.sha1(usedforsecurity=False)
    if kind in ("crc32c", "crc32"):
        return _Crc(kind)
    if kind in PART_SIZED_KINDS and multipart_part_size:
        return MultipartEtag(multipart_part_size, kind)
    return None


def parallel_digest(kind: str, size: int, part_size: int | None) -> PartDigests | RangeCrcs | None:
    """A checksum that ranges of a file can feed in any order, None when ``kind`` must be hashed
    in file order (md5, sha1, sha256)."""
    if kind in PART_SIZED_KINDS and part_size:
        return PartDigests(part_size, size, kind)
    if kind in CRC_POLYNOMIALS:
        return RangeCrcs(kind, size)
    return None


def hash_file(path: Path, hasher: Hasher) -> str:
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()
