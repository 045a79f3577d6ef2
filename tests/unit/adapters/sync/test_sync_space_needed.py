"""The sync's space check: what counts as needed, what as free, and the message that says so."""

from __future__ import annotations

import doctest
import os
from pathlib import Path

import pytest

from triton_operator import models
from triton_operator.adapters.sync import results, space
from triton_operator.adapters.sync.results import NoSpace
from triton_operator.adapters.sync.space import Need, Room, check, room, usage
from triton_operator.quantities import quantity_bytes


def test_doctests() -> None:
    for module in (space, results, models):
        assert doctest.testmod(module).failed == 0


def test_each_file_takes_whole_blocks_and_folders_and_the_state_file_count() -> None:
    need = Need(downloads=(10 * 4096 + 1,), small=(100,), folders=3, files=1)
    # 11 blocks of data, 1 of config, 3 folders, 1 for the state file.
    assert need.total(4096) == (11 + 1 + 3 + 1) * 4096


def test_nothing_to_write_needs_nothing() -> None:
    assert Need().total(4096) == 0


def test_a_limit_leaves_what_the_volume_does_not_already_hold() -> None:
    assert (
        Room(Path("/models"), 4096, fs_free=100 * 2**30, limit=20 * 2**30, used=5 * 2**30).free == 15 * 2**30
    )
    assert Room(Path("/models"), 4096, fs_free=2**30, limit=20 * 2**30, used=0).free == 2**30
    assert Room(Path("/models"), 4096, fs_free=2**30, limit=2**20, used=2**21).free == 0


def test_too_much_raises_naming_the_bytes_needed_and_free_and_the_path() -> None:
    big = Need(downloads=(int(2.4 * 2**30),), files=1)
    needed = -(-int(2.4 * 2**30) // 4096) * 4096 + 4096  # whole blocks, and one for the state file
    with pytest.raises(NoSpace) as caught:
        check(big, Room(Path("/models"), 4096, fs_free=int(1.1 * 2**30)))
    message = str(caught.value)
    assert message.startswith(f"the model repository needs 2.4 GiB ({needed} bytes), /models has 1.1 GiB")
    assert f"({int(1.1 * 2**30)} bytes) free; nothing was written" in message
    assert caught.value.needed == needed and caught.value.path == "/models"
    with pytest.raises(NoSpace, match=r"free under its 2\.0 GiB size limit"):
        check(big, Room(Path("/models"), 4096, fs_free=2**40, limit=2 * 2**30, used=0))
    assert check(big, Room(Path("/models"), 4096, fs_free=3 * 2**30)) == needed


def test_room_reads_statvfs_of_the_nearest_folder_that_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    real = os.statvfs

    def statvfs(path: os.PathLike[str] | str) -> os.statvfs_result:
        seen.append(str(path))
        r = real(path)
        fields = list(r)
        fields[0] = fields[1] = 4096  # f_bsize, f_frsize
        fields[4] = 10  # f_bavail
        return os.statvfs_result(fields)

    monkeypatch.setattr(os, "statvfs", statvfs)
    got = room(tmp_path / "models" / "not-yet", limit=None)
    assert seen == [str(tmp_path)] and got.fs_free == 40960 and got.block == 4096
    assert not (tmp_path / "models").exists()


def test_usage_counts_blocks_once_per_inode(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 10000)
    os.link(tmp_path / "a", tmp_path / "b")
    blocks = os.stat(tmp_path / "a").st_blocks * 512
    assert usage(tmp_path) == blocks


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("20Gi", 20 * 2**30),
        ("500M", 500 * 10**6),
        ("1.5Ki", 1536),
        ("1048576", 2**20),
        ("0.5", 1),
        ("1e3", 1000),
        ("1500m", 2),
        (" 3k ", 3000),
    ],
)
def test_quantities(text: str, value: int) -> None:
    assert quantity_bytes(text) == value


@pytest.mark.parametrize("text", ["", "20GB", "Gi", "20 Gi x", "1.2.3", "1Ki5"])
def test_not_quantities(text: str) -> None:
    with pytest.raises(ValueError, match="is not a quantity of bytes"):
        quantity_bytes(text)


def test_a_negative_quantity_is_refused() -> None:
    with pytest.raises(ValueError, match="is negative"):
        quantity_bytes("-1Gi")
