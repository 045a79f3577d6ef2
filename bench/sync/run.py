"""Benchmark `triton-operator sync` against KServe-style boto3 downloads on local seaweedfs: a table.

Two modes:

- default: a mixed set (200 shards + one big object) and a 10,000-object no-op resync;
- ``--real``: the full-size generated repository (tests/support/realrepo.py: a 2 GiB model in 256 MiB
  shards, a 500 MiB one, small ones, an ensemble), downloaded in one run by a raw ranged read (the
  machine's limit), KServe-style boto3, ``rclone copy`` and ``triton-operator sync``, all with the same
  number of connections; seconds, client CPU seconds per GiB and the server's CPU for each.
  ``--real --big 8MiB --medium 4MiB --shard 2MiB`` is the small run the tests make.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import multiprocessing
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "support"))

import realrepo  # noqa: E402
from storage_servers import S3_ACCESS_KEY, S3_SECRET_KEY, Server, start_seaweedfs  # noqa: E402
from triton_operator.adapters.storage import open_store, pin_repository  # noqa: E402
from triton_operator.adapters.sync.destination import syncfs  # noqa: E402
from triton_operator.adapters.sync.download import SyncOptions, sync  # noqa: E402
from triton_operator.adapters.sync.results import SyncStats  # noqa: E402
from triton_operator.core.repository.manifest import Manifest, manifest_to_json  # noqa: E402
from triton_operator.models import ModelSpec, Repository  # noqa: E402

MiB = 1024 * 1024
GiB = 1024 * MiB
OUR_SOURCE = REPO / "operator" / "src"  # this tree's triton_operator, what ours runs unless --ref
CREDS = {"AWS_ACCESS_KEY_ID": S3_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY}


def client(endpoint: str, pool: int = 64, *, crc: bool = False) -> Any:
    """A boto3 client; ``crc`` keeps boto3's default of sending S3 a CRC32 with each upload (S3 then
    keeps it: of the whole object, or composite of a multipart upload's parts)."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=Config(
            s3={"addressing_style": "path"},
            max_pool_connections=pool,
            request_checksum_calculation="when_supported" if crc else "when_required",
            response_checksum_validation="when_required",
        ),
        aws_access_key_id=S3_ACCESS_KEY,
        aws_secret_access_key=S3_SECRET_KEY,
    )


# ---------------------------------------------------------------- data


def upload_mixed(endpoint: str, bucket: str, files: int, files_bytes: int, big_bytes: int) -> tuple[int, int]:
    """``files`` objects of equal size totalling ``files_bytes`` plus one ``big_bytes`` object."""
    s3 = client(endpoint)
    s3.create_bucket(Bucket=bucket)
    each = max(1, files_bytes // files)
    # One random block, varied per object, keeps generation cheap while every object differs.
    block = os.urandom(each)
    big_config = TransferConfig(multipart_threshold=64 * MiB, multipart_chunksize=64 * MiB, max_concurrency=8)

    def put(i: int) -> None:
        body = i.to_bytes(8, "big") + block[8:]
        s3.put_object(Bucket=bucket, Key=f"models/mixed/1/shard-{i:04d}.bin", Body=body)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, range(files)))
    if big_bytes:
        path = Path(tempfile.mkstemp(prefix="bench-big-")[1])
        try:
            with path.open("wb") as f:
                left = big_bytes
                while left:
                    n = min(left, 64 * MiB)
                    f.write(os.urandom(n))
                    left -= n
            s3.upload_file(str(path), bucket, "models/mixed/1/model.plan", Config=big_config)
        finally:
            path.unlink()
    return files + (1 if big_bytes else 0), each * files + big_bytes


def upload_many(endpoint: str, bucket: str, count: int, size: int = 1024) -> None:
    s3 = client(endpoint, pool=64)
    s3.create_bucket(Bucket=bucket)
    body = os.urandom(size)

    def put(i: int) -> None:
        s3.put_object(
            Bucket=bucket, Key=f"models/many{i % 10}/1/f{i:05d}.bin", Body=i.to_bytes(4, "big") + body
        )

    with ThreadPoolExecutor(64) as pool:
        list(pool.map(put, range(count)))


# ---------------------------------------------------------------- the KServe-style baselines

_worker: Any = None


def _init_worker(endpoint: str) -> None:
    global _worker  # noqa: PLW0603 - one boto3 resource per process, as KServe's initializer does
    _worker = boto3.resource(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=S3_ACCESS_KEY,
        aws_secret_access_key=S3_SECRET_KEY,
        config=Config(s3={"addressing_style": "path"}),
    )


def _download(args: tuple[str, str, str]) -> str:
    bucket, key, target = args
    _worker.Bucket(bucket).download_file(key, target)  # default TransferConfig, as KServe
    return key


def _download_threads(args: tuple[str, str, str, int]) -> str:
    bucket, key, target, threads = args
    _worker.Bucket(bucket).download_file(key, target, Config=TransferConfig(max_concurrency=threads))
    return key


def kserve_download(
    endpoint: str, bucket: str, prefix: str, dest: Path, *, processes: int, threads: int | None = None
) -> None:
    """What KServe's storage initializer does for s3:// (kserve_storage.py ``_download_s3``).

    List the prefix with a boto3 resource, then ``multiprocessing.Pool(min(4, n))`` workers
    (S3_MAX_FILE_CONCURRENCY, default 4) each call ``Bucket.download_file`` with the default
    TransferConfig (objects over 8 MiB in 8 MiB ranged parts, 10 threads per object). No
    checksum is verified. ``processes=1`` runs the same calls serially, as KServe did before the pool.
    ``threads`` sets TransferConfig.max_concurrency (threads per object) where 10 does not fit a
    connection budget.
    """
    _init_worker(endpoint)
    tasks = []
    for obj in _worker.Bucket(bucket).objects.filter(Prefix=prefix):
        if obj.key.endswith("/") or obj.size == 0:
            continue
        target = dest / obj.key.removeprefix(prefix).lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        tasks.append((bucket, obj.key, str(target)))
    if processes == 1:
        for task in tasks:
            _download(task)
        return
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(
        processes=min(processes, len(tasks)), initializer=_init_worker, initargs=(endpoint,)
    ) as pool:
        if threads is None:
            pool.map(_download, tasks)
        else:
            pool.map(_download_threads, [(*task, threads) for task in tasks])


# ---------------------------------------------------------------- timing


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (the baseline's worker processes)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def settle(seconds: float = 1.0) -> None:
    """Let the disk finish what earlier rows left it (a flush, then a pause): no row pays for
    another's writeback."""
    os.sync()
    time.sleep(seconds)


def fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


# ---------------------------------------------------------------- the full-size repository (--real)

RCLONE_MISSING = "rclone not installed (Debian: apt-get install rclone)"


@dataclasses.dataclass
class Row:
    """One way of downloading the repository, and what each of its runs measured."""

    name: str
    checks: str  # what it verifies of the bytes
    run: Callable[[Path], Any] | None  # None: it cannot run here (``missing`` says why)
    missing: str = ""
    seconds: list[float] = dataclasses.field(default_factory=list)
    cpu: list[float] = dataclasses.field(default_factory=list)
    server: list[float] = dataclasses.field(default_factory=list)
    startup: list[float] = dataclasses.field(default_factory=list)
    """Ours only: the process's time before its sync began (interpreter, imports, the store's client)."""


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ranges(manifest: Manifest, part: int) -> list[tuple[str, int, int]]:
    """Every pinned object's bytes as ranges of at most ``part`` bytes, the biggest first."""
    out = [(e.key, s, min(s + part, e.size)) for e in manifest.entries for s in range(0, e.size, part)]
    return sorted(out, key=lambda r: r[1] - r[2])


def raw_read(endpoint: str, bucket: str, manifest: Manifest, *, connections: int, part: int) -> int:
    """The machine's limit: ranged GETs of every pinned byte, ``connections`` at a time, each read
    into one reused buffer and dropped (no disk, no checksum, no SDK past signing the URL)."""
    s3 = client(endpoint, pool=connections)
    where = urlsplit(endpoint)
    local = threading.local()

    def get(piece: tuple[str, int, int]) -> int:
        key, start, end = piece
        url = urlsplit(s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}))
        if not hasattr(local, "conn"):
            local.conn = http.client.HTTPConnection(where.hostname or "", where.port, timeout=60)
            local.buffer = memoryview(bytearray(MiB))
        local.conn.request("GET", f"{url.path}?{url.query}", headers={"Range": f"bytes={start}-{end - 1}"})
        response = local.conn.getresponse()
        if response.status not in (200, 206):
            raise RuntimeError(f"GET {key} bytes {start}-{end - 1}: HTTP {response.status}")
        count = 0
        while n := response.readinto(local.buffer):
            count += n
        return count

    with ThreadPoolExecutor(connections) as pool:
        return sum(pool.map(get, ranges(manifest, part)))


def source_at(ref: str, work: Path) -> Path:
    """operator/src as git ref ``ref`` has it, extracted under ``work``."""
    tar = subprocess.run(
        ["git", "-C", str(REPO), "archive", ref, "operator/src"], check=True, capture_output=True
    )
    subprocess.run(["tar", "-x", "-C", str(work)], input=tar.stdout, check=True)
    return work / "operator" / "src"


def sync_command(
    manifest: Path,
    dest: Path,
    *,
    concurrency: int,
    part: int,
    verify: str,
    src: Path = OUR_SOURCE,
) -> dict[str, Any]:
    """`triton-operator sync` (from ``src``) in its own process, as a pod's init container runs it;
    its summary."""
    env = {**os.environ, **CREDS, "PYTHONPATH": str(src)}
    args = [sys.executable, "-c", "import sys; from triton_operator.cli import main; sys.exit(main())"]
    args += ["sync", "--manifest", str(manifest), "--dest", str(dest), "--progress", "json"]
    args += ["--concurrency", str(concurrency), "--part-size", str(part), "--verify", verify]
    args += ["--termination-log", os.devnull]
    done = subprocess.run(args, env=env, check=True, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["event"] == "summary", done.stdout[-2000:]
    return dict(summary)


def rclone_copy(binary: str, endpoint: str, source: str, dest: Path, *, transfers: int, streams: int) -> None:
    """``rclone copy`` of ``source`` (bucket/prefix) into ``dest``: ``transfers`` files at a time, files
    over 250 MiB in ``streams`` ranged streams (rclone's --multi-thread-cutoff)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RCLONE_"))}
    env |= {
        "RCLONE_S3_PROVIDER": "Other",
        "RCLONE_S3_ENDPOINT": endpoint,
        "RCLONE_S3_ACCESS_KEY_ID": S3_ACCESS_KEY,
        "RCLONE_S3_SECRET_ACCESS_KEY": S3_SECRET_KEY,
        "RCLONE_CONFIG": os.devnull,
    }
    args = [binary, "copy", f":s3:{source}", str(dest), "--transfers", str(transfers)]
    args += ["--multi-thread-streams", str(streams), "-q"]
    subprocess.run(args, env=env, check=True, stdin=subprocess.DEVNULL)


def unchecked(manifest: Manifest) -> Manifest:
    """The manifest with its checksums dropped: sync then reads each object under its pinned ETag
    and checks sizes only (a diagnostic of the transfer alone; no user can ask for this)."""
    entries = tuple(dataclasses.replace(e, checksum_kind="none", checksum="") for e in manifest.entries)
    return dataclasses.replace(manifest, entries=entries)


def bytes_under(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def real_main(args: argparse.Namespace) -> int:
    """The full-size repository, downloaded every way in one run: see the module's docstring."""
    shape = realrepo.RepoShape(
        big_bytes=realrepo.parse_size(args.big),
        medium_bytes=realrepo.parse_size(args.medium),
        small_count=args.small,
        small_bytes=realrepo.parse_size(args.small_size),
        shard_bytes=realrepo.parse_size(args.shard),
    )
    conc, part = args.concurrency, args.part_size_mib * MiB
    per_process = max(1, conc // 4)
    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="bench-sync-real-", dir=args.workdir))
    server: Server | None = None
    try:
        server = start_seaweedfs(work / "weed", work / "weed.log")
        endpoint, pid = server.endpoint, server.process.pid
        s3 = client(endpoint, crc=True)  # as boto3 >= 1.36 and the AWS CLI upload by default
        s3.create_bucket(Bucket="models")
        t_up, repository = timed(lambda: realrepo.upload_repository(s3, "models", "real", shape))
        models = [ModelSpec.model_validate(m) for m in repository.spec_models]
        manifest = pin_repository(Repository(uri="s3://models/real", endpoint=endpoint), models, CREDS)
        total = sum(e.size for e in manifest.entries)
        print(
            f"seaweedfs at {endpoint}; uploaded {len(repository.files)} files, {total / MiB:,.0f} MiB "
            f"in {t_up:.1f}s",
            file=sys.stderr,
        )

        pinned, dropped = work / "manifest.json", work / "manifest-unchecked.json"
        pinned.write_text(manifest_to_json(manifest))
        dropped.write_text(manifest_to_json(unchecked(manifest)))

        def ours(path: Path, dest: Path, verify: str = "fast", src: Path = OUR_SOURCE) -> dict[str, Any]:
            stats = sync_command(path, dest, concurrency=conc, part=part, verify=verify, src=src)
            assert stats["downloaded_bytes"] == total, stats
            return stats

        big_files = sum(1 for e in manifest.entries if e.size > part)

        def verified(dest: Path, verify: str, src: Path = OUR_SOURCE) -> dict[str, Any]:
            stats = ours(pinned, dest, verify, src)
            assert stats["unverified_files"] == 0, stats
            assert stats["crc_checked_files"] == (big_files if verify == "fast" else 0), stats
            return stats

        def raw(dest: Path) -> None:
            assert raw_read(endpoint, "models", manifest, connections=conc, part=part) == total

        def kserve(dest: Path, threads: int | None) -> None:
            kserve_download(endpoint, "models", "real", dest, processes=4, threads=threads)
            assert bytes_under(dest) >= total

        rclone = shutil.which(args.rclone)

        def rclone_run(dest: Path, flushed: bool = False) -> None:
            assert rclone is not None
            rclone_copy(rclone, endpoint, "models/real", dest, transfers=4, streams=per_process)
            assert bytes_under(dest) >= total
            if flushed:  # on disk before it counts as done (one syncfs of the volume)
                syncfs(dest)

        rows = [
            Row("raw ranged read, bytes dropped (the machine's limit)", "none", raw),
            Row(
                f"KServe-style boto3: 4 processes x {per_process} threads",
                "none",
                partial(kserve, threads=None if per_process == 10 else per_process),
            ),
            Row(
                "KServe-style boto3 as shipped: 4 processes x 10 threads (40 connections)",
                "none",
                partial(kserve, threads=None),
            ),
            Row(
                f"rclone copy --transfers 4 --multi-thread-streams {per_process}",
                "MD5 of single-part objects only",
                rclone_run if rclone else None,
                "" if rclone else RCLONE_MISSING,
            ),
            Row(
                f"rclone copy --transfers 4 --multi-thread-streams {per_process}, then syncfs",
                "MD5 of single-part objects only; flushed",
                partial(rclone_run, flushed=True) if rclone else None,
                "" if rclone else RCLONE_MISSING,
            ),
            Row(
                f"**triton-operator sync** (c={conc})",
                "every byte: S3's CRC32 of the pinned object for ranged files, MD5 for the rest",
                partial(verified, verify="fast"),
            ),
            Row(
                "triton-operator sync --verify digest",
                "MD5 of every byte (multipart ETags recomputed)",
                partial(verified, verify="digest"),
            ),
            Row(
                "triton-operator sync, checksums dropped (diagnostic)",
                "sizes",
                partial(ours, dropped),
            ),
        ]
        if args.ref:
            rows.append(
                Row(
                    f"triton-operator sync at {args.ref} (the same command from that commit)",
                    "as that commit checks",
                    partial(verified, verify="fast", src=source_at(args.ref, work)),
                )
            )
        runnable = [r for r in rows if r.run is not None]
        raw(work)  # warm-up: the server's first read of each object is not measured
        for rep in range(args.repeat):
            # Each repeat in another order (seeded): no row always follows the same one, whose
            # leftovers (page cache freed, writeback) it would pay for.
            for row in random.Random(rep).sample(runnable, len(runnable)):
                assert row.run is not None
                dest = fresh(work / "dest")
                settle()
                cpu0, server0 = cpu_seconds(), process_cpu(pid)
                seconds, result = timed(partial(row.run, dest))
                row.seconds.append(seconds)
                if isinstance(result, dict):  # ours: its summary's seconds are the sync's own
                    row.startup.append(seconds - float(result["seconds"]))
                row.cpu.append(cpu_seconds() - cpu0)
                row.server.append(process_cpu(pid) - server0)
                print(f"{row.name}: {seconds:.2f}s, client CPU {row.cpu[-1]:.2f}s", file=sys.stderr)
        shutil.rmtree(work / "dest", ignore_errors=True)
        print_real_table(args, manifest, shape, rows, (load_before, os.getloadavg()[0]))
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


def print_real_table(
    args: argparse.Namespace,
    manifest: Manifest,
    shape: realrepo.RepoShape,
    rows: list[Row],
    load: tuple[float, float],
) -> None:
    total = sum(e.size for e in manifest.entries)
    gib = total / GiB
    baseline = statistics.median(rows[1].seconds)
    print()
    print(
        f"Full-size repository: {len(manifest.entries)} objects, {total / MiB:,.0f} MiB "
        f"({realrepo.format_size(shape.big_bytes)} + {realrepo.format_size(shape.medium_bytes)} in "
        f"{realrepo.format_size(shape.shard_bytes)} shards, {shape.small_count} small, an ensemble), "
        f"local seaweedfs, {args.concurrency} connections each unless said, median of {args.repeat}, "
        f"{os.cpu_count()} CPUs, load average {load[0]:.1f} before and {load[1]:.1f} after"
    )
    print()
    print(
        "| download | bytes checked | seconds | MB/s | vs KServe-style | client CPU s | CPU s/GiB | "
        "server CPU s | start-up s |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        if not row.seconds:
            print(f"| {row.name} | {row.missing} | - | - | - | - | - | - | - |")
            continue
        seconds, cpu = statistics.median(row.seconds), statistics.median(row.cpu)
        server = statistics.median(row.server)
        startup = f"{statistics.median(row.startup):.2f}" if row.startup else "-"
        print(
            f"| {row.name} | {row.checks} | {seconds:.2f} | {total / seconds / 1e6:,.0f} | "
            f"{baseline / seconds:.2f}x | {cpu:.2f} | {cpu / gib:.2f} | {server:.2f} | {startup} |"
        )
    print()
    print(
        "start-up s: ours only, the process's wall time less the seconds its own summary reports "
        "(the interpreter, imports, the store's client before the sync; closing it and exiting after)."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--scale", type=float, default=1.0, help="shrink the mixed set (0.1: 205 MiB + 102 MiB)"
    )
    parser.add_argument("--files", type=int, default=200, help="files in the mixed set besides the big one")
    parser.add_argument("--objects", type=int, default=10_000, help="objects of the no-op resync repository")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each download; the median is shown")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--part-size-mib", type=int, default=64)
    parser.add_argument("--no-serial", action="store_true", help="skip the serial download_file baseline")
    parser.add_argument("--workdir", type=Path, default=None, help="where seaweedfs data and downloads go")
    real = parser.add_argument_group("--real: the full-size generated repository (tests/support/realrepo.py)")
    real.add_argument("--real", action="store_true", help="benchmark the generated repository instead")
    real.add_argument("--big", default="2GiB", help="the big model's weights")
    real.add_argument("--medium", default="500MiB", help="the medium model's weights")
    real.add_argument("--small", type=int, default=3, help="small models")
    real.add_argument("--small-size", default="1MiB", help="each small model's weights")
    real.add_argument("--shard", default="256MiB", help="largest weight shard")
    real.add_argument("--rclone", default="rclone", help="the rclone binary (a row says when it is missing)")
    real.add_argument("--ref", help="a row more: triton-operator sync from this git ref (a before and after)")
    args = parser.parse_args()
    if args.real:
        return real_main(args)

    files_bytes = int(2 * GiB * args.scale)
    big_bytes = int(1 * GiB * args.scale)
    work = Path(tempfile.mkdtemp(prefix="bench-sync-", dir=args.workdir))
    server: Server | None = None
    try:
        server = start_seaweedfs(work / "weed", work / "weed.log")
        endpoint = server.endpoint
        print(f"seaweedfs at {endpoint}; work dir {work}", file=sys.stderr)

        t_up, (n_files, n_bytes) = timed(
            lambda: upload_mixed(endpoint, "mixed", args.files, files_bytes, big_bytes)
        )
        print(f"uploaded {n_files} objects, {n_bytes / MiB:,.0f} MiB in {t_up:.1f}s", file=sys.stderr)

        repo = Repository(uri="s3://mixed/models", endpoint=endpoint)
        models = [ModelSpec(name="mixed")]
        t_pin, manifest = timed(lambda: pin_repository(repo, models, CREDS))

        rows: list[tuple[str, float, float]] = []

        def bench(name: str, fn: Callable[[Path], Any]) -> Any:
            times, cpus, result = [], [], None
            for _ in range(args.repeat):
                dest = fresh(work / "dest")
                cpu0 = cpu_seconds()
                seconds, result = timed(partial(fn, dest))
                times.append(seconds)
                cpus.append(cpu_seconds() - cpu0)
                print(f"{name}: {seconds:.2f}s, client CPU {cpus[-1]:.2f}s", file=sys.stderr)
            shutil.rmtree(work / "dest", ignore_errors=True)
            rows.append((name, statistics.median(times), statistics.median(cpus)))
            return result

        bench(
            "KServe-style: 4 processes x download_file",
            lambda d: kserve_download(endpoint, "mixed", "models", d, processes=4),
        )

        def kserve_then_flush(dest: Path) -> None:
            kserve_download(endpoint, "mixed", "models", dest, processes=4)
            os.sync()

        bench("KServe-style, then sync(2) (flushed)", kserve_then_flush)
        if not args.no_serial:
            bench(
                "serial download_file (older KServe)",
                lambda d: kserve_download(endpoint, "mixed", "models", d, processes=1),
            )

        def ours(dest: Path) -> SyncStats:
            store = open_store(manifest.repository, CREDS, max_connections=args.concurrency)
            try:
                options = SyncOptions(
                    dest=dest, concurrency=args.concurrency, part_size=args.part_size_mib * MiB
                )
                return sync(manifest, store, options)
            finally:
                store.close()

        stats: SyncStats = bench(f"triton-operator sync (c={args.concurrency}, MD5-verified)", ours)
        assert stats.downloaded_bytes == n_bytes, stats

        # No-op resync of a many-object repository.
        t_many_up, _ = timed(lambda: upload_many(endpoint, "many", args.objects))
        print(f"uploaded {args.objects} small objects in {t_many_up:.1f}s", file=sys.stderr)
        many_models = [ModelSpec(name=f"many{i}") for i in range(10)]
        t_many_pin, many = timed(
            lambda: pin_repository(Repository(uri="s3://many/models", endpoint=endpoint), many_models, CREDS)
        )
        dest = fresh(work / "many")
        store = open_store(many.repository, CREDS, max_connections=args.concurrency)
        try:
            t_first, first = timed(
                lambda: sync(many, store, SyncOptions(dest=dest, concurrency=args.concurrency))
            )
            t_noop, noop = timed(
                lambda: sync(many, store, SyncOptions(dest=dest, concurrency=args.concurrency))
            )
        finally:
            store.close()
        assert first.downloaded_files == args.objects and noop.downloaded_files == 0, (first, noop)
        assert noop.present_files == args.objects

        base = rows[0][1]
        print()
        shape = f"{args.files} x {files_bytes // args.files / MiB:,.1f} MiB + 1 x {big_bytes / MiB:,.0f} MiB"
        print(
            f"Mixed set: {n_files} objects, {n_bytes / MiB:,.0f} MiB ({shape}), local seaweedfs, "
            f"{os.cpu_count()} CPUs, median of {args.repeat}"
        )
        print()
        print("| download | seconds | MB/s | speedup vs KServe-style | client CPU s |")
        print("|---|---:|---:|---:|---:|")
        for name, seconds, cpu in rows:
            rate = n_bytes / seconds / 1e6
            print(f"| {name} | {seconds:.2f} | {rate:,.0f} | {base / seconds:.2f}x | {cpu:.2f} |")
        print()
        print(f"| {args.objects:,}-object repository (1 KiB each) | seconds |")
        print("|---|---:|")
        print(f"| pin (list + select, operator side) | {t_many_pin:.2f} |")
        print(f"| first sync ({first.downloaded_files:,} downloads) | {t_first:.2f} |")
        print(f"| no-op resync (0 downloads, {noop.present_files:,} present) | {t_noop:.2f} |")
        print()
        print(f"pin of the mixed set: {t_pin:.2f}s; uploads took {t_up:.1f}s and {t_many_up:.1f}s")
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
