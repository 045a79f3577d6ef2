"""The sync engine retries a read the store could not answer with core.edges.backoff's delays: growing,
jittered, capped (on main: a fixed 0.4, 0.8, 1.6 s, the same for every thread)."""

from __future__ import annotations

import random
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from triton_operator.adapters.storage.base import Sink, StoreUnavailable
from triton_operator.adapters.sync import download as engine
from triton_operator.adapters.sync.download import Syncer, SyncOptions, _Job
from triton_operator.core.edges.backoff import Random
from triton_operator.core.repository.manifest import Manifest, ManifestEntry, StoreRef

ENTRY = ManifestEntry(
    key="m/1/model.bin", dest="m/1/model.bin", size=3, checksum_kind="md5", checksum="0" * 32
)


class Unavailable:
    """A store whose first ``failures`` reads fail as an unreachable store's do, then answer."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.reads = 0

    def read_range(
        self, key: str, start: int, end: int | None, sink: Sink, *, etag: str = "", generation: str = ""
    ) -> int:
        self.reads += 1
        if self.reads <= self.failures:
            raise StoreUnavailable("s3://b/m", "503 SlowDown")
        sink(b"abc")
        return 3


def delays(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, failures: int, jitter: Random, retries: int = 10
) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(engine, "time", SimpleNamespace(sleep=slept.append, monotonic=time.monotonic))
    manifest = Manifest(StoreRef(uri="s3://b/m"), (), (ENTRY,))
    store = Unavailable(failures)
    syncer = Syncer(manifest, store, SyncOptions(dest=tmp_path, retries=retries), random=jitter)  # type: ignore[arg-type]
    got = bytearray()
    job = _Job(ENTRY, tmp_path / "model.bin")
    assert syncer._read_with_retries(job, 0, None, lambda: got.extend) == 3
    assert bytes(got) == b"abc" and syncer.stats.retried_reads == failures
    return slept


def test_the_delays_grow_up_to_the_cap(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert delays(monkeypatch, tmp_path, 6, lambda: 1.0) == [0.4, 0.8, 1.6, 3.2, 5.0, 5.0]


def test_two_threads_that_failed_together_do_not_retry_together(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    first = delays(monkeypatch, tmp_path, 3, random.Random(1).random)
    second = delays(monkeypatch, tmp_path, 3, random.Random(2).random)
    assert all(a != b for a, b in zip(first, second, strict=True))
    assert all(0.0 <= d <= c for d, c in zip(first + second, [0.4, 0.8, 1.6] * 2, strict=True))
