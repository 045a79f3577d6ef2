"""The node cache's shared files on this machine's kernel: real bind mounts (so root, as the
DaemonSet's container is), real hard links, the CSI plugin on its unix sockets called by a real gRPC
client, the lease over real HTTP. `FakeTokenReviewer` stands in for the API server's TokenReview and
these tests for the kubelet (the e2e test uses both real ones)."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import http.client
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest

from fake_token_reviewer import FakeTokenReviewer
from triton_operator.adapters.nodecache.csi import MESSAGES, CsiPlugin
from triton_operator.adapters.nodecache.server import NodeCacheServer, ServerThread
from triton_operator.adapters.nodecache.store import ContentStore
from triton_operator.adapters.nodecache.views import MNT_DETACH, LinuxMounter, Views, mount_points
from triton_operator.core.repository.shared_files import DRIVER, EPHEMERAL_KEY, POD_NAMESPACE_KEY, POD_UID_KEY

pytestmark = [
    pytest.mark.storage,
    pytest.mark.skipif(
        os.geteuid() != 0, reason="bind mounts need root (the cache's DaemonSet runs privileged)"
    ),
]

DATA = os.urandom(200_000)
KEY = f"sha256/{hashlib.sha256(DATA).hexdigest()}"
BLOB = hashlib.sha256(DATA).hexdigest()


def new_uid() -> str:
    return str(uuid.uuid4())


@dataclass
class Cache:
    thread: ServerThread
    reviewer: FakeTokenReviewer
    views: Views
    kubelet: Path

    @property
    def store(self) -> ContentStore:
        return self.views.store

    def request(self, method: str, path: str, body: bytes, uid: str, namespace: str) -> tuple[int, bytes]:
        token = self.reviewer.issue(namespace, uid)
        conn = http.client.HTTPConnection("127.0.0.1", self.thread.port, timeout=30)
        try:
            conn.request(method, path, body, {"Authorization": f"Bearer {token}"})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def lease(self, uid: str, namespace: str, objects: dict[str, int]) -> dict[str, Any]:
        body = {"pod": uid, "objects": [[*k.split("/"), size] for k, size in objects.items()]}
        status, data = self.request("POST", "/v1/leases", json.dumps(body).encode(), uid, namespace)
        assert status == 200, data
        answer: dict[str, Any] = json.loads(data)
        return answer

    def put(self, data: bytes, uid: str, namespace: str = "team-a") -> int:
        key = f"sha256/{hashlib.sha256(data).hexdigest()}"
        self.lease(uid, namespace, {key: len(data)})
        status = self.request("PUT", f"/v1/objects/{key}", data, uid, namespace)[0]
        assert self.store.settle()
        return status

    def target(self, uid: str) -> Path:
        return self.kubelet / "pods" / uid / "volumes" / "kubernetes.io~csi" / "node-cache-files" / "mount"

    def publish(self, uid: str, namespace: str = "team-a") -> Path:
        context = {POD_UID_KEY: uid, POD_NAMESPACE_KEY: namespace, EPHEMERAL_KEY: "true"}
        self.views.publish(context, str(self.target(uid)))
        return self.target(uid)


def is_mount(path: Path | str) -> bool:
    return str(path) in mount_points()


def unmount_all_under(folder: Path) -> None:
    """Whatever a failed test left mounted under ``folder`` (deepest first)."""
    mounted = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for point in sorted((m for m in mounted if m.startswith(str(folder))), key=len, reverse=True):
        LinuxMounter()._call("umount2", os.fsencode(point), MNT_DETACH)


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[Cache]:
    root = tmp_path / "cache"
    # The kubelet's folder: short, as a unix socket's path is at most 107 bytes.
    kubelet = Path(tempfile.mkdtemp(prefix="kl.", dir="/tmp"))
    store = ContentStore(root, 1_000_000, 3600.0, pod_lease_bytes=1_000_000)
    views = Views(root, store, LinuxMounter())
    reviewer = FakeTokenReviewer()
    thread = ServerThread(NodeCacheServer(store, reviewer, views=views))
    thread.start()
    try:
        yield Cache(thread, reviewer, views, kubelet)
    finally:
        thread.stop()
        unmount_all_under(tmp_path)
        unmount_all_under(kubelet)
        shutil.rmtree(kubelet)


def test_a_pod_sees_read_only_the_cache_pages_of_exactly_what_its_lease_found(cache: Cache) -> None:
    assert cache.put(DATA, new_uid()) in (200, 201)
    pod = new_uid()
    target = cache.publish(pod)
    assert is_mount(target)
    options = next(
        line.split(" ")[5].split(",")
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split(" ")[4] == str(target)
    )
    assert {"ro", "nosuid", "nodev"} <= set(options), options
    assert list(target.iterdir()) == []  # nothing until its lease
    missing = "sha256/" + "0" * 64
    answer = cache.lease(pod, "team-a", {KEY: len(DATA), missing: 5})
    assert answer["held"] == [KEY]
    assert answer["shared"] == {KEY: BLOB}
    shared = target / BLOB
    assert shared.read_bytes() == DATA
    assert shared.stat().st_ino == (cache.store.blob_path(BLOB)).stat().st_ino  # the cache's own file
    assert stat.S_IMODE(shared.stat().st_mode) == 0o444
    # Its lease again (a sync's after waiting for another pod's upload) changes nothing of the blob:
    # tritonserver takes a newer ctime of a model's file for a change of the model.
    changed = shared.stat().st_ctime_ns
    assert cache.lease(pod, "team-a", {KEY: len(DATA)})["shared"] == {KEY: BLOB}
    assert shared.stat().st_ctime_ns == changed
    # Read-only for everyone, root included: the mount's flag, not the file's mode.
    for attempt in (
        lambda: shared.open("r+b"),
        lambda: os.chmod(shared, 0o666),
        shared.unlink,
        lambda: (target / "new").write_bytes(b"x"),
        lambda: os.link(shared, target / "again"),
        lambda: shared.rename(target / "moved"),
    ):
        with pytest.raises(OSError) as refused:
            attempt()
        assert refused.value.errno == errno.EROFS
    assert cache.store.blob_path(BLOB).read_bytes() == DATA


def test_another_namespace_and_a_pod_without_a_view_get_nothing(cache: Cache) -> None:
    assert cache.put(DATA, new_uid(), "team-a") in (200, 201)
    other = new_uid()
    target = cache.publish(other, "team-b")
    answer = cache.lease(other, "team-b", {KEY: len(DATA)})
    assert answer["held"] == [] and answer["shared"] == {}
    assert list(target.iterdir()) == []
    # A token naming the uid of a view of team-a, but of team-b, which holds the bytes too: the
    # view's namespace is checked, not only the index of the token's.
    assert cache.put(DATA, new_uid(), "team-b") in (200, 201)
    mixed = new_uid()
    cache.publish(mixed, "team-a")
    answer = cache.lease(mixed, "team-b", {KEY: len(DATA)})
    assert answer["held"] == [KEY] and answer["shared"] == {}
    # A lease of a pod with no volume makes no folder.
    lonely = new_uid()
    assert cache.lease(lonely, "team-a", {KEY: len(DATA)}) == {"held": [KEY], "part_sizes": {}, "shared": {}}
    assert not (cache.views.root / lonely).exists()


def test_a_viewed_blob_is_kept_until_its_view_ends(cache: Cache) -> None:
    uploader, pod = new_uid(), new_uid()
    assert cache.put(DATA, uploader) in (200, 201)
    cache.publish(pod)
    assert cache.lease(pod, "team-a", {KEY: len(DATA)})["shared"] == {KEY: BLOB}
    for lease in (uploader, pod):
        cache.store.drop_lease(lease)
    other = os.urandom(900_000)  # 200 + 900 kB past the 1 MB limit: only an eviction makes room
    assert cache.put(other, new_uid()) == 507
    assert cache.store.blob_path(BLOB).exists()
    cache.views.unpublish(str(cache.target(pod)))
    assert not is_mount(cache.target(pod)) and not cache.target(pod).exists()
    assert not (cache.views.root / pod).exists()
    cache.views.unpublish(str(cache.target(pod)))  # again: a no-op, as CSI asks
    assert cache.put(other, new_uid()) in (200, 201)
    assert not cache.store.blob_path(BLOB).exists()


def test_at_start_a_view_whose_mount_is_gone_is_removed_and_the_others_kept(cache: Cache) -> None:
    assert cache.put(DATA, new_uid()) in (200, 201)
    alive, gone = new_uid(), new_uid()
    for pod in (alive, gone):
        cache.publish(pod)
        assert cache.lease(pod, "team-a", {KEY: len(DATA)})["shared"] == {KEY: BLOB}
        cache.store.drop_lease(pod)
    LinuxMounter().unmount(cache.target(gone))  # its pod went while the cache was away
    restarted = ContentStore(cache.store.root, 1_000_000, 3600.0, pod_lease_bytes=1_000_000)
    views = Views(cache.store.root, restarted, LinuxMounter())
    assert views.sweep() == (1, 1)
    assert not (views.root / gone).exists() and not (views.root / f"{gone}.record").exists()
    assert (views.root / alive / BLOB).exists()
    assert restarted.figures()[2] == len(DATA)  # kept as if leased


def test_the_kubelet_registers_the_plugin_and_publishes_through_its_sockets(
    cache: Cache, tmp_path: Path
) -> None:
    plugin = CsiPlugin(cache.views, "node-1", cache.kubelet, "9.9.9")
    pod = new_uid()
    target = str(cache.target(pod))

    async def call(socket: Path, method: str, request: str, answer: str, **fields: Any) -> Any:
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            rpc = channel.unary_unary(
                method,
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=MESSAGES[answer].FromString,
            )
            return await rpc(MESSAGES[request](**fields), timeout=10)

    async def csi_call(service: str, method: str, **fields: Any) -> Any:
        path, request, answer = (
            f"/csi.v1.{service}/{method}",
            f"csi.v1.{method}Request",
            f"csi.v1.{method}Response",
        )
        return await call(plugin.endpoint, path, request, answer, **fields)

    async def scenario() -> None:
        await plugin.start()
        try:
            reg = plugin.registration
            assert reg.parent == cache.kubelet / "plugins_registry"
            info = await call(
                reg,
                "/pluginregistration.Registration/GetInfo",
                "pluginregistration.InfoRequest",
                "pluginregistration.PluginInfo",
            )
            assert (info.type, info.name, info.endpoint) == ("CSIPlugin", DRIVER, str(plugin.endpoint))
            assert list(info.supported_versions) == ["1.0.0"]
            await call(
                reg,
                "/pluginregistration.Registration/NotifyRegistrationStatus",
                "pluginregistration.RegistrationStatus",
                "pluginregistration.RegistrationStatusResponse",
                plugin_registered=True,
            )
            assert plugin.registered is True
            csi = plugin.endpoint
            assert stat.S_IMODE(csi.parent.stat().st_mode) == 0o700
            assert stat.S_IMODE(csi.stat().st_mode) == 0o600
            name = await csi_call("Identity", "GetPluginInfo")
            assert (name.name, name.vendor_version) == (DRIVER, "9.9.9")
            # What the kubelet asks at registration and before each publish: empty answers.
            for service, method in (
                ("Identity", "GetPluginCapabilities"),
                ("Identity", "Probe"),
                ("Node", "NodeGetCapabilities"),
            ):
                said = await csi_call(service, method)
                assert said.ListFields() == [], method
            node = await csi_call("Node", "NodeGetInfo")
            assert node.node_id == "node-1"
            context = {POD_UID_KEY: pod, POD_NAMESPACE_KEY: "team-a", EPHEMERAL_KEY: "true"}
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await csi_call(
                    "Node",
                    "NodePublishVolume",
                    volume_id="v",
                    target_path=target,
                    volume_context={**context, POD_UID_KEY: new_uid()},
                )
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "target_path: names pod" in refused.value.details()
            assert not is_mount(target)
            for _ in range(2):  # a second publish of the same target is a no-op
                await csi_call(
                    "Node",
                    "NodePublishVolume",
                    volume_id="v",
                    target_path=target,
                    volume_context=context,
                    readonly=True,
                )
                assert is_mount(target)
            await csi_call(
                "Node",
                "NodeUnpublishVolume",
                volume_id="v",
                target_path=target,
            )
            assert not is_mount(target) and not Path(target).exists()
        finally:
            await plugin.stop()
        assert not plugin.registration.exists()

    asyncio.run(scenario())


def node_cache_command(tmp_path: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "triton_operator.cli", "node-cache",
        "--root", str(tmp_path / "c"), "--size-limit", "1Mi", "--address", "127.0.0.1", "--port", "0", *extra,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--shared-files", "/tmp"], "--shared-files needs --node-name"),
        (["--shared-files", "/" + "k" * 80, "--node-name", "n1"], "longer than a unix socket's 107 bytes"),
        (
            ["--shared-files", "/nonexistent/kubelet", "--node-name", "n1"],
            "--shared-files /nonexistent/kubelet: not a folder",
        ),
    ],
)
def test_a_bad_shared_files_setting_stops_the_command_naming_it(
    tmp_path: Path, extra: list[str], says: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    done = subprocess.run(
        node_cache_command(tmp_path, *extra), check=False, capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 2
    assert says in done.stderr


def test_the_command_offers_the_plugin_to_the_kubelet_and_withdraws_it_when_stopped(tmp_path: Path) -> None:
    """`triton-operator node-cache --shared-files KUBELET_ROOT` puts its sockets in the kubelet's
    folders, answers the registration call on one, and removes it on SIGTERM (the API server it
    reviews tokens with is never asked here)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "unused"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }))  # fmt: skip
    kubelet = Path(tempfile.mkdtemp(prefix="kl.", dir="/tmp"))
    registration = kubelet / "plugins_registry" / "triton-node-cache.sock"
    log = tmp_path / "log"
    args = node_cache_command(tmp_path, "--shared-files", str(kubelet), "--node-name", "n1")
    try:
        with log.open("wb") as out:
            process = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "KUBECONFIG": str(kubeconfig)}
            )
        deadline = time.monotonic() + 30
        while not registration.exists():
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)

        async def info() -> Any:
            async with grpc.aio.insecure_channel(f"unix://{registration}") as channel:
                rpc = channel.unary_unary(
                    "/pluginregistration.Registration/GetInfo",
                    request_serializer=lambda m: m.SerializeToString(),
                    response_deserializer=MESSAGES["pluginregistration.PluginInfo"].FromString,
                )
                return await rpc(MESSAGES["pluginregistration.InfoRequest"](), timeout=10)

        answer = asyncio.run(info())
        assert answer.endpoint == str(kubelet / "plugins" / "triton-node-cache" / "csi.sock")
        assert Path(answer.endpoint).exists()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0, log.read_text()
        assert not registration.exists()
    finally:
        if process.poll() is None:
            process.kill()
        shutil.rmtree(kubelet)
