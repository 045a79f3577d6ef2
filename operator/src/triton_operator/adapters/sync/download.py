"""The download engine of `triton-operator sync`: pinned objects in parallel, verified, atomic."""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import mmap
import os
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from triton_operator.adapters.storage.base import Chunk, ObjectStore, Sink, StoreUnavailable, TransferCheck
from triton_operator.adapters.storage.pvc import PvcStore
from triton_operator.adapters.sync.destination import (
    Dirs,
    boot_id,
    fsync_dir,
    link_or_copy,
    load_state,
    place_bytes,
    place_symlink,
    preallocate,
    save_state,
    start_writeback,
    state_record,
    syncfs,
    tmp_name,
    write_all,
)
from triton_operator.adapters.sync.hashing import (
    BLAKE3,
    CHUNK,
    Hasher,
    MiB,
    PartDigests,
    RangeCrcs,
    hash_file,
    make_hasher,
    parallel_digest,
)
from triton_operator.adapters.sync.progress import Progress, silent
from triton_operator.adapters.sync.results import ChecksumMismatch, SyncError, SyncStats, UnsafeDestination
from triton_operator.adapters.sync.space import Need, check, device_of, room
from triton_operator.core.edges.backoff import Backoff, Random
from triton_operator.core.repository.manifest import (
    CONFIG_FILE,
    CONTENT_KINDS,
    Manifest,
    ManifestEntry,
    ModelSource,
    SelectedModel,
    SelectionFailed,
    parse_repository_uri,
    select_objects,
)
from triton_operator.core.repository.shared_files import shared_target

log = logging.getLogger(__name__)


class ObjectSource(Protocol):
    """Another place that may hold pinned objects' bytes (the node's cache), consulted before the
    store: whatever it gives is checked against the pinned checksum like the store's bytes, and a
    failure or a mismatch there only sends the object to the store. Offered each verified download."""

    def held(
        self, entries: Sequence[ManifestEntry], fetching: Sequence[ManifestEntry] = ()
    ) -> frozenset[str]:
        """Declares the sync's use of ``entries``; the keys (source_key) of those it holds.
        ``fetching``: those the sync reads from its store where the source lacks them (and offers)."""

    def part_size(self, entry: ManifestEntry) -> int | None:
        """The part size of a held multipart upload, to check the source's bytes with instead of
        asking the store (None: ask the store). A wrong one only fails the source's copy."""

    def read(self, entry: ManifestEntry, sink: Sink, start: int = 0, end: int | None = None) -> int | None:
        """Streams the object (its bytes ``start``..``end``, end excluded; called from several
        threads at once for one object's ranges) to ``sink``: the bytes given, None when it has
        not got it."""

    def offer(self, entry: ManifestEntry, path: Path, part_size: int | None = None) -> None:
        """A verified download of ``entry`` at ``path`` (``part_size``: the multipart upload's,
        that its ETag was checked with), to keep (best effort, never raises)."""


def shared_file_matches(path: str, size: int, blake3: str) -> bool:
    """Whether the file at ``path`` (a read-only file of the node cache's, mapped, not copied) has
    ``size`` bytes whose BLAKE3 is ``blake3``."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size != size:
            return False
        hasher = make_hasher(BLAKE3)
        assert hasher is not None
        if size:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                hasher.update(memoryview(mapped))
        return hasher.hexdigest() == blake3


def source_key(entry: ManifestEntry) -> str:
    return f"{entry.checksum_kind}/{entry.checksum}"


@dataclass(frozen=True)
class SyncOptions:
    dest: Path
    configs: Path | None = None
    cache: Path | None = None
    concurrency: int = 16
    part_size: int = 64 * MiB
    retries: int = 3
    pvc_root: Path | None = None  # where a pvc:// claim is mounted (unpinned manifests)
    volume_limit: int | None = None  # the dest volume's size limit (an emptyDir's sizeLimit), bytes
    source: ObjectSource | None = None  # consulted before the store (the node cache)
    # where the pod's read-only view of the node cache's files is mounted ("": none): a symlink
    # into it that an earlier sync placed (and recorded) is a present file, any other is refused
    shared_dir: str = ""
    # "fast": a file read from the store in ranges is checked by the store's own CRC of the pinned
    # object (S3's CRC32C/CRC32, of the whole object or composite of its parts) where it keeps one,
    # else by the pinned digest; "digest": always by the pinned digest (MD5, SHA-1, SHA-256).
    verify: str = "fast"
    # Models whose files are fetched first, in this order: a free connection always takes a part of
    # the first model in it with bytes left to fetch, so each model's files land together, as early
    # as they can (a model not named comes after those named). (): every file at once, big first.
    model_order: tuple[str, ...] = ()
    # Given the keys (source_key) of the objects the source holds, once its lease answered: the
    # model_order to use instead (the agent's first fill orders a warm node's models differently).
    reorder: Callable[[frozenset[str]], tuple[str, ...]] | None = None


VERIFY_MODES = ("fast", "digest")
PREALLOCATE_FROM = 1024 * 1024
"""A file read from the node cache in one stream, of at least this many bytes, gets its blocks first."""
AWAIT_MARGIN_SECONDS = 5.0
"""A sync waits for other pods' uploads at most the longest of their claims' times, plus this."""
READ_RETRY_BACKOFF = Backoff(base=0.4, cap=5.0)
"""Delays before a read the store could not answer (StoreUnavailable) is tried again: up to 0.4 s,
0.8 s, ... (full jitter: the sync's threads that failed together do not retry together), never more
than 5 s. The store's own attempts came first (s3_http honours the store's Retry-After)."""
# Pinned digests that a store's CRC may stand in for, where the store binds its CRC to them.
_DIGEST_KINDS = frozenset({"md5", "s3-multipart"})


class _Aborted(Exception):  # noqa: N818 - control flow, not an error
    """Raised inside a sink when another task has failed."""


class _WriteFailed(Exception):  # noqa: N818 - carries the OSError past the store's handlers
    """Raised inside a sink when writing to dest failed (a full volume): the store must not take it
    for its own failure (stores turn an OSError in a read into StoreUnavailable, and retry it)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class _Then:
    """What a task returns to have more tasks run after it (``Syncer._run_all``)."""

    def __init__(self, tasks: Sequence[Callable[[], Any]]) -> None:
        self.tasks = tasks


class _Ranked:
    """Tasks handed out lowest rank first, then in the order added: each task added is run by one
    call of ``run_next`` (the calls are what the pool is given), whichever task is first then. A
    task added later with a lower rank (a big file's parts, once its HEADs are answered) goes before
    those of higher ranks still waiting."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Callable[[], Any]]] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()

    def add(self, rank: int, tasks: Sequence[Callable[[], Any]]) -> list[Callable[[], Any]]:
        """Queue ``tasks`` at ``rank``; the calls that run them (as many as the tasks)."""
        with self._lock:
            for task in tasks:
                heapq.heappush(self._heap, (rank, next(self._seq), task))
        return [self.run_next] * len(tasks)

    def run_next(self) -> Any:
        with self._lock:
            _, _, task = heapq.heappop(self._heap)
        return task()


class _Turns:
    """Ranged parts of big files, handed out file by file in turns: writes into one file wait for
    each other (the filesystem locks the file for each write), so parts running at once are best of
    different files. Each part added is run by one call of ``run_next``, whichever part is next."""

    def __init__(self) -> None:
        self._files: deque[deque[Callable[[], Any]]] = deque()
        self._lock = threading.Lock()

    def add(self, parts: Sequence[Callable[[], Any]]) -> list[Callable[[], Any]]:
        """Queue one file's parts; the calls that run them (as many as the parts)."""
        if parts:
            with self._lock:
                self._files.append(deque(parts))
        return [self.run_next] * len(parts)

    def run_next(self) -> Any:
        with self._lock:
            parts = self._files.popleft()
            part = parts.popleft()
            if parts:
                self._files.append(parts)
        return part()


@dataclass
class _Job:
    """One file being downloaded: parts are written with pwrite, hashed in order by pread."""

    entry: ManifestEntry
    path: Path
    multipart_part_size: int | None = None
    hasher: Hasher | None = None
    tmp: Path = field(init=False)
    fd: int = -1
    parts: list[tuple[int, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: dict[int, int] = field(default_factory=dict)
    hash_pos: int = 0
    hashing: bool = False
    finished: bool = False
    aligned: PartDigests | RangeCrcs | None = None  # a checksum that ranges feed in parallel
    parts_left: int = 0
    cached: Path | None = None  # the cache holds the pinned content: placed from there, not fetched
    from_source: bool = False  # read from options.source, not the store
    part_size_from_source: bool = False  # multipart_part_size as options.source told it
    # the store's CRC (or the node cache's signed SHA-256), checked instead of the pinned digest
    check: TransferCheck | None = None
    deferred: bool = False  # nothing local to compare: its HEADs are sent as it is fetched (_remote_check)
    source_failed: bool = False  # a range read from options.source failed: the store is read
    source_got: int = 0  # bytes options.source gave for the job's ranges so far

    def __post_init__(self) -> None:
        self.tmp = tmp_name(self.path)

    @property
    def verify_kind(self) -> str:
        return self.check.kind if self.check is not None else self.entry.checksum_kind

    @property
    def verify_value(self) -> str:
        return self.check.value if self.check is not None else self.entry.checksum

    @property
    def verify_part_size(self) -> int | None:
        return self.check.part_size if self.check is not None else self.multipart_part_size

    def new_hasher(self) -> Hasher | None:
        return make_hasher(self.verify_kind, self.verify_part_size)


class Syncer:
    """Runs one sync of a pinned manifest into ``options.dest``."""

    def __init__(
        self,
        manifest: Manifest,
        store: ObjectStore | None,
        options: SyncOptions,
        progress: Progress | None = None,
        random: Random | None = None,
    ) -> None:
        self.manifest = manifest
        self.store = store
        self.options = options
        self.random = random
        """The jitter of the read retries (core.edges.backoff); None: the system's."""
        self.progress = progress or silent()
        self.stats = SyncStats()
        self.dest = options.dest
        self._abort = threading.Event()
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._state_new: dict[str, list[Any]] = {}
        self._state_old: dict[str, list[Any]] = {}
        self._touched_dirs: set[Path] = set()
        self._jobs: list[_Job] = []
        self._held: frozenset[str] = frozenset()  # what options.source holds (source_key)
        self._boot = boot_id()  # "" where unknown: then what is written is flushed
        self._ranks = {m: i for i, m in enumerate(options.model_order)}
        self._queue = _Ranked()
        self._dirs = Dirs(self.dest)
        # Each model's files not placed yet; the models placed (progress.model_placed told); whether
        # dest may be written yet (not before the files are known to fit).
        self._left: dict[str, int] = {m.name: 0 for m in manifest.models}
        for entry in manifest.entries:
            model = _model_of(entry)
            self._left[model] = self._left.get(model, 0) + 1
        self._placed: set[str] = set()
        self._writable = False

    # -------------------------------------------------------- entry point

    def run(self) -> SyncStats:
        started = time.monotonic()
        if self.manifest.pinned:
            self._sync_pinned()  # makes dest once it knows the files fit
        else:
            self.dest.mkdir(parents=True, exist_ok=True)
            self._sync_unpinned()
        self._write_configs()
        self._writable = True
        for model in self.manifest.models:  # what was not told yet (a claim's; nothing left to fetch)
            self._model_done(model.name, at_end=True)
        new_state = self.manifest.pinned and self._state_new != self._state_old
        if not self._boot and (self._touched_dirs or new_state):
            # This boot has no id to bind the state file to: one flush for everything written
            # (data, renames and folders), and the state file only after it. With an id nothing is
            # flushed: within the boot the page cache is what every reader gets, and after a
            # crash the state file is not trusted (every file is checked by its digest again).
            syncfs(self.dest)
            if self.options.cache is not None and self.options.cache.is_dir():
                syncfs(self.options.cache)
        if new_state:
            save_state(self.dest, self._state_new, self._boot)
            if not self._boot:
                fsync_dir(self.dest)
        self.stats.seconds = time.monotonic() - started
        self.progress.finish(self.stats)
        return self.stats

    # -------------------------------------------------------- pinned

    def _sync_pinned(self) -> None:
        if self.store is None:
            raise SyncError("a pinned manifest needs a store to read from")
        entries = self.manifest.entries
        self.stats.files = len(entries)
        self.stats.bytes = sum(e.size for e in entries)
        self.progress.begin(self.stats.files, self.stats.bytes)
        unknown = self._skip_known(entries)
        self._download(unknown)
        self._cleanup_jobs()
        self._prune()

    def _skip_known(self, entries: Sequence[ManifestEntry]) -> list[ManifestEntry]:
        """Mark present the files the last sync recorded unchanged; the rest, whose state is unknown."""
        state = self._state_old = load_state(self.dest, self._boot)
        dirs = Dirs(self.dest)
        unknown: list[ManifestEntry] = []
        for entry in entries:
            parent, _, _ = entry.dest.rpartition("/")
            if not dirs.check(parent):  # nothing is made before the files are known to fit
                unknown.append(entry)
                continue
            path = self.dest / entry.dest
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                unknown.append(entry)
                continue
            if stat.S_ISLNK(st.st_mode):
                if not self._placed_link(entry, path, st, state):
                    raise UnsafeDestination(
                        f"{path} is a symlink where {entry.key!r} should go; sync refuses it"
                    )
                self._mark_present(entry, st)
                continue
            if not stat.S_ISREG(st.st_mode):
                raise UnsafeDestination(f"{path} exists and is not a regular file")
            if state.get(entry.dest) == state_record(entry, st):
                self._mark_present(entry, st)
            else:
                unknown.append(entry)
        return unknown

    def _download(self, unknown: list[ManifestEntry]) -> None:
        workers = max(1, self.options.concurrency)
        if self.options.source is not None and unknown:
            # What this sync may read from the store (its unknown files) is claimed: a pod of the
            # namespace that needs one of them meanwhile waits for this pod's upload (``_await``).
            self._held = self.options.source.held(self.manifest.entries, unknown)
        if self.options.reorder is not None:
            self._ranks = {m: i for i, m in enumerate(self.options.reorder(self._held))}
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sync") as pool:
            # Phase 1: files whose state is unknown are hashed; the cache is consulted.
            checked = [job for job in self._run_all(pool, [partial(self._check, e) for e in unknown]) if job]
            hits = [job for job in checked if job.cached is not None]
            to_fetch = [job for job in checked if job.cached is None]
            # Nothing is written before the bytes to write are known to fit the volume.
            self._preflight(to_fetch, hits)
            self.dest.mkdir(parents=True, exist_ok=True)
            for job in checked:
                self._dirs.ensure(job.entry.dest.rpartition("/")[0])
            self._may_write()
            self._run_all(pool, [partial(self._place_cached, job) for job in hits])
            # Phase 2: what the source (the node cache) holds is read from it while the store's
            # downloads of the rest run beside it; then whatever the source failed to give, from the
            # store. Store downloads: big files in ranged parts first, then whole files, biggest first.
            source = self.options.source
            coming = getattr(source, "coming", None)  # a source other pods upload to (optional)
            tried: list[_Job] = []
            direct: list[_Job] = []
            awaited: list[_Job] = []
            for job in to_fetch:
                if source is not None and source_key(job.entry) in self._held:
                    tried.append(job)
                elif coming is not None and coming(job.entry) is not None:
                    awaited.append(job)  # another pod reads it from the store now: after the rest
                else:
                    direct.append(job)
            self._jobs.extend(direct)
            self._jobs.extend(tried)
            self._jobs.extend(awaited)
            reads = self._source_tasks(source, tried) if source is not None else {}
            stores = self._store_tasks(direct)
            runs: list[Callable[[], Any]] = []
            if source is not None and coming is not None and awaited:
                # Waits beside the rest (one of the pool's threads), from the start: each object is
                # read as soon as its upload lands.
                longest = max(coming(job.entry) or 0.0 for job in awaited)
                runs.append(
                    partial(self._await, source, awaited, time.monotonic() + longest + AWAIT_MARGIN_SECONDS)
                )
            for rank in sorted({*reads, *stores}):
                # taken in turns, so that neither waits for the other's queue to drain
                pairs = itertools.zip_longest(stores.get(rank, []), reads.get(rank, []))
                runs += self._queue.add(rank, [task for pair in pairs for task in pair if task is not None])
            self._run_all(pool, runs)
            left = [job for job in (*tried, *awaited) if not job.finished]
            if source is not None:
                with self._lock:
                    self.stats.source_misses += len(direct) + len(left)
            if left:
                again = self._store_tasks(left)
                self._run_all(pool, [run for r in sorted(again) for run in self._queue.add(r, again[r])])

    def _await(self, source: ObjectSource, jobs: list[_Job], deadline: float) -> _Then:
        """A task run beside the sync's reads: ``jobs`` are objects other pods of the namespace read
        from their stores to upload to the source. It waits (each wait bounded by the source) until
        some of them are no longer coming; their reads from the source (or, where the source still
        lacks them, the store's downloads) then run as next tasks, and another such task waits for
        the rest. At ``deadline`` (the claims' longest time), or when the source fails, what is left
        is downloaded from the store."""
        wait_for = getattr(source, "await_uploads", None)
        settled: frozenset[str] | None = frozenset()
        while (
            wait_for is not None and not settled and time.monotonic() < deadline and not self._abort.is_set()
        ):
            settled = wait_for([job.entry for job in jobs])
            if settled is None:
                break
        ready = [job for job in jobs if settled and source_key(job.entry) in settled]
        rest = [job for job in jobs if job not in ready] if settled else []
        held = source.held(self.manifest.entries, [job.entry for job in ready]) if ready else frozenset()
        got = [job for job in ready if source_key(job.entry) in held]
        stored = [job for job in jobs if job not in got and job not in rest]
        for job in got:  # set up as phase 1 sets up a held one
            job.deferred, job.check = False, None
            if job.entry.checksum_kind == "s3-multipart":
                job.multipart_part_size = self._multipart_part_size(job, held)
        with self._lock:
            self.stats.awaited_files += len(got)
            self.stats.source_misses += len(stored)
        reads, stores = self._source_tasks(source, got), self._store_tasks(stored)
        tasks: list[Callable[[], Any]] = []
        for rank in sorted({*reads, *stores}):
            tasks += self._queue.add(rank, [*stores.get(rank, []), *reads.get(rank, [])])
        if rest:
            tasks.append(partial(self._await, source, rest, deadline))
        return _Then(tasks)

    def _run_all(self, pool: ThreadPoolExecutor, tasks: Iterable[Callable[[], Any]]) -> list[Any]:
        """Run tasks on the pool, and the tasks any of them returns in a ``_Then`` as soon as it
        does; on the first failure stop the rest and raise it. The first tasks' results, in order."""
        if self._errors:
            raise self._errors[0]
        futures: list[Future[Any]] = [pool.submit(self._guard, t) for t in tasks]
        every = list(futures)
        pending = set(futures)
        while pending and not self._errors:  # _guard records every failure before its future completes
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                result = None if f.exception() is not None else f.result()
                if isinstance(result, _Then) and not self._errors:
                    more = [pool.submit(self._guard, t) for t in result.tasks]
                    every.extend(more)
                    pending.update(more)
        if self._errors:
            self._abort.set()
            for f in every:
                f.cancel()
            wait(every)
            self._cleanup_jobs()
            raise self._errors[0]
        return [f.result() for f in futures]

    def _guard(self, task: Callable[[], Any]) -> Any:
        if self._abort.is_set():
            return None
        try:
            return task()
        except _Aborted:
            return None
        except _WriteFailed as failed:
            self._failed(failed.error)
            raise failed.error from None
        except BaseException as exc:
            self._failed(exc)
            raise

    def _failed(self, exc: BaseException) -> None:
        with self._lock:
            self._errors.append(exc)
        self._abort.set()

    def _placed_link(
        self, entry: ManifestEntry, path: Path, st: os.stat_result, state: Mapping[str, list[Any]]
    ) -> bool:
        """Whether the symlink at ``path`` is one this pod's sync placed for ``entry``: recorded as
        it is now (a symlink cannot change, only be replaced: a new inode) and naming a file of the
        pod's view of the node cache's files that is still there."""
        folder = self.options.shared_dir
        if not folder or state.get(entry.dest) != state_record(entry, st):
            return False
        try:
            link = os.readlink(path)
        except OSError:
            return False
        return shared_target(link, folder) is not None and os.path.isfile(link)

    def _mark_present(self, entry: ManifestEntry, st: os.stat_result) -> None:
        with self._lock:
            self._state_new[entry.dest] = state_record(entry, st)
            self.stats.present_files += 1
        self.progress.file_done(entry.size, downloaded=False)
        self._file_placed(entry)

    # -------------------------------------------------------- each model as soon as its files are in

    def _rank(self, job: _Job) -> int:
        """Where ``job``'s model is in options.model_order (after them all when not named)."""
        return self._ranks.get(_model_of(job.entry), len(self._ranks))

    def _file_placed(self, entry: ManifestEntry) -> None:
        """``entry`` is at its path, verified: the progress is told, and its model is placed when it
        was the model's last file."""
        self.progress.file_placed(entry)
        model = _model_of(entry)
        with self._lock:
            self._left[model] -= 1
        self._model_done(model)

    def _may_write(self) -> None:
        """The files are known to fit: dest may be written, and each model with nothing left to
        place (present already, or without files: an ensemble) is placed now."""
        with self._lock:
            self._writable = True
        for model in self.manifest.models:
            self._model_done(model.name)

    def _model_done(self, model: str, *, at_end: bool = False) -> None:
        """Place ``model`` once every one of its files is and dest may be written: its folder pruned
        (old versions, temp files), its config.pbtxt written, the progress told (once). ``at_end``:
        from run(), which placed every file and wrote every config already (a claim's models, whose
        files are linked, not counted)."""
        with self._lock:
            waits = not self._writable or self._left.get(model, 0) > 0
            if model in self._placed or (waits and not at_end):
                return
            self._placed.add(model)
        if not at_end and self.manifest.pinned:
            self._prune_model(model)
            self._write_config(model, self._dirs)
        self.progress.model_placed(model)

    def _check(self, entry: ManifestEntry) -> _Job | None:
        """Phase 1: a file already present and right, a cache hit, or a job to download."""
        path = self.dest / entry.dest
        job = _Job(entry, path)
        if self._nothing_to_compare(entry, path):
            job.deferred = True  # its HEADs wait for its download, which they then start
            return job
        if entry.checksum_kind == "s3-multipart" and self.store is not None:
            job.multipart_part_size = self._multipart_part_size(job)
        hasher = job.new_hasher()
        if hasher is None:
            return job  # nothing to compare a local file with: fetch it under the pinned etag
        try:
            st: os.stat_result | None = os.lstat(path)
        except FileNotFoundError:
            st = None
        if (
            st is not None
            and stat.S_ISREG(st.st_mode)
            and st.st_size == entry.size
            and hash_file(path, hasher) == entry.checksum
        ):
            self._mark_present(entry, os.stat(path))
            return None
        job.cached = self._cache_hit(job)
        if job.cached is None:
            job.check = self._transfer_check(job)
        return job

    def _nothing_to_compare(self, entry: ManifestEntry, path: Path) -> bool:
        """Whether ``entry`` is downloaded from the store whatever it asks: no file of its size at
        ``path`` to hash, nothing in the cache, and not one the source holds (whose part size comes
        from the source). Its HEADs can then wait for its download (``_remote_check``), so that other
        files' downloads start while they are answered."""
        if self.store is None or source_key(entry) in self._held:
            return False
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISREG(st.st_mode) and st.st_size == entry.size:
            return False
        cached = self._cache_path(entry)
        return cached is None or not os.path.lexists(cached)

    def _remote_check(self, job: _Job) -> None:
        """What ``_check`` left to a deferred job's download: a multipart upload's part size and the
        store's CRC (each a HEAD), before its hashing and its parts are planned."""
        if not job.deferred:
            return
        entry = job.entry
        if entry.checksum_kind == "s3-multipart" and self.store is not None:
            job.multipart_part_size = self.store.part_size(entry.key, entry.etag)
        job.check = self._transfer_check(job)
        job.deferred = False

    def _transfer_check(self, job: _Job) -> TransferCheck | None:
        """The store's CRC of a big file it will be asked for, when verify is "fast".

        Only where the store can bind its CRC to the pinned digest (S3: the digest is the ETag the
        reads are conditional on; GCS: the pinned generation's MD5 is the digest), so that the CRC
        is of the pinned bytes; any other pin (SHA-256 of an encrypted object, Azure) is checked by
        its digest."""
        entry = job.entry
        if (
            self.options.verify != "fast"
            or self.store is None
            or entry.size <= self.options.part_size
            or entry.checksum_kind not in _DIGEST_KINDS
            or source_key(entry) in self._held
        ):
            return None
        return self.store.transfer_check(
            entry.key, entry.etag, entry.generation, job.multipart_part_size, entry.checksum
        )

    def _cache_hit(self, job: _Job) -> Path | None:
        """The cached file, when the cache holds the pinned content."""
        entry = job.entry
        cached = self._cache_path(entry)
        if cached is None:
            return None
        try:
            cst: os.stat_result | None = os.stat(cached)
        except FileNotFoundError:
            cst = None
        if cst is not None and stat.S_ISREG(cst.st_mode) and cst.st_size == entry.size:
            hasher = job.new_hasher()
            assert hasher is not None
            if hash_file(cached, hasher) == entry.checksum:
                return cached
        return None

    def _place_cached(self, job: _Job) -> None:
        entry, path = job.entry, job.path
        assert job.cached is not None
        link_or_copy(job.cached, path)
        with self._lock:
            self._state_new[entry.dest] = state_record(entry, os.stat(path))
            self.stats.cache_hits += 1
            self._touched_dirs.add(path.parent)
        self.progress.file_done(entry.size, downloaded=False)
        self._file_placed(entry)

    def _preflight(self, to_fetch: Sequence[_Job], hits: Sequence[_Job]) -> None:
        """Raise NoSpace, writing nothing, when the files to write do not fit dest's volume."""
        if not to_fetch and not hits:
            return  # only configs (and the state file) may change: a few bytes, nothing to refuse
        space = room(self.dest, self.options.volume_limit)
        dest_device = device_of(self.dest)
        copies = [j.entry.size for j in hits if j.cached is not None and device_of(j.cached) != dest_device]
        configs = self.options.configs
        small = [
            (configs / m.name / CONFIG_FILE).stat().st_size
            for m in self.manifest.models
            if configs is not None and (configs / m.name / CONFIG_FILE).is_file()
        ]
        folders = (
            {
                "/".join(parts[:n])
                for parts in (e.dest.split("/")[:-1] for e in self.manifest.entries)
                for n in range(1, len(parts) + 1)
            }
            | {f"{m.name}/{v}" for m in self.manifest.models for v in m.versions}
            | {m.name for m in self.manifest.models}
        )
        need = Need(
            downloads=tuple(j.entry.size for j in to_fetch),
            copies=tuple(copies),
            small=tuple(small),
            folders=sum(1 for f in folders if not (self.dest / f).is_dir()),
            files=len(self.manifest.entries),
        )
        check(need, space)

    def _cache_path(self, entry: ManifestEntry) -> Path | None:
        if self.options.cache is None or entry.checksum_kind not in CONTENT_KINDS:
            return None
        return self.options.cache / entry.checksum_kind / entry.checksum

    def _sink(self, write: Sink) -> Sink:
        abort = self._abort
        progress = self.progress

        def sink(chunk: Chunk) -> None:
            if abort.is_set():
                raise _Aborted
            try:
                write(chunk)
            except OSError as exc:
                raise _WriteFailed(exc) from exc
            progress.add_bytes(len(chunk))

        return sink

    def _read_with_retries(
        self, job: _Job, start: int, end: int | None, make_sink: Callable[[], Sink]
    ) -> int:
        assert self.store is not None
        attempt = 0
        while True:
            counted = [0]
            inner = make_sink()

            def sink(chunk: Chunk, inner: Sink = inner, counted: list[int] = counted) -> None:
                inner(chunk)
                counted[0] += len(chunk)

            try:
                return self.store.read_range(
                    job.entry.key, start, end, sink, etag=job.entry.etag, generation=job.entry.generation
                )
            except StoreUnavailable:
                attempt += 1
                self.progress.add_bytes(-counted[0])
                if attempt > self.options.retries or self._abort.is_set():
                    raise
                with self._lock:
                    self.stats.retried_reads += 1
                time.sleep(READ_RETRY_BACKOFF.delay(attempt - 1, random=self.random))

    def _fetch_whole(self, job: _Job) -> None:
        """A small file in one streamed read, hashed as it arrives; a retry starts it over."""
        self._remote_check(job)
        fd = job.fd = os.open(job.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)

        def make_sink() -> Sink:
            os.lseek(fd, 0, os.SEEK_SET)
            os.ftruncate(fd, 0)
            hasher = job.hasher = job.new_hasher()

            def write(chunk: Chunk) -> None:
                write_all(fd, chunk)
                if hasher is not None:
                    hasher.update(chunk)

            return self._sink(write)

        count = self._read_with_retries(job, 0, None, make_sink)
        self._finish(job, count)

    def _store_tasks(self, jobs: list[_Job]) -> dict[int, list[Callable[[], Any]]]:
        """The store's downloads of ``jobs``, by rank (``_rank``: their model's place in
        options.model_order), each rank's biggest first: big files in ranged parts (a deferred one's
        HEADs first, then its temp file allocated and its parts planned; the others' now), then whole
        files. The jobs are in self._jobs already. A rank's parts are taken file by file in turns
        (``_Turns``)."""
        out: dict[int, list[Callable[[], Any]]] = {}
        for rank in sorted({self._rank(j) for j in jobs}):
            ranked = sorted((j for j in jobs if self._rank(j) == rank), key=lambda j: -j.entry.size)
            turns = _Turns()
            plans: list[Callable[[], Any]] = []
            runs: list[Callable[[], Any]] = []
            for job in ranked:
                if job.entry.size <= self.options.part_size:
                    continue
                if job.deferred:
                    plans.append(partial(self._plan_parts, job, turns, rank))
                    continue
                try:
                    self._open_parts(job)
                except OSError:  # no room for the file (ENOSPC): no temp file is left behind
                    self._cleanup_jobs()
                    raise
                runs.extend(turns.add([partial(self._fetch_part, job, s, e) for s, e in job.parts]))
            whole = [partial(self._fetch_whole, j) for j in ranked if j.entry.size <= self.options.part_size]
            out[rank] = [*plans, *runs, *whole]
        return out

    def _plan_parts(self, job: _Job, turns: _Turns, rank: int) -> _Then:
        """A deferred big file: its HEADs, its temp file and its parts, run in turns with the others'
        of its rank, before any of a later rank."""
        self._remote_check(job)
        self._open_parts(job)  # an OSError (no room) fails the sync; _run_all removes the temp files
        parts = turns.add([partial(self._fetch_part, job, s, e) for s, e in job.parts])
        return _Then(self._queue.add(rank, parts))

    def _source_tasks(self, source: ObjectSource, jobs: list[_Job]) -> dict[int, list[Callable[[], Any]]]:
        """The source's reads of ``jobs``, by rank (as ``_store_tasks``), each rank's biggest first:
        a big file whose checksum ranges can feed in any order (an S3 multipart ETag) in ranges of
        whole upload parts, read at once on several connections and hashed in parallel; any other
        file in one read (several files at once)."""
        tasks: dict[int, list[Callable[[], Any]]] = {}
        vouched = getattr(source, "vouched", None)  # a source that signs what it holds (optional)
        shared = getattr(source, "shared", None)  # a source whose files the pod sees (optional)
        for job in sorted(jobs, key=lambda j: -j.entry.size):
            size = job.entry.size
            in_view = shared(job.entry) if shared is not None else None
            if in_view is not None:
                tasks.setdefault(self._rank(job), []).append(
                    partial(self._link_shared, source, job, *in_view)
                )
                continue
            digest = vouched(job.entry) if vouched is not None else None
            if digest is not None:
                # The BLAKE3 (or SHA-256) the node cache signed for the pinned bytes (its key
                # checked): its bytes are checked against that instead of the pin, in one stream.
                job.check = TransferCheck(*digest)
            rank = self._rank(job)
            if size > self.options.part_size and parallel_digest(job.verify_kind, size, job.verify_part_size):
                tasks.setdefault(rank, []).append(partial(self._plan_source_parts, source, job, rank))
            else:
                tasks.setdefault(rank, []).append(partial(self._fetch_source, source, job))
        return tasks

    def _link_shared(self, source: ObjectSource, job: _Job, target: str, blake3: str) -> bool:
        """A held object whose file the pod sees in its read-only view of the node cache's files:
        that file is checked against the BLAKE3 the cache signed for the pin, then the model's file
        is a symlink to it (no byte copied: the cache's own pages). A file that is not there or does
        not match is read from the source as before (then the store)."""
        entry = job.entry
        try:
            placed = shared_file_matches(target, entry.size, blake3)
            if placed:
                os.symlink(target, job.tmp)
                os.replace(job.tmp, job.path)
        except OSError as exc:
            log.warning("the node cache's file for %s could not be used: %s", entry.key, exc)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(job.tmp)
            placed = False
        if not placed:
            with self._lock:
                self.stats.source_refused += 1
            job.check = TransferCheck(BLAKE3, blake3)
            return self._fetch_source(source, job)
        job.finished = True
        job.from_source = True
        with self._lock:
            self._state_new[entry.dest] = state_record(entry, os.lstat(job.path))
            self.stats.source_hits += 1
            self.stats.source_bytes += entry.size
            self.stats.vouched_files += 1
            self.stats.shared_files += 1
            self._touched_dirs.add(job.path.parent)
        self.progress.add_bytes(entry.size)
        self.progress.file_done(entry.size)
        self._file_placed(entry)
        return True

    def _fetch_source(self, source: ObjectSource, job: _Job) -> bool:
        """One object from the source, checked as it arrives; False (nothing left behind) when the
        source has not got it or its bytes do not match the pin: the store is read instead."""
        fd = job.fd = os.open(job.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        if job.entry.size >= PREALLOCATE_FROM:
            # Its blocks allocated at once: the writes then skip the filesystem's allocation of each
            # page as it is written (a tenth of a CPU-second a GiB on ext4 here).
            preallocate(fd, job.entry.size)
        hasher = job.hasher = job.new_hasher()
        got = [0]

        def write(chunk: Chunk) -> None:
            write_all(fd, chunk)
            if hasher is not None:
                hasher.update(chunk)
            got[0] += len(chunk)

        count = source.read(job.entry, self._sink(write))
        if count is not None and hasher is not None:
            job.from_source = True
            try:
                self._finish(job, count)
                return True
            except ChecksumMismatch:
                with self._lock:
                    self.stats.source_refused += 1
        self._drop_source_copy(job, got[0])  # every byte the sink took, a failed read's too
        return False

    def _plan_source_parts(self, source: ObjectSource, job: _Job, rank: int) -> _Then:
        """A big file from the source: its temp file allocated, its ranges read at its rank."""
        self._open_parts(job)
        job.from_source = True
        job.source_failed = False
        job.source_got = 0
        return _Then(
            self._queue.add(rank, [partial(self._fetch_source_part, source, job, s, e) for s, e in job.parts])
        )

    def _fetch_source_part(self, source: ObjectSource, job: _Job, start: int, end: int) -> None:
        """One range of a big file from the source, hashed as it arrives; whoever reads the last
        one checks the file against the pin, or (a range failed, the bytes do not match) leaves it
        to the store."""
        count: int | None = None
        got = 0
        if not job.source_failed:
            fd, pos = job.fd, [start]
            assert job.aligned is not None
            digests = job.aligned.range(start, end)

            def write(chunk: Chunk) -> None:
                write_all(fd, chunk, pos[0])
                digests.update(chunk)
                pos[0] += len(chunk)

            count = source.read(job.entry, self._sink(write), start, end)
            got = pos[0] - start  # every byte the sink took (the progress counted it), a failed read's too
        with job.lock:
            job.source_got += got
            if count != end - start:
                job.source_failed = True
            job.parts_left -= 1
            if job.parts_left > 0:
                return
        if not job.source_failed:
            try:
                self._finish(job, job.entry.size)
                return
            except ChecksumMismatch:
                with self._lock:
                    self.stats.source_refused += 1
        self._drop_source_copy(job, job.source_got)

    def _drop_source_copy(self, job: _Job, count: int) -> None:
        """What the source gave for ``job`` (``count`` bytes) is dropped: the store is read."""
        self.progress.add_bytes(-count)
        job.from_source = False
        job.check = None  # the store's bytes are checked against the pin
        job.hasher = None
        job.aligned = None
        if job.fd >= 0:
            os.close(job.fd)
        job.fd = -1
        with contextlib.suppress(FileNotFoundError):
            os.unlink(job.tmp)
        if job.part_size_from_source and self.store is not None:
            # The store's download is checked with the store's own part size.
            job.multipart_part_size = self.store.part_size(job.entry.key, job.entry.etag)
            job.part_size_from_source = False

    def _multipart_part_size(self, job: _Job, held: frozenset[str] | None = None) -> int | None:
        """A multipart object's part size: as the source knows it where it holds the object
        (``held``: as for ``_source_part_size``), else as the store says (None without a store)."""
        from_source = self._source_part_size(job, held)
        if from_source or self.store is None:
            return from_source
        return self.store.part_size(job.entry.key, job.entry.etag)

    def _source_part_size(self, job: _Job, held: frozenset[str] | None = None) -> int | None:
        """A held multipart object's part size as the source knows it (no request to the store);
        ``held``: what the source's latest lease answered (default: its first)."""
        source = self.options.source
        if source is None or source_key(job.entry) not in (self._held if held is None else held):
            return None
        size = source.part_size(job.entry)
        job.part_size_from_source = size is not None
        return size

    def _open_parts(self, job: _Job) -> None:
        """A big file: allocate the temp file's size and plan its ranged parts."""
        job.fd = os.open(job.tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        preallocate(job.fd, job.entry.size)
        size, step = job.entry.size, self.options.part_size
        upload_part = job.verify_part_size
        job.aligned = parallel_digest(job.verify_kind, size, upload_part)
        if isinstance(job.aligned, PartDigests) and upload_part:
            # Ranges that cover whole upload parts: each part's digest is computed as it streams in.
            step = upload_part * max(1, step // upload_part)
        elif job.aligned is None:
            job.hasher = job.new_hasher()  # hashed in file order, from the file as written
        job.parts = [(s, min(s + step, size)) for s in range(0, size, step)]
        job.parts_left = len(job.parts)

    def _fetch_part(self, job: _Job, start: int, end: int) -> None:
        fd = job.fd
        pos = [start]
        aligned = job.aligned

        def make_sink() -> Sink:
            pos[0] = start
            digests = aligned.range(start, end) if aligned is not None else None

            def write(chunk: Chunk) -> None:
                write_all(fd, chunk, pos[0])
                if digests is not None:
                    digests.update(chunk)
                pos[0] += len(chunk)

            return self._sink(write)

        count = self._read_with_retries(job, start, end, make_sink)
        if count != end - start:
            raise ChecksumMismatch(
                job.entry.key, job.entry.dest, f"bytes {start}-{end - 1} length", str(end - start), str(count)
            )
        if not self._boot:
            start_writeback(fd, start, end - start)  # the flush at the end then finds little left
        with self._lock:
            self.stats.ranged_parts += 1
        self._part_done(job, start, end)

    def _part_done(self, job: _Job, start: int, end: int) -> None:
        """Hash completed parts in file order; whoever completes the last one finishes the file."""
        if job.aligned is not None:
            with job.lock:
                job.parts_left -= 1
                last = job.parts_left == 0
            if last:
                self._finish(job, job.entry.size)
            return
        with job.lock:
            job.done[start] = end
            if job.hashing:
                return
            job.hashing = True
        while True:
            with job.lock:
                stop = job.done.pop(job.hash_pos, None)
                if stop is None:
                    job.hashing = False
                    return
                begin = job.hash_pos
            if job.hasher is not None:
                self._hash_range(job, job.hasher, begin, stop)
            with job.lock:
                job.hash_pos = stop
                last = stop == job.entry.size
            if last:
                self._finish(job, job.entry.size)
                with job.lock:
                    job.hashing = False
                return

    def _hash_range(self, job: _Job, hasher: Hasher, begin: int, stop: int) -> None:
        """Feed bytes ``begin``..``stop`` of the temp file, as written, to the file's hasher."""
        offset = begin
        while offset < stop:
            if self._abort.is_set():
                raise _Aborted
            chunk = os.pread(job.fd, min(CHUNK * 8, stop - offset), offset)
            if not chunk:
                raise SyncError(f"{job.tmp}: short read while verifying")
            hasher.update(chunk)
            offset += len(chunk)

    def _finish(self, job: _Job, count: int) -> None:
        entry = job.entry
        size = os.fstat(job.fd).st_size
        if count != entry.size or size != entry.size:
            raise ChecksumMismatch(entry.key, entry.dest, "size", str(entry.size), str(max(count, size)))
        digest = job.aligned if job.aligned is not None else job.hasher
        verified = digest is not None
        if digest is not None:
            actual = digest.hexdigest()
            if actual != job.verify_value:
                by = "the manifest pins" if job.check is None else "the store keeps for the pinned object"
                raise ChecksumMismatch(
                    entry.key, entry.dest, job.verify_kind, job.verify_value, actual, by=by
                )
        os.close(job.fd)  # not flushed file by file (see run)
        job.fd = -1
        os.replace(job.tmp, job.path)
        job.finished = True
        st = os.stat(job.path)
        cached = self._cache_path(entry) if verified else None
        if cached is not None and not cached.exists():
            cached.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):
                link_or_copy(job.path, cached)
        if verified and not job.from_source and self.options.source is not None:
            self.options.source.offer(entry, job.path, job.multipart_part_size)
        with self._lock:
            self._state_new[entry.dest] = state_record(entry, st)
            if job.from_source:
                self.stats.source_hits += 1
                self.stats.source_bytes += entry.size
            else:
                self.stats.downloaded_files += 1
                self.stats.downloaded_bytes += entry.size
            if not verified:
                self.stats.unverified_files += 1
            elif job.check is not None and job.from_source:
                self.stats.vouched_files += 1
            elif job.check is not None:
                self.stats.crc_checked_files += 1
            self._touched_dirs.add(job.path.parent)
        self.progress.file_done(entry.size)
        self._file_placed(entry)

    def _cleanup_jobs(self) -> None:
        for job in self._jobs:
            if job.fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(job.fd)
                job.fd = -1
            if not job.finished:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(job.tmp)

    def _prune(self) -> None:
        """Remove files in the models' folders that the manifest does not name (old versions, temps)."""
        for model in self.manifest.models:
            self._prune_model(model.name)

    def _prune_model(self, model: str) -> None:
        """Remove files in ``model``'s folder that the manifest does not name."""
        keep = {e.dest for e in self.manifest.entries if _model_of(e) == model}
        root = self.dest / model
        if not root.is_dir() or root.is_symlink():
            return
        for dirpath, dirnames, filenames in os.walk(root, topdown=False, followlinks=False):
            d = Path(dirpath)
            for name in filenames + [n for n in dirnames if (d / n).is_symlink()]:
                rel = (d / name).relative_to(self.dest).as_posix()
                if rel in keep or rel == f"{model}/{CONFIG_FILE}":
                    continue
                os.unlink(d / name)
                with self._lock:
                    self.stats.pruned_files += 1
                    self._touched_dirs.add(d)
            if d != root:
                with contextlib.suppress(OSError):
                    d.rmdir()  # only when empty

    # -------------------------------------------------------- unpinned (pvc)

    def _sync_unpinned(self) -> None:
        """Link the claim's selected version folders into dest; the claim is read where mounted."""
        root = self.options.pvc_root
        loc = parse_repository_uri(self.manifest.repository.uri)
        if root is None:
            raise SyncError(
                f"{self.manifest.repository.uri}: the manifest is not pinned (pvc); pass --pvc-root, "
                "the folder where the claim is mounted"
            )
        store = PvcStore(self.manifest.repository.uri, loc.bucket, loc.prefix, root, checksums=False)
        sources = [ModelSource(m.name, m.folder, m.policy) for m in self.manifest.models]
        selection = select_objects(sources, store.list(store.prefix), prefix=store.prefix)
        if selection.errors:
            raise SelectionFailed(selection.errors)
        self.progress.begin(0, 0)
        dirs = Dirs(self.dest)
        for model in selection.models:
            model_dir = dirs.ensure(model.name)
            wanted = _link_targets(model, Path(root) / f"{loc.prefix}{model.folder}")
            for name, target in sorted(wanted.items()):
                if place_symlink(model_dir / name, target):
                    self.stats.linked_versions += 1
                    self._touched_dirs.add(model_dir)
            for entry in os.listdir(model_dir):
                p = model_dir / entry
                if entry not in wanted and entry != CONFIG_FILE and p.is_symlink():
                    os.unlink(p)
                    self.stats.pruned_files += 1
                    self._touched_dirs.add(model_dir)

    # -------------------------------------------------------- rendered configs

    def _write_configs(self) -> None:
        dirs = Dirs(self.dest)
        for model in self.manifest.models:
            self._write_config(model.name, dirs)

    def _write_config(self, name: str, dirs: Dirs) -> None:
        """``name``'s rendered config.pbtxt into its folder, and a folder for each pinned version,
        even one with no files (an ensemble's)."""
        configs = self.options.configs
        if configs is None:
            return
        for model in self.manifest.models:
            if model.name != name:
                continue
            for version in model.versions:
                dirs.ensure(f"{model.name}/{version}")
            src = configs / model.name / CONFIG_FILE
            if not src.is_file():
                raise SyncError(f"{src}: no rendered config for model {model.name!r} in {configs}")
            data = src.read_bytes()
            dst = dirs.ensure(model.name) / CONFIG_FILE
            if place_bytes(dst, data):
                with self._lock:
                    self.stats.configs_written += 1
                    self._touched_dirs.add(dst.parent)


def _model_of(entry: ManifestEntry) -> str:
    """The model a manifest entry is a file of: the first folder of its path under dest."""
    return entry.dest.partition("/")[0]


def _link_targets(model: SelectedModel, base: Path) -> dict[str, Path]:
    """The folders of a model on the claim to link into dest, by name: its selected versions and the
    first folder of any other selected object."""
    wanted: dict[str, Path] = {v: base / v for v in model.versions}
    for sel in model.objects:
        rel = sel.dest.split("/", 1)[1]
        first = rel.split("/", 1)[0]
        if first not in wanted:
            wanted[first] = base / first
    return wanted


def sync(
    manifest: Manifest, store: ObjectStore | None, options: SyncOptions, progress: Progress | None = None
) -> SyncStats:
    """Fetch and verify what ``manifest`` pins into ``options.dest``; see Syncer."""
    return Syncer(manifest, store, options, progress).run()
