"""Pods' read-only views of the node cache's blobs (its CSI volume): hard links, bind-mounted read-only."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import re
import shutil
import stat
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol

from triton_operator.adapters.nodecache.store import ContentStore, remove_path
from triton_operator.core.repository.cache_rules import BLOB_FORM
from triton_operator.core.repository.shared_files import UID_FORM, target_pod_uid, view_owner

log = logging.getLogger(__name__)

VIEWS = "views"
"""<root>/views/<pod uid>/<sha256>: hard links to blobs; <root>/views/<pod uid>.record: its
namespace and the target path the kubelet mounted it at."""


class Mounter(Protocol):
    """Bind mounts (a stand-in in tests that cannot mount)."""

    def bind_readonly(self, source: Path, target: Path) -> None: ...

    def unmount(self, target: Path) -> None: ...

    def mounted(self, target: Path) -> bool: ...


MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND = 1, 2, 4, 32, 4096
MNT_DETACH = 2


class LinuxMounter:
    """mount(2) and umount2(2) through libc: a bind mount, then remounted read-only, nosuid and nodev
    (a bind mount takes those flags only on its remount). Not noexec: a model's folder may hold a
    backend's shared library, which tritonserver maps executable (a copy in the pod's emptyDir could
    be, too)."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)

    def _call(self, name: str, *args: object) -> None:
        if getattr(self._libc, name)(*args) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{name}: {os.strerror(err)}")

    def bind_readonly(self, source: Path, target: Path) -> None:
        src, dst = os.fsencode(source), os.fsencode(target)
        self._call("mount", src, dst, None, MS_BIND, None)
        try:
            flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV
            self._call("mount", None, dst, None, flags, None)
        except OSError:
            self.unmount(target)  # never leave it writable
            raise

    def unmount(self, target: Path) -> None:
        self._call("umount2", os.fsencode(target), MNT_DETACH)

    def mounted(self, target: Path) -> bool:
        """Whether ``target`` is a mount point of this mount namespace (``os.path.ismount`` cannot
        tell a bind mount of a folder of the same filesystem)."""
        return os.path.abspath(target) in mount_points()


def mount_points(mountinfo: Path = Path("/proc/self/mountinfo")) -> frozenset[str]:
    """The mount points of this mount namespace (mountinfo's fifth field, its octal escapes undone)."""
    points: set[str] = set()
    for line in mountinfo.read_text().splitlines():
        fields = line.split(" ")
        if len(fields) > 4:
            points.add(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[4]))
    return frozenset(points)


class Views:
    """The views of ``store``'s blobs under ``root``/views, mounted by ``mounter``.

    ``publish`` (the kubelet's NodePublishVolume) makes a pod's empty view and mounts it read-only
    at the kubelet's target; ``link`` (the pod's lease) links the blobs the lease found into the
    view of a pod that has one; ``unpublish`` unmounts and removes it; ``sweep`` (at start)
    removes the views whose mount is gone and keeps the blobs of the others.
    """

    def __init__(self, root: Path, store: ContentStore, mounter: Mounter) -> None:
        self.root = root / VIEWS
        self.store = store
        self.mounter = mounter
        self._lock = threading.Lock()
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o711)

    def _folder(self, uid: str) -> Path:
        return self.root / uid

    def _record(self, uid: str) -> Path:
        return self.root / f"{uid}.record"

    def publish(self, context: Mapping[str, str], target: str) -> None:
        """Mount the view of the pod the kubelet names at ``target`` (ValueError: a call naming no
        pod, or two); a second publish of the same target is a no-op, as CSI asks."""
        owner = view_owner(context, target)
        path = Path(target)
        with self._lock:
            folder = self._folder(owner.pod_uid)
            folder.mkdir(mode=0o755, exist_ok=True)
            self._record(owner.pod_uid).write_text(f"{owner.namespace}\n{target}\n")
            path.mkdir(parents=True, exist_ok=True)
            if not self.mounter.mounted(path):
                self.mounter.bind_readonly(folder, path)
        log.info("node cache: view of pod %s (%s) mounted at %s", owner.pod_uid, owner.namespace, target)

    def unpublish(self, target: str) -> None:
        """Unmount ``target`` and remove its view; a target already gone is a no-op."""
        path = Path(target)
        uid = target_pod_uid(target)
        if uid is None:
            raise ValueError(f"target_path: {target!r} is not a kubelet's path of a pod's CSI volume")
        with self._lock:
            if self.mounter.mounted(path):
                self.mounter.unmount(path)
            with contextlib.suppress(FileNotFoundError):
                path.rmdir()
            self._remove_locked(uid)

    def _remove_locked(self, uid: str) -> None:
        shutil.rmtree(self._folder(uid), ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            self._record(uid).unlink()
        self.store.drop_viewed(uid)

    def _namespace(self, uid: str) -> str | None:
        try:
            return self._record(uid).read_text().split("\n")[0]
        except OSError:
            return None

    def link(self, uid: str, namespace: str, blobs: Iterable[str]) -> frozenset[str]:
        """Link ``blobs`` (those a lease of pod ``uid`` of ``namespace`` found) into that pod's view,
        when it has one of that namespace; the blobs linked (none: no view)."""
        if UID_FORM.fullmatch(uid) is None:
            return frozenset()
        with self._lock:
            folder = self._folder(uid)
            if not folder.is_dir() or self._namespace(uid) != namespace:
                return frozenset()
            linked: list[str] = []
            for blob in blobs:
                if BLOB_FORM.fullmatch(blob) is None:
                    continue
                source, target = self.store.blob_path(blob), folder / blob
                # Nothing is changed that need not be: a chmod or a new link moves the blob's ctime,
                # which tritonserver takes for a change of every model file linked to it (an
                # ensemble's next load then reloads such a composing model).
                try:
                    if not os.path.lexists(target):
                        if stat.S_IMODE(os.stat(source).st_mode) != 0o444:
                            source.chmod(0o444)
                        os.link(source, target)
                except FileExistsError:
                    pass
                except FileNotFoundError:  # evicted since the lease found it: read over HTTP
                    continue
                linked.append(blob)
            self.store.keep_viewed(uid, linked)
            return frozenset(linked)

    def sweep(self) -> tuple[int, int]:
        """At start: remove each view whose target is no longer mounted (its pod went while the cache
        was away) and keep the blobs of the others; (kept, removed)."""
        kept = removed = 0
        with self._lock:
            for entry in list(self.root.iterdir()):
                uid = entry.name.removesuffix(".record")
                if UID_FORM.fullmatch(uid) is None:
                    remove_path(entry)
                    continue
                if entry.name.endswith(".record"):
                    continue
                try:
                    target = self._record(uid).read_text().split("\n")[1]
                except (OSError, IndexError):
                    target = ""
                if target and self.mounter.mounted(Path(target)):
                    self.store.keep_viewed(uid, [p.name for p in entry.iterdir()])
                    kept += 1
                else:
                    self._remove_locked(uid)
                    removed += 1
            for record in self.root.glob("*.record"):
                if not self._folder(record.name.removesuffix(".record")).is_dir():
                    record.unlink()
        return kept, removed
