"""One sync of a whole revision places each model (its files verified, its folder pruned, its config
written, Progress.model_placed) as soon as its own last file is in, while other models' files are
still on their way; never before its own last file; and with ``model_order`` a free connection takes
the first model's parts before a later model's (the agent's first fill loads each model then)."""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from triton_operator.adapters.storage.base import Sink
from triton_operator.adapters.sync.download import SyncOptions, sync
from triton_operator.adapters.sync.progress import silent
from triton_operator.core.repository.manifest import (
    CONFIG_FILE,
    Manifest,
    ManifestEntry,
    ManifestModel,
    StoreRef,
    VersionPolicy,
)

KiB = 1024
WAIT = 10.0  # seconds a held read waits for its release before it gives up (then the test fails)


class HeldStore:
    """A store in memory whose reads of a key wait for ``hold[key]`` (an Event) first, up to WAIT
    seconds (``timed_out`` names those that waited in vain); ``started`` is each read as it begins."""

    def __init__(self, objects: dict[str, bytes], hold: dict[str, threading.Event] | None = None) -> None:
        self.objects = objects
        self.hold = hold or {}
        self.started: list[tuple[str, int]] = []
        self.timed_out: list[str] = []
        self.on_start: Callable[[str, int], object] = lambda key, start: None
        self._lock = threading.Lock()

    def read_range(
        self, key: str, start: int, end: int | None, sink: Sink, *, etag: str = "", generation: str = ""
    ) -> int:
        with self._lock:
            self.started.append((key, start))
        self.on_start(key, start)
        gate = self.hold.get(key)
        if gate is not None and not gate.wait(WAIT):
            with self._lock:
                self.timed_out.append(key)
        data = self.objects[key][start:end]
        for i in range(0, len(data), KiB):
            sink(data[i : i + KiB])
        return len(data)

    def part_size(self, key: str, etag: str) -> int | None:
        return None

    def transfer_check(
        self, key: str, etag: str, generation: str, part_size: int | None, checksum: str
    ) -> None:
        return None

    def close(self) -> None:
        return None


def revision(
    tmp_path: Path, files: dict[str, int], models: tuple[str, ...]
) -> tuple[Manifest, dict[str, bytes], Path]:
    """A pinned manifest of ``files`` (dest -> size, random bytes), its objects, and the rendered
    configs' folder (one config per model)."""
    rng = random.Random(7)
    objects = {f"repo/{dest}": rng.randbytes(size) for dest, size in files.items()}
    entries = tuple(
        ManifestEntry(
            f"repo/{dest}",
            dest,
            size,
            "md5",
            hashlib.md5(objects[f"repo/{dest}"], usedforsecurity=False).hexdigest(),
        )
        for dest, size in files.items()
    )
    manifest = Manifest(
        StoreRef("s3://bucket/repo"),
        tuple(ManifestModel(m, m, VersionPolicy(), ("1",)) for m in models),
        entries,
    )
    configs = tmp_path / "configs"
    for m in models:
        (configs / m).mkdir(parents=True)
        (configs / m / CONFIG_FILE).write_text(f'name: "{m}"\n')
    return manifest, objects, configs


def test_a_model_is_placed_once_its_own_last_file_is_in_while_another_models_are_not(tmp_path: Path) -> None:
    manifest, objects, configs = revision(
        tmp_path,
        {"early/1/a.bin": 3 * KiB, "early/1/b.bin": 40 * KiB, "late/1/w.bin": 20 * KiB},
        ("early", "late", "ensemble"),
    )
    late_file = threading.Event()
    early_b = threading.Event()
    store = HeldStore(objects, {"repo/late/1/w.bin": late_file, "repo/early/1/b.bin": early_b})
    dest = tmp_path / "models"
    events: list[str] = []
    seen_at_placing: dict[str, dict[str, bool]] = {}
    lock = threading.Lock()

    def file_placed(entry: ManifestEntry) -> None:
        with lock:
            events.append(f"file {entry.dest}")
        if entry.dest == "early/1/a.bin":
            early_b.set()  # early's other file only once its first is in: early is not placed yet

    def model_placed(model: str) -> None:
        with lock:
            events.append(f"model {model}")
            seen_at_placing[model] = {
                "config": (dest / model / CONFIG_FILE).is_file(),
                "version folder": (dest / model / "1").is_dir(),
                "late file": (dest / "late/1/w.bin").is_file(),
            }
        if model == "early":
            late_file.set()  # the last file of the revision comes only once early is placed

    options = SyncOptions(dest=dest, configs=configs, part_size=16 * KiB, concurrency=4)
    stats = sync(manifest, store, options, silent(on_file_placed=file_placed, on_model_placed=model_placed))  # type: ignore[arg-type]

    assert store.timed_out == []  # early was placed while late's file was held back
    assert stats.downloaded_files == 3
    # early placed after both of its files and before late's file; late after its own
    assert events.index("model early") > max(
        events.index("file early/1/a.bin"), events.index("file early/1/b.bin")
    )
    assert events.index("model early") < events.index("file late/1/w.bin") < events.index("model late")
    assert seen_at_placing["early"] == {"config": True, "version folder": True, "late file": False}
    assert seen_at_placing["late"]["late file"] and seen_at_placing["late"]["config"]
    # a model with no file (an ensemble) is placed as soon as dest may be written, with its folders
    assert events.index("model ensemble") < events.index("file late/1/w.bin")
    assert seen_at_placing["ensemble"] == {"config": True, "version folder": True, "late file": False}
    assert sorted(e for e in events if e.startswith("model ")) == [
        "model early",
        "model ensemble",
        "model late",
    ]
    for dest_path, data in (
        (d, objects[f"repo/{d}"]) for d in ("early/1/a.bin", "early/1/b.bin", "late/1/w.bin")
    ):
        assert (dest / dest_path).read_bytes() == data


def test_a_model_is_not_placed_before_its_own_last_file_lands(tmp_path: Path) -> None:
    manifest, objects, configs = revision(tmp_path, {"m/1/a.bin": 2 * KiB, "m/1/b.bin": 2 * KiB}, ("m",))
    release = threading.Event()
    store = HeldStore(objects, {"repo/m/1/b.bin": release})
    placed: list[tuple[str, bool]] = []

    def file_placed(entry: ManifestEntry) -> None:
        if entry.dest == "m/1/a.bin":
            time.sleep(0.2)  # time for a wrong placing to show
            placed.append(("after a", False))
            release.set()

    def model_placed(model: str) -> None:
        placed.append((model, (tmp_path / "models/m/1/b.bin").is_file()))

    sync(
        manifest,
        store,  # type: ignore[arg-type]
        SyncOptions(dest=tmp_path / "models", configs=configs),
        silent(on_file_placed=file_placed, on_model_placed=model_placed),
    )
    assert placed == [("after a", False), ("m", True)]


def test_a_free_connection_takes_the_first_models_parts_before_a_later_models(tmp_path: Path) -> None:
    """model_order: every part of ``first`` (named first) is read before any of ``second``, though
    ``second``'s file is bigger; without an order the two files' parts are read in turns, the
    biggest's first. One connection: the order of the reads is the order the tasks are taken."""
    manifest, objects, configs = revision(
        tmp_path, {"second/1/w.bin": 96 * KiB, "first/1/w.bin": 64 * KiB}, ("first", "second")
    )

    def reads(order: tuple[str, ...]) -> list[str]:
        store = HeldStore(objects)
        dest = tmp_path / f"models-{'-'.join(order) or 'none'}"
        options = SyncOptions(
            dest=dest, configs=configs, part_size=16 * KiB, concurrency=1, model_order=order
        )
        sync(manifest, store, options)  # type: ignore[arg-type]
        assert (dest / "first/1/w.bin").read_bytes() == objects["repo/first/1/w.bin"]
        return [key.split("/")[1] for key, _ in store.started]

    ordered = reads(("first", "second"))
    assert ordered == ["first"] * 4 + ["second"] * 6
    assert reads(()) == ["second", "first"] * 4 + ["second"] * 2


class HeldSource:
    """A node cache in memory that holds ``objects`` (store key -> bytes) and serves them; ``reads``
    (shared with a HeldStore's ``started``) records each read's key as it begins."""

    def __init__(self, objects: dict[str, bytes], reads: list[tuple[str, int]]) -> None:
        self.objects = objects
        self.reads = reads

    def held(
        self, entries: Sequence[ManifestEntry], fetching: Sequence[ManifestEntry] = ()
    ) -> frozenset[str]:
        return frozenset(f"{e.checksum_kind}/{e.checksum}" for e in entries if e.key in self.objects)

    def part_size(self, entry: ManifestEntry) -> int | None:
        return None

    def read(self, entry: ManifestEntry, sink: Sink, start: int = 0, end: int | None = None) -> int | None:
        self.reads.append((entry.key, start))
        data = self.objects[entry.key][start:end]
        for i in range(0, len(data), KiB):
            sink(data[i : i + KiB])
        return len(data)

    def offer(self, entry: ManifestEntry, path: Path, part_size: int | None = None) -> None:
        return None


def test_reorder_takes_the_order_from_what_the_source_holds(tmp_path: Path) -> None:
    """reorder: told the keys the source's lease named held (``second``'s object, not ``first``'s),
    its order replaces model_order: ``second``'s read from the source comes before any part of
    ``first`` from the store, though model_order named ``first`` first. One connection."""
    manifest, objects, configs = revision(
        tmp_path, {"first/1/w.bin": 64 * KiB, "second/1/w.bin": 32 * KiB}, ("first", "second")
    )
    store = HeldStore(objects)
    source = HeldSource({"repo/second/1/w.bin": objects["repo/second/1/w.bin"]}, store.started)
    told: list[frozenset[str]] = []

    def reorder(held: frozenset[str]) -> tuple[str, ...]:
        told.append(held)
        return ("second", "first") if held else ("first", "second")

    dest = tmp_path / "models"
    options = SyncOptions(
        dest=dest,
        configs=configs,
        part_size=16 * KiB,
        concurrency=1,
        source=source,
        model_order=("first", "second"),
        reorder=reorder,
    )
    stats = sync(manifest, store, options)  # type: ignore[arg-type]

    second = next(e for e in manifest.entries if e.dest == "second/1/w.bin")
    assert told == [frozenset({f"md5/{second.checksum}"})]
    assert [key.split("/")[1] for key, _ in store.started] == ["second"] + ["first"] * 4
    assert stats.source_hits == 1
    for path in ("first/1/w.bin", "second/1/w.bin"):
        assert (dest / path).read_bytes() == objects[f"repo/{path}"]
