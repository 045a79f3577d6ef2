"""bench/sync/checksums.py at a small size: one row a checksum, each with its CPU seconds per GiB."""

from __future__ import annotations

import subprocess
import sys

from testkit import REPO


def test_the_checksum_table_has_a_measured_row_for_each_checksum() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "sync" / "checksums.py"), "--mib", "8", "--repeat", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    rows = [line.strip("| ").split(" | ") for line in done.stdout.splitlines() if line.startswith("| ")]
    assert rows[0] == ["checksum", "what it checks", "CPU s/GiB"]
    names = [r[0] for r in rows[1:]]
    assert names[0] == "md5" and "crc32 (ISA-L, what sync uses)" in names and len(names) == 7
    assert all(float(r[2]) > 0 for r in rows[1:])
