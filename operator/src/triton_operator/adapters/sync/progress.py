"""What a sync shows while it runs: a bar on a terminal, JSON lines otherwise."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import TextIO

from triton_operator.adapters.sync.hashing import MiB
from triton_operator.adapters.sync.results import SyncStats


class Progress:
    """A single-line bar on a TTY; otherwise JSON lines (every N files or second, and a summary)."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        tty: bool | None = None,
        every_files: int = 100,
        every_seconds: float = 1.0,
    ) -> None:
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


def silent() -> Progress:
    """A Progress that writes nothing: for a sync run without one."""
    return Progress(_NullStream(), tty=False)  # type: ignore[arg-type]
