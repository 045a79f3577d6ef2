"""The CRCs sync checks instead of a digest: combined from ranges in any order, and S3's composites."""

from __future__ import annotations

import random
import zlib

import google_crc32c
import pytest

from triton_operator.adapters.sync.hashing import crc_combine, make_hasher, parallel_digest

CRCS = {"crc32": zlib.crc32, "crc32c": google_crc32c.value}


def crc_hex(kind: str, data: bytes) -> str:
    return int(CRCS[kind](data)).to_bytes(4, "big").hex()


def s3_composite(kind: str, data: bytes, part: int) -> str:
    """S3's composite checksum as documented: the CRC of the parts' big-endian CRCs, then -<parts>."""
    parts = [int(CRCS[kind](data[i : i + part])).to_bytes(4, "big") for i in range(0, len(data), part)]
    return crc_hex(kind, b"".join(parts)) + f"-{len(parts)}"


@pytest.mark.parametrize("kind", sorted(CRCS))
@pytest.mark.parametrize("seed", range(6))
def test_crc_combine_joins_two_crcs_as_the_crc_of_the_joined_bytes(kind: str, seed: int) -> None:
    rnd = random.Random(seed)
    a, b = rnd.randbytes(rnd.randrange(0, 5000)), rnd.randbytes(rnd.randrange(1, 70000))
    joined = crc_combine(kind, int(CRCS[kind](a)), int(CRCS[kind](b)), len(b))
    assert joined == int(CRCS[kind](a + b))


@pytest.mark.parametrize("kind", sorted(CRCS))
@pytest.mark.parametrize("seed", range(4))
def test_ranges_hashed_in_any_order_give_the_whole_files_crc(kind: str, seed: int) -> None:
    rnd = random.Random(seed)
    data = rnd.randbytes(300_001)
    cuts = sorted(rnd.sample(range(1, len(data)), 5))
    ranges = list(zip([0, *cuts], [*cuts, len(data)], strict=True))
    rnd.shuffle(ranges)
    whole = parallel_digest(kind, len(data), None)
    assert whole is not None
    for start, end in ranges[:-1]:
        hasher = whole.range(start, end)
        for i in range(start, end, 7777):
            hasher.update(data[i : min(i + 7777, end)])
    assert whole.hexdigest() == "incomplete"  # one range still missing
    start, end = ranges[-1]
    whole.range(start, end).update(data[start:end])
    assert whole.hexdigest() == crc_hex(kind, data)


@pytest.mark.parametrize("kind", sorted(CRCS))
def test_a_range_that_stopped_short_leaves_the_crc_incomplete(kind: str) -> None:
    data = random.Random(3).randbytes(1000)
    whole = parallel_digest(kind, len(data), None)
    assert whole is not None
    whole.range(0, 500).update(data[:500])
    whole.range(500, 1000).update(data[500:999])
    assert whole.hexdigest() == "incomplete"


@pytest.mark.parametrize("kind", sorted(CRCS))
@pytest.mark.parametrize(("size", "part"), [(10_000, 4096), (8192, 4096), (100, 4096)])
def test_the_composite_of_an_s3_multipart_upload_is_recomputed(kind: str, size: int, part: int) -> None:
    data = random.Random(size).randbytes(size)
    expected = s3_composite(kind, data, part)
    streamed = make_hasher(f"{kind}-composite", part)
    assert streamed is not None
    for i in range(0, size, 1000):
        streamed.update(memoryview(data)[i : i + 1000])  # pieces that straddle the parts
    assert streamed.hexdigest() == expected
    parallel = parallel_digest(f"{kind}-composite", size, part)
    assert parallel is not None
    for start in reversed(range(0, size, part)):  # whole parts, last first
        parallel.range(start, min(start + part, size)).update(data[start : start + part])
    assert parallel.hexdigest() == expected


def test_a_composite_kind_without_the_part_size_cannot_be_checked() -> None:
    assert make_hasher("crc32-composite", None) is None
    assert parallel_digest("crc32c-composite", 10, None) is None
    assert parallel_digest("md5", 10, None) is None  # hashed in file order
