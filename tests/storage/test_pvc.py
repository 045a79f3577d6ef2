"""pvc:// repositories: pinned from a mounted claim (sha256), or unpinned and linked by the pod."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from triton_operator.adapters.storage import ObjectChanged, StoreConfigError, open_store, pin_repository
from triton_operator.adapters.storage.pvc import PvcStore, file_sha256
from triton_operator.adapters.sync.download import SyncOptions, sync
from triton_operator.core.repository.manifest import StoreRef, manifest_from_json, manifest_to_json
from triton_operator.core.spec.modelconfig import build_config_pbtxt
from triton_operator.models import ModelSpec, Repository

URI = "pvc://model-claim/repo"
MODELS = [
    ModelSpec(name="resnet", config={"backend": "python", "versionPolicy": {"latest": {"numVersions": 2}}}),
    ModelSpec(name="tok", path="tokenizer", config={"backend": "python"}),
]


@pytest.fixture
def claim(tmp_path: Path) -> Path:
    """The claim's files as the pod would see them mounted."""
    root = tmp_path / "claim"
    files = {
        "repo/resnet/1/model.bin": b"one",
        "repo/resnet/2/model.bin": b"two",
        "repo/resnet/3/model.bin": b"three",
        "repo/resnet/labels.txt": b"a\nb\n",
        "repo/resnet/config.pbtxt": b"ignored",
        "repo/tokenizer/5/vocab.txt": b"hello",
    }
    for key, data in files.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(data)
    (tmp_path / "secret.txt").write_bytes(b"outside the claim")
    os.symlink(tmp_path / "secret.txt", root / "repo/resnet/3/leak.txt")
    return root


def configs(root: Path) -> Path:
    for m in MODELS:
        (root / m.name).mkdir(parents=True, exist_ok=True)
        (root / m.name / "config.pbtxt").write_text(build_config_pbtxt(m.name, m.config))
    return root


def test_the_operator_cannot_open_a_claim_it_has_not_mounted() -> None:
    with pytest.raises(StoreConfigError) as info:
        open_store(Repository(uri=URI), {})
    assert info.value.field == "repository.uri" and "mounted" in str(info.value)


def test_a_mounted_claim_is_listed_with_sha256_and_links_out_of_it_are_skipped(claim: Path) -> None:
    store = PvcStore(URI, "model-claim", "repo/", claim)
    listing = {o.key: o for o in store.list(store.prefix)}
    assert "repo/resnet/3/leak.txt" not in listing
    assert listing["repo/resnet/2/model.bin"].sha256 == file_sha256(claim / "repo/resnet/2/model.bin")
    assert listing["repo/resnet/2/model.bin"].size == 3


def test_pinned_from_a_mounted_claim_then_synced_and_verified(claim: Path, tmp_path: Path) -> None:
    manifest = pin_repository(Repository(uri=URI), MODELS, {}, pvc_root=claim)
    assert manifest.pinned and {e.checksum_kind for e in manifest.entries} == {"sha256"}
    assert [m.versions for m in manifest.models] == [("2", "3"), ("5",)]
    store = open_store(manifest.repository, {}, pvc_root=claim)
    stats = sync(manifest, store, SyncOptions(dest=tmp_path / "models", configs=configs(tmp_path / "c")))
    assert stats.downloaded_files == 4 and stats.unverified_files == 0
    assert (tmp_path / "models/tok/5/vocab.txt").read_bytes() == b"hello"
    assert not (tmp_path / "models/resnet/1").exists()

    (claim / "repo/resnet/3/model.bin").write_bytes(b"THREE")  # rewritten after pinning
    with pytest.raises(ObjectChanged) as info:
        sync(manifest, store, SyncOptions(dest=tmp_path / "again"))
    assert info.value.key == "repo/resnet/3/model.bin"


def test_unpinned_the_pod_links_the_selected_versions_of_the_mounted_claim(
    claim: Path, tmp_path: Path
) -> None:
    manifest = pin_repository(Repository(uri=URI), MODELS, {})  # the operator: no mount, no pinning
    assert not manifest.pinned and manifest.entries == ()
    manifest = manifest_from_json(manifest_to_json(manifest))
    assert manifest.repository == StoreRef(URI)
    dest = tmp_path / "models"
    options = SyncOptions(dest=dest, configs=configs(tmp_path / "c"), pvc_root=claim)
    stats = sync(manifest, None, options)
    assert sorted(p.name for p in (dest / "resnet").iterdir()) == ["2", "3", "config.pbtxt", "labels.txt"]
    assert os.readlink(dest / "resnet/3") == str(claim / "repo/resnet/3")
    assert (dest / "resnet/3/model.bin").read_bytes() == b"three"
    assert (dest / "tok/5/vocab.txt").read_bytes() == b"hello"
    assert (dest / "resnet/config.pbtxt").read_text() == build_config_pbtxt("resnet", MODELS[0].config)
    assert stats.linked_versions == 4

    (claim / "repo/resnet/4").mkdir()
    (claim / "repo/resnet/4/model.bin").write_bytes(b"four")
    stats = sync(manifest, None, options)
    assert sorted(p.name for p in (dest / "resnet").iterdir()) == ["3", "4", "config.pbtxt", "labels.txt"]
    assert (stats.linked_versions, stats.pruned_files) == (1, 1)

    with pytest.raises(Exception, match="pvc-root"):
        sync(manifest, None, SyncOptions(dest=tmp_path / "x"))
