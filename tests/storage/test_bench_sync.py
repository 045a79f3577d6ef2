"""bench/sync/run.py --real at a small size, as CI runs it: the table has every row, ours checked
every byte, a machine without rclone gets a row that says so, ours' start-up is shown, and --ref adds
the sync of another commit (no timings are asserted)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.storage

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--real", "--big", "8MiB", "--medium", "3MiB", "--shard", "2MiB", "--small-size", "64KiB"]
ROWS = (
    "raw ranged read",
    "KServe-style boto3: 4 processes x 4 threads",
    "KServe-style boto3 as shipped",
    "rclone copy --transfers 4 --multi-thread-streams 4",
    "then syncfs",
    "**triton-operator sync** (c=16)",
    "triton-operator sync --verify digest",
    "checksums dropped (diagnostic)",
)


def bench(tmp_path: Path, *extra: str) -> dict[str, list[str]]:
    """The bench's table, row name -> its cells."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "operator" / "src")}
    args = [sys.executable, str(ROOT / "bench" / "sync" / "run.py"), *SMALL, "--repeat", "1"]
    args += ["--part-size-mib", "1", "--workdir", str(tmp_path), *extra]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    table = [line for line in done.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    cells = {
        line.split(" | ")[0][2:]: [c.strip() for c in line.strip("| ").split(" | ")[1:]] for line in table
    }
    assert "Full-size repository: 19 objects" in done.stdout, done.stdout
    return cells


def row(cells: dict[str, list[str]], start: str) -> list[str]:
    """The row whose name is ``start``, else the one row whose name holds it."""
    if start in cells:
        return cells[start]
    (found,) = [v for k, v in cells.items() if start in k]
    return found


def test_the_small_run_prints_every_row_and_says_when_rclone_is_missing(tmp_path: Path) -> None:
    cells = bench(tmp_path, "--rclone", str(tmp_path / "no-rclone-here"), "--ref", "HEAD")
    assert next(iter(cells)) == "download"
    for name in ROWS:
        assert row(cells, name)
    for rclone in ("rclone copy --transfers 4 --multi-thread-streams 4", "then syncfs"):
        assert row(cells, rclone)[0].startswith("rclone not installed")
        assert row(cells, rclone)[1:] == ["-"] * 7
    ours = row(cells, "**triton-operator sync**")
    assert ours[0].startswith("every byte: S3's CRC32 of the pinned object")
    assert row(cells, "--verify digest")[0].startswith("MD5 of every byte")
    assert float(ours[1]) > 0 and float(ours[5]) > 0  # seconds and CPU seconds per GiB measured
    assert 0 < float(ours[7]) < float(ours[1])  # its start-up: part of its seconds
    assert row(cells, "raw ranged read")[7] == "-"  # measured for ours only
    assert row(cells, "KServe-style boto3: 4 processes x 4 threads")[3] == "1.00x"  # the baseline
    before = row(cells, "triton-operator sync at HEAD")  # --ref: the command from that commit
    assert before[0] == "as that commit checks" and float(before[1]) > 0


@pytest.mark.skipif(
    shutil.which("rclone") is None, reason="rclone is not installed (e2e/bootstrap installs it)"
)
def test_the_small_run_measures_rclone_where_it_is_installed(tmp_path: Path) -> None:
    cells = bench(tmp_path)
    rclone = row(cells, "rclone copy --transfers 4 --multi-thread-streams 4")
    assert rclone[0] == "MD5 of single-part objects only" and float(rclone[1]) > 0
    flushed = row(cells, "then syncfs")
    assert flushed[0] == "MD5 of single-part objects only; flushed" and float(flushed[1]) > 0
