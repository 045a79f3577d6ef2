"""The destination's files: temp names, safe folders, atomic placement, the boot-bound state file."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import secrets
import shutil
import stat
import threading
from pathlib import Path
from typing import Any

from triton_operator.adapters.sync.hashing import CHUNK
from triton_operator.adapters.sync.results import UnsafeDestination
from triton_operator.core.repository.manifest import ManifestEntry

STATE_FILE = ".triton-sync.json"
STATE_FORMAT = 2
"""1: written after a flush, trusted on any boot; 2: trusted on the boot it names (none: flushed)."""
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_TMP_MARK = ".tmp-sync-"

WRITE_PIECE = 32 * 1024
"""The most bytes one write(2) hands the page cache. Linux sizes a file's page-cache folios by the
write: up to 32 KiB (order 3, the kernel's costly order) they come from each CPU's lists of pages
freed a moment ago; a 1 MiB write asks for 1 MiB folios from the buddy allocator's large free blocks,
which a VM host may have reclaimed (free page reporting) and must fault in again. On the 2-core
benchmark VM 1 MiB writes cost 3x the system CPU of 32 KiB ones (docs/benchmarks.md, Sync). The extra
system calls cost about 0.1 s per GiB."""

_SYNC_FILE_RANGE_WRITE = 2


# ---------------------------------------------------------------- flushes


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def syncfs(path: Path) -> None:
    """Flush the whole filesystem holding ``path`` (data, renames, folders) in one call."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        libc_syncfs = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)
        if libc_syncfs is None:
            os.sync()
        elif libc_syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs: {os.strerror(err)}", str(path))
    finally:
        os.close(fd)


def _libc_function(name: str) -> Any:
    return getattr(ctypes.CDLL(None, use_errno=True), name, None)


_sync_file_range = _libc_function("sync_file_range")
if _sync_file_range is not None:
    _sync_file_range.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)


def boot_id() -> str:
    """This boot's id, "" where the kernel does not tell. The page cache lives as long as the boot:
    within it, what a sync wrote is what every reader of the files gets, flushed to disk or not."""
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Start writing bytes ``offset``..``offset+length`` of ``fd`` to disk, without waiting
    (sync_file_range WRITE): the disk works while the download goes on, and the one flush at the
    end (syncfs) finds little left. A hint only: durability still comes from that flush."""
    if _sync_file_range is not None and length > 0:
        _sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE)  # an error changes nothing


def preallocate(fd: int, size: int) -> None:
    """Give the file ``size`` bytes of disk now (fallocate): a full volume fails here, before the
    download, and the parts then write into allocated blocks. Where the filesystem cannot allocate
    ahead, the file is only sized (sparse), as before."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise
        os.ftruncate(fd, size)


# ---------------------------------------------------------------- placing files


def write_all(fd: int, data: bytes | memoryview, offset: int | None = None) -> None:
    """Write every byte of ``data`` at ``offset`` (or the file position), WRITE_PIECE at a time.
    A short write (a volume filling up) is carried on until it completes or raises (ENOSPC):
    bytes are never dropped."""
    view = memoryview(data).cast("B")
    while view:
        piece = view[:WRITE_PIECE]
        n = os.write(fd, piece) if offset is None else os.pwrite(fd, piece, offset)
        if n <= 0:
            raise OSError(errno.EIO, "a write made no progress")
        view = view[n:]
        if offset is not None:
            offset += n


def tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}{_TMP_MARK}{secrets.token_hex(4)}")


class Dirs:
    """Creates folders under dest, refusing symlinks and non-folders on the way."""

    def __init__(self, dest: Path) -> None:
        self.dest = dest
        self._ok: set[str] = {""}
        self._lock = threading.Lock()

    def check(self, rel_dir: str) -> bool:
        """Whether ``rel_dir`` exists as folders all the way (made by nobody); refuses what ensure does."""
        with self._lock:
            if rel_dir in self._ok:
                return True
            parts = rel_dir.split("/")
            for n in range(1, len(parts) + 1):
                rel = "/".join(parts[:n])
                if rel in self._ok:
                    continue
                try:
                    st = os.lstat(self.dest / rel)
                except FileNotFoundError:
                    return False
                _refuse(self.dest / rel, st)
                self._ok.add(rel)
            return True

    def ensure(self, rel_dir: str) -> Path:
        with self._lock:
            if rel_dir in self._ok:
                return self.dest / rel_dir if rel_dir else self.dest
            parts = rel_dir.split("/")
            for n in range(1, len(parts) + 1):
                rel = "/".join(parts[:n])
                if rel in self._ok:
                    continue
                path = self.dest / rel
                try:
                    st = os.lstat(path)
                except FileNotFoundError:
                    os.mkdir(path)
                else:
                    _refuse(path, st)
                self._ok.add(rel)
            return self.dest / rel_dir


def _refuse(path: Path, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeDestination(f"{path} is a symlink; sync refuses to write through it")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDestination(f"{path} exists and is not a folder")


def link_or_copy(src: Path, dst: Path) -> None:
    """Place ``src``'s bytes at ``dst`` atomically: a hardlink if possible, else a copy."""
    tmp = tmp_name(dst)
    try:
        try:
            os.link(src, tmp)
        except OSError:
            with src.open("rb") as fin, tmp.open("wb") as fout:
                shutil.copyfileobj(fin, fout, CHUNK)
        os.replace(tmp, dst)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def place_bytes(dst: Path, data: bytes) -> bool:
    """Write ``data`` at ``dst`` atomically unless it is there already; whether it wrote."""
    try:
        st = os.lstat(dst)
    except FileNotFoundError:
        st = None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeDestination(f"{dst} is a symlink; sync refuses to write through it")
        if stat.S_ISREG(st.st_mode) and dst.read_bytes() == data:
            return False
    tmp = tmp_name(dst)
    tmp.write_bytes(data)
    os.replace(tmp, dst)
    return True


def place_symlink(link: Path, target: Path) -> bool:
    """Point ``link`` at ``target`` atomically unless it does already; whether it changed it.

    Only a symlink (one sync made) may be replaced: a file or folder there is refused.
    """
    try:
        st = os.lstat(link)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISLNK(st.st_mode):
        raise UnsafeDestination(f"{link} exists and is not a link made by sync")
    if st is not None and os.readlink(link) == str(target):
        return False
    tmp = tmp_name(link)
    os.symlink(target, tmp)
    os.replace(tmp, link)
    return True


# ---------------------------------------------------------------- state of earlier syncs


def state_record(entry: ManifestEntry, st: os.stat_result) -> list[Any]:
    return [
        st.st_size,
        st.st_mtime_ns,
        st.st_ino,
        entry.checksum_kind,
        entry.checksum,
        entry.etag,
        entry.generation,
    ]


def load_state(dest: Path, boot: str) -> dict[str, list[Any]]:
    """What the last sync recorded of the files it placed, where it can be trusted on boot ``boot``:
    a record of another boot (unflushed data a crash may have lost: a file of zeros keeps its size
    and mtime) is ignored, and the files are checked by their digests instead."""
    try:
        data = json.loads((dest / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        return {}
    if data.get("format") == STATE_FORMAT:
        written_on = data.get("boot")
        if not isinstance(written_on, str) or (written_on and written_on != boot):
            return {}
    elif data.get("format") != 1:  # format 1: written after a flush
        return {}
    return {str(k): v for k, v in data["files"].items() if isinstance(v, list)}


def save_state(dest: Path, files: dict[str, list[Any]], boot: str) -> None:
    """Record ``files`` for the next sync: trusted on boot ``boot`` only, or (``boot`` "", after a
    flush) on any boot, then written durably itself."""
    path = dest / STATE_FILE
    tmp = tmp_name(path)
    with tmp.open("w") as f:
        json.dump({"format": STATE_FORMAT, "boot": boot, "files": files}, f, separators=(",", ":"))
        if not boot:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
