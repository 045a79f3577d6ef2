"""Benchmark the node cache on local seaweedfs: a pod's sync on a cold node (the store) and on a warm
node (the node cache), the same repository, each byte checked: a table.

    .venv/bin/python bench/node_cache/run.py [--shards 8 --shard-mib 64 --part-mib 16]

Each row is a real `triton-operator sync` process (as the init container runs it) into an empty
folder; the node cache is its real server on loopback in this process, its callers' tokens checked
by tests/support/fake_token_reviewer.py (no API server here; each sync gets its pod's token in a
file); the store's bytes are counted by a proxy in front of seaweedfs
(tests/support/counting_proxy.py), not by the sync.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "support"))

from counting_proxy import counting_proxy  # noqa: E402
from fake_token_reviewer import FakeTokenReviewer  # noqa: E402
from storage_servers import S3_ACCESS_KEY, S3_SECRET_KEY, free_port, s3_client, start_seaweedfs  # noqa: E402
from triton_operator.adapters.nodecache.server import NodeCacheServer, ServerThread  # noqa: E402
from triton_operator.adapters.nodecache.store import ContentStore  # noqa: E402
from triton_operator.adapters.storage import pin_repository  # noqa: E402
from triton_operator.core.manifest import manifest_to_json  # noqa: E402
from triton_operator.core.startup import SyncSummary, parse_summary  # noqa: E402
from triton_operator.models import ModelSpec, Repository  # noqa: E402

MiB = 1024 * 1024
CREDS = {"AWS_ACCESS_KEY_ID": S3_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY}


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


REVIEWER = FakeTokenReviewer()


def sync(work: Path, name: str, manifest_path: Path, cache_port: int | None) -> tuple[float, float, str]:
    """One sync into work/name, as pod ``name`` of namespace "bench": (seconds, CPU seconds, its
    summary line)."""
    log = work / f"{name}.log"
    log.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | CREDS
    if cache_port is not None:
        env |= {"TRITON_NODE_CACHE_HOST": "127.0.0.1", "TRITON_NODE_CACHE_PORT": str(cache_port)}
        env["TRITON_NODE_CACHE_POD"] = name
        (work / f"{name}.token").write_text(REVIEWER.issue("bench", name))
        env["TRITON_NODE_CACHE_TOKEN"] = str(work / f"{name}.token")
    args = [sys.executable, "-m", "triton_operator.cli", "sync", "--manifest", str(manifest_path)]
    args += ["--dest", str(work / name), "--termination-log", str(log), "--progress", "json"]
    cpu, started = children_cpu(), time.monotonic()
    subprocess.run(args, env=env, check=True, stdout=subprocess.DEVNULL, timeout=1800)
    return time.monotonic() - started, children_cpu() - cpu, log.read_text().strip()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shards", type=int, default=8, help="weight shards (default 8)")
    parser.add_argument("--shard-mib", type=int, default=64, help="MiB a shard (default 64)")
    parser.add_argument("--part-mib", type=int, default=16, help="multipart upload part size (default 16)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-node-cache-") as tmp:
        work = Path(tmp)
        server = start_seaweedfs(work / "weed", work / "weed.log")
        cache = None
        try:
            s3 = s3_client(server.endpoint)
            s3.create_bucket(Bucket="models")
            from boto3.s3.transfer import TransferConfig  # noqa: PLC0415

            part = args.part_mib * MiB
            config = TransferConfig(multipart_threshold=part, multipart_chunksize=part)
            block = os.urandom(args.shard_mib * MiB)
            for i in range(args.shards):
                path = work / "shard"
                path.write_bytes(i.to_bytes(8, "big") + block[8:])
                s3.upload_file(str(path), "models", f"models/big/1/shard-{i:03d}.bin", Config=config)
                path.unlink()
            repository = Repository(uri="s3://models/models", endpoint=server.endpoint)
            pinned = pin_repository(repository, [ModelSpec(name="big", config={"backend": "python"})], CREDS)
            total = pinned.total_bytes
            kinds = sorted({e.checksum_kind for e in pinned.entries})
            store = ContentStore(work / "cache", 4 * total, 3600.0)
            cache = ServerThread(NodeCacheServer(store, REVIEWER), "127.0.0.1", free_port())
            port = cache.start()
            rows: list[tuple[str, float, float, int, SyncSummary]] = []
            with counting_proxy(server.endpoint) as proxy:
                manifest = replace(pinned, repository=replace(pinned.repository, endpoint=proxy.endpoint))
                manifest_path = work / "manifest.json"
                manifest_path.write_text(manifest_to_json(manifest))
                for name, port_or_none in (
                    ("store only (no cache)", None),
                    ("cold node (store, then upload)", port),
                    ("warm node (node cache)", port),
                ):
                    proxy.reset()
                    seconds, cpu, line = sync(work, f"pod-{len(rows)}", manifest_path, port_or_none)
                    summary = parse_summary(line)
                    assert summary is not None, line
                    rows.append((name, seconds, cpu, proxy.bytes_from_server, summary))
        finally:
            if cache is not None:
                cache.stop()
            server.stop()
    shape = f"{args.shards} shards x {args.shard_mib} MiB = {total / MiB:,.0f} MiB"
    print(f"\n{shape}, checksums {', '.join(kinds)}")
    head = f"{'sync':32} {'seconds':>8} {'MiB/s':>8} {'CPU s':>7} {'CPU s/GiB':>9}"
    print(f"{head} {'from store':>14} {'cache hits':>10}")
    for name, seconds, cpu, from_store, summary in rows:
        hits = "-" if summary.node_cache_hits is None else str(summary.node_cache_hits)
        rate = total / MiB / seconds
        per_gib = cpu / (total / 1024**3)
        print(f"{name:32} {seconds:8.2f} {rate:8.0f} {cpu:7.2f} {per_gib:9.2f} {from_store:14,} {hits:>10}")
    print("from store: bytes seaweedfs sent, counted by a proxy (object bytes, headers, part-size HEADs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
