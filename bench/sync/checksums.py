"""CPU seconds per GiB of each checksum sync may compute, on this machine: a table.

Each is fed the same random bytes 1 MiB at a time (as the sync's reads arrive), on one thread, best of
``--repeat``. Usage: ``.venv/bin/python bench/sync/checksums.py [--mib 512] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "operator" / "src"))

from triton_operator.adapters.sync.hashing import make_hasher  # noqa: E402

MiB = 1024 * 1024


def zlib_crc32() -> Callable[[memoryview], None]:
    value = [0]

    def update(data: memoryview) -> None:
        value[0] = zlib.crc32(data, value[0])

    return update


def ours(kind: str, part_size: int | None = None) -> Callable[[memoryview], None]:
    hasher = make_hasher(kind, part_size)
    assert hasher is not None
    return hasher.update


def seconds_per_gib(update: Callable[[memoryview], None], data: bytes) -> float:
    view = memoryview(data)
    started = time.process_time()
    for offset in range(0, len(data), MiB):
        update(view[offset : offset + MiB])
    return (time.process_time() - started) / (len(data) / (1024 * MiB))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=512, help="bytes hashed per try, in MiB (default 512)")
    parser.add_argument("--repeat", type=int, default=3, help="tries per checksum, the best kept (default 3)")
    args = parser.parse_args()
    data = os.urandom(args.mib * MiB)
    rows: list[tuple[str, str, Callable[[], Callable[[memoryview], None]]]] = [
        (
            "md5",
            "the pinned digest of an S3 upload (its ETag), GCS, Azure",
            lambda: hashlib.md5(usedforsecurity=False).update,
        ),
        (
            "s3-multipart (md5 of 8 MiB parts)",
            "a multipart upload's ETag",
            lambda: ours("s3-multipart", 8 * MiB),
        ),
        ("sha256", "an encrypted object's additional checksum", lambda: hashlib.sha256().update),
        (
            "sha1",
            "an encrypted object's additional checksum",
            lambda: hashlib.sha1(usedforsecurity=False).update,
        ),
        (
            "crc32 (ISA-L, what sync uses)",
            "S3's CRC32, whole or composite",
            lambda: ours("crc32"),
        ),
        ("crc32 (zlib, for comparison)", "-", zlib_crc32),
        ("crc32c (google-crc32c)", "S3's CRC32C, whole or composite", lambda: ours("crc32c")),
    ]
    print(
        f"{args.mib} MiB of random bytes, 1 MiB at a time, one thread, best of {args.repeat}, "
        f"{os.cpu_count()} CPUs"
    )
    print()
    print("| checksum | what it checks | CPU s/GiB |")
    print("|---|---|---:|")
    for name, what, make in rows:
        best = min(seconds_per_gib(make(), data) for _ in range(args.repeat))
        print(f"| {name} | {what} | {best:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
