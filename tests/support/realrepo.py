"""A model repository of a real size and shape, generated: sharded weights that the models check at load.

``write_repository`` writes it to a folder, ``upload_repository`` streams it to an S3 bucket (a boto3
client given); both return a ``GeneratedRepository``: every model and file with its size and sha256,
the number each model adds to its input, and the TritonService ``spec.models`` that serve it
(``spec_models`` gives those alone, without generating anything).

The shape (``RepoShape``): a big model (default 2 GiB) and a medium one (500 MiB) in weight shards of
``shard_bytes``, ``small_count`` small ones and an ensemble chaining the first two small ones. Each
weighted model is a Python-backend model (tests/data/realrepo/model.py) that at ``initialize`` reads
every shard and checks its size and sha256 against the version's ``weights.json`` (a mismatch fails the
load with "weights check failed: ..."), so load time grows with size as a real backend's does; it then
answers OUTPUT0 = INPUT0 + c, with c in [1, 1000] derived from the shards' sha256 (``weights_constant``).
Weights are deterministic: shard bytes are PCG64's raw stream seeded by (seed, model, version, shard),
written in chunks of 4 MiB (never the whole model in memory); the same seed gives the same sha256, and
each version of a model has its own bytes.

    python tests/support/realrepo.py --out /tmp/repo                        # 2 GiB + 500 MiB + 3 small
    python tests/support/realrepo.py --out /tmp/repo --big 64MiB --medium 16MiB --shard 8MiB --versions 1,2
    python tests/support/realrepo.py --s3-endpoint http://127.0.0.1:8333 --bucket models --prefix real
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

try:
    from triton_operator.core.spec.modelconfig import build_config_pbtxt
except ImportError:  # run as a script by a Python without the operator installed: its source beside this
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "operator" / "src"))
    from triton_operator.core.spec.modelconfig import build_config_pbtxt

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

MODEL_CODE = Path(__file__).resolve().parents[1] / "data" / "realrepo" / "model.py"
INDEX = "weights.json"
CHUNK = 4 * MiB
"""Bytes generated, hashed and written at a time: the generator's memory, whatever the model's size."""

BIG = "llm"
MEDIUM = "encoder"
ENSEMBLE = "pipeline"

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": KiB, "m": 1000**2, "mb": 1000**2, "mib": MiB}
_UNITS |= {"g": 1000**3, "gb": 1000**3, "gib": GiB, "t": 1000**4, "tb": 1000**4, "tib": 1024 * GiB}


def parse_size(text: str) -> int:
    """'2GiB', '500MiB', '1.5GB', '4096' -> bytes (binary and decimal units, case-insensitive)."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if match is None or match.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (e.g. 2GiB, 500MiB, 1.5GB, 4096)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def format_size(size: int) -> str:
    for unit, factor in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if size >= factor:
            return f"{size / factor:.1f} {unit}"
    return f"{size} B"


@dataclass(frozen=True)
class RepoShape:
    """What to generate. A size of 0 leaves that model out."""

    big_bytes: int = 2 * GiB
    medium_bytes: int = 500 * MiB
    small_count: int = 3
    small_bytes: int = 1 * MiB
    shard_bytes: int = 256 * MiB
    seed: int = 0
    versions: tuple[int, ...] = (1,)
    version_policy: Mapping[str, Any] | None = None
    """The weighted models' config.versionPolicy (proto3 JSON); None: Triton's default, latest 1."""
    ensemble: bool = True
    """An ensemble chaining small-1 and small-2 (needs small_count >= 2)."""

    def __post_init__(self) -> None:
        if self.shard_bytes <= 0:
            raise ValueError(f"shard_bytes must be positive, not {self.shard_bytes}")
        if min(self.big_bytes, self.medium_bytes, self.small_bytes, self.small_count) < 0:
            raise ValueError("sizes and small_count cannot be negative")
        if (
            not self.versions
            or any(v < 1 for v in self.versions)
            or len(set(self.versions)) < len(self.versions)
        ):
            raise ValueError(f"versions must be distinct numbers >= 1, not {self.versions}")
        if self.ensemble and (self.small_count < 2 or self.small_bytes == 0):
            raise ValueError("the ensemble chains two small models: small_count >= 2 and small_bytes > 0")

    def weighted(self) -> list[tuple[str, int]]:
        """(name, bytes a version) of every model with weights, in order."""
        models = [(BIG, self.big_bytes), (MEDIUM, self.medium_bytes)]
        models += [(f"small-{i}", self.small_bytes) for i in range(1, self.small_count + 1)]
        return [(name, size) for name, size in models if size > 0]


@dataclass(frozen=True)
class FileInfo:
    """One file of the repository: its path under the repository root, size and sha256."""

    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class GeneratedModel:
    name: str
    versions: tuple[int, ...]
    files: tuple[FileInfo, ...]
    constants: Mapping[int, float] = field(default_factory=dict)
    """Weighted models: version -> the c it adds. An ensemble: empty."""
    steps: tuple[str, ...] = ()
    """An ensemble: the models it chains, in order."""

    @property
    def weight_bytes(self) -> int:
        return sum(f.size for f in self.files if "/weights-" in f.path)


@dataclass(frozen=True)
class GeneratedRepository:
    shape: RepoShape
    models: tuple[GeneratedModel, ...]
    spec_models: list[dict[str, Any]]
    """TritonService spec.models that serve the repository (configs in proto3 JSON)."""
    seconds: float = 0.0

    @property
    def files(self) -> list[FileInfo]:
        return [f for m in self.models for f in m.files]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def model(self, name: str) -> GeneratedModel:
        return next(m for m in self.models if m.name == name)

    def added(self, name: str, version: int | None = None) -> float:
        """What ``name`` adds to its input at ``version`` (default: the latest); an ensemble: its
        steps' sum at their latest versions."""
        model = self.model(name)
        if model.steps:
            return sum(self.added(step) for step in model.steps)
        return model.constants[version if version is not None else max(model.versions)]

    def spec(self, uri: str, **extra: Any) -> dict[str, Any]:
        """A whole TritonService spec serving the repository from ``uri``."""
        return {"repository": {"uri": uri}, "models": [dict(m) for m in self.spec_models], **extra}

    def describe(self) -> dict[str, Any]:
        """The description as plain JSON."""
        return {
            "seed": self.shape.seed,
            "totalBytes": self.total_bytes,
            "seconds": round(self.seconds, 3),
            "models": [
                {
                    "name": m.name,
                    "versions": list(m.versions),
                    "weightBytes": m.weight_bytes,
                    "added": {str(v): c for v, c in m.constants.items()},
                    "steps": list(m.steps),
                    "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in m.files],
                }
                for m in self.models
            ],
            "specModels": self.spec_models,
        }


# ---------------------------------------------------------------- specs


def _tensor(name: str) -> dict[str, Any]:
    return {"name": name, "dataType": "TYPE_FP32", "dims": [-1]}


def weighted_config(shape: RepoShape) -> dict[str, Any]:
    config: dict[str, Any] = {
        "backend": "python",
        "maxBatchSize": 8,
        "input": [_tensor("INPUT0")],
        "output": [_tensor("OUTPUT0")],
        "instanceGroup": [{"kind": "KIND_CPU", "count": 1}],
    }
    if shape.version_policy is not None:
        config["versionPolicy"] = dict(shape.version_policy)
    return config


def ensemble_config(first: str, second: str) -> dict[str, Any]:
    return {
        "platform": "ensemble",
        "maxBatchSize": 8,
        "input": [_tensor("INPUT0")],
        "output": [_tensor("OUTPUT0")],
        "ensembleScheduling": {
            "step": [
                {
                    "modelName": first,
                    "modelVersion": "-1",
                    "inputMap": {"INPUT0": "INPUT0"},
                    "outputMap": {"OUTPUT0": "between"},
                },
                {
                    "modelName": second,
                    "modelVersion": "-1",
                    "inputMap": {"INPUT0": "between"},
                    "outputMap": {"OUTPUT0": "OUTPUT0"},
                },
            ]
        },
    }


def spec_models(shape: RepoShape) -> list[dict[str, Any]]:
    """The TritonService spec.models of the repository ``shape`` describes (nothing is generated)."""
    models = [{"name": name, "config": weighted_config(shape)} for name, _ in shape.weighted()]
    if shape.ensemble:
        models.append({"name": ENSEMBLE, "config": ensemble_config("small-1", "small-2")})
    return models


# ---------------------------------------------------------------- weights


def weights_constant(digests: Sequence[str]) -> float:
    """What a model adds, from its shards' sha256 hex digests in index order (the model's own copy of
    this function is in tests/data/realrepo/model.py)."""
    combined = hashlib.sha256("\n".join(digests).encode()).digest()
    return float(int.from_bytes(combined[:4], "big") % 1000 + 1)


def shard_sizes(total: int, shard_bytes: int) -> list[int]:
    count = max(1, -(-total // shard_bytes))
    return [shard_bytes] * (count - 1) + [total - shard_bytes * (count - 1)]


def shard_name(index: int, count: int) -> str:
    return f"weights-{index:05d}-of-{count:05d}.bin"


def _seed_words(seed: int, model: str, version: int, shard: int) -> list[int]:
    name = int.from_bytes(hashlib.sha256(model.encode()).digest()[:8], "big")
    return [seed, name, version, shard]


def shard_chunks(seed: int, model: str, version: int, shard: int, size: int) -> Iterator[bytes]:
    """The bytes of one shard, CHUNK at a time: PCG64's raw stream (stable across numpy versions)."""
    generator = np.random.PCG64(np.random.SeedSequence(_seed_words(seed, model, version, shard)))
    left = size
    while left > 0:
        n = min(CHUNK, left)
        words = generator.random_raw(-(-n // 8)).astype("<u8", copy=False)
        yield words.view(np.uint8)[:n].tobytes()
        left -= n


# ---------------------------------------------------------------- the repository as files

Sink = Callable[[str, Iterator[bytes]], FileInfo]
"""Writes one file (path under the repository root, its bytes in chunks) and says what it wrote."""


def _hashing(chunks: Iterator[bytes], digest: Any, counter: list[int]) -> Iterator[bytes]:
    for chunk in chunks:
        digest.update(chunk)
        counter[0] += len(chunk)
        yield chunk


def _generate(shape: RepoShape, sink: Sink) -> GeneratedRepository:
    started = time.monotonic()
    code = MODEL_CODE.read_bytes()
    specs = spec_models(shape)
    configs = {m["name"]: m["config"] for m in specs}
    models: list[GeneratedModel] = []
    for name, size in shape.weighted():
        files: list[FileInfo] = []
        constants: dict[int, float] = {}
        for version in sorted(shape.versions):
            sizes = shard_sizes(size, shape.shard_bytes)
            shards: list[dict[str, Any]] = []
            for index, shard_size in enumerate(sizes, start=1):
                rel = f"{name}/{version}/{shard_name(index, len(sizes))}"
                info = sink(rel, shard_chunks(shape.seed, name, version, index, shard_size))
                files.append(info)
                shards.append({"name": rel.rsplit("/", 1)[1], "size": info.size, "sha256": info.sha256})
            index_json = json.dumps({"model": name, "version": version, "shards": shards}, indent=1) + "\n"
            files.append(sink(f"{name}/{version}/{INDEX}", iter([index_json.encode()])))
            files.append(sink(f"{name}/{version}/model.py", iter([code])))
            constants[version] = weights_constant([s["sha256"] for s in shards])
        files.append(sink(f"{name}/config.pbtxt", iter([build_config_pbtxt(name, configs[name]).encode()])))
        models.append(GeneratedModel(name, tuple(sorted(shape.versions)), tuple(files), constants))
    if shape.ensemble:
        config = build_config_pbtxt(ENSEMBLE, configs[ENSEMBLE]).encode()
        files = [sink(f"{ENSEMBLE}/config.pbtxt", iter([config]))]
        models.append(GeneratedModel(ENSEMBLE, (1,), tuple(files), steps=("small-1", "small-2")))
    return GeneratedRepository(shape, tuple(models), specs, time.monotonic() - started)


def write_repository(out: Path, shape: RepoShape) -> GeneratedRepository:
    """Write the repository under ``out`` (created; files there are overwritten): one model folder
    each, with its config.pbtxt rendered from the spec as the operator renders it."""

    def write(rel: str, chunks: Iterator[bytes]) -> FileInfo:
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        digest, counter = hashlib.sha256(), [0]
        with path.open("wb") as f:
            for chunk in _hashing(chunks, digest, counter):
                f.write(chunk)
        return FileInfo(rel, counter[0], digest.hexdigest())

    out.mkdir(parents=True, exist_ok=True)
    repository = _generate(shape, write)
    if shape.ensemble:  # an ensemble's version folder is empty (object stores keep none; sync makes it)
        (out / ENSEMBLE / "1").mkdir(parents=True, exist_ok=True)
    return repository


class _ChunkReader(io.RawIOBase):
    """A read-only stream over generated chunks, for boto3's upload_fileobj (which reads it part by
    part: memory stays at its parts in flight)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._pending = memoryview(chunk)
        view = memoryview(buffer).cast("B")
        n = min(len(view), len(self._pending))
        view[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n


def upload_repository(
    s3: Any, bucket: str, prefix: str, shape: RepoShape, *, transfer_config: Any = None
) -> GeneratedRepository:
    """Stream the repository to ``s3://bucket/prefix/`` with the boto3 client ``s3`` (nothing on disk).
    config.pbtxt files are uploaded too: the operator renders its own and skips them, and they let
    tritonserver or `triton-operator import` read the bucket as it is."""
    base = prefix.strip("/") + "/" if prefix.strip("/") else ""

    def upload(rel: str, chunks: Iterator[bytes]) -> FileInfo:
        digest, counter = hashlib.sha256(), [0]
        reader = io.BufferedReader(_ChunkReader(_hashing(chunks, digest, counter)))
        extra = {} if transfer_config is None else {"Config": transfer_config}
        s3.upload_fileobj(reader, bucket, base + rel, **extra)
        return FileInfo(rel, counter[0], digest.hexdigest())

    return _generate(shape, upload)


# ---------------------------------------------------------------- the command line


def _shape(args: argparse.Namespace) -> RepoShape:
    policy: dict[str, Any] | None = {"all": {}} if args.all_versions else None
    return RepoShape(
        big_bytes=parse_size(args.big),
        medium_bytes=parse_size(args.medium),
        small_count=args.small,
        small_bytes=parse_size(args.small_size),
        shard_bytes=parse_size(args.shard),
        seed=args.seed,
        versions=tuple(int(v) for v in args.versions.split(",")),
        version_policy=policy,
        ensemble=not args.no_ensemble,
    )


def _s3_client(endpoint: str | None) -> Any:
    import boto3  # noqa: PLC0415 (only the upload needs it)
    from botocore.config import Config  # noqa: PLC0415

    config = Config(
        s3={"addressing_style": "path"},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    return boto3.client("s3", endpoint_url=endpoint, config=config)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    where = parser.add_argument_group("where (one or both)")
    where.add_argument("--out", type=Path, help="write the repository into this folder")
    where.add_argument("--bucket", help="upload to this S3 bucket (credentials: the AWS_* environment)")
    where.add_argument("--prefix", default="", help="key prefix in the bucket")
    where.add_argument("--s3-endpoint", help="S3 endpoint URL (default: AWS)")
    parser.add_argument("--big", default="2GiB", help=f"weights of {BIG!r} (0: leave it out)")
    parser.add_argument("--medium", default="500MiB", help=f"weights of {MEDIUM!r} (0: leave it out)")
    parser.add_argument("--small", type=int, default=3, help="number of small models")
    parser.add_argument("--small-size", default="1MiB", help="weights of each small model")
    parser.add_argument("--shard", default="256MiB", help="largest weight shard")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--versions", default="1", help="version folders of each model, e.g. 1,2")
    parser.add_argument("--all-versions", action="store_true", help="versionPolicy all (default: latest 1)")
    parser.add_argument("--no-ensemble", action="store_true")
    parser.add_argument("--uri", default="s3://models/real", help="repository.uri of the spec written")
    parser.add_argument("--describe", type=Path, help="write the description (files, sha256, spec) as JSON")
    args = parser.parse_args(argv)
    if args.out is None and args.bucket is None:
        parser.error("say where: --out DIR and/or --bucket NAME")
    try:
        shape = _shape(args)
    except ValueError as exc:
        parser.error(str(exc))
    results = []
    if args.out is not None:
        results.append(("folder " + str(args.out), write_repository(args.out, shape)))
    if args.bucket is not None:
        s3 = _s3_client(args.s3_endpoint)
        target = f"s3://{args.bucket}/{args.prefix}"
        results.append((target, upload_repository(s3, args.bucket, args.prefix, shape)))
    for target, repository in results:
        rate = repository.total_bytes / max(repository.seconds, 1e-9) / MiB
        print(
            f"{target}: {len(repository.models)} models, {len(repository.files)} files, "
            f"{format_size(repository.total_bytes)} in {repository.seconds:.1f} s ({rate:.0f} MiB/s)"
        )
        for model in repository.models:
            if model.steps:
                print(f"  {model.name:<12} ensemble: {' > '.join(model.steps)}")
                continue
            added = ", ".join(f"v{v}: +{c:g}" for v, c in model.constants.items())
            print(f"  {model.name:<12} {format_size(model.weight_bytes):>10} of weights  {added}")
    if args.describe is not None:
        description = results[-1][1].describe() | {"spec": results[-1][1].spec(args.uri)}
        args.describe.write_text(json.dumps(description, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
