"""tests/support/realrepo.py at a small size: a real tritonserver loads every generated model, each
answers with what its weights add, a damaged shard fails its load, and generation is deterministic and
streams (its memory does not grow with the model)."""

from __future__ import annotations

import hashlib
import json
import tracemalloc
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import requests

from realrepo import CHUNK, ENSEMBLE, GeneratedRepository, KiB, MiB, RepoShape, write_repository
from tritonserver import RunningServer, TritonInstall, start_server

pytestmark = [pytest.mark.triton, pytest.mark.timeout(600)]

TIMEOUT = 120  # seconds a request may take before the test gives up (not an assertion on speed)

# Every shape feature at a few MiB: uneven last shards, two versions served side by side, an ensemble.
SHAPE = RepoShape(
    big_bytes=5 * MiB + 123,
    medium_bytes=3 * MiB,
    small_count=3,
    small_bytes=64 * KiB,
    shard_bytes=2 * MiB,
    seed=7,
    versions=(1, 2),
    version_policy={"all": {}},
)
X = [1.0, 2.0, 3.0, 4.0]


def infer(server: RunningServer, model: str, version: int | None = None) -> list[float]:
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version is not None else "") + "/infer"
    body: dict[str, Any] = {
        "inputs": [{"name": "INPUT0", "shape": [1, len(X)], "datatype": "FP32", "data": X}]
    }
    reply = requests.post(server.http_url + path, json=body, timeout=TIMEOUT)
    assert reply.status_code == 200, f"{model} v{version}: {reply.text}\n{server.log_tail()}"
    data: list[float] = reply.json()["outputs"][0]["data"]
    return data


def load(server: RunningServer, model: str) -> tuple[int, str]:
    reply = requests.post(f"{server.http_url}/v2/repository/models/{model}/load", timeout=TIMEOUT)
    return reply.status_code, reply.text


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(MiB), b""):
            digest.update(block)
    return digest.hexdigest()


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, GeneratedRepository]:
    root = tmp_path_factory.mktemp("realrepo") / "models"
    return root, write_repository(root, SHAPE)


@pytest.fixture(scope="module")
def served(
    triton_install: TritonInstall,
    generated: tuple[Path, GeneratedRepository],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RunningServer]:
    root, repository = generated
    models = [m["name"] for m in repository.spec_models]
    log = tmp_path_factory.mktemp("realrepo-triton") / "tritonserver.log"
    server = start_server(triton_install, root, models, log)
    yield server
    server.stop()


def test_the_repository_has_the_shape_asked_for(generated: tuple[Path, GeneratedRepository]) -> None:
    root, repository = generated
    assert [m.name for m in repository.models] == [
        "llm",
        "encoder",
        "small-1",
        "small-2",
        "small-3",
        ENSEMBLE,
    ]
    shards = sorted(p.relative_to(root).as_posix() for p in root.glob("llm/1/weights-*"))
    assert shards == [f"llm/1/weights-0000{i}-of-00003.bin" for i in (1, 2, 3)]
    assert [(root / s).stat().st_size for s in shards] == [2 * MiB, 2 * MiB, MiB + 123]
    for model in repository.models[:-1]:
        assert model.weight_bytes == len(SHAPE.versions) * dict(SHAPE.weighted())[model.name]
    # The description says what is on disk, file by file, and nothing else is there.
    assert {f.path: (f.size, f.sha256) for f in repository.files} == {
        p.relative_to(root).as_posix(): (p.stat().st_size, sha256_of(p))
        for p in root.rglob("*")
        if p.is_file()
    }
    index = json.loads((root / "encoder/2/weights.json").read_text())
    assert [s["name"] for s in index["shards"]] == [
        "weights-00001-of-00002.bin",
        "weights-00002-of-00002.bin",
    ]
    assert (root / ENSEMBLE / "1").is_dir()


def test_every_model_answers_with_what_its_weights_add(
    served: RunningServer, generated: tuple[Path, GeneratedRepository]
) -> None:
    _, repository = generated
    for model in repository.models:
        if model.steps:
            continue
        assert len(set(model.constants.values())) == len(SHAPE.versions), "versions must add different c"
        for version in model.versions:
            added = repository.added(model.name, version)
            assert infer(served, model.name, version) == [x + added for x in X], (model.name, version)
    # The ensemble chains small-1 and small-2 at their latest versions.
    chained = repository.added("small-1") + repository.added("small-2")
    assert repository.added(ENSEMBLE) == chained
    assert infer(served, ENSEMBLE) == [x + chained for x in X]


def test_each_model_read_every_shard_at_load(served: RunningServer) -> None:
    log = served.log()
    for name, size in SHAPE.weighted():
        shards = -(-size // SHAPE.shard_bytes)
        for version in SHAPE.versions:
            assert f"realrepo: {name} version {version}: checked {shards} shards, {size} bytes" in log


def test_a_damaged_shard_fails_its_models_load_naming_the_shard(
    triton_install: TritonInstall, tmp_path: Path
) -> None:
    shape = RepoShape(
        big_bytes=0, medium_bytes=MiB, small_count=2, small_bytes=64 * KiB, shard_bytes=256 * KiB, seed=3
    )
    write_repository(tmp_path / "models", shape)
    flipped = tmp_path / "models/encoder/1/weights-00003-of-00004.bin"
    data = bytearray(flipped.read_bytes())
    data[1000] ^= 0x01
    flipped.write_bytes(bytes(data))
    truncated = tmp_path / "models/small-2/1/weights-00001-of-00001.bin"
    truncated.write_bytes(truncated.read_bytes()[:-1])

    server = start_server(triton_install, tmp_path / "models", [], tmp_path / "tritonserver.log")
    try:
        verdicts = {name: load(server, name) for name in ("encoder", "small-2", "small-1")}
        log = server.log()
    finally:
        server.stop()
    assert verdicts["small-1"][0] == 200, verdicts["small-1"]  # the undamaged model loads
    for name, words in (
        ("encoder", "weights check failed: shard weights-00003-of-00004.bin has sha256 "),
        ("small-2", f"weights check failed: shard weights-00001-of-00001.bin has {64 * KiB - 1} bytes, "),
    ):
        status, text = verdicts[name]
        assert status == 400, (name, status, text)
        assert words in text and words in log, f"{name}: {text}\n{log}"


def test_the_same_seed_gives_the_same_bytes_and_another_seed_other_bytes(tmp_path: Path) -> None:
    shape = RepoShape(
        big_bytes=0, medium_bytes=MiB + 5, small_count=2, small_bytes=KiB, shard_bytes=MiB, seed=1
    )
    first = write_repository(tmp_path / "a", shape)
    again = write_repository(tmp_path / "b", shape)
    other = write_repository(tmp_path / "c", replace(shape, seed=2))
    assert first.files == again.files
    assert first.describe()["models"] == again.describe()["models"]
    weights = [(f, o) for f, o in zip(first.files, other.files, strict=True) if "/weights-" in f.path]
    assert len(weights) == 4
    assert all(f.path == o.path and f.size == o.size and f.sha256 != o.sha256 for f, o in weights)
    # A model's bytes depend on (seed, model, version, shard) only: a repository of version 2 alone
    # holds what the same model's version 2 holds next to version 1.
    both = write_repository(tmp_path / "d", replace(shape, versions=(1, 2)))
    alone = write_repository(tmp_path / "e", replace(shape, versions=(2,)))
    assert both.model("encoder").constants[2] == alone.model("encoder").constants[2]
    assert both.model("encoder").constants[1] == first.model("encoder").constants[1]


def generation_peak(folder: Path, size: int) -> int:
    """tracemalloc's peak while writing one model of ``size`` bytes in one shard (numpy's buffers count)."""
    shape = RepoShape(big_bytes=size, medium_bytes=0, small_count=0, shard_bytes=size, ensemble=False)
    tracemalloc.start()
    try:
        repository = write_repository(folder, shape)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert repository.model("llm").weight_bytes == size
    return peak


def test_generation_streams_in_chunks(tmp_path: Path) -> None:
    """Writing a 64 MiB model allocates a few chunks, not the model, and no more than a 16 MiB one does
    (a memory check, not a timing one)."""
    small = generation_peak(tmp_path / "small", 16 * MiB)
    large = generation_peak(tmp_path / "large", 64 * MiB)
    assert CHUNK <= large < 64 * MiB // 4, f"peak {large} bytes for a 64 MiB model"
    assert large - small < CHUNK, f"peak {small} bytes at 16 MiB, {large} at 64 MiB"
