"""How sync puts a download's bytes on disk: every byte at its offset, in writes of at most
WRITE_PIECE (small page-cache folios), and a ranged download's temp file allocated before its parts."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import pytest

from triton_operator.adapters.sync.destination import WRITE_PIECE, preallocate, write_all

MiB = 1024 * 1024


def open_new(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL)


def test_a_chunk_is_written_at_its_offset_in_pieces_of_at_most_write_piece(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = random.Random(1).randbytes(3 * WRITE_PIECE + 123)
    sizes: list[int] = []
    real = os.pwrite

    def counting(fd: int, view: memoryview, offset: int) -> int:  # the real write, counted
        sizes.append(len(view))
        return real(fd, view, offset)

    monkeypatch.setattr(os, "pwrite", counting)
    fd = open_new(tmp_path / "f")
    try:
        write_all(fd, data, 1000)
    finally:
        os.close(fd)
    assert sizes == [WRITE_PIECE] * 3 + [123]
    assert (tmp_path / "f").read_bytes() == bytes(1000) + data


def test_a_streamed_chunk_is_written_in_pieces_and_short_writes_are_carried_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = random.Random(2).randbytes(2 * WRITE_PIECE + 7)
    sizes: list[int] = []
    real = os.write

    def short(fd: int, view: memoryview) -> int:  # the kernel taking half of each write (a filling volume)
        sizes.append(len(view))
        return real(fd, view[: max(1, len(view) // 2)])

    monkeypatch.setattr(os, "write", short)
    fd = open_new(tmp_path / "f")
    try:
        write_all(fd, memoryview(data))
    finally:
        os.close(fd)
    assert max(sizes) == WRITE_PIECE
    assert (tmp_path / "f").read_bytes() == data


def test_a_ranged_download_s_file_is_allocated_on_disk_before_its_parts(tmp_path: Path) -> None:
    fd = open_new(tmp_path / "f")
    try:
        preallocate(fd, 8 * MiB + 5)
        st = os.fstat(fd)
    finally:
        os.close(fd)
    assert st.st_size == 8 * MiB + 5
    assert st.st_blocks * 512 >= 8 * MiB + 5  # allocated, not a sparse file


def test_a_filesystem_that_cannot_allocate_ahead_gets_a_sized_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unsupported(fd: int, offset: int, length: int) -> None:  # fake: such a filesystem's answer
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    fd = open_new(tmp_path / "f")
    try:
        preallocate(fd, 3 * MiB)
        assert os.fstat(fd).st_size == 3 * MiB
    finally:
        os.close(fd)


def test_a_volume_without_room_for_the_file_fails_at_the_allocation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, offset: int, length: int) -> None:  # fake: a full volume's answer
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    fd = open_new(tmp_path / "f")
    try:
        with pytest.raises(OSError) as info:
            preallocate(fd, 3 * MiB)
    finally:
        os.close(fd)
    assert info.value.errno == errno.ENOSPC
