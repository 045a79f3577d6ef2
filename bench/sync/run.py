"""Benchmark `triton-operator sync` against KServe-style boto3 downloads on local seaweedfs: a table."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "support"))

from storage_servers import S3_ACCESS_KEY, S3_SECRET_KEY, Server, start_seaweedfs  # noqa: E402
from triton_operator.adapters.storage import open_store, pin_repository  # noqa: E402
from triton_operator.adapters.sync.engine import SyncOptions, sync  # noqa: E402
from triton_operator.adapters.sync.results import SyncStats  # noqa: E402
from triton_operator.models import ModelSpec, Repository  # noqa: E402

MiB = 1024 * 1024
GiB = 1024 * MiB
CREDS = {"AWS_ACCESS_KEY_ID": S3_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY}


def client(endpoint: str, pool: int = 64) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=Config(
            s3={"addressing_style": "path"},
            max_pool_connections=pool,
            request_checksum_calculation="when_required",
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


def kserve_download(endpoint: str, bucket: str, prefix: str, dest: Path, *, processes: int) -> None:
    """What KServe's storage initializer does for s3:// (kserve_storage.py ``_download_s3``).

    List the prefix with a boto3 resource, then ``multiprocessing.Pool(min(4, n))`` workers
    (S3_MAX_FILE_CONCURRENCY, default 4) each call ``Bucket.download_file`` with the default
    TransferConfig (objects over 8 MiB in 8 MiB ranged parts, 10 threads per object). No
    checksum is verified. ``processes=1`` runs the same calls serially, as KServe did before the pool.
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
        pool.map(_download, tasks)


# ---------------------------------------------------------------- timing


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (the baseline's worker processes)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


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
    args = parser.parse_args()

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

        bench("KServe-style, then sync(2) to flush like ours", kserve_then_flush)
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

        stats: SyncStats = bench(f"triton-operator sync (c={args.concurrency}, MD5-verified, flushed)", ours)
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
