"""The node cache, real but for who its callers are: `NodeCacheServer` on loopback (in this process,
with `FakeTokenReviewer` standing in for the API server's TokenReview), seaweedfs behind a proxy that
counts the bytes it sends (what a sync really read from the store), and `triton-operator sync` as
the init container runs it, with its pod's token in a file."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import blake3
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from prometheus_client.parser import text_string_to_metric_families

from counting_proxy import CountingProxy, counting_proxy
from fake_token_reviewer import FakeTokenReviewer
from storage_backends import Backend
from testkit import free_port
from triton_operator.adapters.nodecache.client import NodeCacheClient
from triton_operator.adapters.nodecache.server import NodeCacheServer, ServerThread
from triton_operator.adapters.nodecache.statements import Signer
from triton_operator.adapters.nodecache.store import ContentStore
from triton_operator.adapters.nodecache.views import MNT_DETACH, LinuxMounter, Views, mount_points
from triton_operator.adapters.storage import pin_repository
from triton_operator.core.pod.startup import SyncSummary, parse_summary
from triton_operator.core.repository.manifest import Manifest, ManifestEntry, manifest_to_json
from triton_operator.core.repository.shared_files import (
    EPHEMERAL_KEY,
    FILES_ENV,
    POD_NAMESPACE_KEY,
    POD_UID_KEY,
)
from triton_operator.models import ModelSpec
from triton_operator.quantities import quantity_bytes

pytestmark = pytest.mark.storage

MODELS = [ModelSpec(name="adder", config={"backend": "python", "maxBatchSize": 4})]
FILES = {f"models/adder/1/weights{i}.bin": os.urandom(100_000 + i) for i in range(5)}
TOTAL = sum(len(d) for d in FILES.values())
NAMESPACE = "team-a"


# ----------------------------------------------------------------- the node cache


@dataclass
class NodeCache:
    thread: ServerThread
    reviewer: FakeTokenReviewer
    root: Path
    tokens: dict[tuple[str, str], str] = field(default_factory=dict)

    @property
    def port(self) -> int:
        return self.thread.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def store(self) -> ContentStore:
        return self.thread.server.store

    def token(self, pod: str = "tester", namespace: str = NAMESPACE) -> str:
        """The pod's token (one per pod, as the kubelet projects it)."""
        if (namespace, pod) not in self.tokens:
            self.tokens[(namespace, pod)] = self.reviewer.issue(namespace, pod)
        return self.tokens[(namespace, pod)]

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        *,
        pod: str = "tester",
        namespace: str = NAMESPACE,
        token: str | None = "",
    ) -> tuple[int, bytes]:
        """One request as ``pod`` of ``namespace`` (``token``: None sends none, "" the pod's own)."""
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {token or self.token(pod, namespace)}"
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body, sent)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def lease(
        self, objects: dict[str, int], pod: str = "tester", namespace: str = NAMESPACE
    ) -> tuple[int, Any]:
        """Lease ``objects`` (key -> size) for ``pod``; (status, answer)."""
        body = {"pod": pod, "objects": [[*k.split("/"), size] for k, size in objects.items()]}
        status, data = self.request(
            "POST", "/v1/leases", json.dumps(body).encode(), pod=pod, namespace=namespace
        )
        return status, json.loads(data) if status == 200 else data

    def put(
        self,
        key: str,
        data: bytes,
        pod: str = "tester",
        namespace: str = NAMESPACE,
        headers: dict[str, str] | None = None,
    ) -> int:
        """Lease ``key`` for ``pod`` (with the size of ``data``) and upload ``data`` under it."""
        status, _ = self.lease({key: len(data)}, pod, namespace)
        assert status == 200
        return self.request("PUT", f"/v1/objects/{key}", data, headers, pod=pod, namespace=namespace)[0]

    def metrics(self) -> dict[str, float]:
        """The cache's metrics, once the checks of uploads it answered 202 to are done."""
        assert self.store.settle()
        status, text = self.request("GET", "/metrics", token=None)
        assert status == 200
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text.decode()):
            for sample in family.samples:
                label = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                out[f"{sample.name}{{{label}}}" if label else sample.name] = sample.value
        return out

    def objects(self, namespace: str = NAMESPACE) -> set[str]:
        """The keys the namespace's index holds on disk (the deferred checks done)."""
        assert self.store.settle()
        base = self.root / "index" / namespace
        return {f"{p.parent.name}/{p.name}" for p in base.glob("*/*")}

    def blob(self, key: str, namespace: str = NAMESPACE) -> Path:
        """The blob the namespace's key names (its bytes, named by their SHA-256)."""
        assert self.store.settle()
        name = (self.root / "index" / namespace / key).read_text().split()[0]
        return self.root / "blobs" / name

    def stop(self) -> None:
        self.thread.stop()


@pytest.fixture
def start_cache(tmp_path: Path) -> Iterator[Callable[..., NodeCache]]:
    started: list[NodeCache] = []

    def start(
        size_limit: str = "1Gi",
        lease_seconds: float = 3600.0,
        root: Path | None = None,
        reviewer: FakeTokenReviewer | None = None,
        *,
        views: bool = False,
        **options: Any,
    ) -> NodeCache:
        root = root or tmp_path / f"cache-{len(started)}"
        reviewer = reviewer or FakeTokenReviewer()
        store = ContentStore(root, quantity_bytes(size_limit), lease_seconds)
        if views:  # pods' read-only views of its files (real bind mounts: root)
            options["views"] = Views(root, store, LinuxMounter())
        thread = ServerThread(NodeCacheServer(store, reviewer, **options))
        thread.start()
        cache = NodeCache(thread, reviewer, root)
        started.append(cache)
        return cache

    yield start
    for cache in started:
        if not cache.thread.loop.is_closed():
            cache.stop()


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
    work: Path,
    manifest: Manifest,
    env: dict[str, str],
    cache: NodeCache | str | None,
    pod: str = "pod-a",
    *,
    namespace: str = NAMESPACE,
    token: str | None = None,
    extra: tuple[str, ...] = (),
) -> tuple[subprocess.CompletedProcess[str], SyncSummary | None]:
    """`triton-operator sync` into work/models as the init container of ``pod`` of ``namespace``
    runs it, with the pod's token (``token``, else the cache's for the pod) and ``extra``
    arguments; its summary."""
    work.mkdir(parents=True, exist_ok=True)
    path = work / "manifest.json"
    path.write_text(manifest_to_json(manifest))
    log = work / "termination-log"
    log.write_text("")
    args = [sys.executable, "-m", "triton_operator.cli", "sync", "--manifest", str(path)]
    args += ["--dest", str(work / "models"), "--termination-log", str(log), *extra]
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "GOOGLE_"))}
    clean |= cache_env(work, cache, pod, namespace, token)
    done = subprocess.run(
        args, env={**clean, **env}, capture_output=True, text=True, timeout=120, check=False
    )
    return done, parse_summary(log.read_text())


def cache_env(
    work: Path, cache: NodeCache | str | None, pod: str, namespace: str, token: str | None
) -> dict[str, str]:
    """The node cache's variables of the pod's sync container, its token written to a file."""
    out = {"TRITON_NODE_CACHE_POD": pod}
    if cache is None:
        return out
    url = cache if isinstance(cache, str) else cache.url
    if token is None and isinstance(cache, NodeCache):
        token = cache.token(pod, namespace)
    host, _, port = url.removeprefix("http://").rpartition(":")
    out |= {"TRITON_NODE_CACHE_HOST": host, "TRITON_NODE_CACHE_PORT": port}
    if token is not None:
        (work / "token").write_text(token)
        out["TRITON_NODE_CACHE_TOKEN"] = str(work / "token")
    return out


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
    first, cold = run_sync(tmp_path / "pod-a", manifest, s3_backend.credentials, cache, "pod-a")
    assert first.returncode == 0, first.stderr
    assert_synced(tmp_path / "pod-a")
    assert cold is not None
    assert (cold.fetched, cold.node_cache_hits, cold.node_cache_misses) == (TOTAL, 0, len(FILES))
    assert proxy.bytes_from_server >= TOTAL
    # The first pod gave the node what it read (checked by the cache against each md5).
    assert cache.objects() == {md5_key(d) for d in FILES.values()}
    assert cache.metrics()["triton_node_cache_stored_total"] == len(FILES)

    proxy.reset()
    second, warm = run_sync(tmp_path / "pod-b", manifest, s3_backend.credentials, cache, "pod-b")
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
    # Each pod's token was reviewed once, however many requests it made (lease, reads, uploads).
    assert cache.reviewer.reviews == 2


def test_a_corrupted_cache_entry_is_refused_read_from_the_store_and_healed(
    s3_backend: Backend,
    store: tuple[Manifest, CountingProxy],
    start_cache: Callable[..., NodeCache],
    tmp_path: Path,
) -> None:
    manifest, proxy = store
    cache = start_cache()
    first, _ = run_sync(tmp_path / "pod-a", manifest, s3_backend.credentials, cache)
    assert first.returncode == 0, first.stderr
    victim = FILES["models/adder/1/weights2.bin"]
    on_disk = cache.blob(md5_key(victim))
    spoiled = bytearray(on_disk.read_bytes())
    spoiled[1000] ^= 0xFF  # same size, one byte off: a bad disk, or someone on the node
    on_disk.write_bytes(bytes(spoiled))

    proxy.reset()
    second, summary = run_sync(tmp_path / "pod-b", manifest, s3_backend.credentials, cache, "pod-b")
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
    assert cache.blob(md5_key(victim)).read_bytes() == victim

    proxy.reset()
    third, _ = run_sync(tmp_path / "pod-c", manifest, s3_backend.credentials, cache, "pod-c")
    assert third.returncode == 0, third.stderr
    assert proxy.bytes_from_server == 0


# ----------------------------------------------------------------- signed statements


def new_signer() -> Signer:
    return Signer(Ed25519PrivateKey.generate())


def sync_stats(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The sync's own figures (the last line of ``--progress json``)."""
    summary: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["event"] == "summary", summary
    return summary


def test_a_pod_given_the_key_checks_the_sha256_the_cache_signed_and_refuses_spoiled_bytes(
    s3_backend: Backend,
    store: tuple[Manifest, CountingProxy],
    start_cache: Callable[..., NodeCache],
    tmp_path: Path,
) -> None:
    """With the cache's public key, a warm pod checks each file by the SHA-256 the cache signed for
    it (not its MD5 pin), and still every byte: a blob spoiled on the node fails that check and the
    file comes from the store."""
    manifest, proxy = store
    signer = new_signer()
    cache = start_cache(signer=signer)
    keyed = {"TRITON_NODE_CACHE_PUBLIC_KEY": signer.public_key()}
    first, _ = run_sync(tmp_path / "pod-a", manifest, s3_backend.credentials, cache)
    assert first.returncode == 0, first.stderr

    proxy.reset()
    warm, summary = run_sync(
        tmp_path / "pod-b",
        manifest,
        s3_backend.credentials | keyed,
        cache,
        "pod-b",
        extra=("--progress", "json"),
    )
    assert warm.returncode == 0, warm.stderr
    assert_synced(tmp_path / "pod-b")
    assert summary is not None and (summary.fetched, summary.node_cache_hits) == (0, len(FILES))
    assert proxy.bytes_from_server == 0
    assert sync_stats(warm)["vouched_files"] == len(FILES)
    assert summary.node_cache_vouched == len(FILES)  # its termination message says so too

    victim = FILES["models/adder/1/weights2.bin"]
    on_disk = cache.blob(md5_key(victim))
    spoiled = bytearray(on_disk.read_bytes())
    spoiled[1000] ^= 0xFF  # same size, one byte off; the statement still names the blob's SHA-256
    on_disk.write_bytes(bytes(spoiled))
    proxy.reset()
    third, summary = run_sync(
        tmp_path / "pod-c",
        manifest,
        s3_backend.credentials | keyed,
        cache,
        "pod-c",
        extra=("--progress", "json"),
    )
    assert third.returncode == 0, third.stderr
    assert_synced(tmp_path / "pod-c")  # the spoiled bytes were refused
    assert summary is not None and (summary.fetched, summary.node_cache_hits) == (len(victim), len(FILES) - 1)
    stats = sync_stats(third)
    assert (stats["vouched_files"], stats["source_refused"]) == (len(FILES) - 1, 1)
    assert summary.node_cache_vouched == len(FILES) - 1


def test_an_impostor_on_the_port_cannot_make_a_pod_take_its_bytes(
    s3_backend: Backend,
    store: tuple[Manifest, CountingProxy],
    start_cache: Callable[..., NodeCache],
    tmp_path: Path,
) -> None:
    """Whoever holds the cache's port without its key: its own signatures over forged bytes (whose
    SHA-256 it names truly) are refused, the pod checks its pin, which the forged bytes fail, and
    reads the store. A pod that took any statement, or none at all, would place the forged bytes."""
    manifest, _proxy = store
    real_key = new_signer()
    root = tmp_path / "impostor"
    for data in FILES.values():
        forged = os.urandom(len(data))
        blob = hashlib.sha256(forged).hexdigest()
        (root / "blobs").mkdir(parents=True, exist_ok=True)
        (root / "blobs" / blob).write_bytes(forged)
        index = root / "index" / NAMESPACE / md5_key(data)
        index.parent.mkdir(parents=True, exist_ok=True)
        index.write_text(f"{blob}\n")
    impostor = start_cache(root=root, signer=new_signer())
    assert len(impostor.objects()) == len(FILES)  # it says it holds every file
    keyed = {"TRITON_NODE_CACHE_PUBLIC_KEY": real_key.public_key()}
    done, summary = run_sync(
        tmp_path / "pod-a", manifest, s3_backend.credentials | keyed, impostor, extra=("--progress", "json")
    )
    assert done.returncode == 0, done.stderr
    assert_synced(tmp_path / "pod-a")
    stats = sync_stats(done)
    assert (stats["vouched_files"], stats["source_refused"]) == (0, len(FILES))
    assert summary is not None and summary.fetched == TOTAL
    assert summary.node_cache_vouched == 0
    assert "statements were refused" in done.stderr


def test_a_pod_checks_the_blake3_the_cache_signed_and_an_older_caches_sha256(
    s3_backend: Backend,
    store: tuple[Manifest, CountingProxy],
    start_cache: Callable[..., NodeCache],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cache records each blob's BLAKE3 as it takes the bytes and signs it (statement /2); a
    pod checks that: a BLAKE3 record gone wrong makes it refuse the (intact) bytes, read the store,
    and the cache, asked to hash its copy again, drops it and keeps the pod's upload with the right
    record. An answer without a /2 statement (a cache from before) is checked by its SHA-256."""
    manifest, proxy = store
    signer = new_signer()
    cache = start_cache(signer=signer)
    keyed = s3_backend.credentials | {"TRITON_NODE_CACHE_PUBLIC_KEY": signer.public_key()}
    first, _ = run_sync(tmp_path / "pod-a", manifest, s3_backend.credentials, cache)
    assert first.returncode == 0, first.stderr
    victim = FILES["models/adder/1/weights2.bin"]
    record = cache.root / "blake3" / cache.blob(md5_key(victim)).name
    assert record.read_text().strip() == blake3.blake3(victim).hexdigest()
    record.write_text(blake3.blake3(b"other bytes").hexdigest() + "\n")
    restarted = start_cache(root=cache.root, reviewer=cache.reviewer, signer=signer)  # reads the records
    cache.stop()

    signed = NodeCacheServer._statements
    monkeypatch.setattr(
        NodeCacheServer,
        "_statements",
        lambda self, caller, held: {k: v for k, v in signed(self, caller, held).items() if k != "blake3"},
    )
    proxy.reset()
    older, summary = run_sync(
        tmp_path / "pod-b", manifest, keyed, restarted, "pod-b", extra=("--progress", "json")
    )
    assert older.returncode == 0, older.stderr
    assert_synced(tmp_path / "pod-b")
    assert (sync_stats(older)["vouched_files"], sync_stats(older)["source_refused"]) == (len(FILES), 0)
    assert proxy.bytes_from_server == 0  # SHA-256 checked: the BLAKE3 record is not used

    monkeypatch.setattr(NodeCacheServer, "_statements", signed)
    proxy.reset()
    warm, summary = run_sync(
        tmp_path / "pod-c", manifest, keyed, restarted, "pod-c", extra=("--progress", "json")
    )
    assert warm.returncode == 0, warm.stderr
    assert_synced(tmp_path / "pod-c")
    stats = sync_stats(warm)
    assert (stats["vouched_files"], stats["source_refused"]) == (len(FILES) - 1, 1)
    assert summary is not None and summary.fetched == len(victim)
    assert restarted.metrics()["triton_node_cache_corrupt_total"] == 1  # its recheck of both digests
    healed = cache.root / "blake3" / restarted.blob(md5_key(victim)).name
    assert healed.read_text().strip() == blake3.blake3(victim).hexdigest()


@pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root (the cache's DaemonSet runs privileged)")
def test_a_pod_with_a_view_links_to_the_caches_files_checked_and_copies_nothing(
    s3_backend: Backend,
    store: tuple[Manifest, CountingProxy],
    start_cache: Callable[..., NodeCache],
    tmp_path: Path,
) -> None:
    """A pod given the cache's CSI volume (its view mounted where $TRITON_NODE_CACHE_FILES says)
    gets each held object as a symlink to the cache's own file, checked first against the BLAKE3
    the cache signed: no byte copied, none from the store. Its next sync finds them present; a file
    that went bad on the cache's disk is refused and read from the store into a file of its own."""
    manifest, proxy = store
    signer = new_signer()
    cache = start_cache(signer=signer, views=True)
    keyed = s3_backend.credentials | {"TRITON_NODE_CACHE_PUBLIC_KEY": signer.public_key()}
    first, _ = run_sync(tmp_path / "pod-a", manifest, s3_backend.credentials, cache)
    assert first.returncode == 0, first.stderr
    views = cache.thread.server.views
    assert views is not None
    kubelet = Path(tempfile.mkdtemp(prefix="kl.", dir="/tmp"))

    def pod_with_view() -> tuple[str, dict[str, str]]:
        uid = str(uuid.uuid4())
        target = kubelet / "pods" / uid / "volumes" / "kubernetes.io~csi" / "node-cache-files" / "mount"
        views.publish({POD_UID_KEY: uid, POD_NAMESPACE_KEY: NAMESPACE, EPHEMERAL_KEY: "true"}, str(target))
        return uid, keyed | {FILES_ENV: str(target)}

    try:
        uid, env = pod_with_view()
        proxy.reset()
        warm, _ = run_sync(tmp_path / "pod-b", manifest, env, cache, uid, extra=("--progress", "json"))
        assert warm.returncode == 0, warm.stderr
        assert_synced(tmp_path / "pod-b")  # through the links
        assert proxy.bytes_from_server == 0
        stats = sync_stats(warm)
        assert (stats["shared_files"], stats["vouched_files"], stats["source_refused"]) == (
            len(FILES),
        ) * 2 + (0,)
        for key, data in FILES.items():
            placed = tmp_path / "pod-b" / "models" / key.removeprefix("models/")
            assert placed.is_symlink()
            assert os.readlink(placed) == f"{env[FILES_ENV]}/{cache.blob(md5_key(data)).name}"
        assert cache.metrics()["triton_node_cache_hit_bytes_total"] == 0  # nothing sent over HTTP
        again, _ = run_sync(tmp_path / "pod-b", manifest, env, cache, uid, extra=("--progress", "json"))
        assert again.returncode == 0, again.stderr
        assert sync_stats(again)["present_files"] == len(FILES)

        victim = FILES["models/adder/1/weights2.bin"]
        on_disk = cache.blob(md5_key(victim))
        spoiled = bytearray(on_disk.read_bytes())
        spoiled[1000] ^= 0xFF  # same size, one byte off: a bad disk, or root on the node
        on_disk.write_bytes(bytes(spoiled))
        other, env = pod_with_view()
        proxy.reset()
        third, _ = run_sync(tmp_path / "pod-c", manifest, env, cache, other, extra=("--progress", "json"))
        assert third.returncode == 0, third.stderr
        assert_synced(tmp_path / "pod-c")
        stats = sync_stats(third)
        assert stats["shared_files"] == len(FILES) - 1 and stats["source_refused"] >= 1
        fetched = tmp_path / "pod-c" / "models" / "adder/1/weights2.bin"
        assert not fetched.is_symlink() and fetched.read_bytes() == victim
        assert len(victim) <= proxy.bytes_from_server < TOTAL
    finally:
        for point in sorted((m for m in mount_points() if m.startswith(str(kubelet))), key=len, reverse=True):
            LinuxMounter()._call("umount2", os.fsencode(point), MNT_DETACH)
        shutil.rmtree(kubelet)


def test_a_cache_from_before_blake3_computes_it_at_start_and_drops_spoiled_blobs(
    start_cache: Callable[..., NodeCache],
) -> None:
    signer = new_signer()
    cache = start_cache(signer=signer)
    intact, spoiled = os.urandom(300_000), os.urandom(200_000)
    assert cache.put(md5_key(intact), intact) == 201
    assert cache.put(md5_key(spoiled), spoiled) == 201
    blob = cache.blob(md5_key(spoiled))
    cache.stop()
    shutil.rmtree(cache.root / "blake3")  # as a version before BLAKE3 left it
    blob.write_bytes(b"x" + spoiled[1:])

    again = start_cache(root=cache.root, reviewer=cache.reviewer, signer=signer)
    deadline = time.monotonic() + 30

    def blake3_of(data: bytes) -> str | None:
        found = again.store.blob_of(NAMESPACE, md5_key(data))
        return found[2] if found is not None else None

    while blake3_of(intact) is None:
        assert time.monotonic() < deadline, "no BLAKE3 computed for the blob kept from before"
        time.sleep(0.05)
    while again.store.holds(NAMESPACE, md5_key(spoiled)):
        assert time.monotonic() < deadline, "the spoiled blob was kept"
        time.sleep(0.05)
    assert again.metrics()["triton_node_cache_corrupt_total"] == 1
    status, answer = again.lease({md5_key(intact): len(intact), md5_key(spoiled): len(spoiled)})
    assert status == 200 and answer["held"] == [md5_key(intact)]
    assert answer["statements"]["blake3"]["objects"] == {md5_key(intact): blake3.blake3(intact).hexdigest()}


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


def test_a_pod_without_a_token_reads_the_store_and_asks_the_cache_nothing_more(
    s3_backend: Backend,
    store: tuple[Manifest, CountingProxy],
    start_cache: Callable[..., NodeCache],
    tmp_path: Path,
) -> None:
    """A pod of a revision made before the cache checked tokens (none mounted): its lease is refused
    (401), it syncs from its store, and makes no further request (no read, no upload)."""
    manifest, proxy = store
    cache = start_cache()
    done, summary = run_sync(tmp_path / "old", manifest, s3_backend.credentials, cache.url, "old")
    assert done.returncode == 0, done.stderr
    assert_synced(tmp_path / "old")
    assert summary is not None and summary.fetched == TOTAL
    assert proxy.bytes_from_server >= TOTAL
    assert cache.objects() == set()
    assert cache.metrics()["triton_node_cache_refused_requests_total{reason=401}"] == 1


@pytest.mark.parametrize("one_download", [False, True])
def test_pods_syncing_at_once_each_get_every_byte_and_the_node_keeps_one_copy(
    one_download: bool,
    s3_backend: Backend,
    store: tuple[Manifest, CountingProxy],
    start_cache: Callable[..., NodeCache],
    tmp_path: Path,
) -> None:
    manifest, proxy = store
    cache = start_cache(one_download=one_download)
    pods = [f"pod-{i}" for i in range(4)]
    with ThreadPoolExecutor(len(pods)) as pool:
        results = list(
            pool.map(lambda pod: run_sync(tmp_path / pod, manifest, s3_backend.credentials, cache, pod), pods)
        )
    for pod, (done, summary) in zip(pods, results, strict=True):
        assert done.returncode == 0, done.stderr
        assert summary is not None
        assert_synced(tmp_path / pod)
    assert cache.objects() == {md5_key(d) for d in FILES.values()}
    for key in cache.objects():
        assert (
            hashlib.md5(cache.blob(key).read_bytes(), usedforsecurity=False).hexdigest() == key.split("/")[1]
        )
        assert hashlib.sha256(cache.blob(key).read_bytes()).hexdigest() == cache.blob(key).name
    assert not list((cache.root / "tmp").iterdir())  # no write left half-done
    assert cache.metrics()["triton_node_cache_stored_total"] == len(FILES)  # each object kept once
    if one_download:
        # The first lease claimed every object; the other pods waited for its uploads and read the
        # node's copies: the store sent each object once (each pod reading it: up to 4 x TOTAL).
        assert TOTAL <= proxy.bytes_from_server < 2 * TOTAL

    proxy.reset()
    later, _ = run_sync(tmp_path / "later", manifest, s3_backend.credentials, cache, "later")
    assert later.returncode == 0, later.stderr
    assert proxy.bytes_from_server == 0


def lease_fetching(
    cache: NodeCache, objects: dict[str, int], pod: str, namespace: str = NAMESPACE
) -> dict[str, Any]:
    """Lease ``objects`` for ``pod``, saying it reads them from its store where the node lacks them
    (and uploads them): the answer."""
    body = {"pod": pod, "objects": [[*k.split("/"), n] for k, n in objects.items()], "fetch": list(objects)}
    status, data = cache.request(
        "POST", "/v1/leases", json.dumps(body).encode(), pod=pod, namespace=namespace
    )
    assert status == 200, data
    answer: dict[str, Any] = json.loads(data)
    return answer


def wait_for(cache: NodeCache, keys: list[str], pod: str, namespace: str = NAMESPACE) -> tuple[int, Any]:
    status, data = cache.request(
        "POST", "/v1/waits", json.dumps({"keys": keys}).encode(), pod=pod, namespace=namespace
    )
    return status, json.loads(data) if status == 200 else data.decode()


def test_a_claim_makes_its_namespaces_other_pods_wait_for_its_upload_and_no_other_namespaces(
    start_cache: Callable[..., NodeCache],
) -> None:
    cache = start_cache(one_download=True)
    data = os.urandom(300_000)
    key = md5_key(data)
    other = md5_key(b"other bytes")
    # Without --one-download a lease's "fetch" claims nothing: each pod reads its store.
    plain = start_cache()
    assert "coming" not in lease_fetching(plain, {key: len(data)}, "pod-a")
    assert "coming" not in lease_fetching(plain, {key: len(data)}, "pod-b")
    # pod-a claims the object (the node lacks it; nobody else reads it); pod-b of its namespace is
    # told it is coming, for at most its claim's time; team-b's pod is told nothing of it: it
    # claims the object in its own namespace.
    assert lease_fetching(cache, {key: len(data)}, "pod-a")["coming"] == {}
    coming = lease_fetching(cache, {key: len(data), other: 11}, "pod-b")["coming"]
    assert list(coming) == [key] and 0 < coming[key] <= 15 + len(data) / (25 * 1024 * 1024)
    assert lease_fetching(cache, {key: len(data)}, "pod-c", "team-b")["coming"] == {}
    # A lease without "fetch" claims nothing and hears nothing of claims.
    assert "coming" not in cache.lease({key: len(data)}, "pod-d")[1]

    # A wait names keys of its pod's lease only, in the form the cache keeps.
    assert wait_for(cache, [md5_key(b"never leased")], "pod-b") == (
        403,
        "keys: a wait names only objects of its pod's live lease\n",
    )
    status, text = wait_for(cache, ["crc32c/00000000"], "pod-b")
    assert (status, text.split(":")[0]) == (400, "keys[0]")
    # pod-b's other object is claimed by pod-b itself: settled at once (it reads the store).
    assert wait_for(cache, [other], "pod-b") == (200, {"settled": [other]})

    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(wait_for, cache, [key], "pod-b")
        time.sleep(0.5)
        assert not waiting.done()  # pod-a has not uploaded yet
        status, _ = cache.request("PUT", f"/v1/objects/{key}", data, pod="pod-a")
        assert status == 201
        assert waiting.result(timeout=10) == (200, {"settled": [key]})
    # pod-b leases again and the node holds it now; team-b still does not (its own index).
    assert key in lease_fetching(cache, {key: len(data)}, "pod-b")["held"]
    assert lease_fetching(cache, {key: len(data)}, "pod-c", "team-b")["held"] == []


@pytest.mark.parametrize("ends", ["lease dropped", "upload refused"])
def test_a_claim_that_never_lands_only_delays_the_sync_that_waits_for_it(
    ends: str,
    s3_backend: Backend,
    store: tuple[Manifest, CountingProxy],
    start_cache: Callable[..., NodeCache],
    tmp_path: Path,
) -> None:
    """Another pod of the namespace claimed every object and never uploads them (deleted, or its
    bytes wrong): the sync reads nothing from the store while the claims hold, then, as they end
    (the pod's lease dropped, as the cache's audit does for a deleted pod, or its upload refused),
    reads the store itself and syncs every byte."""
    manifest, proxy = store
    cache = start_cache(one_download=True)
    keys = {md5_key(d): len(d) for d in FILES.values()}
    assert lease_fetching(cache, keys, "pod-x")["coming"] == {}
    proxy.reset()
    with ThreadPoolExecutor(1) as pool:
        syncing = pool.submit(run_sync, tmp_path / "pod-b", manifest, s3_backend.credentials, cache, "pod-b")
        time.sleep(3)
        assert not syncing.done()
        assert proxy.bytes_from_server == 0  # waiting for pod-x's uploads, not reading the store
        if ends == "lease dropped":
            cache.store.drop_lease("pod-x")
        else:
            for key, size in keys.items():
                status, _ = cache.request("PUT", f"/v1/objects/{key}", b"x" * size, pod="pod-x")
                assert status == 422
        done, summary = syncing.result(timeout=60)
    assert done.returncode == 0, done.stderr
    assert_synced(tmp_path / "pod-b")
    assert summary is not None and summary.node_cache_misses == len(FILES)
    assert TOTAL <= proxy.bytes_from_server < 2 * TOTAL
    assert cache.objects() == set(keys)  # pod-b claimed them in turn and uploaded them


# ----------------------------------------------------------------- what the cache takes


def test_a_fills_uploads_of_one_model_outlive_the_next_models_lease(
    start_cache: Callable[..., NodeCache], tmp_path: Path
) -> None:
    """The agent's first fill (one pod shape) syncs one model at a time, each sync with its own
    client and lease, and waits for every upload at its end. The cache keeps one lease per pod, each
    replacing the one before, and refuses (403) an upload its pod's live lease does not name: a
    lease of the next model's objects alone left an upload of the model before refused (the
    real-size scale-up then read that object from the store). Each sync of a part leases the whole
    revision (NodeCacheClient's ``lease``), so every upload is kept."""
    cache = start_cache()
    token = tmp_path / "token"
    token.write_text(cache.token("pod-a"))

    def fill(whole: bool) -> dict[str, bool]:
        """Two models' syncs (new bytes each time): the big model's offers its object, and the
        small one's lease comes meanwhile; whether the cache kept each model's object."""
        data = {"big": os.urandom(2 * 1024 * 1024), "small": os.urandom(64 * 1024)}
        entries = {}
        for model, body in data.items():
            (tmp_path / f"{model}.bin").write_bytes(body)
            checksum = md5_key(body).split("/")[1]
            entries[model] = ManifestEntry(f"models/{model}/1/w", f"{model}/1/w", len(body), "md5", checksum)
        lease = list(entries.values()) if whole else None
        clients = []
        for model in ("big", "small"):
            client = NodeCacheClient(cache.url, "pod-a", token_path=token, uploads=1, lease=lease)
            assert client.held([entries[model]]) == frozenset()
            clients.append(client)
        for model, client in zip(("big", "small"), clients, strict=True):
            client.offer(entries[model], tmp_path / f"{model}.bin")
        for client in clients:
            client.close(30)
        kept = cache.objects()
        return {model: md5_key(body) in kept for model, body in data.items()}

    # Each sync's lease its own model's objects only: the big model's upload is refused.
    assert fill(whole=False) == {"big": False, "small": True}
    assert cache.metrics()["triton_node_cache_refused_uploads_total{reason=unleased}"] == 1
    assert fill(whole=True) == {"big": True, "small": True}


def test_the_cache_keeps_only_bytes_that_match_their_key(start_cache: Callable[..., NodeCache]) -> None:
    cache = start_cache()
    real, forged = os.urandom(5000), os.urandom(5000)
    key = md5_key(real)
    assert cache.put(key, forged) == 422
    assert cache.request("GET", f"/v1/objects/{key}")[0] == 404
    # Cut short: other bytes (leased at their own size: the cache takes only a lease's size).
    assert cache.put(key, real[:-1]) == 422
    assert cache.request("GET", f"/v1/objects/{key}")[0] == 404
    # A CRC is no digest (anyone can make bytes with a chosen CRC): never cached.
    assert cache.request("PUT", "/v1/objects/crc32c/00000000", real)[0] == 400
    assert cache.request("PUT", "/v1/objects/s3-multipart/" + "0" * 32 + "-2", real)[0] in (400, 404)
    assert cache.objects() == set()
    assert not list((cache.root / "tmp").iterdir())

    assert cache.put(key, real) == 201
    assert cache.request("GET", f"/v1/objects/{key}") == (200, real)
    assert cache.put(key, real) == 409  # present
    metrics = cache.metrics()
    assert metrics["triton_node_cache_refused_uploads_total{reason=checksum}"] == 2
    assert metrics["triton_node_cache_refused_uploads_total{reason=kind}"] >= 1


def test_an_upload_answered_before_its_check_is_kept_only_if_it_matches(
    start_cache: Callable[..., NodeCache],
) -> None:
    """``Prefer: respond-async``: 202 once the bytes are on the cache's disk, the check after; a
    lease made meanwhile waits for the check and finds what it placed, and bytes that do not match
    their key are never placed (the 202 promised nothing)."""
    cache = start_cache()
    real, forged = os.urandom(3 * 1024 * 1024), os.urandom(3 * 1024 * 1024)
    key = md5_key(real)
    async_put = {"Prefer": "respond-async"}
    assert cache.put(key, forged, pod="forger", headers=async_put) == 202
    assert cache.store.settle()
    assert cache.request("GET", f"/v1/objects/{key}")[0] == 404
    assert cache.objects() == set()
    assert cache.metrics()["triton_node_cache_refused_uploads_total{reason=checksum}"] == 1
    assert not list((cache.root / "tmp").iterdir())

    assert cache.put(key, real, pod="uploader", headers=async_put) == 202
    # At once, without waiting on the store: the next pod's lease finds the object held.
    assert cache.lease({key: len(real)}, pod="next") == (200, {"held": [key], "part_sizes": {}})
    assert cache.request("GET", f"/v1/objects/{key}", pod="next") == (200, real)
    assert cache.metrics()["triton_node_cache_stored_total"] == 1


def test_a_namespaces_checks_in_flight_never_hold_up_another_namespaces_lease(
    start_cache: Callable[..., NodeCache],
) -> None:
    """A lease waits (a bounded while) for the checks of its own namespace's uploads, and only
    those: a pod of another namespace leases at once, also while the first one waits."""
    cache = start_cache(idle_seconds=2.0)
    data = os.urandom(1000)
    key = md5_key(data)
    assert cache.lease({key: len(data)}, pod="uploader", namespace="team-x")[0] == 200
    kind, checksum = key.split("/")
    upload = cache.store.begin("team-x", "uploader", kind, checksum, size=len(data), deferred=True)
    cache.store.checking(upload)  # received whole, its check not done
    try:
        with ThreadPoolExecutor(1) as pool:
            started = time.monotonic()
            waiting = pool.submit(cache.lease, {key: len(data)}, "x-reader", "team-x")
            time.sleep(0.3)
            assert cache.lease({key: len(data)}, pod="y-reader", namespace="team-y")[0] == 200
            other = time.monotonic() - started
            assert waiting.result()[0] == 200
            same = time.monotonic() - started
        assert other < 1.0 < same  # team-y at once; team-x until its check's bounded wait ends
    finally:
        cache.store.end(upload)


def test_eviction_keeps_the_bound_and_never_takes_a_leased_object(
    start_cache: Callable[..., NodeCache],
) -> None:
    cache = start_cache(size_limit="350k")  # room for three objects of 100 000 bytes
    blobs = {name: os.urandom(100_000) for name in "abcde"}
    keys = {name: md5_key(data) for name, data in blobs.items()}
    for name in "abc":
        assert cache.put(keys[name], blobs[name], pod=f"up-{name}") == 201
        assert cache.lease({}, pod=f"up-{name}")[0] == 200  # the uploader's lease moves on
    # A pod syncing a revision leases "a" (the oldest); "b" is read again, so "c" is now the least
    # recently used of the objects no lease holds.
    assert cache.lease({keys["a"]: 100_000}, pod="p1") == (200, {"held": [keys["a"]], "part_sizes": {}})
    assert cache.request("GET", f"/v1/objects/{keys['b']}")[0] == 200

    assert cache.put(keys["d"], blobs["d"], pod="up-d") == 201
    assert cache.objects() == {keys["a"], keys["b"], keys["d"]}
    assert cache.request("GET", f"/v1/objects/{keys['c']}")[0] == 404

    # Every object leased: no room is made, the upload is refused and nothing is evicted.
    assert cache.lease({keys["b"]: 100_000}, pod="p2")[0] == 200
    assert cache.put(keys["e"], blobs["e"], pod="up-e") == 507
    assert cache.objects() == {keys["a"], keys["b"], keys["d"]}
    # An object bigger than the whole cache is refused outright (here: its lease already, since
    # one pod may lease at most half the cache).
    assert cache.lease({md5_key(b"x" * 400_000): 400_000})[0] == 413
    metrics = cache.metrics()
    assert metrics["triton_node_cache_evictions_total"] == 1
    assert metrics["triton_node_cache_bytes"] == 300_000 <= metrics["triton_node_cache_limit_bytes"]
    assert metrics["triton_node_cache_leased_bytes"] == 300_000


def test_a_restarted_cache_keeps_its_objects_and_drops_half_written_ones(
    start_cache: Callable[..., NodeCache],
) -> None:
    cache = start_cache()
    data = os.urandom(10_000)
    assert cache.put(md5_key(data), data) == 201
    cache.stop()
    (cache.root / "tmp" / "md5-cut-short").write_bytes(b"half")  # an upload the stop cut short
    (cache.root / "blobs" / "not-a-digest").write_bytes(b"junk")
    (cache.root / "index" / NAMESPACE / "md5" / "not-a-digest").write_bytes(b"junk")
    (cache.root / "blobs" / ("0" * 64)).write_bytes(b"no index names it")

    again = start_cache(root=cache.root, reviewer=cache.reviewer)
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
        first, cold = run_sync(tmp_path / "pod-a", manifest, s3_backend.credentials, cache, "pod-a")
        assert first.returncode == 0, first.stderr
        assert cold is not None and cold.fetched == len(BIG) + len(FILES["models/adder/1/weights0.bin"])
        assert key in cache.objects()  # the cache checked it with the part size the pod named

        proxy.reset()
        second, warm = run_sync(tmp_path / "pod-b", manifest, s3_backend.credentials, cache, "pod-b")
        assert second.returncode == 0, second.stderr
        assert (tmp_path / "pod-b" / "models" / "adder" / "1" / "weights.bin").read_bytes() == BIG
        assert warm is not None
        assert (warm.fetched, warm.node_cache_hits, warm.node_cache_misses) == (0, 2, 0)
        # Not one request to the store: the cache told the pod the part size it checked the upload
        # with, and the pod checked the cache's bytes with it.
        assert proxy.bytes_from_server == 0

        # A wrong copy on the node: the pod refuses it (it checks with its store's part size), reads
        # the store, and tells the cache, which checks its own copy and takes the right one.
        on_disk = cache.blob(key)
        spoiled = bytearray(on_disk.read_bytes())
        spoiled[PART + 7] ^= 0x01
        on_disk.write_bytes(bytes(spoiled))
        third, healed = run_sync(tmp_path / "pod-c", manifest, s3_backend.credentials, cache, "pod-c")
        assert third.returncode == 0, third.stderr
        assert (tmp_path / "pod-c" / "models" / "adder" / "1" / "weights.bin").read_bytes() == BIG
        assert healed is not None and (healed.fetched, healed.node_cache_hits) == (len(BIG), 1)
        assert cache.blob(key).read_bytes() == BIG
        assert cache.metrics()["triton_node_cache_corrupt_total"] == 1

        # The part size the cache tells is only what a pod checks with: a wrong one (a tampered
        # record, read at the cache's restart) fails the cache's copy, the pod reads the store with
        # the store's part size, and its upload sets the record right (the copy was right).
        cache.stop()
        record = cache.root / "index" / NAMESPACE / key
        blob, part = record.read_text().split()
        assert part == str(PART)
        record.write_text(f"{blob} {PART + 1}\n")  # still three parts, not the upload's
        again = start_cache(root=cache.root, reviewer=cache.reviewer)
        fourth, wrong = run_sync(tmp_path / "pod-d", manifest, s3_backend.credentials, again, "pod-d")
        assert fourth.returncode == 0, fourth.stderr
        assert (tmp_path / "pod-d" / "models" / "adder" / "1" / "weights.bin").read_bytes() == BIG
        assert wrong is not None and (wrong.fetched, wrong.node_cache_hits) == (len(BIG), 1)
        assert record.read_text().split() == [blob, str(PART)]
        proxy.reset()
        fifth, right = run_sync(tmp_path / "pod-e", manifest, s3_backend.credentials, again, "pod-e")
        assert fifth.returncode == 0, fifth.stderr
        assert right is not None and (right.fetched, right.node_cache_hits) == (0, 2)
        assert proxy.bytes_from_server == 0


def test_a_multipart_upload_is_kept_only_with_the_part_size_that_makes_its_etag(
    start_cache: Callable[..., NodeCache],
) -> None:
    cache = start_cache()
    key = f"s3-multipart/{multipart_etag(BIG, PART)}"
    path = f"/v1/objects/{key}"

    def put(headers: dict[str, str]) -> int:
        return cache.put(key, BIG, headers=headers)

    assert put({}) == 400  # no part size: nothing to check the ETag with
    assert put({"X-Part-Size": str(PART + 1)}) == 422  # three parts, but not these
    assert put({"X-Part-Size": "1"}) == 400  # millions of parts, not three: refused before hashing
    assert cache.objects() == set()
    assert put({"X-Part-Size": str(PART)}) == 201
    assert cache.request("GET", path) == (200, BIG)


def test_a_warm_pod_reads_a_big_object_in_ranges_at_once_sent_by_sendfile(
    s3_backend: Backend, start_cache: Callable[..., NodeCache], tmp_path: Path
) -> None:
    """A multipart object bigger than the sync's part size: the pod asks the cache for its ranges
    (whole upload parts) on several connections at once, each hashed as it arrives, and checks the
    whole against its pinned ETag; the cache sends every byte with sendfile."""
    bucket = s3_backend.new_bucket()
    s3_backend.put(bucket, "models/adder/1/weights.bin", BIG, part_size=PART)
    pinned = pin_repository(s3_backend.repository(bucket), MODELS, s3_backend.credentials)
    cache = start_cache()
    first, _ = run_sync(tmp_path / "pod-a", pinned, s3_backend.credentials, cache, "pod-a")
    assert first.returncode == 0, first.stderr
    last = f"Range: bytes={2 * PART}-".encode()
    # The first range's request is held until the last range's is seen: only reads on several
    # connections at once get past it without waiting (a read after a read would wait 10 s).
    with (
        counting_proxy(cache.url, hold=(b"Range: bytes=0-", last)) as front,
        counting_proxy(s3_backend.endpoint) as store,
    ):
        manifest = replace(pinned, repository=replace(pinned.repository, endpoint=store.endpoint))
        second, warm = run_sync(
            tmp_path / "pod-b",
            manifest,
            s3_backend.credentials,
            front.endpoint,
            "pod-b",
            token=cache.token("pod-b"),
            extra=("--part-size", str(PART)),
        )
        assert second.returncode == 0, second.stderr
        assert (tmp_path / "pod-b" / "models" / "adder" / "1" / "weights.bin").read_bytes() == BIG
        assert warm is not None and (warm.fetched, warm.node_cache_hits) == (0, 1)
        assert store.bytes_from_server == 0
        assert front.released.is_set() and front.hold_timeouts == 0
        assert front.connections >= 3  # the lease's, and the ranges' own
    metrics = cache.metrics()
    assert metrics["triton_node_cache_sent_bytes_total{how=sendfile}"] == len(BIG)
    assert metrics["triton_node_cache_sent_bytes_total{how=copy}"] == 0
    assert metrics["triton_node_cache_hits_total"] == 1  # one object read, in three ranges
    assert metrics["triton_node_cache_hit_bytes_total"] == len(BIG)


@pytest.mark.parametrize("spoil", ["bytes", "cut"])
def test_a_big_object_whose_ranges_fail_the_pin_or_break_is_read_from_the_store(
    spoil: str, s3_backend: Backend, start_cache: Callable[..., NodeCache], tmp_path: Path
) -> None:
    """Ranges read at once: one byte off in the cache's copy (the whole fails the pinned ETag), or
    a connection cut in the middle of a range: the pod drops what the cache gave, reads the store,
    and uploads it; the cache checks its own copy (dropped only if its bytes changed)."""
    bucket = s3_backend.new_bucket()
    s3_backend.put(bucket, "models/adder/1/weights.bin", BIG, part_size=PART)
    pinned = pin_repository(s3_backend.repository(bucket), MODELS, s3_backend.credentials)
    key = "s3-multipart/" + multipart_etag(BIG, PART)
    cache = start_cache()
    first, _ = run_sync(tmp_path / "pod-a", pinned, s3_backend.credentials, cache, "pod-a")
    assert first.returncode == 0, first.stderr
    if spoil == "bytes":
        on_disk = cache.blob(key)
        spoiled = bytearray(on_disk.read_bytes())
        spoiled[2 * PART + 3] ^= 0x01
        on_disk.write_bytes(bytes(spoiled))
    with (
        counting_proxy(cache.url, cut_after=PART // 2 if spoil == "cut" else None) as front,
        counting_proxy(s3_backend.endpoint) as store,
    ):
        manifest = replace(pinned, repository=replace(pinned.repository, endpoint=store.endpoint))
        second, summary = run_sync(
            tmp_path / "pod-b",
            manifest,
            s3_backend.credentials,
            front.endpoint,
            "pod-b",
            token=cache.token("pod-b"),
            extra=("--part-size", str(PART)),
        )
        assert second.returncode == 0, second.stderr
        assert (tmp_path / "pod-b" / "models" / "adder" / "1" / "weights.bin").read_bytes() == BIG
        assert summary is not None and summary.fetched == len(BIG)
        assert store.bytes_from_server >= len(BIG)
        assert front.cuts == (1 if spoil == "cut" else 0)
    assert cache.blob(key).read_bytes() == BIG
    expected = 1 if spoil == "bytes" else 0
    assert cache.metrics()["triton_node_cache_corrupt_total"] == expected


def test_the_cache_serves_one_range_of_an_object_and_refuses_others(
    start_cache: Callable[..., NodeCache],
) -> None:
    cache = start_cache()
    data = os.urandom(100_000)
    key = md5_key(data)
    assert cache.put(key, data) == 201
    path = f"/v1/objects/{key}"
    assert cache.request("GET", path, headers={"Range": "bytes=1000-1999"}) == (206, data[1000:2000])
    assert cache.request("GET", path, headers={"Range": "bytes=99000-"}) == (206, data[99000:])
    assert cache.request("GET", path, headers={"Range": "bytes=99000-200000"}) == (206, data[99000:])
    for bad in ("bytes=100000-", "bytes=5-4", "bytes=0-1,5-6", "bytes=-500", "lines=0-1"):
        status, _ = cache.request("GET", path, headers={"Range": bad})
        assert status == 416, bad
    # A range is no way past the namespace's index.
    status, _ = cache.request("GET", path, headers={"Range": "bytes=0-99"}, pod="b1", namespace="team-b")
    assert status == 404


# ----------------------------------------------------------------- in-place pods: the agent


def run_agent_once(
    work: Path, manifest: Manifest, env: dict[str, str], cache: NodeCache, pod: str
) -> tuple[subprocess.CompletedProcess[str], SyncSummary | None]:
    """`triton-operator agent --once` into work/models, as the init container of a pod with
    modelUpdates InPlace runs it (its base revision's manifest and configs); its summary."""
    from triton_operator.core.spec.modelconfig import build_config_pbtxt  # noqa: PLC0415

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
    clean |= cache_env(work, cache, pod, NAMESPACE, None)
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
    first, cold = run_agent_once(tmp_path / "pod-a", manifest, s3_backend.credentials, cache, "pod-a")
    assert first.returncode == 0, first.stderr
    assert_synced(tmp_path / "pod-a")
    assert cold is not None
    assert (cold.fetched, cold.node_cache_hits, cold.node_cache_misses) == (TOTAL, 0, len(FILES))
    assert cache.objects() == {md5_key(d) for d in FILES.values()}

    proxy.reset()
    second, warm = run_agent_once(tmp_path / "pod-b", manifest, s3_backend.credentials, cache, "pod-b")
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
    first, _ = run_sync(tmp_path / "pod-a", kept, s3_backend.credentials, cache, "pod-a")
    assert first.returncode == 0, first.stderr
    assert cache.objects() == {md5_key(d) for d in FILES.values()}  # the node holds every kept file

    new = os.urandom(200_000)
    s3_backend.put(bucket, "models/adder/1/new.bin", new)
    manifest = pin_repository(s3_backend.repository(bucket), MODELS, s3_backend.credentials)
    with counting_proxy(s3_backend.endpoint) as store, counting_proxy(cache.url, rate=50_000) as slow:
        via = replace(manifest, repository=replace(manifest.repository, endpoint=store.endpoint))
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(
                run_sync,
                tmp_path / "pod-b",
                via,
                s3_backend.credentials,
                slow.endpoint,
                "pod-b",
                token=cache.token("pod-b"),
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


# ----------------------------------------------------------------- tenants and hostile callers

# Two different 128-byte blocks with one MD5 (Wang and Yu's 2005 collision), as an attacker makes
# one in seconds today: the model file A of namespace "victim", the bytes B of namespace "attacker".
COLLISION_A = bytes.fromhex(
    "d131dd02c5e6eec4693d9a0698aff95c2fcab58712467eab4004583eb8fb7f89"
    "55ad340609f4b30283e488832571415a085125e8f7cdc99fd91dbdf280373c5b"
    "d8823e3156348f5bae6dacd436c919c6dd53e2b487da03fd02396306d248cda0"
    "e99f33420f577ee8ce54b67080a80d1ec69821bcb6a8839396f9652b6ff72a70"
)
COLLISION_B = bytes.fromhex(
    "d131dd02c5e6eec4693d9a0698aff95c2fcab50712467eab4004583eb8fb7f89"
    "55ad340609f4b30283e4888325f1415a085125e8f7cdc99fd91dbd7280373c5b"
    "d8823e3156348f5bae6dacd436c919c6dd53e23487da03fd02396306d248cda0"
    "e99f33420f577ee8ce54b67080280d1ec69821bcb6a8839396f965ab6ff72a70"
)


def test_bytes_put_under_a_colliding_md5_never_reach_another_namespace(
    s3_backend: Backend, start_cache: Callable[..., NodeCache], tmp_path: Path
) -> None:
    """The poisoning attack: a pod of namespace "attacker" uploads B under md5(A) (the cache rightly
    finds md5(B) == md5(A)); the sync of a pod of namespace "victim" whose pinned object is A must
    not take B: it reads A from its store."""
    assert COLLISION_A != COLLISION_B and md5_key(COLLISION_A) == md5_key(COLLISION_B)
    key = md5_key(COLLISION_A)
    bucket = s3_backend.new_bucket()
    s3_backend.put(bucket, "models/adder/1/model.bin", COLLISION_A)
    pinned = pin_repository(s3_backend.repository(bucket), MODELS, s3_backend.credentials)
    assert [(e.checksum_kind, f"md5/{e.checksum}") for e in pinned.entries if e.size == 128] == [("md5", key)]
    cache = start_cache()
    assert cache.put(key, COLLISION_B, pod="mallory", namespace="attacker") == 201
    assert cache.request("GET", f"/v1/objects/{key}", pod="mallory", namespace="attacker") == (
        200,
        COLLISION_B,
    )
    # The victim's namespace does not see it, under any name.
    assert cache.request("GET", f"/v1/objects/{key}", pod="v", namespace="victim")[0] == 404

    with counting_proxy(s3_backend.endpoint) as proxy:
        manifest = replace(pinned, repository=replace(pinned.repository, endpoint=proxy.endpoint))
        done, summary = run_sync(
            tmp_path / "victim", manifest, s3_backend.credentials, cache, "victim-pod", namespace="victim"
        )
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "victim" / "models" / "adder" / "1" / "model.bin").read_bytes() == COLLISION_A
        assert summary is not None and summary.node_cache_hits == 0
        assert proxy.bytes_from_server >= len(COLLISION_A)  # it read the store
    # The victim's upload is its namespace's own: each namespace gets its own bytes back, and the
    # cache named each blob by the SHA-256 it computed.
    assert cache.blob(key, "victim").read_bytes() == COLLISION_A
    assert cache.blob(key, "attacker").read_bytes() == COLLISION_B
    assert cache.blob(key, "victim").name == hashlib.sha256(COLLISION_A).hexdigest()


def test_identical_files_of_two_namespaces_share_one_blob_but_not_their_reads(
    start_cache: Callable[..., NodeCache],
) -> None:
    """Knowing a checksum is not enough to read: a namespace reads only what its own pods uploaded;
    the bytes are kept once."""
    cache = start_cache()
    data = os.urandom(50_000)
    key = f"sha256/{hashlib.sha256(data).hexdigest()}"
    assert cache.put(key, data, pod="a1", namespace="team-a") == 201
    assert cache.request("GET", f"/v1/objects/{key}", pod="b1", namespace="team-b")[0] == 404
    assert cache.request("HEAD", f"/v1/objects/{key}", pod="b1", namespace="team-b")[0] == 404
    assert cache.put(key, data, pod="b1", namespace="team-b") == 201
    assert cache.request("GET", f"/v1/objects/{key}", pod="b1", namespace="team-b") == (200, data)
    assert cache.blob(key, "team-a") == cache.blob(key, "team-b")
    assert len(list((cache.root / "blobs").iterdir())) == 1
    assert cache.metrics()["triton_node_cache_bytes"] == len(data)


def test_callers_without_a_valid_token_get_401_and_nothing_else(
    start_cache: Callable[..., NodeCache],
) -> None:
    cache = start_cache()
    data = os.urandom(1000)
    key = md5_key(data)
    assert cache.put(key, data) == 201
    lease = json.dumps({"objects": [[*key.split("/"), 1000]]}).encode()
    api_server_token = cache.reviewer.issue(NAMESPACE, "tester", audience="https://kubernetes.default.svc")
    deleted = cache.reviewer.issue(NAMESPACE, "gone")
    cache.reviewer.delete("gone")
    for token in (None, "not-a-jwt", api_server_token, deleted, cache.token() + "x"):
        for method, path, body in (
            ("GET", f"/v1/objects/{key}", None),
            ("HEAD", f"/v1/objects/{key}", None),
            ("PUT", f"/v1/objects/{key}", data),
            ("POST", "/v1/leases", lease),
            ("POST", "/v1/waits", json.dumps({"keys": [key]}).encode()),
            ("GET", "/v1/anything", None),
        ):
            status, answer = cache.request(method, path, body, token=token)
            assert status == 401, (token, method, path)
            assert data not in answer
    # Health and metrics stay open and name no namespace, pod or object.
    assert cache.request("GET", "/healthz", token=None)[0] == 200
    status, text = cache.request("GET", "/metrics", token=None)
    assert status == 200
    for private in (NAMESPACE, "tester", key.split("/")[1]):
        assert private.encode() not in text
    assert cache.metrics()["triton_node_cache_refused_requests_total{reason=401}"] >= 25


def test_a_pod_leases_and_uploads_only_for_itself(start_cache: Callable[..., NodeCache]) -> None:
    cache = start_cache()
    data = os.urandom(2000)
    key = md5_key(data)
    # Another pod's uid in the lease: refused, and nothing leased for either.
    body = json.dumps({"pod": "someone-else", "objects": [[*key.split("/"), 2000]]}).encode()
    assert cache.request("POST", "/v1/leases", body, pod="tester")[0] == 403
    # No lease, or another size than leased: no upload.
    assert cache.request("PUT", f"/v1/objects/{key}", data, pod="tester")[0] == 403
    assert cache.lease({key: 1999}, pod="tester")[0] == 200
    assert cache.request("PUT", f"/v1/objects/{key}", data, pod="tester")[0] == 400
    assert cache.objects() == set()
    assert cache.lease({}, pod="tester")[0] == 200
    # A pod whose token no longer passes (deleted) loses its lease at the next audit.
    assert cache.put(key, data, pod="short-lived") == 201
    assert "short-lived" in cache.store.leases()
    cache.reviewer.delete("short-lived")
    cache.thread.call(cache.thread.server.audit_once())
    assert "short-lived" not in cache.store.leases()
    assert cache.metrics()["triton_node_cache_leased_bytes"] == 0


def test_lease_bodies_are_bounded_before_they_are_read(start_cache: Callable[..., NodeCache]) -> None:
    import socket  # noqa: PLC0415

    cache = start_cache(size_limit="1Mi")
    # 64 MiB announced, not one byte sent: refused at once from the Content-Length.
    with socket.create_connection(("127.0.0.1", cache.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/leases HTTP/1.1\r\nHost: x\r\nContent-Length: 67108864\r\n"
            + f"Authorization: Bearer {cache.token()}\r\n\r\n".encode()
        )
        assert sock.recv(100).startswith(b"HTTP/1.1 413")
    # Many tiny items: refused before they are parsed into Python objects.
    tiny = b'{"objects": [' + b",".join([b"[]"] * 400_000) + b"]}"
    assert cache.request("POST", "/v1/leases", tiny)[0] == 413
    # More bytes than one pod may lease (half the cache).
    assert cache.lease({md5_key(b"big"): 600_000})[0] == 413
    assert cache.lease({md5_key(b"ok"): 500_000})[0] == 200


def test_a_headers_only_upload_takes_no_room_and_a_stalled_one_ends(
    start_cache: Callable[..., NodeCache],
) -> None:
    import socket  # noqa: PLC0415

    cache = start_cache(size_limit="350k", idle_seconds=1.0)
    blobs = {name: os.urandom(100_000) for name in "abc"}
    for name, data in blobs.items():
        assert cache.put(md5_key(data), data, pod=f"up-{name}") == 201
        assert cache.lease({}, pod=f"up-{name}")[0] == 200  # nothing of it leased any more
    big = md5_key(b"never sent")
    assert cache.lease({big: 150_000}, pod="mallory")[0] == 200
    with socket.create_connection(("127.0.0.1", cache.port), timeout=10) as sock:
        sock.sendall(
            f"PUT /v1/objects/{big} HTTP/1.1\r\nHost: x\r\nContent-Length: 150000\r\n".encode()
            + f"Authorization: Bearer {cache.token('mallory')}\r\n\r\n".encode()
        )
        time.sleep(0.3)
        # Nothing evicted for bytes that have not arrived.
        assert cache.objects() == {md5_key(d) for d in blobs.values()}
        assert cache.metrics()["triton_node_cache_evictions_total"] == 0
        sock.sendall(b"x" * 1000)
        assert sock.recv(100).startswith(b"HTTP/1.1 408")  # stalled past --idle-seconds
    assert cache.objects() == {md5_key(d) for d in blobs.values()}
    assert not list((cache.root / "tmp").iterdir())
    assert cache.metrics()["triton_node_cache_refused_uploads_total{reason=stalled}"] == 1


def test_a_client_header_cannot_make_the_cache_drop_an_intact_object(
    start_cache: Callable[..., NodeCache],
) -> None:
    """X-Check-Existing with a wrong X-Part-Size (three parts still): the cache hashes its own copy,
    finds it intact, keeps it and answers 409."""
    cache = start_cache()
    key = f"s3-multipart/{multipart_etag(BIG, PART)}"
    assert cache.put(key, BIG, pod="owner", headers={"X-Part-Size": str(PART)}) == 201
    headers = {"X-Check-Existing": "1", "X-Part-Size": str(PART + 1), "Content-Length": str(len(BIG))}
    assert cache.lease({key: len(BIG)}, pod="mallory")[0] == 200
    assert cache.request("PUT", f"/v1/objects/{key}", None, headers, pod="mallory")[0] == 409
    assert cache.request("GET", f"/v1/objects/{key}", pod="mallory") == (200, BIG)
    assert cache.lease({key: len(BIG)}, pod="mallory")[1]["part_sizes"] == {key: PART}
    assert cache.metrics()["triton_node_cache_corrupt_total"] == 0


def test_connections_are_bounded_and_idle_ones_closed(start_cache: Callable[..., NodeCache]) -> None:
    import socket  # noqa: PLC0415

    cache = start_cache(max_connections=8, idle_seconds=1.0)
    idle = [socket.create_connection(("127.0.0.1", cache.port), timeout=5) for _ in range(8)]
    try:
        time.sleep(0.2)
        with socket.create_connection(("127.0.0.1", cache.port), timeout=5) as extra:
            assert extra.recv(10) == b""  # closed at once: the cache holds 8
        for sock in idle:  # each closed by the cache once idle for a second
            assert sock.recv(10) == b""
    finally:
        for sock in idle:
            sock.close()
    assert cache.request("GET", "/healthz", token=None)[0] == 200
    assert cache.metrics()["triton_node_cache_refused_requests_total{reason=connections}"] >= 1


def test_the_command_listens_on_ipv6(tmp_path: Path) -> None:
    """`triton-operator node-cache --address ::1` serves (the API server it reviews tokens with is
    never asked here: a request without a token is refused before any review)."""
    import socket  # noqa: PLC0415

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "unused"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    with socket.socket(socket.AF_INET6) as sock:
        sock.bind(("::1", 0))
        port = sock.getsockname()[1]
    args = [sys.executable, "-m", "triton_operator.cli", "node-cache", "--root", str(tmp_path / "c")]
    args += ["--size-limit", "1Mi", "--address", "::1", "--port", str(port)]
    log = tmp_path / "log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "KUBECONFIG": str(kubeconfig)}
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, log.read_text()
            try:
                conn = http.client.HTTPConnection("::1", port, timeout=2)
                conn.request("GET", "/healthz")
                assert conn.getresponse().status == 200
                break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        conn = http.client.HTTPConnection("::1", port, timeout=5)
        conn.request("GET", f"/v1/objects/{md5_key(b'x')}")
        assert conn.getresponse().status == 401
    finally:
        process.terminate()
        assert process.wait(timeout=15) == 0
