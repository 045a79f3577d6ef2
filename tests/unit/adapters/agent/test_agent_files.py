"""The agent's files: the in-place ConfigMap's folder as the kubelet lays it out, and its state folder."""

from __future__ import annotations

import json
import os
from pathlib import Path

from triton_operator.adapters.agent.files import InPlaceDir, StateDir, present_revisions, read_target
from triton_operator.core.objects.names import inplace_config_key, inplace_manifest_key
from triton_operator.core.pod.agent_plan import InPlaceState, Record, RevisionFiles
from triton_operator.core.repository.manifest import (
    Manifest,
    ManifestEntry,
    ManifestModel,
    StoreRef,
    VersionPolicy,
    manifest_to_json,
)


def revision(name: str, *models: str) -> RevisionFiles:
    manifest = Manifest(
        StoreRef("s3://b/repo"),
        tuple(ManifestModel(m, m, VersionPolicy(), ("1",)) for m in models),
        tuple(ManifestEntry(f"repo/{m}/1/f", f"{m}/1/f", 1, "md5", "0" * 32) for m in models),
    )
    return RevisionFiles(name, manifest, {m: f'name: "{m}"\n' for m in models})


def configmap(folder: Path, keys: dict[str, str]) -> None:
    """A ConfigMap volume as the kubelet writes it: the files in a ..data folder, a link per key."""
    data = folder / "..2026_11_27"
    data.mkdir(parents=True)
    for key, text in keys.items():
        (data / key).write_text(text)
    os.symlink(data.name, folder / "..data")
    for key in keys:
        os.symlink(f"..data/{key}", folder / key)


def test_a_revision_is_read_only_when_every_one_of_its_keys_is_there(tmp_path: Path) -> None:
    r2 = revision("r2", "a", "b")
    keys = {
        "state.json": json.dumps({"stable": "r1", "next": "r2"}),
        inplace_manifest_key("r2"): manifest_to_json(r2.manifest),
        inplace_config_key("r2", "a"): r2.configs["a"],
    }
    configmap(tmp_path / "cm", keys)
    folder = InPlaceDir(tmp_path / "cm")
    assert folder.state() == InPlaceState("r1", "r2")
    assert folder.revision("r2") is None  # b's config is missing
    assert present_revisions(folder, {"r1", "r2"}) == set()

    (tmp_path / "cm/..2026_11_27" / inplace_config_key("r2", "b")).write_text(r2.configs["b"])
    os.symlink(f"..data/{inplace_config_key('r2', 'b')}", tmp_path / "cm" / inplace_config_key("r2", "b"))
    assert folder.revision("r2") == r2
    assert present_revisions(folder, {"r1", "r2"}) == {"r2"}


def test_no_configmap_and_no_annotation_are_nothing(tmp_path: Path) -> None:
    folder = InPlaceDir(tmp_path / "missing")
    assert folder.state() is None and folder.revision("r1") is None
    assert read_target(tmp_path / "missing/target") == ""
    (tmp_path / "target").write_text("  r2\n")
    assert read_target(tmp_path / "target") == "r2"


def test_the_state_folder_keeps_the_record_and_the_revisions_it_names(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "state")
    assert state.record() == Record()
    r1, r2 = revision("r1", "a"), revision("r2", "a", "b")
    for files in (r1, r2):
        state.save(files)
    assert state.load("r1") == r1 and state.load("r2") == r2 and state.load("r3") is None
    assert (state.configs("r2") / "b/config.pbtxt").read_text() == r2.configs["b"]
    record = Record(applied="r1", pending="r2", updated_at="t")
    state.write(record)
    assert state.record() == record
    state.prune({"r2"})
    assert state.load("r1") is None and state.load("r2") == r2
    assert sorted(p.name for p in state.path.iterdir()) == ["agent.json", "revisions"]
