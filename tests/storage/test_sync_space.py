"""`triton-operator sync` on a volume too small for the repository: exit 7 before writing anything."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage_backends import Backend
from triton_operator.adapters.storage import open_store, pin_repository
from triton_operator.adapters.sync import download as engine
from triton_operator.adapters.sync.download import SyncOptions, sync
from triton_operator.core.repository.manifest import Manifest, manifest_to_json
from triton_operator.core.spec.modelconfig import build_config_pbtxt
from triton_operator.models import ModelSpec

pytestmark = pytest.mark.storage

MiB = 1024 * 1024
MODELS = [ModelSpec(name="big", config={"backend": "python", "maxBatchSize": 4})]
# 3 MiB and a bit: two objects read in ranged parts (--part-size 1MiB), one whole.
FILES = {
    "models/big/1/weights-a.bin": os.urandom(MiB + 4096),
    "models/big/1/weights-b.bin": os.urandom(MiB + 8192),
    "models/big/1/tokenizer.json": os.urandom(900 * 1024),
}


@pytest.fixture
def pinned(s3_backend: Backend) -> Manifest:
    bucket = s3_backend.new_bucket()
    for key, data in FILES.items():
        s3_backend.put(bucket, key, data)
    return pin_repository(s3_backend.repository(bucket), MODELS, s3_backend.credentials)


def run_sync(
    work: Path, manifest: Manifest, env: dict[str, str], dest: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    path = work / "manifest.json"
    path.write_text(manifest_to_json(manifest))
    configs = work / "configs"
    for m in MODELS:
        (configs / m.name).mkdir(parents=True, exist_ok=True)
        (configs / m.name / "config.pbtxt").write_text(build_config_pbtxt(m.name, m.config))
    args = [sys.executable, "-m", "triton_operator.cli", "sync", "--manifest", str(path)]
    args += ["--configs", str(configs), "--dest", str(dest), "--part-size", "1MiB", *extra]
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "GOOGLE_"))}
    return subprocess.run(
        args, env={**clean, **env}, capture_output=True, text=True, timeout=120, check=False
    )


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MiB filesystem (tmpfs; needs root): statvfs says what is free, not a monkeypatch."""
    mount = tmp_path / "volume"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_repository_bigger_than_the_filesystem_exits_7_writing_nothing(
    s3_backend: Backend, pinned: Manifest, tmp_path: Path, small_tmpfs: Path
) -> None:
    log = tmp_path / "termination-log"
    log.write_text("")
    result = run_sync(
        tmp_path, pinned, s3_backend.credentials, small_tmpfs / "models", "--termination-log", str(log)
    )
    assert result.returncode == 7, result.stderr
    needed = sum(len(d) for d in FILES.values())
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("triton-operator sync: error: the model repository needs 2.9 MiB (")
    assert f"{small_tmpfs / 'models'} has " in line and "free; nothing was written" in line
    figures = [int(w.strip("(")) for w in line.split() if w.startswith("(") and w.strip("(").isdigit()]
    assert figures[0] >= needed and figures[1] <= 2 * MiB, line
    # Nothing was written: not dest itself, no folder, no temp file.
    assert tree(small_tmpfs) == []
    # The reason, in one line, where Kubernetes reads a container's termination message.
    assert log.read_text().strip() == line.removeprefix("triton-operator sync: error: ")


def test_a_volume_size_limit_counts_what_dest_holds_but_not_files_already_present(
    s3_backend: Backend, pinned: Manifest, tmp_path: Path
) -> None:
    dest = tmp_path / "models"
    too_small = run_sync(tmp_path, pinned, s3_backend.credentials, dest, "--volume-limit", "2Mi")
    assert too_small.returncode == 7, too_small.stderr
    assert "under its 2.0 MiB size limit" in too_small.stderr
    assert not dest.exists()

    assert run_sync(tmp_path, pinned, s3_backend.credentials, dest).returncode == 0
    (dest / "big/1/weights-a.bin").unlink()
    # What dest holds (2 MiB) leaves 1.5 MiB under a 3.5Mi limit: enough for the one missing file,
    # not for the whole repository; files present with the pinned checksum are not fetched again.
    again = run_sync(tmp_path, pinned, s3_backend.credentials, dest, "--volume-limit", "3.5Mi")
    assert again.returncode == 0, again.stderr
    assert (dest / "big/1/weights-a.bin").read_bytes() == FILES["models/big/1/weights-a.bin"]
    (dest / "big/1/weights-a.bin").unlink()
    (dest / "big/1/weights-b.bin").unlink()
    third = run_sync(tmp_path, pinned, s3_backend.credentials, dest, "--volume-limit", "2Mi")
    assert third.returncode == 7, third.stderr
    assert sorted(p.name for p in (dest / "big/1").iterdir()) == ["tokenizer.json"]


def test_a_volume_that_fills_up_while_writing_fails_as_full_not_as_a_checksum_mismatch(
    backend: Backend, bucket: str, small_tmpfs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the space check (here skipped, as if something else filled the volume meanwhile), a
    write cut short by a full volume raises ENOSPC, on every store: no byte of a part is silently
    dropped (a checksum mismatch), nor taken for the store's failure (StoreUnavailable, retried)."""
    for key, data in FILES.items():
        backend.put(bucket, key, data)
    manifest = pin_repository(backend.repository(bucket), MODELS, backend.credentials)
    monkeypatch.setattr(engine, "check", lambda need, space: 0)
    store = open_store(manifest.repository, backend.credentials)
    try:
        with pytest.raises(OSError) as caught:
            sync(manifest, store, SyncOptions(dest=small_tmpfs / "models", part_size=MiB, concurrency=4))
    finally:
        store.close()
    assert caught.value.errno == errno.ENOSPC
    assert not [p for p in small_tmpfs.rglob("*") if ".tmp-sync-" in p.name]  # temp files removed
