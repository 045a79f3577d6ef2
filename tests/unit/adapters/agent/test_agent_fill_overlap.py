"""The first fill of a pod of the one shape (Agent.fill, tritonserver started empty) is one sync of
every model's files: the big model's bytes are on their way while the small model's are, the small
model is loaded while the big model's files are still held back, each model is loaded only once its
own files and config are in place, the ensemble after its step; a refused load fails the fill with
Triton's reason. A fake store in memory (its reads held by events) and a fake tritonserver."""

from __future__ import annotations

import hashlib
import random
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from triton_operator.adapters.agent import runner
from triton_operator.adapters.agent.model_control import LoadFailed
from triton_operator.adapters.agent.runner import Agent, AgentOptions, FillFailed
from triton_operator.adapters.storage.base import Sink
from triton_operator.adapters.sync import download
from triton_operator.adapters.sync.download import SyncOptions
from triton_operator.core.pod.agent_plan import FILL_LOADS, RevisionFiles, fill_order
from triton_operator.core.repository.manifest import (
    CONFIG_FILE,
    Manifest,
    ManifestEntry,
    ManifestModel,
    StoreRef,
    VersionPolicy,
)
from triton_operator.core.vocabulary.triton_state import ModelVersionState

KiB = 1024
WAIT = 5.0  # seconds a held read waits for its release before it gives up (the test then fails)
FILES = {"big/1/a.bin": 48 * KiB, "big/1/b.bin": 40 * KiB, "small/1/model.py": 2 * KiB}
PY = 'name: "{m}"\nbackend: "python"\n'
ENSEMBLE = (
    'name: "ens"\nplatform: "ensemble"\n'
    'ensemble_scheduling {\n  step { model_name: "small" model_version: -1 }\n}\n'
)


class HeldStore:
    """Objects in memory; a read of a key in ``hold`` waits for its event first (up to WAIT s:
    ``timed_out`` names those that waited in vain); ``began`` is set by each read of a key in it."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.hold: dict[str, threading.Event] = {}
        self.began: dict[str, threading.Event] = {}
        self.timed_out: list[str] = []
        self.landed: list[str] = []  # keys whose last byte was given
        self._lock = threading.Lock()

    def read_range(
        self, key: str, start: int, end: int | None, sink: Sink, *, etag: str = "", generation: str = ""
    ) -> int:
        if key in self.began:
            self.began[key].set()
        gate = self.hold.get(key)
        if gate is not None and not gate.wait(WAIT):
            with self._lock:
                self.timed_out.append(key)
        data = self.objects[key][start:end]
        sink(data)
        with self._lock:
            self.landed.append(key)
        return len(data)

    def part_size(self, key: str, etag: str) -> int | None:
        return None

    def transfer_check(
        self, key: str, etag: str, generation: str, part_size: int | None, checksum: str
    ) -> None:
        return None

    def close(self) -> None:
        return None


@dataclass(frozen=True)
class Seen:
    """What a load found: the model's files and config in /models, the models loaded before it, the
    store's keys whose bytes were all given."""

    files: bool
    config: bool
    loaded: list[str]
    landed: list[str]


@dataclass
class EmptyTriton:
    """tritonserver started with no model: each load recorded with what /models and the store held
    at that moment; ``on_load`` is called with the model's name first."""

    dest: Path
    store: HeldStore
    url: str = "http://fake"
    timeout: float = 1.0
    load_timeout: float = 5.0
    loaded: dict[str, str] = field(default_factory=dict)
    loads: list[str] = field(default_factory=list)
    seen: dict[str, Seen] = field(default_factory=dict)
    fail: set[str] = field(default_factory=set)

    def live(self) -> bool:
        return True

    def load(self, model: str) -> None:
        files = sorted(d for d in FILES if d.startswith(f"{model}/"))
        self.seen[model] = Seen(
            files=all((self.dest / d).is_file() for d in files),
            config=(self.dest / model / CONFIG_FILE).is_file(),
            loaded=sorted(self.loaded),
            landed=list(self.store.landed),
        )
        self.loads.append(model)
        if model in self.fail:
            self.loaded[model] = "UNAVAILABLE"
            raise LoadFailed("load", model, "refuses to load")
        self.loaded[model] = "READY"
        if model == "small":
            self.store.hold["repo/big/1/a.bin"].set()
            self.store.hold["repo/big/1/b.bin"].set()

    def unload(self, model: str) -> None:
        self.loaded.pop(model, None)

    def index(self) -> tuple[ModelVersionState, ...]:
        return tuple(ModelVersionState(m, "1", s, "") for m, s in sorted(self.loaded.items()))

    def ready(self, model: str, version: str = "") -> bool:
        return self.loaded.get(model) == "READY"


def stored(sizes: dict[str, int], seed: int) -> tuple[dict[str, bytes], tuple[ManifestEntry, ...]]:
    """Random objects under repo/ of ``sizes`` (destination -> bytes) and their manifest entries (md5)."""
    rng = random.Random(seed)
    objects = {f"repo/{d}": rng.randbytes(size) for d, size in sizes.items()}
    entries = tuple(
        ManifestEntry(
            f"repo/{d}", d, size, "md5", hashlib.md5(objects[f"repo/{d}"], usedforsecurity=False).hexdigest()
        )
        for d, size in sizes.items()
    )
    return objects, entries


def pod(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Agent, EmptyTriton, HeldStore, RevisionFiles]:
    objects, entries = stored(FILES, seed=3)
    models = tuple(ManifestModel(m, m, VersionPolicy(), ("1",)) for m in ("big", "ens", "small"))
    files = RevisionFiles(
        "r1",
        Manifest(StoreRef("s3://bucket/repo"), models, entries),
        {"big": PY.format(m="big"), "small": PY.format(m="small"), "ens": ENSEMBLE},
    )
    store = HeldStore(objects)
    # big's files come only once small is loaded; small's file only once a read of big's began:
    # a fill that fetches one model after the other (whichever first) waits in vain for one of them
    store.hold = {"repo/big/1/a.bin": threading.Event(), "repo/big/1/b.bin": threading.Event()}
    big_began = threading.Event()
    store.began = {"repo/big/1/a.bin": big_began, "repo/big/1/b.bin": big_began}
    store.hold["repo/small/1/model.py"] = big_began
    monkeypatch.setattr(runner, "open_store", lambda *args, **kwargs: store)
    dest = tmp_path / "models"
    triton = EmptyTriton(dest, store)
    options = AgentOptions(
        dest=dest,
        state_dir=tmp_path / "state",
        base=files,
        triton=triton,  # type: ignore[arg-type]
        proc=tmp_path / "no-proc",
        part_size=16 * KiB,
        fills=True,
    )
    return Agent(options), triton, store, files


def test_the_small_model_loads_while_the_big_models_files_are_still_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, triton, store, files = pod(tmp_path, monkeypatch)
    agent.apply(files)

    assert store.timed_out == []  # neither model waited for the other's whole fetch
    assert sorted(triton.loads) == ["big", "ens", "small"]
    # small was loaded before big's files landed: while they were held back
    assert not any(k.startswith("repo/big/") for k in triton.seen["small"].landed)
    assert triton.loads.index("ens") > triton.loads.index("small")  # the ensemble after its step
    assert "small" in triton.seen["ens"].loaded
    for model in ("big", "small", "ens"):  # each only once its own files and config are in
        assert triton.seen[model].files and triton.seen[model].config, (model, triton.seen[model])
    status = agent.status()
    assert status["state"] == "Applied" and status["revision"] == "r1"
    assert status["models"] == {"big": "READY", "ens": "READY", "small": "READY"}
    assert status["fetchedBytes"] == sum(FILES.values())
    assert status["summary"]  # the fill's summary (status.timeToServe's bytes)
    assert agent.check().ready


def test_a_refused_load_fails_the_fill_with_tritons_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, triton, _, files = pod(tmp_path, monkeypatch)
    triton.fail = {"big"}
    with pytest.raises(FillFailed) as failed:
        agent.apply(files)
    assert "big" in str(failed.value) and "refuses to load" in str(failed.value)
    assert agent.status()["state"] == "Failed" and "refuses to load" in agent.status()["message"]
    assert not agent.check().ready


def test_the_fill_orders_its_models_again_once_the_node_caches_lease_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fill's sync gets fill_order of the revision as its model_order, and as its reorder
    fill_order given the keys the node cache's lease named held (a warm node reads faster)."""
    agent, triton, _, files = pod(tmp_path, monkeypatch)
    given: list[SyncOptions] = []
    real = download.sync

    def sync(manifest: Manifest, store: Any, options: SyncOptions, progress: Any) -> Any:
        given.append(options)
        return real(manifest, store, options, progress)

    monkeypatch.setattr(runner, "sync", sync)
    agent.apply(files)

    assert sorted(triton.loads) == ["big", "ens", "small"]
    (options,) = given
    assert options.model_order == fill_order(files)
    assert options.reorder is not None
    every = frozenset(f"md5/{e.checksum}" for e in files.manifest.entries)
    assert options.reorder(frozenset()) == fill_order(files)
    assert options.reorder(every) == fill_order(files, every)


def test_the_fill_loads_two_models_at_once_when_both_are_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two models whose bytes are in are loaded at once (FILL_LOADS): each load waits, up to WAIT
    seconds, for a second load to be in flight; one loader at a time would wait in vain."""
    assert FILL_LOADS == 2
    sizes = {"a/1/w.bin": 4 * KiB, "b/1/w.bin": 4 * KiB}
    objects, entries = stored(sizes, seed=5)
    files = RevisionFiles(
        "r1",
        Manifest(
            StoreRef("s3://bucket/repo"),
            tuple(ManifestModel(m, m, VersionPolicy(), ("1",)) for m in ("a", "b")),
            entries,
        ),
        {"a": PY.format(m="a"), "b": PY.format(m="b")},
    )
    store = HeldStore(objects)
    monkeypatch.setattr(runner, "open_store", lambda *args, **kwargs: store)
    together = threading.Barrier(2, timeout=WAIT)
    alone: list[str] = []

    class TwoAtOnce(EmptyTriton):
        def load(self, model: str) -> None:
            try:
                together.wait()
            except threading.BrokenBarrierError:
                alone.append(model)
            super().load(model)

    dest = tmp_path / "models"
    triton = TwoAtOnce(dest, store)
    agent = Agent(
        AgentOptions(
            dest=dest,
            state_dir=tmp_path / "state",
            base=files,
            triton=triton,  # type: ignore[arg-type]
            proc=tmp_path / "no-proc",
            part_size=16 * KiB,
            fills=True,
        )
    )
    agent.apply(files)

    assert alone == []
    assert sorted(triton.loads) == ["a", "b"]
    assert agent.status()["models"] == {"a": "READY", "b": "READY"}
