"""The node cache, all real: `triton-operator node-cache` as its own process on loopback, seaweedfs
behind a proxy that counts the bytes it sends (what a sync really read from the store), and
`triton-operator sync` as the init container runs it."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from counting_proxy import CountingProxy, counting_proxy
from storage_backends import Backend
from testkit import free_port, stop_process, wait_healthy
from triton_operator.adapters.storage import pin_repository
from triton_operator.core.manifest import Manifest, manifest_to_json
from triton_operator.core.startup import SyncSummary, parse_summary
from triton_operator.models import ModelSpec

pytestmark = pytest.mark.storage

MODELS = [ModelSpec(name="adder", config={"backend": "python", "maxBatchSize": 4})]
FILES = {f"models/adder/1/weights{i}.bin": os.urandom(100_000 + i) for i in range(5)}
TOTAL = sum(len(d) for d in FILES.values())


# ----------------------------------------------------------------- the node cache's process


@dataclass
class NodeCache:
    process: subprocess.Popen[bytes]
    port: int
    root: Path
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request(method, path, body)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def metrics(self) -> dict[str, float]:
        status, text = self.request("GET", "/metrics")
        assert status == 200
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text.decode()):
            for sample in family.samples:
                label = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                out[f"{sample.name}{{{label}}}" if label else sample.name] = sample.value
        return out

    def objects(self) -> set[str]:
        base = self.root / "objects"
        return {f"{p.parent.name}/{p.name}" for p in base.glob("*/*")}


@pytest.fixture
def start_cache(tmp_path: Path) -> Iterator[Callable[..., NodeCache]]:
    started: list[NodeCache] = []

    def start(size_limit: str = "1Gi", lease_seconds: float = 3600.0, root: Path | None = None) -> NodeCache:
        port = free_port()
        root = root or tmp_path / f"cache-{len(started)}"
        log = tmp_path / f"cache-{len(started)}.log"
        args = [sys.executable, "-m", "triton_operator.cli", "node-cache", "--root", str(root)]
        args += ["--size-limit", size_limit, "--address", "127.0.0.1", "--port", str(port)]
        args += ["--lease-seconds", str(lease_seconds)]
        with log.open("wb") as out:
            process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        cache = NodeCache(process, port, root, log)
        started.append(cache)
        wait_healthy(process, port, log.read_text)
        return cache

    yield start
    for cache in started:
        stop_process(cache.process)


# ----------------------------------------------------------------- the store, counted


@pytest.fixture
def store(s3_backend: Backend) -> Iterator[tuple[Manifest, CountingProxy]]:
    """The files in a new bucket, pinned; the manifest reaches seaweedfs through a counting proxy."""
    bucket = s3_backend.new_bucket()
    for key, data in FILES.items():
        s3_backend.put(bucket, key, data)
    manifest = pin_repository(s3_backend.repository(bucket), MODELS, s3_backend.credentials)
    assert {e.checksum_kind for e in manifest.entries} == {"md5"}  # S3's single-part ETags
    with counting_proxy(s3_backend.endpoint) as proxy:
        yield replace(manifest, repository=replace(manifest.repository, endpoint=proxy.endpoint)), proxy


def run_sync(
    work: Path, manifest: Manifest, env: dict[str, str], cache_url: str | None, pod: str = "pod-a"
) -> tuple[subprocess.CompletedProcess[str], SyncSummary | None]:
    """`triton-operator sync` into work/models as the init container runs it; its summary."""
    work.mkdir(parents=True, exist_ok=True)
    path = work / "manifest.json"
    path.write_text(manifest_to_json(manifest))
    log = work / "termination-log"
    log.write_text("")
    args = [sys.executable, "-m", "triton_operator.cli", "sync", "--manifest", str(path)]
    args += ["--dest", str(work / "models"), "--termination-log", str(log)]
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "GOOGLE_"))}
    if cache_url is not None:
        host, _, port = cache_url.removeprefix("http://").rpartition(":")
        clean |= {"TRITON_NODE_CACHE_HOST": host, "TRITON_NODE_CACHE_PORT": port}
    clean["TRITON_NODE_CACHE_POD"] = pod
    done = subprocess.run(
        args, env={**clean, **env}, capture_output=True, text=True, timeout=120, check=False
    )
    return done, parse_summary(log.read_text())


def assert_synced(work: Path) -> None:
    for key, data in FILES.items():
        assert (work / "models" / key.removeprefix("models/")).read_bytes() == data, key


def md5_key(data: bytes) -> str:
    return f"md5/{hashlib.md5(data, usedforsecurity=False).hexdigest()}"


# ----------------------------------------------------------------- a warm node


def test_a_second_pod_on_the_node_reads_nothing_from_the_store(
    s3_backend: Backend,
    store: tuple[Manifest, CountingProxy],
    start_cache: Callable[..., NodeCache],
    tmp_path: Path,
) -> None:
    manifest, proxy = store
    cache = start_cache()
    first, cold = run_sync(tmp_path / "pod-a", manifest, s3_backend.credentials, cache.url, "pod-a")
    assert first.returncode == 0, first.stderr
    assert_synced(tmp_path / "pod-a")
    assert cold is not None
    assert (cold.fetched, cold.node_cache_hits, cold.node_cache_misses) == (TOTAL, 0, len(FILES))
    assert proxy.bytes_from_server >= TOTAL
    # The first pod gave the node what it read (checked by the cache against each md5).
    assert cache.objects() == {md5_key(d) for d in FILES.values()}
    assert cache.metrics()["triton_node_cache_stored_total"] == len(FILES)

    proxy.reset()
    second, warm = run_sync(tmp_path / "pod-b", manifest, s3_backend.credentials, cache.url, "pod-b")
    assert second.returncode == 0, second.stderr
    assert_synced(tmp_path / "pod-b")
    assert proxy.bytes_from_server == 0  # not one byte from the store
    assert warm is not None
    assert (warm.fetched, warm.present, warm.node_cache_hits, warm.node_cache_misses) == (
        0,
        TOTAL,
        len(FILES),
        0,
    )
    metrics = cache.metrics()
    assert metrics["triton_node_cache_hits_total"] == len(FILES)
    assert metrics["triton_node_cache_hit_bytes_total"] == TOTAL


def test_a_corrupted_cache_entry_is_refused_read_from_the_store_and_healed(
    s3_backend: Backend,
    store: tuple[Manifest, CountingProxy],
    start_cache: Callable[..., NodeCache],
    tmp_path: Path,
) -> None:
    manifest, proxy = store
    cache = start_cache()
    first, _ = run_sync(tmp_path / "pod-a", manifest, s3_backend.credentials, cache.url)
    assert first.returncode == 0, first.stderr
    victim = FILES["models/adder/1/weights2.bin"]
    on_disk = cache.root / "objects" / md5_key(victim)
    spoiled = bytearray(on_disk.read_bytes())
    spoiled[1000] ^= 0xFF  # same size, one byte off: a bad disk, or someone on the node
    on_disk.write_bytes(bytes(spoiled))

    proxy.reset()
    second, summary = run_sync(tmp_path / "pod-b", manifest, s3_backend.credentials, cache.url, "pod-b")
    assert second.returncode == 0, second.stderr
    assert_synced(tmp_path / "pod-b")  # the pod got the right bytes
    assert summary is not None
    assert (summary.fetched, summary.node_cache_hits, summary.node_cache_misses) == (
        len(victim),
        len(FILES) - 1,
        1,
    )
    assert len(victim) <= proxy.bytes_from_server < TOTAL
    assert cache.metrics()["triton_node_cache_corrupt_total"] == 1
    # The cache dropped it as it served it; the pod uploaded the store's bytes, which it kept.
    assert on_disk.read_bytes() == victim

    proxy.reset()
    third, _ = run_sync(tmp_path / "pod-c", manifest, s3_backend.credentials, cache.url, "pod-c")
    assert third.returncode == 0, third.stderr
    assert proxy.bytes_from_server == 0


def test_when_the_cache_is_down_the_sync_reads_the_store(
    s3_backend: Backend, store: tuple[Manifest, CountingProxy], tmp_path: Path
) -> None:
    manifest, proxy = store
    nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    done, summary = run_sync(tmp_path / "pod-a", manifest, s3_backend.credentials, nobody)
    assert done.returncode == 0, done.stderr
    assert_synced(tmp_path / "pod-a")
    assert summary is not None
    assert (summary.fetched, summary.node_cache_hits, summary.node_cache_misses) == (TOTAL, 0, len(FILES))
    assert proxy.bytes_from_server >= TOTAL


def test_pods_syncing_at_once_each_get_every_byte_and_the_node_keeps_one_copy(
    s3_backend: Backend,
    store: tuple[Manifest, CountingProxy],
    start_cache: Callable[..., NodeCache],
    tmp_path: Path,
) -> None:
    manifest, proxy = store
    cache = start_cache()
    pods = [f"pod-{i}" for i in range(4)]
    with ThreadPoolExecutor(len(pods)) as pool:
        results = list(
            pool.map(
                lambda pod: run_sync(tmp_path / pod, manifest, s3_backend.credentials, cache.url, pod), pods
            )
        )
    for pod, (done, summary) in zip(pods, results, strict=True):
        assert done.returncode == 0, done.stderr
        assert summary is not None
        assert_synced(tmp_path / pod)
    assert cache.objects() == {md5_key(d) for d in FILES.values()}
    for key in cache.objects():
        assert (
            hashlib.md5((cache.root / "objects" / key).read_bytes(), usedforsecurity=False).hexdigest()
            == (key.split("/")[1])
        )
    assert not list((cache.root / "tmp").iterdir())  # no write left half-done
    assert cache.metrics()["triton_node_cache_stored_total"] == len(FILES)  # each object kept once

    proxy.reset()
    later, _ = run_sync(tmp_path / "later", manifest, s3_backend.credentials, cache.url, "later")
    assert later.returncode == 0, later.stderr
    assert proxy.bytes_from_server == 0


# ----------------------------------------------------------------- what the cache takes


def test_the_cache_keeps_only_bytes_that_match_their_key(start_cache: Callable[..., NodeCache]) -> None:
    cache = start_cache()
    real, forged = os.urandom(5000), os.urandom(5000)
    key = md5_key(real)
    assert cache.request("PUT", f"/v1/objects/{key}", forged)[0] == 422
    assert cache.request("GET", f"/v1/objects/{key}")[0] == 404
    assert cache.request("PUT", f"/v1/objects/{key}", real[:-1])[0] == 422  # cut short: other bytes
    assert cache.request("GET", f"/v1/objects/{key}")[0] == 404
    # A CRC is no digest (anyone can make bytes with a chosen CRC): never cached.
    assert cache.request("PUT", "/v1/objects/crc32c/00000000", real)[0] == 400
    assert cache.request("PUT", "/v1/objects/s3-multipart/" + "0" * 32 + "-2", real)[0] in (400, 404)
    assert cache.objects() == set()
    assert not list((cache.root / "tmp").iterdir())

    assert cache.request("PUT", f"/v1/objects/{key}", real)[0] == 201
    assert cache.request("GET", f"/v1/objects/{key}") == (200, real)
    assert cache.request("PUT", f"/v1/objects/{key}", real)[0] == 409  # present
    metrics = cache.metrics()
    assert metrics["triton_node_cache_refused_uploads_total{reason=checksum}"] == 2
    assert metrics["triton_node_cache_refused_uploads_total{reason=kind}"] >= 1


def test_eviction_keeps_the_bound_and_never_takes_a_leased_object(
    start_cache: Callable[..., NodeCache],
) -> None:
    cache = start_cache(size_limit="350k")  # room for three objects of 100 000 bytes
    blobs = {name: os.urandom(100_000) for name in "abcde"}
    keys = {name: md5_key(data) for name, data in blobs.items()}
    for name in "abc":
        assert cache.request("PUT", f"/v1/objects/{keys[name]}", blobs[name])[0] == 201
    # A pod syncing a revision leases "a" (the oldest); "b" is read again, so "c" is now the least
    # recently used of the objects no lease holds.
    kind, checksum = keys["a"].split("/")
    status, body = cache.request(
        "POST", "/v1/leases", json.dumps({"pod": "p1", "objects": [[kind, checksum]]}).encode()
    )
    assert (status, json.loads(body)) == (200, {"held": [keys["a"]], "part_sizes": {}})
    assert cache.request("GET", f"/v1/objects/{keys['b']}")[0] == 200

    assert cache.request("PUT", f"/v1/objects/{keys['d']}", blobs["d"])[0] == 201
    assert cache.objects() == {keys["a"], keys["b"], keys["d"]}
    assert cache.request("GET", f"/v1/objects/{keys['c']}")[0] == 404

    # Every object leased: no room is made, the upload is refused and nothing is evicted.
    objects = [k.split("/") for k in (keys["b"], keys["d"])]
    assert (
        cache.request("POST", "/v1/leases", json.dumps({"pod": "p2", "objects": objects}).encode())[0] == 200
    )
    assert cache.request("PUT", f"/v1/objects/{keys['e']}", blobs["e"])[0] == 507
    assert cache.objects() == {keys["a"], keys["b"], keys["d"]}
    # An object bigger than the whole cache is refused outright.
    assert cache.request("PUT", f"/v1/objects/{md5_key(b'x' * 400_000)}", b"x" * 400_000)[0] == 413
    metrics = cache.metrics()
    assert metrics["triton_node_cache_evictions_total"] == 1
    assert metrics["triton_node_cache_bytes"] == 300_000 <= metrics["triton_node_cache_limit_bytes"]
    assert metrics["triton_node_cache_leased_bytes"] == 300_000


def test_a_restarted_cache_keeps_its_objects_and_drops_half_written_ones(
    start_cache: Callable[..., NodeCache],
) -> None:
    cache = start_cache()
    data = os.urandom(10_000)
    assert cache.request("PUT", f"/v1/objects/{md5_key(data)}", data)[0] == 201
    stop_process(cache.process)
    (cache.root / "tmp" / "md5-cut-short").write_bytes(b"half")  # an upload the stop cut short
    (cache.root / "objects" / "md5" / "not-a-digest").write_bytes(b"junk")

    again = start_cache(root=cache.root)
    assert again.objects() == {md5_key(data)}
    assert again.request("GET", f"/v1/objects/{md5_key(data)}") == (200, data)
    assert not list((cache.root / "tmp").iterdir())
    assert again.metrics()["triton_node_cache_bytes"] == len(data)


# ----------------------------------------------------------------- S3 multipart uploads

PART = 5 * 1024 * 1024
BIG = os.urandom(2 * PART + 12345)  # three parts: most model files are uploaded so (aws s3 cp, boto3)


def multipart_etag(data: bytes, part: int) -> str:
    digests = [
        hashlib.md5(data[i : i + part], usedforsecurity=False).digest() for i in range(0, len(data), part)
    ]
    return hashlib.md5(b"".join(digests), usedforsecurity=False).hexdigest() + f"-{len(digests)}"


def test_multipart_uploads_are_cached_checked_with_their_part_size(
    s3_backend: Backend, start_cache: Callable[..., NodeCache], tmp_path: Path
) -> None:
    bucket = s3_backend.new_bucket()
    s3_backend.put(bucket, "models/adder/1/weights.bin", BIG, part_size=PART)
    s3_backend.put(bucket, "models/adder/1/small.bin", FILES["models/adder/1/weights0.bin"])
    pinned = pin_repository(s3_backend.repository(bucket), MODELS, s3_backend.credentials)
    kinds = {e.dest.rsplit("/", 1)[1]: (e.checksum_kind, e.checksum) for e in pinned.entries}
    assert kinds["weights.bin"] == ("s3-multipart", multipart_etag(BIG, PART))
    key = "s3-multipart/" + multipart_etag(BIG, PART)
    cache = start_cache()
    with counting_proxy(s3_backend.endpoint) as proxy:
        manifest = replace(pinned, repository=replace(pinned.repository, endpoint=proxy.endpoint))
        first, cold = run_sync(tmp_path / "pod-a", manifest, s3_backend.credentials, cache.url, "pod-a")
        assert first.returncode == 0, first.stderr
        assert cold is not None and cold.fetched == len(BIG) + len(FILES["models/adder/1/weights0.bin"])
        assert key in cache.objects()  # the cache checked it with the part size the pod named

        proxy.reset()
        second, warm = run_sync(tmp_path / "pod-b", manifest, s3_backend.credentials, cache.url, "pod-b")
        assert second.returncode == 0, second.stderr
        assert (tmp_path / "pod-b" / "models" / "adder" / "1" / "weights.bin").read_bytes() == BIG
        assert warm is not None
        assert (warm.fetched, warm.node_cache_hits, warm.node_cache_misses) == (0, 2, 0)
        # Not one request to the store: the cache told the pod the part size it checked the upload
        # with, and the pod checked the cache's bytes with it.
        assert proxy.bytes_from_server == 0

        # A wrong copy on the node: the pod refuses it (it checks with its store's part size), reads
        # the store, and tells the cache, which checks its own copy and takes the right one.
        on_disk = cache.root / "objects" / key
        spoiled = bytearray(on_disk.read_bytes())
        spoiled[PART + 7] ^= 0x01
        on_disk.write_bytes(bytes(spoiled))
        third, healed = run_sync(tmp_path / "pod-c", manifest, s3_backend.credentials, cache.url, "pod-c")
        assert third.returncode == 0, third.stderr
        assert (tmp_path / "pod-c" / "models" / "adder" / "1" / "weights.bin").read_bytes() == BIG
        assert healed is not None and (healed.fetched, healed.node_cache_hits) == (len(BIG), 1)
        assert on_disk.read_bytes() == BIG
        assert cache.metrics()["triton_node_cache_corrupt_total"] == 1

        # The part size the cache tells is only what a pod checks with: a wrong one (a tampered
        # record, read at the cache's restart) fails the cache's copy, the pod reads the store with
        # the store's part size, and its upload sets the record right (the copy was right).
        stop_process(cache.process)
        record = cache.root / "parts" / key
        assert record.read_text().strip() == str(PART)
        record.write_text(f"{PART + 1}\n")  # still three parts, not the upload's
        again = start_cache(root=cache.root)
        fourth, wrong = run_sync(tmp_path / "pod-d", manifest, s3_backend.credentials, again.url, "pod-d")
        assert fourth.returncode == 0, fourth.stderr
        assert (tmp_path / "pod-d" / "models" / "adder" / "1" / "weights.bin").read_bytes() == BIG
        assert wrong is not None and (wrong.fetched, wrong.node_cache_hits) == (len(BIG), 1)
        assert record.read_text().strip() == str(PART)
        proxy.reset()
        fifth, right = run_sync(tmp_path / "pod-e", manifest, s3_backend.credentials, again.url, "pod-e")
        assert fifth.returncode == 0, fifth.stderr
        assert right is not None and (right.fetched, right.node_cache_hits) == (0, 2)
        assert proxy.bytes_from_server == 0


def test_a_multipart_upload_is_kept_only_with_the_part_size_that_makes_its_etag(
    start_cache: Callable[..., NodeCache],
) -> None:
    cache = start_cache()
    path = f"/v1/objects/s3-multipart/{multipart_etag(BIG, PART)}"

    def put(headers: dict[str, str]) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", cache.port, timeout=30)
        try:
            conn.request("PUT", path, BIG, headers)
            return conn.getresponse().status
        finally:
            conn.close()

    assert put({}) == 400  # no part size: nothing to check the ETag with
    assert put({"X-Part-Size": str(PART + 1)}) == 422  # three parts, but not these
    assert put({"X-Part-Size": "1"}) == 400  # millions of parts, not three: refused before hashing
    assert cache.objects() == set()
    assert put({"X-Part-Size": str(PART)}) == 201
    assert cache.request("GET", path) == (200, BIG)


# ----------------------------------------------------------------- in-place pods: the agent


def run_agent_once(
    work: Path, manifest: Manifest, env: dict[str, str], cache_url: str, pod: str
) -> tuple[subprocess.CompletedProcess[str], SyncSummary | None]:
    """`triton-operator agent --once` into work/models, as the init container of a pod with
    modelUpdates InPlace runs it (its base revision's manifest and configs); its summary."""
    from triton_operator.core.modelconfig import build_config_pbtxt  # noqa: PLC0415

    for folder in ("configs", "inplace", "state"):
        (work / folder).mkdir(parents=True, exist_ok=True)
    for model in MODELS:
        (work / "configs" / model.name).mkdir(exist_ok=True)
        (work / "configs" / model.name / "config.pbtxt").write_text(
            build_config_pbtxt(model.name, model.config)
        )
    (work / "manifest.json").write_text(manifest_to_json(manifest))
    log = work / "termination-log"
    log.write_text("")
    args = [sys.executable, "-m", "triton_operator.cli", "agent", "--once", "--base-revision", "r1"]
    args += ["--manifest", str(work / "manifest.json"), "--configs", str(work / "configs")]
    args += ["--dest", str(work / "models"), "--inplace-dir", str(work / "inplace")]
    args += ["--target-file", str(work / "no-target"), "--state-dir", str(work / "state")]
    args += ["--termination-log", str(log)]
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "GOOGLE_"))}
    host, _, port = cache_url.removeprefix("http://").rpartition(":")
    clean |= {"TRITON_NODE_CACHE_HOST": host, "TRITON_NODE_CACHE_PORT": port, "TRITON_NODE_CACHE_POD": pod}
    done = subprocess.run(
        args, env={**clean, **env}, capture_output=True, text=True, timeout=120, check=False
    )
    return done, parse_summary(log.read_text())


def test_an_in_place_pods_agent_reads_a_warm_node_from_its_cache(
    s3_backend: Backend,
    store: tuple[Manifest, CountingProxy],
    start_cache: Callable[..., NodeCache],
    tmp_path: Path,
) -> None:
    """A pod with modelUpdates InPlace syncs with `agent --once`: it too gives the node what it read,
    a second pod reads 0 bytes from the store, and both leave sync's summary (status.timeToServe's
    bytes) as their termination message."""
    manifest, proxy = store
    cache = start_cache()
    first, cold = run_agent_once(tmp_path / "pod-a", manifest, s3_backend.credentials, cache.url, "pod-a")
    assert first.returncode == 0, first.stderr
    assert_synced(tmp_path / "pod-a")
    assert cold is not None
    assert (cold.fetched, cold.node_cache_hits, cold.node_cache_misses) == (TOTAL, 0, len(FILES))
    assert cache.objects() == {md5_key(d) for d in FILES.values()}

    proxy.reset()
    second, warm = run_agent_once(tmp_path / "pod-b", manifest, s3_backend.credentials, cache.url, "pod-b")
    assert second.returncode == 0, second.stderr
    assert_synced(tmp_path / "pod-b")
    assert proxy.bytes_from_server == 0
    assert warm is not None
    assert (warm.fetched, warm.present, warm.node_cache_hits, warm.node_cache_misses) == (
        0,
        TOTAL,
        len(FILES),
        0,
    )


def test_the_store_downloads_what_the_node_lacks_while_the_node_cache_gives_the_rest(
    s3_backend: Backend, start_cache: Callable[..., NodeCache], tmp_path: Path
) -> None:
    """A new revision that keeps most files: the node cache gives those and the store the new one at
    the same time, not one after the other (the sync's time is the longer of the two, not their sum).
    The cache is behind a slow link here (50 kB/s a connection), so its reads take seconds."""
    bucket = s3_backend.new_bucket()
    for key, data in FILES.items():
        s3_backend.put(bucket, key, data)
    cache = start_cache()
    kept = pin_repository(s3_backend.repository(bucket), MODELS, s3_backend.credentials)
    first, _ = run_sync(tmp_path / "pod-a", kept, s3_backend.credentials, cache.url, "pod-a")
    assert first.returncode == 0, first.stderr
    assert cache.objects() == {md5_key(d) for d in FILES.values()}  # the node holds every kept file

    new = os.urandom(200_000)
    s3_backend.put(bucket, "models/adder/1/new.bin", new)
    manifest = pin_repository(s3_backend.repository(bucket), MODELS, s3_backend.credentials)
    with counting_proxy(s3_backend.endpoint) as store, counting_proxy(cache.url, rate=50_000) as slow:
        via = replace(manifest, repository=replace(manifest.repository, endpoint=store.endpoint))
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(
                run_sync, tmp_path / "pod-b", via, s3_backend.credentials, slow.endpoint, "pod-b"
            )
            while store.bytes_from_server < len(new) and not running.done():
                time.sleep(0.01)
            from_cache_meanwhile = slow.bytes_from_server
            done, summary = running.result(timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "pod-b" / "models" / "adder" / "1" / "new.bin").read_bytes() == new
    assert summary is not None
    assert (summary.fetched, summary.node_cache_hits, summary.node_cache_misses) == (len(new), len(FILES), 1)
    # The store had sent the new file before the cache had sent half of the kept ones.
    assert store.bytes_from_server >= len(new)
    assert from_cache_meanwhile < TOTAL / 2, (from_cache_meanwhile, TOTAL)
