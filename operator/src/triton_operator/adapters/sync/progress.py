"""What a sync shows while it runs: a bar on a terminal, JSON lines otherwise."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from triton_operator.adapters.sync.hashing import MiB
from triton_operator.adapters.sync.results import SyncStats
from triton_operator.core.repository.manifest import ManifestEntry


class Progress:
    """A single-line bar on a TTY; otherwise JSON lines (every N files or second, and a summary).

    ``on_file_placed`` and ``on_model_placed``: told, from the sync's threads, of each file of the
    manifest once it is at its path and verified (downloaded and checked, placed from the cache,
    found present and right), and of each model once its last file is placed, its folder pruned and
    its config.pbtxt written (a first fill loads it then, while other models still download)."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        tty: bool | None = None,
        every_files: int = 100,
        every_seconds: float = 1.0,
        on_file_placed: Callable[[ManifestEntry], object] | None = None,
        on_model_placed: Callable[[str], object] | None = None,
    ) -> None:
        self.on_file_placed = on_file_placed
        self.on_model_placed = on_model_placed
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.every_files = every_files
        self.every_seconds = every_seconds
        self._lock = threading.Lock()
        self.files_total = 0
        self.bytes_total = 0
        self.files_done = 0
        self.bytes_done = 0
        self.bytes_downloaded = 0
        self._start = time.monotonic()
        self._last_emit = 0.0
        self._last_files = 0

    def begin(self, files_total: int, bytes_total: int) -> None:
        with self._lock:
            self.files_total, self.bytes_total = files_total, bytes_total
            self._start = time.monotonic()
        self._emit(force=False)

    def add_bytes(self, n: int, *, downloaded: bool = True) -> None:
        with self._lock:
            self.bytes_done += n
            if downloaded:
                self.bytes_downloaded += n
        if self.tty:
            self._emit(force=False)

    def file_done(self, size: int = 0, *, downloaded: bool = True) -> None:
        with self._lock:
            self.files_done += 1
            if not downloaded:
                self.bytes_done += size
        self._emit(force=False)

    def file_placed(self, entry: ManifestEntry) -> None:
        """``entry`` is at its path in dest, verified (once per file of the manifest)."""
        if self.on_file_placed is not None:
            self.on_file_placed(entry)

    def model_placed(self, model: str) -> None:
        """Every file of ``model`` is placed and its config written (once per model of the manifest,
        by the end of the sync; a model with no file as soon as dest may be written)."""
        if self.on_model_placed is not None:
            self.on_model_placed(model)

    def _rate(self, now: float) -> float:
        elapsed = max(now - self._start, 1e-6)
        return self.bytes_downloaded / elapsed / 1e6

    def _emit(self, *, force: bool) -> None:
        now = time.monotonic()
        with self._lock:
            if self.tty:
                if not force and now - self._last_emit < 0.1:
                    return
            elif not force and (
                now - self._last_emit < self.every_seconds
                and self.files_done - self._last_files < self.every_files
            ):
                return
            self._last_emit, self._last_files = now, self.files_done
            files, files_total = self.files_done, self.files_total
            done, total, rate = self.bytes_done, self.bytes_total, self._rate(now)
        if self.tty:
            width = 24
            filled = int(width * done / total) if total else width
            line = (
                f"\r[{'#' * filled}{'.' * (width - filled)}] {files}/{files_total} files "
                f"{done / MiB:,.1f}/{total / MiB:,.1f} MiB {rate:,.1f} MB/s"
            )
            self.stream.write(line.ljust(79))
        else:
            self.stream.write(
                json.dumps(
                    {
                        "event": "progress",
                        "files": files,
                        "filesTotal": files_total,
                        "bytes": done,
                        "bytesTotal": total,
                        "mbPerSecond": round(rate, 2),
                        "elapsedSeconds": round(now - self._start, 3),
                    }
                )
                + "\n"
            )
        self.stream.flush()

    def finish(self, stats: SyncStats) -> None:
        if self.tty:
            self._emit(force=True)
            self.stream.write(
                f"\nsynced {stats.files} files ({stats.bytes / MiB:,.1f} MiB): "
                f"{stats.downloaded_files} downloaded, "
                f"{stats.present_files} present, {stats.cache_hits} from cache in {stats.seconds:.2f}s\n"
            )
        else:
            self.stream.write(json.dumps({"event": "summary", **stats.to_json()}) + "\n")
        self.stream.flush()

    def error(self, message: str) -> None:
        if self.tty:
            self.stream.write("\n")
        else:
            self.stream.write(json.dumps({"event": "error", "message": message}) + "\n")
        self.stream.flush()


class _NullStream:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        return None

    def isatty(self) -> bool:
        return False


def silent(
    *,
    on_file_placed: Callable[[ManifestEntry], object] | None = None,
    on_model_placed: Callable[[str], object] | None = None,
) -> Progress:
    """A Progress that writes nothing: for a sync run without one (its callbacks as Progress's)."""
    return Progress(
        _NullStream(),  # type: ignore[arg-type]
        tty=False,
        on_file_placed=on_file_placed,
        on_model_placed=on_model_placed,
    )
