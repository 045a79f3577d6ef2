"""The node cache's objects on disk: blobs by their SHA-256 (and BLAKE3), namespaces' indexes, leases, LRU."""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from triton_operator.adapters.sync.hashing import Blake3, Hasher, make_hasher
from triton_operator.core.repository.cache_rules import (
    BLOB_FORM,
    CLAIM_BASE_SECONDS,
    NAMESPACE_FORM,
    PART_SIZED_KINDS,
    CachedObject,
    Claim,
    Lease,
    check_lease,
    choose_evictions,
    claim_holds,
    claim_seconds,
    live_leases,
    object_key,
)

BLOBS = "blobs"
"""<root>/blobs/<sha256>: the bytes, named by the SHA-256 the cache computed as it took them."""
DIGESTS = "blake3"
"""<root>/blake3/<sha256>: the blob's BLAKE3, computed by the cache in the pass that named it (what
the statements pods check their bytes against); a blob kept from before has none until
``ContentStore.complete_digests`` hashes it."""
INDEX = "index"
"""<root>/index/<namespace>/<kind>/<checksum>: ``<sha256> [<part size>]``, one namespace's key."""
TMP = "tmp"
OLD_LAYOUT = ("objects", "parts")
"""Folders of the layout before blobs (keys shared by every namespace): removed at start."""
CHUNK = 1024 * 1024


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
    """A request the cache will not take; ``reason`` is one word (the metric's label), ``status``
    the HTTP status the server answers with."""

    def __init__(self, reason: str, status: int, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status


@dataclass(frozen=True)
class Entry:
    """One namespace's key: the blob that holds its bytes, and a multipart ETag's part size."""

    blob: str
    part_size: int | None = None


@dataclass
class Upload:
    """A write in progress: bytes go to ``tmp``, hashed three times in one pass (the key's kind,
    SHA-256 for the blob's name, BLAKE3 for the statements), room taken as they arrive (``taken``),
    then into place by ``ContentStore.finish``.
    A ``deferred`` upload is only written as it arrives (its uploader does not wait for the check):
    ``finish`` hashes the whole file then, before anything is placed."""

    namespace: str
    key: str
    kind: str
    checksum: str
    size: int
    tmp: Path
    digest: Hasher
    part_size: int | None = None
    blob_digest: hashlib._Hash = field(default_factory=hashlib.sha256)
    blake3: Blake3 = field(default_factory=Blake3)
    taken: int = 0
    received: int = 0
    file: BinaryIO | None = None
    deferred: bool = False

    def feed(self, *chunks: bytes) -> None:
        """Write pieces as they came off the socket (no joining), hashed now unless ``deferred``
        (blocking: the server runs it on its thread pool)."""
        if self.file is None:
            self.file = self.tmp.open("wb")
        for chunk in chunks:
            if not self.deferred:
                self.digest.update(chunk)
                self.blob_digest.update(chunk)
                self.blake3.update(chunk)
            self.file.write(chunk)
            self.received += len(chunk)

    def hash_written(self) -> None:
        """A deferred upload's hashes, over the file as written (blocking)."""
        with self.tmp.open("rb") as f:
            while chunk := f.read(CHUNK):
                self.digest.update(chunk)
                self.blob_digest.update(chunk)
                self.blake3.update(chunk)


class ContentStore:
    """Blobs under ``root``/blobs, at most ``limit`` bytes of them, reached through each namespace's
    index under ``root``/index.

    Thread-safe. One write per namespace and key at a time (a second one is refused as busy), room
    is taken as bytes arrive, every write is checked against its key and named by its SHA-256
    before it is renamed into place, and a reader keeps reading a blob evicted under it (its open
    file).
    """

    def __init__(
        self,
        root: Path,
        limit: int,
        lease_ttl: float,
        clock: Callable[[], float] = time.time,
        *,
        pod_lease_bytes: int | None = None,
    ) -> None:
        self.root = root
        self.limit = limit
        self.lease_ttl = lease_ttl
        self.pod_lease_bytes = pod_lease_bytes if pod_lease_bytes is not None else max(1, limit // 2)
        self.clock = clock
        self.stats = StoreStats()
        self._lock = threading.Lock()
        self._blobs: dict[str, CachedObject] = {}
        self._blake3: dict[str, str] = {}
        """blob -> its BLAKE3 (a blob kept from before has none until complete_digests)."""
        self._index: dict[tuple[str, str], Entry] = {}
        self._refs: dict[str, set[tuple[str, str]]] = {}
        self._used = 0
        self._reserved = 0
        self._writing: set[tuple[str, str]] = set()
        self._checking: set[tuple[str, str]] = set()
        self._settled = threading.Condition(self._lock)
        self._leases: dict[str, Lease] = {}
        self._viewed: dict[str, frozenset[str]] = {}
        """pod uid -> the blobs linked in its view of shared files (kept, like a live lease's)."""
        self._claims: dict[tuple[str, str], Claim] = {}
        """(namespace, key) -> the pod that reads it from its store and will upload it."""
        self._scan()

    # ------------------------------------------------------------ start

    def _scan(self) -> None:
        """Load what an earlier run kept: well-named blobs (last use: their mtime) and the index
        entries whose blob is there; temp files, the old layout, a blob no index names, and
        anything else are removed."""
        for old in OLD_LAYOUT:
            shutil.rmtree(self.root / old, ignore_errors=True)
        tmp = self.root / TMP
        tmp.mkdir(parents=True, exist_ok=True)
        for leftover in tmp.iterdir():
            with contextlib.suppress(OSError):
                leftover.unlink()
        blobs = self.root / BLOBS
        blobs.mkdir(parents=True, exist_ok=True)
        for path in blobs.iterdir():
            if BLOB_FORM.fullmatch(path.name) and path.is_file() and not path.is_symlink():
                st = path.stat()
                self._blobs[path.name] = CachedObject(path.name, st.st_size, st.st_mtime)
                self._used += st.st_size
            else:
                remove_path(path)
        index = self.root / INDEX
        index.mkdir(parents=True, exist_ok=True)
        for ns_dir in index.iterdir():
            if not NAMESPACE_FORM.fullmatch(ns_dir.name) or not ns_dir.is_dir() or ns_dir.is_symlink():
                remove_path(ns_dir)
                continue
            for kind_dir in ns_dir.iterdir():
                for path in kind_dir.iterdir() if kind_dir.is_dir() and not kind_dir.is_symlink() else []:
                    entry = self._read_entry(kind_dir.name, path)
                    if entry is None:
                        remove_path(path)
                        continue
                    self._link_locked(ns_dir.name, f"{kind_dir.name}/{path.name}", entry)
        for blob in [b for b in self._blobs if not self._refs.get(b)]:
            self._remove_blob_locked(blob)
        digests = self.root / DIGESTS
        digests.mkdir(parents=True, exist_ok=True)
        for path in digests.iterdir():
            value = _read_digest(path) if path.name in self._blobs else None
            if value is None:
                remove_path(path)
            else:
                self._blake3[path.name] = value
        with self._lock:
            self._evict_locked(0)  # a smaller limit than the last run's

    def _read_entry(self, kind: str, path: Path) -> Entry | None:
        if object_key(kind, path.name) is None or not path.is_file() or path.is_symlink():
            return None
        words = path.read_text().split()
        if not words or words[0] not in self._blobs:
            return None
        part = int(words[1]) if len(words) > 1 and words[1].isdigit() and int(words[1]) > 0 else None
        if kind in PART_SIZED_KINDS and part is None:
            return None
        return Entry(words[0], part)

    # ------------------------------------------------------------ reads

    def blob_path(self, blob: str) -> Path:
        return self.root / BLOBS / blob

    def _entry_path(self, namespace: str, key: str) -> Path:
        return self.root / INDEX / namespace / key

    def open(
        self, namespace: str, kind: str, checksum: str, *, count_hit: bool = True
    ) -> tuple[BinaryIO, int, str] | None:
        """The namespace's object: its blob's open file, size and name (its last use now; counted a
        hit unless ``count_hit`` is false: another range of one read), or None (a miss: no such key
        in this namespace)."""
        key = object_key(kind, checksum)
        with self._lock:
            entry = self._index.get((namespace, key)) if key is not None else None
            obj = self._blobs.get(entry.blob) if entry is not None else None
            if entry is None or obj is None:
                self.stats.misses += 1
                return None
            try:
                f = self.blob_path(entry.blob).open("rb")
            except FileNotFoundError:  # removed behind the cache's back
                self._forget_blob_locked(entry.blob)
                self.stats.misses += 1
                return None
            now = self.clock()
            self._blobs[entry.blob] = CachedObject(entry.blob, obj.size, now)
            with contextlib.suppress(OSError):
                os.utime(f.fileno(), (now, now))  # the next run's LRU order
            if count_hit:
                self.stats.hits += 1
        return f, obj.size, entry.blob

    def served(self, size: int) -> None:
        with self._lock:
            self.stats.hit_bytes += size

    def drop_corrupt(self, blob: str) -> None:
        """A blob whose bytes no longer have its SHA-256 (the disk, or someone on the node): gone,
        with every index entry naming it. Only the cache's own hash of the blob calls this."""
        with self._lock:
            if blob in self._blobs:
                self._remove_blob_locked(blob)
                self.stats.corrupt += 1

    def recheck(self, namespace: str, kind: str, checksum: str, part_size: int | None = None) -> bool:
        """Hash the blob behind the namespace's key again (blocking): drop it if its bytes no longer
        have its SHA-256, or the BLAKE3 recorded for it (whether it was dropped). An intact
        multipart blob whose ETag ``part_size`` also gives (the cache's own hash says so) has that
        part size recorded in place of the old one. What the caller says decides nothing by itself."""
        key = object_key(kind, checksum)
        with self._lock:
            entry = self._index.get((namespace, key)) if key is not None else None
            size = self._blobs[entry.blob].size if entry is not None and entry.blob in self._blobs else 0
        if entry is None or key is None:
            return False
        digest, b3 = hashlib.sha256(), Blake3()
        other = part_size and part_size != entry.part_size and parts_match(kind, checksum, size, part_size)
        etag = make_hasher(kind, part_size) if other else None
        try:
            with self.blob_path(entry.blob).open("rb") as f:
                while chunk := f.read(CHUNK):
                    digest.update(chunk)
                    b3.update(chunk)
                    if etag is not None:
                        etag.update(chunk)
        except FileNotFoundError:
            return False
        with self._lock:
            recorded = self._blake3.get(entry.blob)
        # Either digest wrong (the bytes, or the BLAKE3 the statements name): the blob goes.
        if digest.hexdigest() != entry.blob or recorded not in (None, b3.hexdigest()):
            self.drop_corrupt(entry.blob)
            return True
        if etag is not None and etag.hexdigest() == checksum:
            fixed = Entry(entry.blob, part_size)
            with self._lock:
                if self._index.get((namespace, key)) == entry:
                    self._write_entry(namespace, key, fixed)
                    self._link_locked(namespace, key, fixed)
        return False

    def leased(self, pod: str, kind: str, checksum: str) -> bool:
        """Whether ``pod``'s live lease names the key."""
        key = object_key(kind, checksum)
        return key is not None and self.names(pod, [key])

    def holds(self, namespace: str, key: str) -> bool:
        with self._lock:
            return (namespace, key) in self._index

    def blob_of(self, namespace: str, key: str) -> tuple[str, int, str | None] | None:
        """The SHA-256 (the blob's name), size and BLAKE3 (None: not computed yet) of the namespace's
        key, or None."""
        with self._lock:
            entry = self._index.get((namespace, key))
            obj = self._blobs.get(entry.blob) if entry is not None else None
            return (obj.key, obj.size, self._blake3.get(obj.key)) if obj is not None else None

    def complete_digests(self, stop: threading.Event | None = None) -> int:
        """Compute the BLAKE3 of each blob that has none (kept by a version before it), checking its
        SHA-256 in the same pass: a blob whose bytes no longer match is dropped (blocking, until
        done or ``stop`` is set; the server runs it once at start, beside its work). The blobs given
        a BLAKE3."""
        with self._lock:
            missing = [b for b in self._blobs if b not in self._blake3]
        done = 0
        for blob in missing:
            if stop is not None and stop.is_set():
                break
            sha, b3 = hashlib.sha256(), Blake3()
            try:
                with self.blob_path(blob).open("rb") as f:
                    while chunk := f.read(CHUNK):
                        sha.update(chunk)
                        b3.update(chunk)
            except FileNotFoundError:  # evicted meanwhile
                continue
            if sha.hexdigest() != blob:
                self.drop_corrupt(blob)
                continue
            with self._lock:
                if blob in self._blobs and blob not in self._blake3:
                    self._write_digest_locked(blob, b3.hexdigest())
                    done += 1
        return done

    def part_size(self, namespace: str, key: str) -> int | None:
        """The part size a multipart object was checked with (what a reader checks it with)."""
        with self._lock:
            entry = self._index.get((namespace, key))
            return entry.part_size if entry is not None else None

    # ------------------------------------------------------------ writes

    def begin(
        self,
        namespace: str,
        pod: str,
        kind: str,
        checksum: str,
        *,
        size: int,
        part_size: int | None = None,
        deferred: bool = False,
    ) -> Upload:
        """Admit a write of ``size`` bytes by ``pod`` of ``namespace`` (its live lease must name the
        key with that size), taking no room yet; or raise Refused. ``deferred``: hashed once written
        (``Upload``)."""
        key = object_key(kind, checksum)
        with self._lock:
            try:
                if key is None:
                    raise Refused(
                        "kind",
                        400,
                        f"{kind}/{checksum}: only sha256, sha1, md5 and S3 multipart ETags are cached",
                    )
                if kind in PART_SIZED_KINDS and not part_size:
                    raise Refused("kind", 400, f"{key}: a multipart ETag is checked with its part size")
                if not parts_match(kind, checksum, size, part_size):
                    raise Refused(
                        "parts", 400, f"{key}: {size} bytes in parts of {part_size} do not make its parts"
                    )
                lease = self._leases.get(pod)
                if lease is None or lease.expires <= self.clock() or key not in lease.keys:
                    raise Refused("unleased", 403, f"{key}: not named by this pod's live lease")
                if lease.sizes.get(key) != size:
                    raise Refused(
                        "size", 400, f"{key}: {size} bytes, the lease declared {lease.sizes.get(key)}"
                    )
                if size > self.limit:
                    raise Refused("size", 413, f"{key}: {size} bytes is over the cache's {self.limit}")
                if (namespace, key) in self._index:
                    raise Refused("present", 409, f"{key}: already cached")
                if (namespace, key) in self._writing:
                    raise Refused("busy", 409, f"{key}: being written by another upload")
            except Refused as refused:
                self._count_refused(refused.reason)
                raise
            self._writing.add((namespace, key))
        digest = make_hasher(kind, part_size)
        assert digest is not None  # a cacheable kind, with its part size
        tmp = self.root / TMP / f"{secrets.token_hex(8)}"
        return Upload(namespace, key, kind, checksum, size, tmp, digest, part_size, deferred=deferred)

    def take(self, upload: Upload, count: int) -> None:
        """Room for ``count`` more bytes of the upload (evicting what must go), as they arrive; or
        Refused (507) when leased blobs leave none, or (400) past the declared size."""
        with self._lock:
            if upload.taken + count > upload.size:
                raise Refused("long", 400, f"{upload.key}: more than the {upload.size} bytes declared")
            if not self._evict_locked(count):
                raise Refused("full", 507, f"{upload.key}: leased objects leave no room")
            self._reserved += count
            upload.taken += count

    def finish(self, upload: Upload) -> None:
        """Check the upload against its key and put it in place (blocking); Refused (nothing kept)
        when it is short or does not match. Bytes already held as a blob are not kept twice."""
        if upload.file is not None:
            upload.file.close()
        if upload.received != upload.size:
            raise Refused("short", 400, f"{upload.key}: {upload.received} of {upload.size} bytes arrived")
        if upload.deferred and upload.file is not None:
            upload.hash_written()
        if upload.digest.hexdigest() != upload.checksum:
            raise Refused(
                "checksum", 422, f"{upload.key}: the bytes' {upload.kind} is {upload.digest.hexdigest()}"
            )
        if upload.file is None:
            upload.tmp.write_bytes(b"")
        blob = upload.blob_digest.hexdigest()
        entry = Entry(blob, upload.part_size if upload.kind in PART_SIZED_KINDS else None)
        with self._lock:
            new = blob not in self._blobs
            if new:
                os.replace(upload.tmp, self.blob_path(blob))
                self._blobs[blob] = CachedObject(blob, upload.size, self.clock())
                self._used += upload.size
            if blob not in self._blake3:  # the same bytes (its SHA-256): their BLAKE3 is this one's
                self._write_digest_locked(blob, upload.blake3.hexdigest())
            self._write_entry(upload.namespace, upload.key, entry)
            self._link_locked(upload.namespace, upload.key, entry)
            self.stats.stored += 1
            self.stats.stored_bytes += upload.size

    def end(self, upload: Upload, refused: str | None = None) -> None:
        """Release the upload's room and name (always, after finish or a failure)."""
        if upload.file is not None and not upload.file.closed:
            upload.file.close()
        with contextlib.suppress(FileNotFoundError):
            upload.tmp.unlink()
        with self._lock:
            self._writing.discard((upload.namespace, upload.key))
            self._checking.discard((upload.namespace, upload.key))
            self._claims.pop((upload.namespace, upload.key), None)  # kept or not: no more waiting
            self._reserved -= upload.taken
            upload.taken = 0
            if refused is not None:
                self.stats.refused[refused] = self.stats.refused.get(refused, 0) + 1
            self._settled.notify_all()

    def checking(self, upload: Upload) -> None:
        """A deferred upload, received whole, waits for its check (``settle`` waits for it)."""
        with self._lock:
            self._checking.add((upload.namespace, upload.key))

    def settle(
        self, namespace: str | None = None, keys: Iterable[str] | None = None, timeout: float = 30.0
    ) -> bool:
        """Wait (blocking) up to ``timeout`` seconds until no deferred check of ``keys`` of
        ``namespace`` (default: any) is in progress; whether none is."""
        wanted = None if keys is None else frozenset(keys)

        def quiet() -> bool:
            return not any(
                (namespace is None or ns == namespace) and (wanted is None or key in wanted)
                for ns, key in self._checking
            )

        with self._lock:
            return self._settled.wait_for(quiet, timeout)

    def _count_refused(self, reason: str) -> None:
        self.stats.refused[reason] = self.stats.refused.get(reason, 0) + 1

    def _write_entry(self, namespace: str, key: str, entry: Entry) -> None:
        path = self._entry_path(namespace, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.root / TMP / f"entry-{secrets.token_hex(8)}"
        tmp.write_text(f"{entry.blob} {entry.part_size}\n" if entry.part_size else f"{entry.blob}\n")
        os.replace(tmp, path)

    def _write_digest_locked(self, blob: str, value: str) -> None:
        tmp = self.root / TMP / f"blake3-{secrets.token_hex(8)}"
        tmp.write_text(value + "\n")
        os.replace(tmp, self.root / DIGESTS / blob)
        self._blake3[blob] = value

    def _link_locked(self, namespace: str, key: str, entry: Entry) -> None:
        old = self._index.get((namespace, key))
        if old is not None and old.blob != entry.blob:
            self._refs.get(old.blob, set()).discard((namespace, key))
        self._index[(namespace, key)] = entry
        self._refs.setdefault(entry.blob, set()).add((namespace, key))

    # ------------------------------------------------------------ leases

    def lease(
        self,
        pod: str,
        namespace: str,
        objects: Iterable[tuple[str, str, int]],
        expires: float | None = None,
    ) -> tuple[list[str], dict[str, int]]:
        """A pod's lease on ``objects`` (kind, checksum, size) until the lease TTL or ``expires``
        (its token's expiry), whichever is first, replacing its earlier one; the keys the namespace
        holds (their blobs counted as used now) and the part sizes of the multipart ones."""
        try:
            sizes = check_lease(list(objects), self.pod_lease_bytes)
        except Exception:
            self._count_refused("lease")
            raise
        with self._lock:
            now = self.clock()
            self._leases = live_leases(self._leases, now)
            end = now + self.lease_ttl if expires is None else min(now + self.lease_ttl, expires)
            self._leases[pod] = Lease(pod, frozenset(sizes), end, namespace, sizes)
            held = sorted(k for k in sizes if (namespace, k) in self._index)
            parts: dict[str, int] = {}
            for key in held:
                entry = self._index[(namespace, key)]
                obj = self._blobs[entry.blob]
                self._blobs[entry.blob] = CachedObject(entry.blob, obj.size, now)
                if entry.part_size:
                    parts[key] = entry.part_size
        return held, parts

    def drop_lease(self, pod: str) -> None:
        with self._lock:
            self._leases.pop(pod, None)
            self._claims = {k: c for k, c in self._claims.items() if c.pod != pod}

    # ------------------------------------------------------------ claims

    def claim(self, pod: str, namespace: str, keys: Iterable[str]) -> dict[str, float]:
        """``pod``, whose live lease names ``keys``, reads those its namespace lacks from its store and
        will upload them: it claims each that no other pod of the namespace claims and no upload is
        writing or checking. The others, coming: key -> the most seconds another's claim (or an
        upload) may keep it coming."""
        coming: dict[str, float] = {}
        with self._lock:
            now = self.clock()
            self._claims = {
                k: c for k, c in self._claims.items() if claim_holds(c, self._leases.get(c.pod), k[1], now)
            }
            lease = self._leases.get(pod)
            if lease is None or lease.expires <= now:
                return coming
            for key in keys:
                if key not in lease.sizes or (namespace, key) in self._index:
                    continue
                left = self._coming_locked(pod, namespace, key, now)
                if left is not None:
                    coming[key] = left
                elif (namespace, key) not in self._claims:  # its own claim keeps its deadline
                    self._claims[(namespace, key)] = Claim(pod, now + claim_seconds(lease.sizes[key]))
        return coming

    def settled(self, pod: str, namespace: str, keys: Iterable[str]) -> list[str]:
        """Of ``keys``, those no longer coming for ``pod``: held by its namespace, or with no other
        pod's claim that holds and no upload writing or checking them."""
        with self._lock:
            now = self.clock()
            return [
                key
                for key in keys
                if (namespace, key) in self._index or self._coming_locked(pod, namespace, key, now) is None
            ]

    def names(self, pod: str, keys: Iterable[str]) -> bool:
        """Whether ``pod``'s live lease names every one of ``keys``."""
        with self._lock:
            lease = self._leases.get(pod)
            return lease is not None and lease.expires > self.clock() and all(k in lease.keys for k in keys)

    def _coming_locked(self, pod: str, namespace: str, key: str, now: float) -> float | None:
        """The most seconds the key stays coming for ``pod`` (another pod's claim, or an upload in
        progress), None when it is not coming."""
        claim = self._claims.get((namespace, key))
        holder = self._leases.get(claim.pod) if claim is not None else None
        if claim is not None and claim.pod != pod and claim_holds(claim, holder, key, now):
            return claim.until - now
        if (namespace, key) in self._writing or (namespace, key) in self._checking:
            return CLAIM_BASE_SECONDS
        return None

    def leases(self) -> Mapping[str, Lease]:
        with self._lock:
            return dict(live_leases(self._leases, self.clock()))

    def keep_viewed(self, pod: str, blobs: Iterable[str]) -> None:
        """Keep ``blobs`` (linked in ``pod``'s view of shared files) as if leased, until
        ``drop_viewed``: evicting a linked blob would free no disk."""
        with self._lock:
            self._viewed[pod] = self._viewed.get(pod, frozenset()) | frozenset(blobs)

    def drop_viewed(self, pod: str) -> None:
        with self._lock:
            self._viewed.pop(pod, None)

    def _leased_blobs_locked(self) -> frozenset[str]:
        now = self.clock()
        out: set[str] = set().union(*self._viewed.values())
        for lease in self._leases.values():
            if lease.expires <= now:
                continue
            for key in lease.keys:
                entry = self._index.get((lease.namespace, key))
                if entry is not None:
                    out.add(entry.blob)
        return frozenset(out)

    # ------------------------------------------------------------ figures

    def figures(self) -> tuple[int, int, int]:
        """(blobs, bytes kept, bytes under a live lease)."""
        with self._lock:
            leased = self._leased_blobs_locked()
            leased_bytes = sum(o.size for k, o in self._blobs.items() if k in leased)
            return len(self._blobs), self._used, leased_bytes

    # ------------------------------------------------------------ eviction

    def _evict_locked(self, incoming: int) -> bool:
        chosen = choose_evictions(
            list(self._blobs.values()),
            self._leased_blobs_locked(),
            self._used + self._reserved,
            self.limit,
            incoming,
        )
        if chosen is None:
            return False
        for blob in chosen:
            size = self._blobs[blob].size
            self._remove_blob_locked(blob)
            self.stats.evictions += 1
            self.stats.evicted_bytes += size
        return True

    def _remove_blob_locked(self, blob: str) -> None:
        remove_path(self.blob_path(blob))
        self._forget_blob_locked(blob)

    def _forget_blob_locked(self, blob: str) -> None:
        for namespace, key in self._refs.pop(blob, set()):
            if (entry := self._index.get((namespace, key))) is not None and entry.blob == blob:
                del self._index[(namespace, key)]
                remove_path(self._entry_path(namespace, key))
        obj = self._blobs.pop(blob, None)
        if obj is not None:
            self._used -= obj.size
        if self._blake3.pop(blob, None) is not None:
            remove_path(self.root / DIGESTS / blob)


def _read_digest(path: Path) -> str | None:
    """A BLAKE3 record's value, None when it is not one (not a file, not 64 lower-case hex)."""
    if not path.is_file() or path.is_symlink():
        return None
    try:
        value = path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return value if BLOB_FORM.fullmatch(value) else None


def remove_path(path: Path) -> None:
    """Remove a file or a folder (a symlink is removed, never followed); gone already is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()
