"""A pvc:// repository read from where its claim is mounted: listing with sizes and sha256."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from triton_operator.adapters.storage.base import (
    BucketNotFound,
    ObjectChanged,
    Sink,
    StoreBase,
    StoreError,
)
from triton_operator.core.repository.manifest import ObjectInfo

CHUNK = 1024 * 1024


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class PvcStore(StoreBase):
    """Files under ``root`` (the claim's mount point); keys are paths relative to it.

    The operator cannot mount a claim itself, so it pins nothing for pvc:// (see
    ``core.repository.manifest.unpinned_manifest``); this store serves the pod, which has the claim mounted,
    and anyone who can mount it and wants sizes and sha256 pinned. The etag of a file is its
    mtime and size, so a file rewritten after pinning fails a conditional read.
    Symlinks are followed only when they stay inside the claim.
    """

    def __init__(
        self, uri: str, claim: str, prefix: str, root: str | Path, *, checksums: bool = True
    ) -> None:
        super().__init__(uri, claim, prefix)
        self.root = Path(root)
        self.checksums = checksums
        if not self.root.is_dir():
            raise BucketNotFound(uri, f"{claim} (not mounted at {self.root})")
        self._real_root = self.root.resolve()

    def versioned(self) -> bool:
        """A claim keeps no old versions of a rewritten file."""
        return False

    def _path(self, key: str) -> Path:
        path = self.root / key
        real = path.resolve()
        if real != self._real_root and self._real_root not in real.parents:
            raise StoreError(f"{self.uri}: {key!r} resolves outside the claim")
        return path

    def _info(self, key: str, path: Path, st: os.stat_result, *, checksum: bool) -> ObjectInfo:
        return ObjectInfo(
            key=key,
            size=st.st_size,
            etag=f"{st.st_mtime_ns:x}-{st.st_size:x}",
            sha256=file_sha256(path) if checksum else "",
        )

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        # The walk starts at the deepest folder the prefix names, then filters by the prefix.
        folder = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = self.root / folder if folder else self.root
        if not start.is_dir():
            return
        for dirpath, dirnames, filenames in os.walk(start, followlinks=False):
            dirnames.sort()
            for name in sorted(filenames):
                path = Path(dirpath) / name
                key = path.relative_to(self.root).as_posix()
                if not key.startswith(prefix):
                    continue
                try:
                    real = self._path(key)
                    st = real.stat()
                except (StoreError, OSError):
                    continue  # dangling links and links out of the claim are not part of it
                if stat.S_ISREG(st.st_mode):
                    yield self._info(key, real, st, checksum=self.checksums)

    def head(self, key: str) -> ObjectInfo | None:
        try:
            path = self._path(key)
            st = path.stat()
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        return self._info(key, path, st, checksum=False)

    def read_range(
        self, key: str, start: int, end: int | None, sink: Sink, *, etag: str = "", generation: str = ""
    ) -> int:
        current = self.head(key)
        if etag and (current is None or current.etag != etag):
            raise ObjectChanged(self.uri, key, f"etag {etag}", self.describe(current))
        if current is None:
            raise StoreError(f"{self.uri}: {key!r} does not exist")
        count = 0
        with self._path(key).open("rb") as f:
            f.seek(start)
            remaining = None if end is None else max(0, end - start)
            while remaining is None or remaining > 0:
                chunk = f.read(CHUNK if remaining is None else min(CHUNK, remaining))
                if not chunk:
                    break
                sink(chunk)
                count += len(chunk)
                if remaining is not None:
                    remaining -= len(chunk)
        return count
