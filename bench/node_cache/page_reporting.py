"""What page cache costs to write after the same amount was freed, with a VM's free page reporting as the
machine has it and turned off: a table (the cause of the pod restart's page-cache cost on this machine).

A VM whose balloon reports free memory to its host (virtio_balloon's free page reporting, Linux's
``page_reporting``: /sys/module/page_reporting/parameters) hands the pages a pod's deleted files freed
back to the host within seconds; the host discards them, and the next write that takes those pages
faults each one in on the host, time that counts as the writer's system CPU (the kernel's copy into
the new page-cache page). Each row writes ``--gib`` GiB into a file in ``--dir``, deletes it, waits
``--wait`` seconds (what the host was told meanwhile: ``reported_kib``), then writes the same amount
into a new file and measures that write: its seconds and the process's system CPU seconds per GiB.

With ``--off`` (root; a machine with the parameters), each run has a row with reporting turned off
too (``page_reporting_order`` above the largest order the kernel frees, so no block is reported),
taking turns with the machine's own setting; the setting is put back when the bench ends, however it
ends. Without the parameters (no free page reporting: bare metal, a VM without such a balloon) the
rows are the machine as it is.

    .venv/bin/python bench/node_cache/page_reporting.py                        # as the machine is
    .venv/bin/python bench/node_cache/page_reporting.py --off --runs 3         # + reporting off, in turns
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from triton_operator.commands.node_cache import MAX_REPORTED_ORDER, PAGE_REPORTING

PARAMETERS = PAGE_REPORTING
OFF_ORDER = MAX_REPORTED_ORDER + 1
"""Above the largest order Linux's buddy allocator frees on x86-64: no free block is reported."""
CHUNK = 8 << 20


@dataclass(frozen=True)
class Row:
    setting: str
    wait: float
    reported_mib: float
    seconds: float
    system_per_gib: float


class Reporting:
    """The machine's free page reporting parameters (``folder``; None: the machine has none)."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder if folder is not None and (folder / "page_reporting_order").exists() else None

    def order(self) -> int | None:
        return None if self.folder is None else int((self.folder / "page_reporting_order").read_text())

    def reported_kib(self) -> int | None:
        if self.folder is None or not (self.folder / "reported_kib").exists():
            return None
        return int((self.folder / "reported_kib").read_text())

    @contextlib.contextmanager
    def set_order(self, order: int) -> Iterator[None]:
        """``page_reporting_order`` at ``order`` inside, the one found before put back after."""
        if self.folder is None:
            raise SystemExit("--off: this machine has no free page reporting (no page_reporting_order)")
        path = self.folder / "page_reporting_order"
        before = path.read_text().strip()
        try:
            path.write_text(f"{order}\n")
        except OSError as exc:
            raise SystemExit(f"--off: cannot write {path} ({exc}); it needs root") from exc
        try:
            yield
        finally:
            path.write_text(f"{before}\n")


def back_free_memory(
    margin_gib: float = 3.0, meminfo: Path = Path("/proc/meminfo")
) -> tuple[int, float, float]:
    """Touch the machine's available memory but ``margin_gib`` once, 1 GiB at a time, then free it, so
    that the host backs it: with reporting off it stays backed, as on a machine whose memory has been
    used (a VM's memory never touched since its boot costs its first writer the same host faults as
    memory reported free). Returns (GiB touched, seconds, this process's system CPU seconds)."""
    available = next(
        int(line.split()[1]) for line in meminfo.read_text().splitlines() if line.startswith("MemAvailable:")
    )
    gib = max(0, int(available / (1 << 20) - margin_gib))
    before, began = resource.getrusage(resource.RUSAGE_SELF).ru_stime, time.perf_counter()
    held = [bytearray(1 << 30) for _ in range(gib)]
    del held
    return gib, time.perf_counter() - began, resource.getrusage(resource.RUSAGE_SELF).ru_stime - before


def write(path: Path, gib: float, block: bytes) -> tuple[float, float]:
    """Write ``gib`` GiB of ``block`` into a new ``path``: (seconds, this process's system CPU seconds)."""
    chunks = max(1, round(gib * (1 << 30) / len(block)))
    before, began = resource.getrusage(resource.RUSAGE_SELF).ru_stime, time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(chunks):
            f.write(block)
    return time.perf_counter() - began, resource.getrusage(resource.RUSAGE_SELF).ru_stime - before


def measure(
    folder: Path, gib: float, wait: float, *, setting: str, reporting: Reporting, block: bytes
) -> Row:
    """One row: write, delete, wait, write again; the second write's figures."""
    first, second = folder / "freed", folder / "written"
    write(first, gib, block)
    reported = reporting.reported_kib()
    first.unlink()
    time.sleep(wait)
    after = reporting.reported_kib()
    seconds, system = write(second, gib, block)
    second.unlink()
    mib = (after - reported) / 1024 if reported is not None and after is not None else float("nan")
    return Row(setting, wait, mib, seconds, system / gib)


def median_rows(rows: list[Row]) -> list[Row]:
    """One row per (setting, wait), in the order first seen: the medians of its runs."""
    keys = list(dict.fromkeys((r.setting, r.wait) for r in rows))
    out = []
    for setting, wait in keys:
        same = [r for r in rows if (r.setting, r.wait) == (setting, wait)]
        out.append(
            Row(
                setting,
                wait,
                statistics.median(r.reported_mib for r in same),
                statistics.median(r.seconds for r in same),
                statistics.median(r.system_per_gib for r in same),
            )
        )
    return out


def table(rows: list[Row], gib: float) -> str:
    head = [
        "free page reporting",
        "wait after the free (s)",
        "reported to the host meanwhile (MiB)",
        f"rewrite of {gib:g} GiB (s)",
        "system CPU s/GiB",
    ]
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---:" if i else "---" for i in range(len(head))) + "|",
    ]
    for r in rows:
        mib = "-" if r.reported_mib != r.reported_mib else f"{r.reported_mib:,.0f}"
        lines.append(f"| {r.setting} | {r.wait:g} | {mib} | {r.seconds:.2f} | {r.system_per_gib:.2f} |")
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0, help="GiB freed, then written again")
    ap.add_argument(
        "--wait", type=float, nargs="+", default=[0.0, 10.0], help="seconds between the free and the write"
    )
    ap.add_argument("--runs", type=int, default=2, help="runs of every row (medians printed)")
    ap.add_argument(
        "--dir", type=Path, default=Path("/var/tmp"), help="where the files go (a disk, not tmpfs)"
    )
    ap.add_argument("--off", action="store_true", help="also rows with reporting off, taking turns (root)")
    ap.add_argument("--parameters", type=Path, default=PARAMETERS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.gib <= 0:
        ap.error(f"--gib must be above 0, not {args.gib:g}")
    if args.runs < 1:
        ap.error(f"--runs must be at least 1, not {args.runs}")
    if any(w < 0 for w in args.wait):
        ap.error(f"--wait must not be negative: {args.wait}")
    if not args.dir.is_dir():
        ap.error(f"--dir {args.dir}: no such folder")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    reporting = Reporting(args.parameters)
    order = reporting.order()
    mine = "none on this machine" if order is None else f"on (page_reporting_order {order})"
    block = os.urandom(CHUNK)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="page-reporting-") as tmp:
        folder = Path(tmp)
        for _ in range(args.runs):
            for wait in args.wait:
                rows.append(measure(folder, args.gib, wait, setting=mine, reporting=reporting, block=block))
                if args.off:
                    with reporting.set_order(OFF_ORDER):
                        off = f"off (order {OFF_ORDER})"
                        rows.append(
                            measure(folder, args.gib, wait, setting=off, reporting=reporting, block=block)
                        )
                print(f"run {len(rows)}: {rows[-1]}", file=sys.stderr, flush=True)
    print(f"{args.gib:g} GiB written, deleted, written again in {args.dir}; medians of {args.runs} run(s)")
    print(table(median_rows(rows), args.gib))
    return 0


if __name__ == "__main__":
    sys.exit(main())
