"""What a sync ends with: its counts, or an error that says which file and why."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


class SyncError(Exception):
    """The sync cannot complete; the message says which file and why."""


class ChecksumMismatch(SyncError):  # noqa: N818
    def __init__(
        self, key: str, dest: str, what: str, expected: str, actual: str, *, by: str = "the manifest pins"
    ) -> None:
        super().__init__(f"object {key!r} ({dest}): {what} is {actual}, {by} {expected}")
        self.key = key
        self.dest = dest
        self.expected = expected
        self.actual = actual


class NoSpace(SyncError):  # noqa: N818
    """The files to write do not fit the destination volume: nothing was written."""

    def __init__(self, needed: int, free: int, path: str, limit: int | None = None) -> None:
        under = f" under its {human(limit)} size limit" if limit is not None else ""
        super().__init__(
            f"the model repository needs {human(needed)} ({needed} bytes), {path} has {human(free)} "
            f"({free} bytes) free{under}; nothing was written"
        )
        self.needed = needed
        self.free = free
        self.path = path
        self.limit = limit


class UnsafeDestination(SyncError):  # noqa: N818
    """Something in the destination (a symlink, a non-directory) where sync would write."""


def human(n: int) -> str:
    """Bytes for a person: ``2.4 GiB``, ``512 KiB``, ``17 B``.

    >>> human(2576980378), human(1536), human(17)
    ('2.4 GiB', '1.5 KiB', '17 B')
    """
    if n < 1024:
        return f"{n} B"
    value = n / 1024
    units = ["KiB", "MiB", "GiB", "TiB"]
    while value >= 1024 and len(units) > 1:
        value /= 1024
        units.pop(0)
    unit = units[0]
    return f"{value:.1f} {unit}"


@dataclass
class SyncStats:
    files: int = 0
    bytes: int = 0
    downloaded_files: int = 0
    downloaded_bytes: int = 0
    present_files: int = 0
    cache_hits: int = 0
    source_hits: int = 0  # objects read from SyncOptions.source (the node cache), verified
    source_bytes: int = 0
    source_misses: int = 0  # objects the source was asked for (or could be) and the store gave
    source_refused: int = 0  # objects the source gave whose bytes did not match the pin
    ranged_parts: int = 0
    unverified_files: int = 0  # no content checksum: size and etag/generation match only
    crc_checked_files: int = 0  # checked by the store's CRC of the pinned object (verify "fast")
    vouched_files: int = 0  # from the node cache, checked by the BLAKE3 (or SHA-256) it signed for the pin
    shared_files: int = 0  # of those, symlinks to the node cache's own read-only files (no byte copied)
    awaited_files: int = 0  # read from the source once another pod of the node had uploaded them
    retried_reads: int = 0
    configs_written: int = 0
    pruned_files: int = 0
    linked_versions: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
