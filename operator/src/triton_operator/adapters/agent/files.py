"""The agent's files: the in-place volume (ConfigMap and the pod's target annotation), its state folder."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from triton_operator.adapters.sync.destination import fsync_dir, place_bytes
from triton_operator.core.objects.names import INPLACE_STATE_KEY, inplace_config_key, inplace_manifest_key
from triton_operator.core.pod.agent_plan import InPlaceState, Record, RevisionFiles, parse_inplace_state
from triton_operator.core.pod.startup import FillTimeline, parse_timeline
from triton_operator.core.repository.manifest import (
    CONFIG_FILE,
    ManifestError,
    manifest_from_json,
    manifest_to_json,
)

RECORD_FILE = "agent.json"
SEEN_FILE = "seen.json"
"""The last state.json and target the agent followed: a restarted agent does not follow an older one."""
REVISIONS = "revisions"
MANIFEST_FILE = "manifest.json"
CONFIGS = "configs"
DATA_LINK = "..data"
"""The kubelet's atomic writer: a volume's files live in a timestamped folder that this link names;
a new payload is a new folder and one rename of the link (every file of a volume changes at once)."""


def read_text(path: Path) -> str | None:
    """A small file's text; None when it is not there (yet) or cannot be read."""
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def read_revision(
    revision: str, manifest_path: Path, config_path: Callable[[str], Path]
) -> RevisionFiles | None:
    """A revision's manifest and each of its models' config.pbtxt (at ``config_path(model)``); None
    unless every one is there and the manifest parses."""
    text = read_text(manifest_path)
    if text is None:
        return None
    try:
        manifest = manifest_from_json(text)
    except ManifestError:
        return None
    configs = {}
    for model in manifest.models:
        config = read_text(config_path(model.name))
        if config is None:
            return None
        configs[model.name] = config
    return RevisionFiles(revision, manifest, configs)


def read_target(path: Path | None) -> str:
    """The pod's annotation as the downwardAPI volume shows it ('' when it has none)."""
    return (read_text(path) or "").strip() if path is not None else ""


def payload(path: Path) -> Path:
    """The folder of the payload the kubelet shows now (``..data`` resolved once), so that files read
    from it are of one payload; ``path`` itself when it is a plain folder."""
    try:
        name = os.readlink(path / DATA_LINK)
    except OSError:
        return path
    return path / name


@dataclass(frozen=True)
class View:
    """One look at the in-place volume: state.json and the pod's target annotation from one payload
    (``root``: the folder they were read from, None without an in-place folder)."""

    state: InPlaceState | None
    target: str
    root: Path | None


class InPlaceDir:
    """The in-place volume as the kubelet shows it: the in-place ConfigMap's keys (optional: none
    until an update) and, in the same projected volume, the pod's target annotation (downward API).

    A revision's files never change under its name (the name is the hash of what it is made of), so
    each revision is read once and kept while it is named."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._read: dict[str, RevisionFiles] = {}

    def state(self) -> InPlaceState | None:
        return self.view().state

    def view(self, target_file: Path | None = None) -> View:
        """state.json and the target annotation as one payload shows them. ``target_file`` in this
        folder (one projected volume) is read from the same payload; elsewhere (a volume of its own,
        which the kubelet refreshes at other moments) on its own."""
        if self.path is None:
            return View(None, read_target(target_file), None)
        together = target_file is not None and target_file.parent == self.path
        for _ in range(3):
            root = payload(self.path)
            state = parse_inplace_state(read_text(root / INPLACE_STATE_KEY))
            target = read_target(root / target_file.name) if together and target_file else None
            if root == self.path or root.is_dir():  # not swapped away (and deleted) while read
                break
        if target is None:
            target = read_target(target_file)
        return View(state, target, root)

    def revision(self, revision: str, root: Path | None = None) -> RevisionFiles | None:
        """``revision``'s manifest and configs, when every one of its keys is there (in ``root``, a
        payload's folder, when given)."""
        if revision in self._read:
            return self._read[revision]
        if self.path is None:
            return None
        path = root or payload(self.path)
        found = read_revision(
            revision,
            path / inplace_manifest_key(revision),
            lambda model: path / inplace_config_key(revision, model),
        )
        if found is None:
            return None
        self._read[revision] = found
        return found

    def where(self, revision: str) -> str:
        """Where ``revision``'s files are looked for, as a wait for them says it."""
        if self.path is None:
            return "in an in-place volume (the agent has none: --inplace-dir)"
        return f"in the in-place volume ({self.path / inplace_manifest_key(revision)} and its configs)"

    def forget_others(self, keep: set[str]) -> None:
        for name in set(self._read) - keep:
            del self._read[name]


class StateDir:
    """The agent's own folder (an emptyDir shared by the init container and the sidecar): its record
    (core.pod.agent_plan.Record) and the files of each revision the record names, as sync reads them:
    revisions/<rev>/manifest.json and revisions/<rev>/configs/<model>/config.pbtxt. Every write is
    atomic (a temp file renamed over) and flushed before the record that names it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def record(self) -> Record:
        return Record.from_json(read_text(self.path / RECORD_FILE))

    def write(self, record: Record) -> None:
        self._write(RECORD_FILE, record.to_json())

    def _write(self, name: str, text: str) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = self.path / f".{name}.tmp"
        with tmp.open("w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path / name)
        fsync_dir(self.path)

    def seen(self) -> tuple[InPlaceState | None, str] | None:
        """The state.json and target last followed (None: none recorded)."""
        try:
            data = json.loads(read_text(self.path / SEEN_FILE) or "")
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        state = parse_inplace_state(json.dumps(data.get("state"))) if data.get("state") else None
        return state, str(data.get("target") or "")

    def write_seen(self, state: InPlaceState | None, target: str) -> None:
        body = {"state": None if state is None else {"stable": state.stable, "next": state.next}}
        self._write(SEEN_FILE, json.dumps({**body, "target": target}, sort_keys=True))

    def timeline(self, kind: str) -> FillTimeline | None:
        """The timeline of ``kind`` (the first fill, the last in-place change) recorded; None: none."""
        try:
            return parse_timeline(json.loads(read_text(self.path / f"{kind}.json") or ""))
        except ValueError:
            return None

    def write_timeline(self, kind: str, timeline: FillTimeline) -> None:
        self._write(f"{kind}.json", json.dumps(timeline.to_json(), sort_keys=True))

    def folder(self, revision: str) -> Path:
        if not revision or "/" in revision or revision in (".", ".."):
            raise ValueError(f"{revision!r} is no revision name")
        return self.path / REVISIONS / revision

    def manifest_path(self, revision: str) -> Path:
        return self.folder(revision) / MANIFEST_FILE

    def configs(self, revision: str) -> Path:
        return self.folder(revision) / CONFIGS

    def save(self, files: RevisionFiles) -> None:
        """Keep ``files`` under revisions/<rev>/ (written unless there already, byte for byte)."""
        folder = self.folder(files.revision)
        self.configs(files.revision).mkdir(parents=True, exist_ok=True)
        for model, text in files.configs.items():
            (self.configs(files.revision) / model).mkdir(parents=True, exist_ok=True)
            place_bytes(self.configs(files.revision) / model / CONFIG_FILE, text.encode())
        place_bytes(folder / MANIFEST_FILE, manifest_to_json(files.manifest).encode())
        for path in (self.configs(files.revision), folder, folder.parent):
            fsync_dir(path)

    def load(self, revision: str) -> RevisionFiles | None:
        """A revision saved earlier; None when it is not (fully) there."""
        configs = self.configs(revision)
        return read_revision(
            revision, self.manifest_path(revision), lambda model: configs / model / CONFIG_FILE
        )

    def prune(self, keep: set[str]) -> None:
        """Delete the saved revisions that ``keep`` does not name."""
        root = self.path / REVISIONS
        if not root.is_dir():
            return
        for child in root.iterdir():
            if child.name not in keep:
                shutil.rmtree(child, ignore_errors=True)


def present_revisions(inplace: InPlaceDir, names: set[str], root: Path | None = None) -> set[str]:
    """Those of ``names`` whose every key the in-place folder (the payload at ``root``) holds."""
    return {name for name in names if inplace.revision(name, root) is not None}


def remove_model_files(dest: Path, paths: tuple[str, ...], folders: tuple[str, ...]) -> int:
    """Delete files (``paths`` under ``dest``) and whole model folders the target does not serve; the
    count of what was there. A symlink is removed, never followed. (Sync of the target has pruned the
    target's own models already: ``paths`` are left only by a sync that did not run to its end.)"""
    removed = 0
    for rel in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(dest / rel)
            removed += 1
    for rel in folders:
        path = dest / rel
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
        removed += 1
    return removed
