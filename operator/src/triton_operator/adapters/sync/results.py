"""What a sync ends with: its counts, or an error that says which file and why."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


class SyncError(Exception):
    """The sync cannot complete; the message says which file and why."""


class ChecksumMismatch(SyncError):  # noqa: N818
    def __init__(self, key: str, dest: str, what: str, expected: str, actual: str) -> None:
        super().__init__(f"object {key!r} ({dest}): {what} is {actual}, the manifest pins {expected}")
        self.key = key
        self.dest = dest
        self.expected = expected
        self.actual = actual


class UnsafeDestination(SyncError):  # noqa: N818
    """Something in the destination (a symlink, a non-directory) where sync would write."""


@dataclass
class SyncStats:
    files: int = 0
    bytes: int = 0
    downloaded_files: int = 0
    downloaded_bytes: int = 0
    present_files: int = 0
    cache_hits: int = 0
    ranged_parts: int = 0
    unverified_files: int = 0  # no content checksum: size and etag/generation match only
    retried_reads: int = 0
    configs_written: int = 0
    pruned_files: int = 0
    linked_versions: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
