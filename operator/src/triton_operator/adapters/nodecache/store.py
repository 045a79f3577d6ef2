"""The node cache's objects on disk: verified writes, atomic placement, leases, LRU eviction."""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from triton_operator.adapters.sync.hashing import Hasher, hash_file, make_hasher
from triton_operator.core.nodecache import (
    MAX_LEASE_OBJECTS,
    PART_SIZED_KINDS,
    CachedObject,
    Lease,
    choose_evictions,
    leased_keys,
    live_leases,
    object_key,
)

OBJECTS = "objects"
TMP = "tmp"
PARTS = "parts"
"""<root>/parts/<kind>/<checksum>: the part size a multipart object was checked with (decimal)."""


@dataclass
class StoreStats:
    """What the store did since it started (the server exports it as metrics)."""

    hits: int = 0
    hit_bytes: int = 0
    misses: int = 0
    stored: int = 0
    stored_bytes: int = 0
    evictions: int = 0
    evicted_bytes: int = 0
    corrupt: int = 0
    refused: dict[str, int] = field(default_factory=dict)


def parts_match(kind: str, checksum: str, size: int, part_size: int | None) -> bool:
    """Whether ``size`` bytes in parts of ``part_size`` make as many parts as a multipart ETag says
    (``-N``); any other kind matches. Checked before hashing: a tiny part size is refused, not
    hashed into millions of part digests."""
    if kind not in PART_SIZED_KINDS:
        return True
    if not part_size or part_size < 1:
        return False
    parts = int(checksum.rsplit("-", 1)[1])
    return max(1, -(-size // part_size)) == parts


class Refused(Exception):  # noqa: N818 - an answer, not a failure of the cache
    """A write the cache will not take; ``reason`` is one word (the metric's label), ``status`` the
    HTTP status the server answers with."""

    def __init__(self, reason: str, status: int, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status


@dataclass
class Upload:
    """A write in progress: bytes go to ``tmp``, hashed, then into place by ``commit``."""

    key: str
    kind: str
    checksum: str
    size: int
    tmp: Path
    part_size: int | None = None  # an S3 multipart upload's part size, to check its ETag with


class ContentStore:
    """Objects under ``root``/objects/<kind>/<checksum>, at most ``limit`` bytes of them.

    Thread-safe: the server answers each request on its own thread. One write per key at a time
    (a second one is refused as busy), space is reserved before a write starts, every write is
    checked against its key before it is renamed into place, and a reader keeps reading an object
    evicted under it (its open file).
    """

    def __init__(
        self, root: Path, limit: int, lease_ttl: float, clock: Callable[[], float] = time.time
    ) -> None:
        self.root = root
        self.limit = limit
        self.lease_ttl = lease_ttl
        self.clock = clock
        self.stats = StoreStats()
        self._lock = threading.Lock()
        self._objects: dict[str, CachedObject] = {}
        self._used = 0
        self._reserved = 0
        self._writing: set[str] = set()
        self._leases: dict[str, Lease] = {}
        self._part_sizes: dict[str, int] = {}
        self._scan()

    # ------------------------------------------------------------ start

    def _scan(self) -> None:
        """Load what an earlier run kept: every well-named object (its last use is its mtime); temp
        files of writes cut short, and anything else, are removed."""
        tmp = self.root / TMP
        tmp.mkdir(parents=True, exist_ok=True)
        for leftover in tmp.iterdir():
            with contextlib.suppress(OSError):
                leftover.unlink()
        objects = self.root / OBJECTS
        objects.mkdir(parents=True, exist_ok=True)
        for kind_dir in objects.iterdir():
            for path in kind_dir.iterdir() if kind_dir.is_dir() else []:
                key = object_key(kind_dir.name, path.name)
                st = path.lstat()
                if key is None or not path.is_file() or path.is_symlink():
                    with contextlib.suppress(OSError):
                        path.unlink()
                    continue
                self._objects[key] = CachedObject(key, st.st_size, st.st_mtime)
                self._used += st.st_size
        parts = self.root / PARTS
        parts.mkdir(parents=True, exist_ok=True)
        for kind_dir in parts.iterdir():
            for path in kind_dir.iterdir() if kind_dir.is_dir() else []:
                key = f"{kind_dir.name}/{path.name}"
                text = path.read_text().strip() if path.is_file() and not path.is_symlink() else ""
                if key in self._objects and text.isdigit() and int(text) > 0:
                    self._part_sizes[key] = int(text)
                else:
                    with contextlib.suppress(OSError):
                        path.unlink()  # of an object gone, or unreadable
        with self._lock:
            self._evict_locked(0)  # a smaller limit than the last run's

    # ------------------------------------------------------------ reads

    def path(self, key: str) -> Path:
        return self.root / OBJECTS / key

    def open(self, kind: str, checksum: str) -> tuple[BinaryIO, int] | None:
        """The object's open file and size (counted a hit, its last use now), or None (a miss)."""
        key = object_key(kind, checksum)
        with self._lock:
            obj = self._objects.get(key) if key is not None else None
            if obj is None or key is None:
                self.stats.misses += 1
                return None
            try:
                f = self.path(key).open("rb")
            except FileNotFoundError:  # removed behind the cache's back
                self._forget_locked(key)
                self.stats.misses += 1
                return None
            now = self.clock()
            self._objects[key] = CachedObject(key, obj.size, now)
            with contextlib.suppress(OSError):
                os.utime(f.fileno(), (now, now))  # the next run's LRU order
            self.stats.hits += 1
        return f, obj.size

    def served(self, size: int) -> None:
        with self._lock:
            self.stats.hit_bytes += size

    def drop_corrupt(self, kind: str, checksum: str) -> None:
        """An object whose bytes no longer match its key (the disk, or someone on the node): gone."""
        key = object_key(kind, checksum)
        if key is None:
            return
        with self._lock:
            if key in self._objects:
                self._remove_locked(key)
                self.stats.corrupt += 1

    def holds(self, key: str) -> bool:
        with self._lock:
            return key in self._objects

    # ------------------------------------------------------------ writes

    def begin(
        self,
        kind: str,
        checksum: str,
        size: int,
        part_size: int | None = None,
        *,
        check_existing: bool = False,
    ) -> Upload:
        """Reserve room for a write of ``size`` bytes, evicting what must go; or raise Refused.

        ``check_existing``: the uploader read this object from the cache and its bytes did not
        match: the cache checks its own copy (with ``part_size`` for a multipart ETag) and drops it
        if so, then takes the upload.
        """
        try:
            return self._begin(kind, checksum, size, part_size)
        except Refused as refused:
            if (
                refused.reason != "present"
                or not check_existing
                or not self._corrupt(kind, checksum, part_size)
            ):
                raise
        self.drop_corrupt(kind, checksum)
        return self._begin(kind, checksum, size, part_size)

    def _corrupt(self, kind: str, checksum: str, part_size: int | None) -> bool:
        """Whether the kept copy does not match its key; one that matches with ``part_size`` (a
        multipart ETag) has that part size recorded, in place of a wrong one."""
        key = object_key(kind, checksum)
        obj = self._objects.get(key) if key is not None else None
        if key is None or obj is None or not parts_match(kind, checksum, obj.size, part_size):
            return False
        hasher = self._hasher(kind, part_size)
        if hasher is None:
            return False
        try:
            corrupt = hash_file(self.path(key), hasher) != checksum
        except FileNotFoundError:
            return False
        if not corrupt and part_size and kind in PART_SIZED_KINDS and self.part_size(key) != part_size:
            self._record_part_size(key, part_size)
            with self._lock:
                self._part_sizes[key] = part_size
        return corrupt

    def part_size(self, key: str) -> int | None:
        """The part size a multipart object was checked with (what a reader checks it with)."""
        with self._lock:
            return self._part_sizes.get(key)

    def _record_part_size(self, key: str, part_size: int) -> None:
        path = self.root / PARTS / key
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.root / TMP / f"part-{secrets.token_hex(4)}"
        tmp.write_text(f"{part_size}\n")
        os.replace(tmp, path)

    @staticmethod
    def _hasher(kind: str, part_size: int | None) -> Hasher | None:
        if kind in PART_SIZED_KINDS and not part_size:
            return None
        return make_hasher(kind, part_size)

    def _begin(self, kind: str, checksum: str, size: int, part_size: int | None) -> Upload:
        key = object_key(kind, checksum)
        with self._lock:
            try:
                if key is None:
                    raise Refused(
                        "kind",
                        400,
                        f"{kind}/{checksum}: only sha256, sha1, md5 and S3 multipart ETags are cached",
                    )
                if self._hasher(kind, part_size) is None:
                    raise Refused("kind", 400, f"{key}: a multipart ETag is checked with its part size")
                if not parts_match(kind, checksum, size, part_size):
                    raise Refused(
                        "parts", 400, f"{key}: {size} bytes in parts of {part_size} do not make its parts"
                    )
                if key in self._objects:
                    raise Refused("present", 409, f"{key}: already cached")
                if key in self._writing:
                    raise Refused("busy", 409, f"{key}: being written by another upload")
                if size > self.limit:
                    raise Refused("size", 413, f"{key}: {size} bytes is over the cache's {self.limit}")
                if not self._evict_locked(size):
                    raise Refused("full", 507, f"{key}: leased objects leave no room for {size} bytes")
            except Refused as refused:
                self.stats.refused[refused.reason] = self.stats.refused.get(refused.reason, 0) + 1
                raise
            self._writing.add(key)
            self._reserved += size
        tmp = self.root / TMP / f"{kind}-{checksum}-{secrets.token_hex(4)}"
        return Upload(key, kind, checksum, size, tmp, part_size)

    def write(self, upload: Upload, read: Callable[[int], bytes]) -> None:
        """Take the upload's bytes from ``read`` (at most n bytes a call, b"" at the end), check them
        against the key, and put them in place; Refused (nothing kept) when they do not match."""
        digest = self._hasher(upload.kind, upload.part_size)
        assert digest is not None  # begin refuses a kind it cannot check
        count = 0
        try:
            with upload.tmp.open("wb") as f:
                while count < upload.size:
                    chunk = read(min(1024 * 1024, upload.size - count))
                    if not chunk:
                        break
                    digest.update(chunk)
                    f.write(chunk)
                    count += len(chunk)
            if count != upload.size:
                raise Refused("short", 400, f"{upload.key}: {count} of {upload.size} bytes arrived")
            if digest.hexdigest() != upload.checksum:
                raise Refused(
                    "checksum", 422, f"{upload.key}: the bytes' {upload.kind} is {digest.hexdigest()}"
                )
            if upload.part_size and upload.kind in PART_SIZED_KINDS:
                self._record_part_size(upload.key, upload.part_size)
            final = self.path(upload.key)
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(upload.tmp, final)
        except Refused as refused:
            self._end(upload, kept=False, reason=refused.reason)
            raise
        except BaseException:
            self._end(upload, kept=False, reason="failed")
            raise
        self._end(upload, kept=True)

    def _end(self, upload: Upload, *, kept: bool, reason: str = "") -> None:
        with contextlib.suppress(FileNotFoundError):
            upload.tmp.unlink()
        with self._lock:
            self._writing.discard(upload.key)
            self._reserved -= upload.size
            if kept:
                if upload.part_size and upload.kind in PART_SIZED_KINDS:
                    self._part_sizes[upload.key] = upload.part_size
                self._objects[upload.key] = CachedObject(upload.key, upload.size, self.clock())
                self._used += upload.size
                self.stats.stored += 1
                self.stats.stored_bytes += upload.size
            else:
                self.stats.refused[reason] = self.stats.refused.get(reason, 0) + 1

    # ------------------------------------------------------------ leases

    def lease(self, pod: str, objects: Iterable[tuple[str, str]]) -> list[str]:
        """A pod's lease on ``objects`` (kind, checksum) for the lease TTL, replacing its earlier
        one; the keys of those the cache holds (each counted as used now). part_sizes tells the
        multipart ones' part sizes."""
        keys = frozenset(k for kind, checksum in objects if (k := object_key(kind, checksum)))
        if len(keys) > MAX_LEASE_OBJECTS:
            raise Refused("lease", 413, f"a lease may name at most {MAX_LEASE_OBJECTS} objects")
        with self._lock:
            now = self.clock()
            self._leases = live_leases(self._leases, now)
            self._leases[pod] = Lease(pod, keys, now + self.lease_ttl)
            held = sorted(k for k in keys if k in self._objects)
            for key in held:
                self._objects[key] = CachedObject(key, self._objects[key].size, now)
        return held

    # ------------------------------------------------------------ figures

    def figures(self) -> tuple[int, int, int]:
        """(objects, bytes kept, bytes under a live lease)."""
        with self._lock:
            leased = leased_keys(self._leases.values(), self.clock())
            leased_bytes = sum(o.size for k, o in self._objects.items() if k in leased)
            return len(self._objects), self._used, leased_bytes

    # ------------------------------------------------------------ eviction

    def _evict_locked(self, incoming: int) -> bool:
        leased = leased_keys(self._leases.values(), self.clock())
        chosen = choose_evictions(
            list(self._objects.values()), leased, self._used + self._reserved, self.limit, incoming
        )
        if chosen is None:
            return False
        for key in chosen:
            size = self._objects[key].size
            self._remove_locked(key)
            self.stats.evictions += 1
            self.stats.evicted_bytes += size
        return True

    def _remove_locked(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(key).unlink()
        if self._part_sizes.pop(key, None) is not None:
            with contextlib.suppress(FileNotFoundError):
                (self.root / PARTS / key).unlink()
        self._forget_locked(key)

    def _forget_locked(self, key: str) -> None:
        obj = self._objects.pop(key, None)
        if obj is not None:
            self._used -= obj.size
