"""Benchmark the node cache on local seaweedfs: a pod's sync on a cold node (the store) and on a
warm node (the node cache), the same repository, each byte checked: a table, this tree beside
``--ref`` (a git ref: its node cache and its sync, the same command from that commit).

    .venv/bin/python bench/node_cache/run.py [--shards 16 --shard-mib 64 --part-mib 16] [--ref REF]
    .venv/bin/python bench/node_cache/run.py --real [--ref REF]   # the real-size repository
    .venv/bin/python bench/node_cache/run.py ... --perf FILE      # + `perf report -i FILE`
    .venv/bin/python bench/node_cache/run.py ... --agent          # + the agent's first fill's rows

``--agent`` adds, for each warm row, the same reads by the pod's model agent (``Agent.fill`` in a
process of its own, as `triton-operator agent` runs it; tritonserver a stand-in whose loads return
at once): what the agent costs beyond the sync engine.

``--real`` uploads the repository tests/support/realrepo.py generates at full size (2.5 GiB: a 2 GiB
model in 256 MiB shards, a 500 MiB one, small ones; boto3 uploads in 8 MiB parts with a CRC32, as
bench/sync ``--real`` and the real-size e2e do) instead of the shards.

Each row is a real `triton-operator sync` process (as the init container runs it) into an empty
folder; the node cache is its real server on loopback in a process of its own (the tree's
``NodeCacheServer``), its callers' tokens checked by tests/support/fake_token_reviewer.py (no API
server here; each sync gets its pod's token in a file); the store's bytes are counted by a proxy in
front of seaweedfs (tests/support/counting_proxy.py), not by the sync. CPU: the sync process's
(pod; the kernel's part of it beside) and the node cache process's (cache) user + system seconds,
per GiB synced. A warm row is the median of ``--warm-runs`` syncs by seconds; the trees' warm
syncs take turns. A tree whose cache signs statements (adapters/nodecache/statements.py) runs its
cache with a new key and has a "warm node, signed" row more: its sync given the public key,
checking the digest the cache signed (its SHA-256, or its BLAKE3 where the tree has that) instead
of the pin.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUPPORT = REPO / "tests" / "support"
OUR_SOURCE = REPO / "operator" / "src"
sys.path.insert(0, str(SUPPORT))

import realrepo  # noqa: E402
from counting_proxy import counting_proxy  # noqa: E402
from storage_servers import S3_ACCESS_KEY, S3_SECRET_KEY, s3_client, start_seaweedfs  # noqa: E402
from triton_operator.adapters.storage import pin_repository  # noqa: E402
from triton_operator.core.pod.startup import SyncSummary, parse_summary  # noqa: E402
from triton_operator.core.repository.cache_rules import object_key  # noqa: E402
from triton_operator.core.repository.manifest import manifest_to_json  # noqa: E402
from triton_operator.models import ModelSpec, Repository  # noqa: E402

MiB = 1024 * 1024
GiB = 1024 * MiB
CREDS = {"AWS_ACCESS_KEY_ID": S3_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY}
TICKS = os.sysconf("SC_CLK_TCK")
SIGNER_MODULE = Path("triton_operator") / "adapters" / "nodecache" / "statements.py"
"""A tree with it signs statements (its cache run with a key, its warm syncs given the public key)."""
FILLS_MODULE = Path("triton_operator") / "adapters" / "agent" / "runner.py"
"""A tree whose Agent has a first fill gets the ``--agent`` rows."""

# The node cache process: a tree's server on loopback, tokens issued for the pods named in argv
# (written to <work>/<pod>.token); prints its port, serves until its stdin closes.
SERVE = """
import base64, os, sys
from pathlib import Path
from fake_token_reviewer import FakeTokenReviewer
from storage_servers import free_port
from triton_operator.adapters.nodecache.server import NodeCacheServer, ServerThread
from triton_operator.adapters.nodecache.store import ContentStore
root, limit, work, sign = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4] == "sign"
reviewer = FakeTokenReviewer()
for pod in sys.argv[5:]:
    (work / f"{pod}.token").write_text(reviewer.issue("bench", pod))
options, public = {}, ""
if sign:  # a tree that signs statements: a new key, its public half to the pods
    from triton_operator.adapters.nodecache.statements import Signer
    key = work / f"signing-{os.getpid()}.key"
    key.write_text(base64.b64encode(os.urandom(32)).decode())
    options["signer"] = Signer.from_file(key)
    public = options["signer"].public_key()
server = NodeCacheServer(ContentStore(root, limit, 3600.0), reviewer, **options)
cache = ServerThread(server, "127.0.0.1", free_port())
print(cache.start(), public, flush=True)
sys.stdin.read()
cache.stop()
"""

# The pod's model agent's first fill (Agent.fill, as `triton-operator agent` runs it in a pod of the one
# shape), tritonserver a stand-in that loads at once: argv manifest, dest, state folder, summary file;
# the node cache from the same environment as the sync's.
FILL = """
import sys
from pathlib import Path
from triton_operator.adapters.agent.runner import Agent, AgentOptions
from triton_operator.commands.sync import credentials_from_env, node_cache_pod, node_cache_url
from triton_operator.core.pod.agent_plan import RevisionFiles
from triton_operator.core.repository.manifest import manifest_from_json
class Triton:  # started empty, each load at once
    def live(self): return True
    def load(self, model): pass
    def index(self): return ()
manifest = manifest_from_json(Path(sys.argv[1]).read_bytes())
configs = {m.name: f'name: "{m.name}"\\nbackend: "python"\\n' for m in manifest.models}
base = RevisionFiles("bench", manifest, configs)
agent = Agent(AgentOptions(dest=Path(sys.argv[2]), state_dir=Path(sys.argv[3]), base=base, triton=Triton(),
    credentials=credentials_from_env(), node_cache=node_cache_url(None), node_cache_pod=node_cache_pod(),
    fills=True))
agent.apply(base)
Path(sys.argv[4]).write_text(agent.summary)
"""


@dataclass(frozen=True)
class Row:
    name: str
    seconds: float
    pod_cpu: float
    cache_cpu: float | None
    from_store: int
    summary: SyncSummary
    node_warm: float | None = (
        None  # a cold row: seconds from the sync's start until the node kept every object
    )
    pod_system: float = 0.0  # of pod_cpu, the kernel's (system) seconds


def row_kinds(src: Path, signs: bool, *, agent: bool) -> list[tuple[str, bool, bool]]:
    """A tree's warm rows: (name suffix, given the public key, by the agent's first fill): a sync,
    a signed one where its cache signs; with ``agent``, each again by Agent.fill where the tree has it."""
    kinds = [("", False, False), (", signed", True, False)] if signs else [("", False, False)]
    fills = src / FILLS_MODULE
    if agent and fills.exists() and "def fill(" in fills.read_text():
        kinds += [(f"{suffix}, agent", signed, True) for suffix, signed, _ in kinds]
    return kinds


def pod_suffix(suffix: str) -> str:
    """A row's suffix (", signed, agent") as a part of its pods' names ("signedagent")."""
    return suffix.replace(",", "").replace(" ", "")


def children_cpu() -> tuple[float, float]:
    """The waited-for children's user and system CPU seconds."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime, usage.ru_stime


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def source_at(ref: str, work: Path) -> Path:
    """operator/src as git ref ``ref`` has it, extracted under ``work``."""
    tar = subprocess.run(
        ["git", "-C", str(REPO), "archive", ref, "operator/src"], check=True, capture_output=True
    )
    work.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(work)], input=tar.stdout, check=True)
    return work / "operator" / "src"


def tree_env(src: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | CREDS
    return env | {"PYTHONPATH": os.pathsep.join([str(src), str(SUPPORT)])}


class Cache:
    """A tree's node cache process."""

    def __init__(self, src: Path, root: Path, limit: int, work: Path, pods: list[str], *, sign: bool) -> None:
        args = [sys.executable, "-c", SERVE, str(root), str(limit), str(work), "sign" if sign else "-", *pods]
        self.process = subprocess.Popen(
            args, env=tree_env(src), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        port, _, public = self.process.stdout.readline().partition(" ")
        self.port, self.public_key = int(port), public.strip()

    def cpu(self) -> float:
        return process_cpu(self.process.pid)

    def stored(self) -> int:
        """Objects the cache has kept so far (its own counter)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as answer:
            for line in answer.read().decode().splitlines():
                if line.startswith("triton_node_cache_stored_total "):
                    return int(float(line.split()[1]))
        return 0

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(60)


def sync(
    src: Path,
    work: Path,
    pod: str,
    manifest_path: Path,
    cache: Cache | None,
    *,
    signed: bool = False,
    perf: Path | None = None,
    agent: bool = False,
) -> tuple[float, float, float, float | None, str]:
    """One sync into work/pod by tree ``src``, as pod ``pod`` of namespace "bench" (``signed``: given
    the cache's public key; ``perf``: under `perf record -F 499 -g` into that file; ``agent``: the
    model agent's first fill instead, FILL): (seconds, its
    CPU seconds, of them in the kernel, the cache's CPU seconds meanwhile, its summary line)."""
    log = work / f"{pod}.log"
    log.write_text("")
    env = tree_env(src)
    if cache is not None:
        env |= {"TRITON_NODE_CACHE_HOST": "127.0.0.1", "TRITON_NODE_CACHE_PORT": str(cache.port)}
        env |= {"TRITON_NODE_CACHE_POD": pod, "TRITON_NODE_CACHE_TOKEN": str(work / f"{pod}.token")}
        if signed:
            env["TRITON_NODE_CACHE_PUBLIC_KEY"] = cache.public_key
    dest = work / pod
    args = [sys.executable, "-m", "triton_operator.cli", "sync", "--manifest", str(manifest_path)]
    args += ["--dest", str(dest), "--termination-log", str(log), "--progress", "json"]
    if agent:
        args = [
            sys.executable,
            "-c",
            FILL,
            str(manifest_path),
            str(dest),
            str(work / f"{pod}.state"),
            str(log),
        ]
    if perf is not None:
        args = ["perf", "record", "-q", "-F", "499", "-g", "-o", str(perf), "--", *args]
    cache_cpu = cache.cpu() if cache is not None else 0.0
    (user, system), started = children_cpu(), time.monotonic()
    subprocess.run(args, env=env, check=True, stdout=subprocess.DEVNULL, timeout=1800)
    seconds, (user_after, system_after) = time.monotonic() - started, children_cpu()
    cpu, system = user_after - user + system_after - system, system_after - system
    if cache is not None:
        # the cold node's uploads finish after the sync (close waits for them)
        cache_cpu = cache.cpu() - cache_cpu
    shutil.rmtree(dest)
    shutil.rmtree(work / f"{pod}.state", ignore_errors=True)
    return seconds, cpu, system, cache_cpu if cache is not None else None, log.read_text().strip()


def record_perf(
    path: Path, work: Path, manifest_path: Path, caches: list[tuple[str, Path, str, Cache]], runs: int
) -> None:
    """One warm signed sync of this tree more (pod ``newsigned-warm-<runs>``), under `perf record`
    into ``path``; not in the table (perf's own CPU would count)."""
    for _label, src, tag, cache in caches:
        if tag == "new":
            sync(src, work, f"newsigned-warm-{runs}", manifest_path, cache, signed=True, perf=path)


def upload_shards(s3: object, work: Path, args: argparse.Namespace) -> None:
    """``--shards`` shards of ``--shard-mib`` under models/big/1/, multipart in ``--part-mib`` parts."""
    from boto3.s3.transfer import TransferConfig  # noqa: PLC0415

    part = args.part_mib * MiB
    config = TransferConfig(multipart_threshold=part, multipart_chunksize=part)
    block = os.urandom(args.shard_mib * MiB)
    for i in range(args.shards):
        path = work / "shard"
        path.write_bytes(i.to_bytes(8, "big") + block[8:])
        s3.upload_file(str(path), "models", f"models/big/1/shard-{i:03d}.bin", Config=config)  # type: ignore[attr-defined]
        path.unlink()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shards", type=int, default=16, help="weight shards (default 16)")
    parser.add_argument("--shard-mib", type=int, default=64, help="MiB a shard (default 64)")
    parser.add_argument("--part-mib", type=int, default=16, help="multipart upload part size (default 16)")
    parser.add_argument("--warm-runs", type=int, default=3, help="warm syncs a tree, median (default 3)")
    parser.add_argument("--cold-runs", type=int, default=1, help="cold syncs a tree, median (default 1)")
    parser.add_argument("--ref", help="rows more: the node cache and sync of this git ref (before/after)")
    parser.add_argument("--real", action="store_true", help="the full-size generated repository instead")
    parser.add_argument(
        "--agent",
        action="store_true",
        help="warm rows more: the same reads by the model agent's first fill (Agent.fill) in a process",
    )
    parser.add_argument(
        "--perf",
        type=Path,
        help="one warm signed sync of this tree more, under `perf record -F 499 -g` into this file",
    )
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-node-cache-") as tmp:
        work = Path(tmp)
        trees = [("this tree", OUR_SOURCE)]
        if args.ref:
            trees.insert(0, (f"ref {args.ref}", source_at(args.ref, work / "ref")))
        server = start_seaweedfs(work / "weed", work / "weed.log")
        try:
            s3 = s3_client(server.endpoint)
            s3.create_bucket(Bucket="models")
            if args.real:
                generated = realrepo.upload_repository(s3, "models", "models", realrepo.RepoShape())
                models = [ModelSpec.model_validate(m) for m in generated.spec_models]
            else:
                upload_shards(s3, work, args)
                models = [ModelSpec(name="big", config={"backend": "python"})]
            repository = Repository(uri="s3://models/models", endpoint=server.endpoint)
            pinned = pin_repository(repository, models, CREDS)
            total = pinned.total_bytes
            kinds = sorted({e.checksum_kind for e in pinned.entries})
            # What a cold node ends up keeping: one object a distinct cacheable checksum.
            keys = {k for e in pinned.entries if (k := object_key(e.checksum_kind, e.checksum)) is not None}
            rows: list[Row] = []
            with counting_proxy(server.endpoint) as proxy:
                manifest = replace(pinned, repository=replace(pinned.repository, endpoint=proxy.endpoint))
                manifest_path = work / "manifest.json"
                manifest_path.write_text(manifest_to_json(manifest))

                def row(
                    name: str,
                    src: Path,
                    pod: str,
                    cache: Cache | None,
                    signed: bool = False,
                    *,
                    agent: bool = False,
                ) -> Row:
                    # No row pays for another's leftovers: dirty pages written back, a pause.
                    os.sync()
                    time.sleep(1)
                    proxy.reset()
                    started = time.monotonic()
                    seconds, cpu, system, cache_cpu, line = sync(
                        src, work, pod, manifest_path, cache, signed=signed, agent=agent
                    )
                    summary = parse_summary(line)
                    assert summary is not None, line
                    warm_after = None
                    if cache is not None and summary.node_cache_hits == 0:
                        # A cold row: until the node keeps every object (checks after the sync too).
                        before = cache.cpu()
                        while cache.stored() < len(keys) and time.monotonic() - started < 600:
                            time.sleep(0.05)
                        warm_after = time.monotonic() - started
                        assert cache_cpu is not None
                        cache_cpu += cache.cpu() - before
                    return Row(
                        name, seconds, cpu, cache_cpu, proxy.bytes_from_server, summary, warm_after, system
                    )

                rows.append(row("store only (no cache)", OUR_SOURCE, "pod-store", None))
                caches: list[tuple[str, Path, str, Cache]] = []
                # Warm syncs: each tree's, and again given the cache's public key (the digest the
                # cache signed checked instead of the pin: SHA-256, or BLAKE3 where the tree has
                # it), for each tree whose cache signs.
                signs = {label: (src / SIGNER_MODULE).exists() for label, src in trees}
                kinds_of = {label: row_kinds(src, signs[label], agent=args.agent) for label, src in trees}
                cold: dict[str, list[Row]] = {}
                try:
                    # Cold nodes: --cold-runs of each tree, taking turns (the order flipped each
                    # run), each on a new cache; the last ones stay for the warm rows.
                    for run in range(args.cold_runs):
                        if caches:
                            for *_, old in caches:
                                old.stop()
                            caches.clear()
                        order = trees if run % 2 == 0 else list(reversed(trees))
                        for label, src in order:
                            tag = "ref" if label.startswith("ref") else "new"
                            pods = [f"{tag}-cold-{run}"]
                            for suffix, *_ in kinds_of[label]:
                                pods += [
                                    f"{tag}{pod_suffix(suffix)}-warm-{i}" for i in range(args.warm_runs + 1)
                                ]
                            root = work / f"cache-{tag}"
                            shutil.rmtree(root, ignore_errors=True)
                            cache = Cache(src, root, 4 * total, work, pods, sign=signs[label])
                            caches.append((label, src, tag, cache))
                            name = f"{label}: cold node"
                            cold.setdefault(name, []).append(row(name, src, pods[0], cache))
                    for runs in cold.values():
                        median = statistics.median_low([r.seconds for r in runs])
                        rows.append(next(r for r in runs if r.seconds == median))
                    # The warm syncs take turns, so that the machine's other load falls on each.
                    warm: dict[str, list[Row]] = {}
                    for i in range(args.warm_runs):
                        for label, src, tag, cache in caches:
                            for suffix, signed, agent in kinds_of[label]:
                                name = f"{label}: warm node{suffix}"
                                pod = f"{tag}{pod_suffix(suffix)}-warm-{i}"
                                warm.setdefault(name, []).append(
                                    row(name, src, pod, cache, signed, agent=agent)
                                )
                    for runs in warm.values():
                        median = statistics.median_low([r.seconds for r in runs])
                        rows.append(next(r for r in runs if r.seconds == median))
                    if args.perf:
                        record_perf(args.perf, work, manifest_path, caches, args.warm_runs)
                finally:
                    for *_, cache in caches:
                        cache.stop()
        finally:
            server.stop()
    if args.real:
        shape = f"the real-size repository (tests/support/realrepo.py), {len(pinned.entries)} objects"
        shape += f", {total / MiB:,.0f} MiB (boto3 uploads: 8 MiB parts, a CRC32)"
    else:
        shape = f"{args.shards} shards x {args.shard_mib} MiB = {total / MiB:,.0f} MiB"
        shape += f" (parts of {args.part_mib} MiB)"
    print(f"\n{shape}, checksums {', '.join(kinds)}")
    w = max(28, *(len(r.name) for r in rows))
    head = f"| {'sync':{w}} | {'seconds':>7} | {'GiB/s':>5} | {'pod CPU s/GiB':>13} | {'of it system':>12}"
    head += f" | {'cache CPU s/GiB':>15}"
    print(f"{head} | {'from store':>13} | {'cache hits':>10} | {'node warm after s':>17} |")
    dashes = (
        f"|{'-' * (w + 2)}|{'-' * 8}:|{'-' * 6}:|{'-' * 14}:|{'-' * 13}:|{'-' * 16}:|{'-' * 14}:|{'-' * 11}:"
    )
    print(f"{dashes}|{'-' * 18}:|")
    gib = total / GiB
    for r in rows:
        hits = "-" if r.summary.node_cache_hits is None else str(r.summary.node_cache_hits)
        cache_cpu = "-" if r.cache_cpu is None else f"{r.cache_cpu / gib:.2f}"
        node_warm = "-" if r.node_warm is None else f"{r.node_warm:.2f}"
        print(
            f"| {r.name:{w}} | {r.seconds:7.2f} | {gib / r.seconds:5.2f} | {r.pod_cpu / gib:13.2f} "
            f"| {r.pod_system / gib:12.2f} | {cache_cpu:>15} | {r.from_store:13,} | {hits:>10} "
            f"| {node_warm:>17} |"
        )
    print("pod CPU: the sync process's user + system seconds a GiB; of it system: the kernel's part")
    print("from store: bytes seaweedfs sent, counted by a proxy (object bytes, headers, part-size HEADs)")
    print("node warm after: a cold row's seconds from the sync's start until the cache had kept every object")
    print(f"load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
