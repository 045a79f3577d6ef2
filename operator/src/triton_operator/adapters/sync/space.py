"""Whether a sync's bytes fit the destination volume, asked before anything is written."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from triton_operator.adapters.sync.results import NoSpace

STATE_BYTES_PER_FILE = 256
"""Room kept for each file's line in the state file (.triton-sync.json), written at the end."""


def on_disk(size: int, block: int) -> int:
    """The bytes a file of ``size`` takes on a filesystem of ``block``-byte blocks.

    >>> on_disk(0, 4096), on_disk(1, 4096), on_disk(4096, 4096), on_disk(4097, 4096)
    (0, 4096, 4096, 8192)
    """
    block = max(1, block)
    return -(-size // block) * block


@dataclass(frozen=True)
class Need:
    """What a sync will write, by kind of write (sizes as the manifest gives them)."""

    downloads: tuple[int, ...] = ()
    """Objects to fetch: their temp file (renamed into place) holds exactly their bytes; the file it
    replaces, if any, is freed only by the rename, so its bytes are not counted as free."""
    copies: tuple[int, ...] = ()
    """Cache hits that cannot be hardlinked (the cache is on another filesystem): copied."""
    small: tuple[int, ...] = ()
    """Rendered configs and the like, written whole."""
    folders: int = 0
    """Folders that may have to be made (one block each)."""
    files: int = 0
    """Files the state file records."""

    def total(self, block: int) -> int:
        """Bytes to have free before the first write, on a filesystem of ``block``-byte blocks.

        >>> Need(downloads=(1, 5000), copies=(10,), small=(3,), folders=2, files=2).total(4096)
        32768
        """
        data = sum(on_disk(s, block) for s in (*self.downloads, *self.copies, *self.small))
        state = on_disk(64 + STATE_BYTES_PER_FILE * self.files, block) if self.files else 0
        # The state file is written beside its old copy (temp then rename): both at once.
        return data + self.folders * max(1, block) + state


@dataclass(frozen=True)
class Room:
    """The space a sync may use under ``path``: the filesystem's, and under a volume's size limit."""

    path: Path
    block: int
    fs_free: int
    limit: int | None = None
    used: int = 0

    @property
    def free(self) -> int:
        if self.limit is None:
            return self.fs_free
        return max(0, min(self.fs_free, self.limit - self.used))


def existing_ancestor(path: Path) -> Path:
    """``path`` or its nearest folder that exists (the one whose filesystem it will be made on)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path("/")


def usage(path: Path) -> int:
    """Bytes the files under ``path`` take (as kubelet measures an emptyDir: blocks, each inode once)."""
    seen: set[int] = set()
    total = 0
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        for name in (*dirnames, *filenames):
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue
            if st.st_ino in seen:
                continue
            seen.add(st.st_ino)
            total += st.st_blocks * 512 if not stat.S_ISLNK(st.st_mode) else 0
    return total


def room(dest: Path, limit: int | None = None) -> Room:
    """The room under ``dest`` (made later if missing): statvfs, and ``limit`` minus what it holds."""
    where = existing_ancestor(dest)
    vfs = os.statvfs(where)
    used = usage(dest) if limit is not None and dest.is_dir() else 0
    return Room(dest, vfs.f_frsize or vfs.f_bsize, vfs.f_bavail * vfs.f_frsize, limit, used)


def device_of(path: Path) -> int:
    return os.stat(existing_ancestor(path)).st_dev


def check(need: Need, space: Room) -> int:
    """The bytes ``need`` takes; NoSpace, naming the bytes needed and free, when they do not fit."""
    needed = need.total(space.block)
    if needed > space.free:
        raise NoSpace(needed, space.free, str(space.path), space.limit)
    return needed
