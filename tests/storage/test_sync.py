"""`sync` against the real S3, GCS and Azure servers: download, verify, resync, cache, parts, changes."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import os
import random
from pathlib import Path
from typing import Any, cast

import pytest
from boto3.s3.transfer import TransferConfig

from counting_proxy import counting_proxy
from realrepo import KiB, RepoShape, upload_repository
from storage_backends import Backend, CountingStore, S3Backend
from triton_operator.adapters.storage import (
    ObjectChanged,
    ObjectStore,
    open_store,
    pin_repository,
    pin_with_versioning,
)
from triton_operator.adapters.storage.base import Chunk, Sink
from triton_operator.adapters.sync import destination as sync_files
from triton_operator.adapters.sync import download as sync_engine
from triton_operator.adapters.sync.destination import STATE_FILE
from triton_operator.adapters.sync.download import SyncOptions, sync
from triton_operator.adapters.sync.results import ChecksumMismatch, SyncStats, UnsafeDestination
from triton_operator.core.repository.manifest import (
    Manifest,
    manifest_digest,
    manifest_from_json,
    manifest_to_json,
)
from triton_operator.core.repository.repository_access import RepositoryAccess
from triton_operator.core.spec.modelconfig import build_config_pbtxt
from triton_operator.models import ModelSpec, Repository, TritonService
from triton_operator.reconcile.pinning import PinnedManifest, RepositoryPinner, repository_verdict, summarize

pytestmark = pytest.mark.storage

MiB = 1024 * 1024
FILES = {
    "models/resnet/1/model.onnx": b"one" * 1000,
    "models/resnet/2/model.onnx": b"two" * 2000,
    "models/resnet/2/sub/weights.bin": os.urandom(300_000),
    "models/resnet/labels.txt": b"cat\ndog\n",
    "models/resnet/config.pbtxt": b'name: "resnet" # the user\'s; the rendered one wins',
    "models/tok/1/model.py": b"print('tok')\n",
    "models/tok/1/empty.txt": b"",
}
MODELS = [
    ModelSpec(name="resnet", config={"backend": "python", "versionPolicy": {"latest": {"numVersions": 1}}}),
    ModelSpec(name="tok", config={"backend": "python"}),
]
EXPECTED = {
    "resnet/2/model.onnx": FILES["models/resnet/2/model.onnx"],
    "resnet/2/sub/weights.bin": FILES["models/resnet/2/sub/weights.bin"],
    "resnet/labels.txt": FILES["models/resnet/labels.txt"],
    "tok/1/model.py": FILES["models/tok/1/model.py"],
    "tok/1/empty.txt": b"",
}


def write_configs(root: Path, models: list[ModelSpec]) -> Path:
    for m in models:
        (root / m.name).mkdir(parents=True, exist_ok=True)
        (root / m.name / "config.pbtxt").write_text(build_config_pbtxt(m.name, m.config))
    return root


def files_under(root: Path) -> dict[str, bytes]:
    out = {}
    for path in root.rglob("*"):
        if path.is_file() and path.name != STATE_FILE:
            out[path.relative_to(root).as_posix()] = path.read_bytes()
    return out


@pytest.fixture
def repo(backend: Backend, bucket: str) -> tuple[Backend, str, Manifest]:
    for key, data in FILES.items():
        backend.put(bucket, key, data)
    return backend, bucket, pin_repository(backend.repository(bucket), MODELS, backend.credentials)


def run(manifest: Manifest, store: CountingStore, dest: Path, **kwargs: object) -> SyncStats:
    options = SyncOptions(dest=dest, concurrency=4, **kwargs)  # type: ignore[arg-type]
    return sync(manifest, store, options)


def test_sync_downloads_verifies_and_writes_rendered_configs(
    repo: tuple[Backend, str, Manifest], tmp_path: Path
) -> None:
    backend, bucket, manifest = repo
    configs = write_configs(tmp_path / "configs", MODELS)
    store = CountingStore(backend.store(bucket))
    stats = run(manifest, store, tmp_path / "models", configs=configs)
    got = files_under(tmp_path / "models")
    assert {k: v for k, v in got.items() if not k.endswith("config.pbtxt")} == EXPECTED
    for m in MODELS:
        assert got[f"{m.name}/config.pbtxt"].decode() == build_config_pbtxt(m.name, m.config)
    assert (stats.files, stats.downloaded_files, stats.configs_written) == (5, 5, 2)
    assert stats.unverified_files == 0
    assert sorted(k for k, _, _ in store.reads) == sorted(e.key for e in manifest.entries)
    assert not [p for p in (tmp_path / "models").rglob("*") if ".tmp-sync-" in p.name]


def test_resync_is_a_no_op(repo: tuple[Backend, str, Manifest], tmp_path: Path) -> None:
    backend, bucket, manifest = repo
    configs = write_configs(tmp_path / "configs", MODELS)
    run(manifest, CountingStore(backend.store(bucket)), tmp_path / "models", configs=configs)
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "models").rglob("*") if p.is_file()}

    store = CountingStore(backend.store(bucket))
    stats = run(manifest, store, tmp_path / "models", configs=configs)
    assert store.reads == []
    assert (stats.downloaded_files, stats.present_files, stats.configs_written) == (0, 5, 0)
    after = {p: p.stat().st_mtime_ns for p in (tmp_path / "models").rglob("*") if p.is_file()}
    assert {p: t for p, t in after.items() if p.name != STATE_FILE} == {
        p: t for p, t in before.items() if p.name != STATE_FILE
    }

    # Without the record of the last sync, present files are hashed instead of fetched again.
    (tmp_path / "models" / STATE_FILE).unlink()
    store = CountingStore(backend.store(bucket))
    stats = run(manifest, store, tmp_path / "models", configs=configs)
    assert store.reads == [] and stats.present_files == 5


def _corrupt_keeping_size_and_mtime(path: Path) -> None:
    """Other bytes in the same inode, with its size and mtime as they were: what a crash can leave
    of a file whose data was never flushed (zeros in its allocated blocks)."""
    st = path.stat()
    with path.open("r+b") as f:
        f.write(bytes(st.st_size))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_the_state_of_the_last_sync_is_trusted_on_its_boot_only(
    repo: tuple[Backend, str, Manifest], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing is flushed: the state file names the boot that wrote it. On that boot its files are
    taken as recorded (the page cache is what every reader gets); after a reboot (another boot id)
    a crash may have lost unflushed data, so every file is checked by its digest again, and one
    that lost its bytes is fetched again."""
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    monkeypatch.setattr(sync_files, "BOOT_ID", boot)
    flushes: list[Path] = []
    monkeypatch.setattr(sync_engine, "syncfs", flushes.append)
    backend, bucket, manifest = repo
    dest = tmp_path / "models"
    run(manifest, CountingStore(backend.store(bucket)), dest)
    assert flushes == []
    target = dest / "resnet/2/model.onnx"
    _corrupt_keeping_size_and_mtime(target)

    store = CountingStore(backend.store(bucket))
    same_boot = run(manifest, store, dest)  # the record stands: nothing is hashed or fetched
    assert store.reads == [] and same_boot.present_files == 5

    boot.write_text("boot-2\n")
    store = CountingStore(backend.store(bucket))
    rebooted = run(manifest, store, dest)
    assert [k for k, _, _ in store.reads] == ["models/resnet/2/model.onnx"]
    assert (rebooted.downloaded_files, rebooted.present_files) == (1, 4)
    assert target.read_bytes() == EXPECTED["resnet/2/model.onnx"]
    assert flushes == []


def test_without_a_boot_id_the_sync_flushes_and_its_state_holds_on_any_boot(
    repo: tuple[Backend, str, Manifest], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the kernel gives no boot id, what a sync wrote is flushed before its state file is
    written, and that state is trusted on a later boot too."""
    monkeypatch.setattr(sync_files, "BOOT_ID", tmp_path / "no-such-file")
    flushes: list[Path] = []
    monkeypatch.setattr(sync_engine, "syncfs", flushes.append)
    backend, bucket, manifest = repo
    dest = tmp_path / "models"
    run(manifest, CountingStore(backend.store(bucket)), dest)
    assert flushes == [dest]
    _corrupt_keeping_size_and_mtime(dest / "resnet/2/model.onnx")
    boot = tmp_path / "boot_id"
    boot.write_text("boot-2\n")
    monkeypatch.setattr(sync_files, "BOOT_ID", boot)
    store = CountingStore(backend.store(bucket))
    stats = run(manifest, store, dest)
    assert store.reads == [] and stats.present_files == 5


def test_a_file_changed_in_dest_is_fetched_again(repo: tuple[Backend, str, Manifest], tmp_path: Path) -> None:
    backend, bucket, manifest = repo
    dest = tmp_path / "models"
    run(manifest, CountingStore(backend.store(bucket)), dest)
    target = dest / "resnet/2/model.onnx"
    target.write_bytes(b"X" * target.stat().st_size)  # same size, other bytes
    store = CountingStore(backend.store(bucket))
    stats = run(manifest, store, dest)
    assert [k for k, _, _ in store.reads] == ["models/resnet/2/model.onnx"]
    assert stats.downloaded_files == 1
    assert target.read_bytes() == EXPECTED["resnet/2/model.onnx"]


def test_an_object_changed_after_pinning_fails_the_sync(
    repo: tuple[Backend, str, Manifest], tmp_path: Path
) -> None:
    backend, bucket, manifest = repo
    (entry,) = [e for e in manifest.entries if e.dest == "resnet/2/model.onnx"]
    backend.put(bucket, entry.key, b"new bytes uploaded after the revision was pinned")
    with pytest.raises(ObjectChanged) as info:
        run(manifest, CountingStore(backend.store(bucket)), tmp_path / "models")
    message = str(info.value)
    assert info.value.key == entry.key and entry.key in message
    pinned = entry.generation if backend.name == "gcs" else entry.etag
    assert pinned in message and info.value.current != "deleted"
    assert info.value.current not in (f"etag {entry.etag}", f"generation {entry.generation}")
    assert not (tmp_path / "models/resnet/2/model.onnx").exists()
    assert not [p for p in (tmp_path / "models").rglob("*") if ".tmp-sync-" in p.name]


def test_a_deleted_object_fails_the_sync(repo: tuple[Backend, str, Manifest], tmp_path: Path) -> None:
    backend, bucket, manifest = repo
    backend.delete(bucket, "models/tok/1/model.py")
    with pytest.raises(ObjectChanged) as info:
        run(manifest, CountingStore(backend.store(bucket)), tmp_path / "models")
    assert info.value.key == "models/tok/1/model.py" and info.value.current == "deleted"


def test_bytes_that_do_not_match_the_pinned_checksum_fail(
    repo: tuple[Backend, str, Manifest], tmp_path: Path
) -> None:
    backend, bucket, manifest = repo
    wrong = hashlib.md5(b"something else").hexdigest()
    entries = tuple(
        dataclasses.replace(e, checksum=wrong) if e.dest == "resnet/labels.txt" else e
        for e in manifest.entries
    )
    with pytest.raises(ChecksumMismatch) as info:
        run(
            dataclasses.replace(manifest, entries=entries),
            CountingStore(backend.store(bucket)),
            tmp_path / "m",
        )
    assert info.value.key == "models/resnet/labels.txt" and wrong in str(info.value)
    assert not (tmp_path / "m/resnet/labels.txt").exists()


def test_the_cache_is_filled_and_then_used(repo: tuple[Backend, str, Manifest], tmp_path: Path) -> None:
    backend, bucket, manifest = repo
    cache = tmp_path / "cache"
    run(manifest, CountingStore(backend.store(bucket)), tmp_path / "first", cache=cache)
    for e in manifest.entries:
        assert (cache / e.checksum_kind / e.checksum).is_file()
    store = CountingStore(backend.store(bucket))
    stats = run(manifest, store, tmp_path / "second", cache=cache)
    assert store.reads == []
    assert (stats.cache_hits, stats.downloaded_files) == (5, 0)
    assert files_under(tmp_path / "second") == EXPECTED

    # A corrupted cache entry is not trusted: that file is downloaded.
    entry = next(e for e in manifest.entries if e.dest == "resnet/labels.txt")
    cached = cache / entry.checksum_kind / entry.checksum
    cached.unlink()
    cached.write_bytes(b"dog\ncat\n")
    store = CountingStore(backend.store(bucket))
    stats = run(manifest, store, tmp_path / "third", cache=cache)
    assert [k for k, _, _ in store.reads] == [entry.key] and stats.cache_hits == 4
    assert files_under(tmp_path / "third") == EXPECTED


def test_a_large_object_is_fetched_in_ranged_parts(backend: Backend, bucket: str, tmp_path: Path) -> None:
    data = random.Random(7).randbytes(20 * MiB + 12345)
    backend.put(bucket, "models/big/1/model.bin", data, part_size=5 * MiB)
    manifest = pin_repository(backend.repository(bucket), [ModelSpec(name="big")], backend.credentials)
    (entry,) = manifest.entries
    store = CountingStore(backend.store(bucket))
    stats = run(manifest, store, tmp_path / "models", part_size=3 * MiB)
    assert (tmp_path / "models/big/1/model.bin").read_bytes() == data
    # S3: ranges follow the upload's 5 MiB parts (learned with HEAD ?partNumber=1), so each
    # part's MD5 is computed as it streams and the multipart ETag is recomputed from them.
    step = 5 * MiB if backend.name == "s3" else 3 * MiB
    expected = [(s, min(s + step, len(data))) for s in range(0, len(data), step)]
    assert sorted((s, e) for _, s, e in store.reads) == expected
    assert stats.ranged_parts == len(expected)
    if backend.name == "s3":
        assert entry.checksum_kind == "s3-multipart" and entry.checksum.endswith("-5")
        assert stats.unverified_files == 0
    elif backend.name == "gcs":
        assert entry.checksum_kind == "md5" and stats.unverified_files == 0
    else:
        # A block-list upload has no Content-MD5: size plus etag-conditional reads only.
        assert entry.checksum_kind == "none" and stats.unverified_files == 1

    # Read whole (part size above the object's size): the checksum is computed in one stream.
    store = CountingStore(backend.store(bucket))
    stats = run(manifest, store, tmp_path / "whole", part_size=64 * MiB)
    assert (tmp_path / "whole/big/1/model.bin").read_bytes() == data
    assert [(s, e) for _, s, e in store.reads] == [(0, None)] and stats.ranged_parts == 0
    assert stats.unverified_files == (1 if backend.name == "azure" else 0)


def test_a_corrupted_part_fails_the_multipart_etag_check(s3_backend: Backend, tmp_path: Path) -> None:
    bucket = s3_backend.new_bucket()
    data = random.Random(8).randbytes(12 * MiB)
    s3_backend.put(bucket, "models/big/1/model.bin", data, part_size=5 * MiB)
    manifest = pin_repository(s3_backend.repository(bucket), [ModelSpec(name="big")], s3_backend.credentials)
    (entry,) = manifest.entries
    # Another 12 MiB object uploaded in 5 MiB parts has the same size and part layout, but
    # another ETag: pin the first one's ETag onto the second one's key.
    s3_backend.put(bucket, "models/big/1/other.bin", random.Random(9).randbytes(12 * MiB), part_size=5 * MiB)
    other = s3_backend.store(bucket).head("models/big/1/other.bin")
    assert other is not None
    forged = dataclasses.replace(entry, key="models/big/1/other.bin", etag=other.etag)
    for part_size in (4 * MiB, 64 * MiB):
        with pytest.raises(ChecksumMismatch) as info:
            run(
                dataclasses.replace(manifest, entries=(forged,)),
                CountingStore(s3_backend.store(bucket)),
                tmp_path / f"m{part_size}",
                part_size=part_size,
            )
        assert entry.checksum in str(info.value) and other.etag in str(info.value)
        assert not (tmp_path / f"m{part_size}/big/1/model.bin").exists()


def test_a_generated_repository_comes_whole_from_ranged_parts_of_multipart_objects(
    s3_backend: S3Backend, tmp_path: Path
) -> None:
    """tests/support/realrepo.py's repository, its shards uploaded in 5 MiB parts, fetched in ranges of
    two parts (one written WRITE_PIECE at a time into an allocated file): every file is the one the
    generator described (its sha256), and every byte was checked against the pinned multipart ETags."""
    bucket = s3_backend.new_bucket()
    shape = RepoShape(
        big_bytes=27 * MiB + 3,
        medium_bytes=11 * MiB,
        small_count=2,
        small_bytes=64 * KiB,
        shard_bytes=16 * MiB,
        seed=11,
    )
    config = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    repository = upload_repository(s3_backend.client, bucket, "models", shape, transfer_config=config)
    specs = [ModelSpec.model_validate(m) for m in repository.spec_models]
    manifest = pin_repository(s3_backend.repository(bucket), specs, s3_backend.credentials)
    multipart = [e for e in manifest.entries if e.checksum_kind == "s3-multipart"]
    assert len(multipart) == 3  # the shards of 16, 11 and 11 MiB
    store = CountingStore(s3_backend.store(bucket))
    stats = run(manifest, store, tmp_path / "models", part_size=10 * MiB)
    assert stats.unverified_files == 0 and stats.downloaded_bytes == sum(e.size for e in manifest.entries)
    # Ranges of 10 MiB, on the uploads' 5 MiB part boundaries; the small files in one read each.
    ranged = sorted((s, e) for _, s, e in store.reads if e is not None)
    tails = [16 * MiB, 11 * MiB + 3, 11 * MiB]
    assert ranged == sorted([(0, 10 * MiB)] * 3 + [(10 * MiB, end) for end in tails])
    assert stats.ranged_parts == 6
    for file in repository.files:
        if file.path.endswith("/config.pbtxt"):
            continue  # the operator renders its own (none given here)
        got = (tmp_path / "models" / file.path).read_bytes()
        assert hashlib.sha256(got).hexdigest() == file.sha256, file.path
    assert not [p for p in (tmp_path / "models").rglob("*") if ".tmp-sync-" in p.name]


def test_a_wrong_byte_in_one_range_of_a_single_part_object_fails_the_check(
    s3_backend: S3Backend, tmp_path: Path
) -> None:
    """A 9 MiB object uploaded whole (its ETag an MD5) is fetched in three ranges and hashed in file
    order from what was written: bytes that differ from the pinned MD5 in its last range only fail the
    sync, and neither the file nor its temp file is left."""
    bucket = s3_backend.new_bucket()
    data = random.Random(12).randbytes(9 * MiB)
    other = data[: 8 * MiB] + bytes([data[8 * MiB] ^ 1]) + data[8 * MiB + 1 :]  # one bit in the last range
    s3_backend.put(bucket, "models/big/1/model.bin", data)
    s3_backend.put(bucket, "models/big/1/other.bin", other)
    manifest = pin_repository(s3_backend.repository(bucket), [ModelSpec(name="big")], s3_backend.credentials)
    entry = next(e for e in manifest.entries if e.dest == "big/1/model.bin")
    assert entry.checksum_kind == "md5" and entry.checksum == hashlib.md5(data).hexdigest()
    head = s3_backend.store(bucket).head("models/big/1/other.bin")
    assert head is not None
    forged = dataclasses.replace(entry, key="models/big/1/other.bin", etag=head.etag)
    store = CountingStore(s3_backend.store(bucket))
    with pytest.raises(ChecksumMismatch) as info:
        run(dataclasses.replace(manifest, entries=(forged,)), store, tmp_path / "m", part_size=3 * MiB)
    assert entry.checksum in str(info.value) and hashlib.md5(other).hexdigest() in str(info.value)
    assert sorted((s, e) for _, s, e in store.reads) == [(0, 3 * MiB), (3 * MiB, 6 * MiB), (6 * MiB, 9 * MiB)]
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_a_symlink_in_dest_is_refused(repo: tuple[Backend, str, Manifest], tmp_path: Path) -> None:
    backend, bucket, manifest = repo
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"precious")
    dest = tmp_path / "models"
    (dest / "resnet").mkdir(parents=True)
    (dest / "resnet/labels.txt").symlink_to(outside)
    with pytest.raises(UnsafeDestination) as info:
        run(manifest, CountingStore(backend.store(bucket)), dest)
    assert "labels.txt" in str(info.value) and "symlink" in str(info.value)
    assert outside.read_bytes() == b"precious"

    other = tmp_path / "other"
    other.mkdir()
    (dest / "tok").symlink_to(other, target_is_directory=True)
    (dest / "resnet/labels.txt").unlink()
    with pytest.raises(UnsafeDestination):
        run(manifest, CountingStore(backend.store(bucket)), dest)
    assert list(other.iterdir()) == []


def test_a_symlink_into_the_view_of_the_node_caches_files_is_refused_unless_the_sync_placed_it(
    repo: tuple[Backend, str, Manifest], tmp_path: Path
) -> None:
    """A pod with the node cache's view trusts a symlink into it only as its own sync recorded it;
    one that something else put there, even naming a file of the view, is refused as any other."""
    backend, bucket, manifest = repo
    view = tmp_path / "view"
    view.mkdir()
    blob = view / ("a" * 64)
    blob.write_bytes(b"precious")
    dest = tmp_path / "models"
    (dest / "resnet").mkdir(parents=True)
    (dest / "resnet/labels.txt").symlink_to(blob)
    with pytest.raises(UnsafeDestination) as info:
        run(manifest, CountingStore(backend.store(bucket)), dest, shared_dir=str(view))
    assert "labels.txt" in str(info.value) and "symlink" in str(info.value)
    assert blob.read_bytes() == b"precious"


def test_files_the_manifest_does_not_name_are_pruned(
    repo: tuple[Backend, str, Manifest], tmp_path: Path
) -> None:
    backend, bucket, manifest = repo
    dest = tmp_path / "models"
    (dest / "resnet/1").mkdir(parents=True)
    (dest / "resnet/1/model.onnx").write_bytes(b"an older version")
    (dest / "unrelated.txt").write_bytes(b"not in a model folder")
    stats = run(
        manifest, CountingStore(backend.store(bucket)), dest, configs=write_configs(tmp_path / "c", MODELS)
    )
    assert not (dest / "resnet/1").exists()
    assert (dest / "unrelated.txt").exists() and (dest / "resnet/config.pbtxt").exists()
    assert stats.pruned_files == 1


def test_a_versioned_s3_bucket_serves_the_pinned_bytes_after_an_in_place_upload(
    s3_backend: Backend, tmp_path: Path
) -> None:
    """Pins carry the S3 VersionId: a revision pinned before an upload to the same key still syncs
    its own bytes (what an undo, a node drain or a scale-up of the stable revision needs)."""
    client = s3_backend.client  # type: ignore[attr-defined]
    bucket = s3_backend.new_bucket()
    client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    models = [ModelSpec(name="tok", config={"backend": "python"})]
    s3_backend.put(bucket, "models/tok/1/model.py", b"old = 1\n")
    old = pin_repository(s3_backend.repository(bucket), models, s3_backend.credentials)
    s3_backend.put(bucket, "models/tok/1/model.py", b"new = 2 # in place\n")
    new = pin_repository(s3_backend.repository(bucket), models, s3_backend.credentials)

    (old_entry,), (new_entry,) = old.entries, new.entries
    assert old_entry.generation and new_entry.generation and old_entry.generation != new_entry.generation
    assert manifest_digest(old) != manifest_digest(new)
    run(old, CountingStore(s3_backend.store(bucket)), tmp_path / "old")
    run(new, CountingStore(s3_backend.store(bucket)), tmp_path / "new")
    assert (tmp_path / "old/tok/1/model.py").read_bytes() == b"old = 1\n"
    assert (tmp_path / "new/tok/1/model.py").read_bytes() == b"new = 2 # in place\n"


def test_an_unversioned_s3_bucket_pins_no_version(s3_backend: Backend) -> None:
    bucket = s3_backend.new_bucket()
    s3_backend.put(bucket, "models/tok/1/model.py", b"x = 1\n")
    manifest = pin_repository(
        s3_backend.repository(bucket),
        [ModelSpec(name="tok", config={"backend": "python"})],
        s3_backend.credentials,
    )
    assert [e.generation for e in manifest.entries] == [""]


def test_a_versioned_gcs_bucket_serves_the_pinned_bytes_after_an_in_place_upload(
    gcs_backend: Backend, tmp_path: Path
) -> None:
    """fake-gcs-server keeps the overwritten generation of a bucket with versioning enabled, and a
    read naming it gets the old bytes: what a revision pinned before the upload syncs."""
    bucket = gcs_backend.new_bucket(versioned=True)
    models = [ModelSpec(name="tok", config={"backend": "python"})]
    gcs_backend.put(bucket, "models/tok/1/model.py", b"old = 1\n")
    old = pin_repository(gcs_backend.repository(bucket), models, gcs_backend.credentials)
    gcs_backend.put(bucket, "models/tok/1/model.py", b"new = 2 # in place\n")
    new = pin_repository(gcs_backend.repository(bucket), models, gcs_backend.credentials)

    (old_entry,), (new_entry,) = old.entries, new.entries
    assert old_entry.generation and new_entry.generation and old_entry.generation != new_entry.generation
    run(old, CountingStore(gcs_backend.store(bucket)), tmp_path / "old")
    run(new, CountingStore(gcs_backend.store(bucket)), tmp_path / "new")
    assert (tmp_path / "old/tok/1/model.py").read_bytes() == b"old = 1\n"
    assert (tmp_path / "new/tok/1/model.py").read_bytes() == b"new = 2 # in place\n"


def pinned_by_the_operator(backend: Backend, bucket: str) -> tuple[PinnedManifest, str]:
    """What the operator pins for a TritonService serving ``tok`` from ``bucket`` (a fresh
    listing, as RepositoryPinner makes it), and the message RepositoryReady shows for it."""
    ts = tok_service(backend, bucket)
    pin = pin_with_versioning(ts.spec.repository, ts.spec.models, backend.credentials)
    pinned = summarize(pin.manifest, versioned=pin.versioned)
    return pinned, repository_verdict(ts, pinned).message


def tok_service(backend: Backend, bucket: str) -> TritonService:
    return TritonService.model_validate(
        {
            "metadata": {"name": "exact", "namespace": "default"},
            "spec": {
                "repository": {"uri": backend.uri(bucket), "endpoint": backend.endpoint},
                "models": [{"name": "tok", "config": {"backend": "python"}}],
            },
        }
    )


@pytest.mark.parametrize("name", ["s3", "gcs"])
def test_a_versioned_bucket_pins_exact_bytes_and_the_status_says_nothing_of_rollback(
    request: pytest.FixtureRequest, name: str, tmp_path: Path
) -> None:
    backend: Backend = request.getfixturevalue(f"{name}_backend")
    bucket = backend.new_bucket(versioned=True)
    backend.put(bucket, "models/tok/1/model.py", b"old = 1\n")
    pinned, message = pinned_by_the_operator(backend, bucket)
    assert not pinned.unversioned and "not exact" not in message, message
    # what the store said is no part of the manifest: its JSON (and digest) are as pinned before
    assert pinned.json == manifest_to_json(
        pin_repository(backend.repository(bucket), [ModelSpec(name="tok")], backend.credentials)
    )
    backend.put(bucket, "models/tok/1/model.py", b"new = 2 # in place\n")
    run(manifest_from_json(pinned.json), CountingStore(backend.store(bucket)), tmp_path / "old")
    assert (tmp_path / "old/tok/1/model.py").read_bytes() == b"old = 1\n"


def test_an_unversioned_bucket_says_rollback_is_not_exact_and_an_overwrite_fails_the_pinned_sync(
    backend: Backend, tmp_path: Path
) -> None:
    """S3 and Azure pin no version there; GCS pins a generation, but the bucket drops it on
    overwrite: RepositoryReady says rollback is not exact for all three, and it is not."""
    bucket = backend.new_bucket()
    backend.put(bucket, "models/tok/1/model.py", b"old = 1\n")
    pinned, message = pinned_by_the_operator(backend, bucket)
    assert pinned.unversioned and "rollback is not exact" in message, message
    backend.put(bucket, "models/tok/1/model.py", b"new = 2 # in place\n")
    with pytest.raises(ObjectChanged):
        run(manifest_from_json(pinned.json), CountingStore(backend.store(bucket)), tmp_path / "old")


def test_an_object_written_while_s3_versioning_is_suspended_makes_rollback_not_exact(
    s3_backend: Backend, tmp_path: Path
) -> None:
    """Its VersionId is "null", which the next upload replaces (seaweedfs as S3 does); objects
    written while versioning was on keep their versions."""
    bucket = s3_backend.new_bucket(versioned=True)
    s3_backend.put(bucket, "models/tok/1/kept.py", b"kept = 1\n")
    s3_backend.client.put_bucket_versioning(  # type: ignore[attr-defined]
        Bucket=bucket, VersioningConfiguration={"Status": "Suspended"}
    )
    s3_backend.put(bucket, "models/tok/1/model.py", b"old = 1\n")
    pinned, message = pinned_by_the_operator(s3_backend, bucket)
    generations = {e.dest: e.generation for e in manifest_from_json(pinned.json).entries}
    assert generations["tok/1/model.py"] == "null" and generations["tok/1/kept.py"] not in ("", "null")
    assert pinned.unversioned and "rollback is not exact" in message, message
    s3_backend.put(bucket, "models/tok/1/model.py", b"new = 2 # in place\n")
    with pytest.raises(ObjectChanged) as info:
        run(manifest_from_json(pinned.json), CountingStore(s3_backend.store(bucket)), tmp_path / "old")
    assert info.value.key == "models/tok/1/model.py"


@pytest.mark.parametrize("versioned", [False, True])
def test_the_operator_keeps_what_a_gcs_bucket_said_of_versioning_while_it_reuses_the_listing(
    gcs_backend: Backend, versioned: bool
) -> None:
    """RepositoryPinner lists once per poll interval: the reconciles in between show the same
    RepositoryReady message (fake-gcs-server needs no credentials, so no Secret is read; its
    namespace is allowed to go without one)."""
    bucket = gcs_backend.new_bucket(versioned=versioned)
    gcs_backend.put(bucket, "models/tok/1/model.py", b"x = 1\n")
    ts = tok_service(gcs_backend, bucket)
    access = RepositoryAccess(ambient_namespaces=("default",))
    pinner = RepositoryPinner(cast(Any, None), clock=lambda: 0.0, access=access)  # no Kubernetes call

    async def twice() -> list[PinnedManifest]:
        first = await pinner(ts, None)
        gcs_backend.delete(bucket, "models/tok/1/model.py")  # a listing now would fail the pin
        return [first, await pinner(ts, first.json)]

    first, cached = asyncio.run(twice())
    assert first == cached and first.unversioned is not versioned
    assert ("rollback is not exact" in repository_verdict(ts, cached).message) is not versioned


@pytest.mark.parametrize("name", ["s3", "gcs"])
def test_a_store_tells_whether_its_bucket_keeps_versions(request: pytest.FixtureRequest, name: str) -> None:
    backend: Backend = request.getfixturevalue(f"{name}_backend")
    assert backend.store(backend.new_bucket(versioned=True)).versioned() is True
    assert backend.store(backend.new_bucket()).versioned() is False


@pytest.mark.parametrize("versioned", [True, False])
def test_pinning_an_s3_bucket_asks_for_its_versioning_once(s3_backend: Backend, versioned: bool) -> None:
    """The listing asks GetBucketVersioning (versioned buckets are listed by version); the answer
    pinning reports is that one, not a second request."""
    bucket = s3_backend.new_bucket(versioned=versioned)
    cast(Any, s3_backend).client.put_object(Bucket=bucket, Key="models/add/1/model.py", Body=b"x")
    store = s3_backend.store(bucket, reads_only=False)  # the operator's, which pins
    asked: list[str] = []
    client: Any = cast(Any, store).client
    client.meta.events.register("before-call.s3.GetBucketVersioning", lambda **_: asked.append("ask"))
    models = [ModelSpec(name="add", config={"backend": "python"})]
    pin = pin_with_versioning(s3_backend.repository(bucket), models, s3_backend.credentials, store=store)
    assert pin.versioned is versioned
    assert all(bool(e.generation) is versioned for e in pin.manifest.entries)
    assert asked == ["ask"]


def test_azurite_keeps_no_blob_versions(azure_backend: Backend) -> None:
    """Evidence for the README: azurite (3.37) gives no version id on upload, listing or
    properties, and a read naming a version id gets the current bytes. So on azurite nothing is
    pinned by version, and a read by version is checked only for what it asks (below)."""
    container = azure_backend.new_bucket()
    client = azure_backend.service.get_container_client(container)  # type: ignore[attr-defined]
    blob = client.get_blob_client("models/tok/1/model.py")
    assert blob.upload_blob(b"old", overwrite=True).get("version_id") is None
    assert blob.upload_blob(b"new", overwrite=True).get("version_id") is None
    assert blob.get_blob_properties().version_id is None
    assert [b.version_id for b in client.list_blobs(include=["versions"])] == [None]
    assert client.download_blob(blob.blob_name, version_id="2020-01-01T00:00:00.0000000Z").readall() == b"new"
    store = azure_backend.store(container)
    assert [o.generation for o in store.list(store.prefix)] == [""]
    assert store.versioned() is None  # the account's versioning setting is not visible here


def test_an_azure_read_of_a_pinned_version_asks_for_that_version(
    azure_backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    """Read by the pinned version id, seen on the request sent to the real azurite (azure-core
    logs each request's URL). azurite ignores the parameter (above), so the old bytes themselves
    cannot be shown here; on Azure with blob versioning the version id is what keeps them."""
    container = azure_backend.new_bucket()
    azure_backend.put(container, "models/tok/1/model.py", b"x = 1\n")
    store = azure_backend.store(container)
    version = "2020-01-01T00:00:00.0000000Z"
    with caplog.at_level(logging.INFO, logger="azure.core.pipeline.policies.http_logging_policy"):
        assert store.open_range("models/tok/1/model.py", 0, 3, generation=version) == b"x ="
    urls = [r.getMessage() for r in caplog.records if "Request URL" in r.getMessage()]
    assert any("/models/tok/1/model.py?" in u and "versionid=" in u for u in urls), urls


class FlippingStore(CountingStore):
    """A real store whose bytes get one bit flipped at offset ``at`` on the way in (a fault injected
    in transit; the store and its ETag and checksums are untouched)."""

    def __init__(self, inner: ObjectStore, at: int) -> None:
        super().__init__(inner)
        self.at = at

    def read_range(
        self, key: str, start: int, end: int | None, sink: Sink, *, etag: str = "", generation: str = ""
    ) -> int:
        pos = [start]

        def flipping(chunk: Chunk) -> None:
            chunk = bytes(chunk)  # valid only during the call; S3's is a view of a reused buffer
            i = self.at - pos[0]
            if 0 <= i < len(chunk):
                chunk = chunk[:i] + bytes([chunk[i] ^ 1]) + chunk[i + 1 :]
            pos[0] += len(chunk)
            sink(chunk)

        return super().read_range(key, start, end, flipping, etag=etag, generation=generation)


@pytest.mark.parametrize(
    ("crc", "upload_part", "kind"),
    [
        ("CRC32", 2 * MiB, "crc32-composite"),  # boto3's default for a multipart upload
        ("CRC32", None, "crc32"),  # boto3's default for a whole upload
        ("CRC32C", None, "crc32c"),
        ("", None, "md5"),  # the store keeps no CRC: the pinned MD5
        ("", 2 * MiB, "s3-multipart"),
    ],
)
def test_a_big_file_is_checked_by_the_stores_crc_of_the_pinned_object(
    s3_backend: S3Backend, tmp_path: Path, crc: str, upload_part: int | None, kind: str
) -> None:
    """verify "fast": a file read in ranges is checked by the CRC S3 keeps of the object with the
    pinned ETag (every byte, far cheaper than MD5), else by the pinned digest; "digest" always by the
    digest. One flipped bit fails the check that applies, and nothing is left."""
    bucket = s3_backend.new_bucket()
    data = random.Random(21).randbytes(9 * MiB + 777)
    s3_backend.put(bucket, "models/big/1/model.bin", data, part_size=upload_part, crc=crc)
    manifest = pin_repository(s3_backend.repository(bucket), [ModelSpec(name="big")], s3_backend.credentials)
    (entry,) = manifest.entries
    assert entry.checksum == entry.etag  # the pinned digest is the object's ETag
    store = s3_backend.store(bucket)
    fast = run(manifest, CountingStore(store), tmp_path / "fast", part_size=3 * MiB)
    assert (tmp_path / "fast/big/1/model.bin").read_bytes() == data
    assert fast.unverified_files == 0 and fast.crc_checked_files == (1 if crc else 0)
    digest = run(manifest, CountingStore(store), tmp_path / "digest", part_size=3 * MiB, verify="digest")
    assert (tmp_path / "digest/big/1/model.bin").read_bytes() == data
    assert digest.unverified_files == 0 and digest.crc_checked_files == 0
    for at in (5, len(data) - 5):  # a bit in the first range, then in the last
        with pytest.raises(ChecksumMismatch) as info:
            run(manifest, FlippingStore(store, at), tmp_path / f"bad{at}", part_size=3 * MiB)
        assert f": {kind} is " in str(info.value)
        assert ("the store keeps for the pinned object" in str(info.value)) == bool(crc)
        assert not [p for p in (tmp_path / f"bad{at}").rglob("*") if p.is_file()]


@pytest.mark.parametrize("part_size", [3 * MiB, 16 * MiB], ids=["ranged", "whole"])
def test_a_connection_cut_in_the_middle_of_a_body_is_read_again(
    s3_backend: S3Backend, tmp_path: Path, part_size: int
) -> None:
    """S3's bodies are read from the socket into one reused buffer: a body the connection ends
    short (a proxy cuts it after 1 MiB) is a failed read that is tried again, never a short file or
    a checksum failure, and the file arrives whole."""
    bucket = s3_backend.new_bucket()
    data = random.Random(25).randbytes(9 * MiB + 5)
    s3_backend.put(bucket, "models/big/1/model.bin", data, crc="CRC32")
    manifest = pin_repository(s3_backend.repository(bucket), [ModelSpec(name="big")], s3_backend.credentials)
    with counting_proxy(s3_backend.endpoint, cut_after=MiB) as proxy:
        cut = open_store(
            Repository(uri=s3_backend.uri(bucket), endpoint=proxy.endpoint), s3_backend.credentials
        )
        stats = run(manifest, CountingStore(cut), tmp_path / "m", part_size=part_size)
    assert proxy.cuts == 1
    assert stats.retried_reads == 1 and stats.unverified_files == 0
    assert (tmp_path / "m/big/1/model.bin").read_bytes() == data


def test_a_connection_read_to_the_end_of_a_body_serves_the_next_read(
    s3_backend: S3Backend, tmp_path: Path
) -> None:
    """Bodies read straight from the socket still hand their connection back: 24 files on 4
    threads take at most 4 connections to the store, not one each."""
    bucket = s3_backend.new_bucket()
    for i in range(24):
        s3_backend.put(bucket, f"models/many/1/f{i:02d}.bin", random.Random(i).randbytes(200 * KiB))
    manifest = pin_repository(s3_backend.repository(bucket), [ModelSpec(name="many")], s3_backend.credentials)
    with counting_proxy(s3_backend.endpoint) as proxy:
        store = open_store(
            Repository(uri=s3_backend.uri(bucket), endpoint=proxy.endpoint), s3_backend.credentials
        )
        stats = run(manifest, CountingStore(store), tmp_path / "m")
    assert stats.downloaded_files == 24 and stats.unverified_files == 0
    assert 1 <= proxy.connections <= 4


def test_a_big_files_downloads_do_not_wait_for_another_files_head_requests(
    s3_backend: S3Backend, tmp_path: Path
) -> None:
    """A big file with nothing in dest to compare asks for its part size and CRC (HEADs) as its
    download starts, not in a round before every download: with the store answering b's HEADs only
    once a GET of a has come (a proxy holds them), the sync goes on, and both files are still
    checked by the store's CRC. Before, every HEAD was answered before any GET was sent, so b's
    waited for the proxy's timeout."""
    bucket = s3_backend.new_bucket()
    files = {name: random.Random(name).randbytes(7 * MiB + 3) for name in ("a", "b")}
    for name, data in files.items():
        s3_backend.put(bucket, f"models/big/1/{name}.bin", data, crc="CRC32")
    manifest = pin_repository(s3_backend.repository(bucket), [ModelSpec(name="big")], s3_backend.credentials)
    held = (f"HEAD /{bucket}/models/big/1/b.bin".encode(), f"GET /{bucket}/models/big/1/a.bin".encode())
    with counting_proxy(s3_backend.endpoint, hold=held) as proxy:
        store = open_store(
            Repository(uri=s3_backend.uri(bucket), endpoint=proxy.endpoint), s3_backend.credentials
        )
        stats = run(manifest, CountingStore(store), tmp_path / "m", part_size=3 * MiB)
    assert proxy.released.is_set() and proxy.hold_timeouts == 0
    assert stats.crc_checked_files == 2 and stats.unverified_files == 0
    assert {n: (tmp_path / f"m/big/1/{n}.bin").read_bytes() for n in files} == files


def test_a_pin_whose_digest_is_not_the_objects_etag_is_checked_by_the_digest(
    s3_backend: S3Backend, tmp_path: Path
) -> None:
    """The store's CRC stands in for the pinned digest only when that digest is the pinned ETag: a
    manifest whose MD5 names other bytes than its ETag's object fails, though the store's CRC of the
    ETag's object matches what arrives."""
    bucket = s3_backend.new_bucket()
    data = random.Random(22).randbytes(9 * MiB)
    other = random.Random(23).randbytes(9 * MiB)
    s3_backend.put(bucket, "models/big/1/model.bin", data, crc="CRC32")
    s3_backend.put(bucket, "models/big/1/other.bin", other, crc="CRC32")
    manifest = pin_repository(s3_backend.repository(bucket), [ModelSpec(name="big")], s3_backend.credentials)
    entry = next(e for e in manifest.entries if e.dest == "big/1/model.bin")
    head = s3_backend.store(bucket).head("models/big/1/other.bin")
    assert head is not None
    forged = dataclasses.replace(entry, key="models/big/1/other.bin", etag=head.etag)
    with pytest.raises(ChecksumMismatch) as info:
        run(
            dataclasses.replace(manifest, entries=(forged,)),
            CountingStore(s3_backend.store(bucket)),
            tmp_path / "m",
            part_size=3 * MiB,
        )
    assert ": md5 is " in str(info.value) and entry.checksum in str(info.value)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_a_big_gcs_object_is_checked_by_the_crc32c_of_its_pinned_generation(
    gcs_backend: Backend, tmp_path: Path
) -> None:
    """GCS keeps a CRC32C of every generation: a file read in ranges is checked by it when the pinned
    generation's MD5 is the pinned digest, by the MD5 with --verify digest or when they differ."""
    bucket = gcs_backend.new_bucket()
    data = random.Random(24).randbytes(7 * MiB + 3)
    gcs_backend.put(bucket, "models/big/1/model.bin", data)
    manifest = pin_repository(
        gcs_backend.repository(bucket), [ModelSpec(name="big")], gcs_backend.credentials
    )
    (entry,) = manifest.entries
    assert entry.checksum_kind == "md5" and entry.generation
    store = gcs_backend.store(bucket)
    fast = run(manifest, CountingStore(store), tmp_path / "fast", part_size=2 * MiB)
    assert (tmp_path / "fast/big/1/model.bin").read_bytes() == data
    assert fast.crc_checked_files == 1 and fast.unverified_files == 0 and fast.ranged_parts == 4
    digest = run(manifest, CountingStore(store), tmp_path / "digest", part_size=2 * MiB, verify="digest")
    assert digest.crc_checked_files == 0 and digest.unverified_files == 0
    with pytest.raises(ChecksumMismatch) as info:
        run(manifest, FlippingStore(store, len(data) // 2), tmp_path / "bad", part_size=2 * MiB)
    assert ": crc32c is " in str(info.value) and "the store keeps for the pinned object" in str(info.value)
    assert not [p for p in (tmp_path / "bad").rglob("*") if p.is_file()]
    # A manifest whose MD5 is not its generation's: the MD5 is checked, and fails.
    forged = dataclasses.replace(entry, checksum="0" * 32)
    with pytest.raises(ChecksumMismatch) as info:
        run(
            dataclasses.replace(manifest, entries=(forged,)),
            CountingStore(store),
            tmp_path / "m",
            part_size=2 * MiB,
        )
    assert ": md5 is " in str(info.value)
