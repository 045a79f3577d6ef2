"""Encrypted S3 objects, whose ETag is no MD5 of their bytes: pinned by another checksum, never by it.

Real seaweedfs for SSE-S3 and SSE-C (it has no KMS configured: SSE-KMS puts fail there), and
``KmsStandIn`` for SSE-KMS: a stand-in, a loopback proxy in front of seaweedfs that answers like an
SSE-KMS bucket (see its docstring).
"""

from __future__ import annotations

import hashlib
import html
import http.client
import json
import os
import re
import threading
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from storage_backends import Backend, CountingStore, S3Backend
from storage_servers import S3_ACCESS_KEY, S3_SECRET_KEY
from testkit import run_init_sync
from triton_operator.adapters.storage import pin_repository
from triton_operator.adapters.storage.s3 import is_aws_endpoint
from triton_operator.adapters.sync.destination import STATE_FILE
from triton_operator.adapters.sync.download import SyncOptions, sync
from triton_operator.adapters.sync.results import ChecksumMismatch
from triton_operator.core.repository.manifest import Manifest, manifest_to_json
from triton_operator.core.spec.modelconfig import build_config_pbtxt
from triton_operator.models import ModelSpec, Repository

pytestmark = pytest.mark.storage

MODELS = [ModelSpec(name="enc", config={"backend": "python"})]
SHA256_FILE = ("models/enc/1/model.onnx", b"weights " * 5000)
CRC32_FILE = ("models/enc/1/labels.txt", b"cat\ndog\n" * 100)


def fake_etag(real: str) -> str:
    """An ETag like SSE-KMS gives: 32 hex digits that are not the MD5 of the bytes."""
    return hashlib.md5(b"sse-kms stand-in:" + real.encode(), usedforsecurity=False).hexdigest()


class KmsStandIn:
    """A stand-in for an S3 bucket whose objects are SSE-KMS encrypted (seaweedfs has no KMS).

    A read-only loopback HTTP proxy in front of seaweedfs. Like S3 under SSE-KMS, every object's
    ETag (in listings, HEAD and GET answers) is replaced by an opaque 32-hex value that is not the
    MD5 of the bytes, HEAD and GET answers carry ``x-amz-server-side-encryption: aws:kms``, and an
    ``If-Match`` naming that ETag matches. The proxy signs again what it forwards with the test
    keys (an ``If-Match`` it rewrites is a signed header). ``drop_checksums`` removes the additional
    checksums (``x-amz-checksum-*``) seaweedfs gives; ``corrupt`` flips a byte of object bodies.
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream)
        self.drop_checksums = False
        self.corrupt = False
        self.reverse: dict[str, str] = {}
        self.requests: list[tuple[str, str]] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                stand_in.forward(self, "GET")

            def do_HEAD(self) -> None:
                stand_in.forward(self, "HEAD")

            def log_message(self, fmt: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)

    def _fake(self, real: str) -> str:
        fake = fake_etag(real)
        self.reverse[fake] = real
        return fake

    def forward(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        self.requests.append((method, handler.path))
        skip = {"host", "authorization", "x-amz-date", "x-amz-content-sha256", "connection", "content-length"}
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in skip}
        for name in [k for k in headers if k.lower() == "if-match"]:
            value = headers[name].strip('"')
            headers[name] = f'"{self.reverse.get(value, value)}"'
        url = f"{self.upstream.scheme}://{self.upstream.netloc}{handler.path}"
        request = AWSRequest(method=method, url=url, headers=headers)
        S3SigV4Auth(Credentials(S3_ACCESS_KEY, S3_SECRET_KEY), "s3", "us-east-1").add_auth(request)
        conn = http.client.HTTPConnection(self.upstream.netloc, timeout=30)
        try:
            conn.request(method, handler.path, headers=dict(request.headers.items()))
            response = conn.getresponse()
            body = response.read()
            status, answer = response.status, response.getheaders()
        finally:
            conn.close()
        path, _, query = handler.path.partition("?")
        is_object = path.strip("/").count("/") >= 1 and "versioning" not in query
        out: list[tuple[str, str]] = []
        for name, value in answer:
            low = name.lower()
            if low in ("content-length", "connection", "transfer-encoding"):
                continue
            if self.drop_checksums and low.startswith("x-amz-checksum-"):
                continue
            out.append((name, f'"{self._fake(value.strip(chr(34)))}"' if low == "etag" else value))
        if is_object and status < 300:
            out.append(("x-amz-server-side-encryption", "aws:kms"))
            out.append(
                ("x-amz-server-side-encryption-aws-kms-key-id", "arn:aws:kms:us-east-1:0:key/stand-in")
            )
            if self.corrupt and method == "GET" and body:
                body = bytes([body[0] ^ 0x01]) + body[1:]
        elif body:
            text = body.decode()
            text = re.sub(
                r"<ETag>(.*?)</ETag>",
                lambda m: (
                    "<ETag>" + html.escape(f'"{self._fake(html.unescape(m[1]).strip(chr(34)))}"') + "</ETag>"
                ),
                text,
            )
            body = text.encode()
        handler.send_response(status)
        for name, value in out:
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if method != "HEAD":
            handler.wfile.write(body)


@pytest.fixture
def kms(s3_backend: Backend) -> Iterator[KmsStandIn]:
    stand_in = KmsStandIn(s3_backend.endpoint)
    yield stand_in
    stand_in.close()


@pytest.fixture
def kms_bucket(s3_backend: Backend) -> str:
    assert isinstance(s3_backend, S3Backend)
    bucket = s3_backend.new_bucket()
    for (key, data), algorithm in ((SHA256_FILE, "SHA256"), (CRC32_FILE, "CRC32")):
        s3_backend.client.put_object(Bucket=bucket, Key=key, Body=data, ChecksumAlgorithm=algorithm)
    return bucket


def through(kms: KmsStandIn, s3_backend: Backend, bucket: str) -> tuple[Repository, dict[str, str]]:
    return Repository(uri=f"s3://{bucket}/models", endpoint=kms.endpoint), dict(s3_backend.credentials)


def sync_from(kms: KmsStandIn, s3_backend: Backend, bucket: str, manifest: Manifest, dest: Path) -> Any:
    store = S3Backend("kms", kms.endpoint, s3_backend.credentials).store(bucket)
    return sync(manifest, CountingStore(store), SyncOptions(dest=dest, concurrency=4))


def synced(dest: Path) -> dict[str, bytes]:
    return {
        p.relative_to(dest).as_posix(): p.read_bytes()
        for p in dest.rglob("*")
        if p.is_file() and p.name != STATE_FILE
    }


def test_sse_kms_objects_sync_verified_by_their_additional_checksums_and_a_flipped_byte_is_caught(
    s3_backend: Backend, kms: KmsStandIn, kms_bucket: str, tmp_path: Path
) -> None:
    repository, credentials = through(kms, s3_backend, kms_bucket)
    manifest = pin_repository(repository, MODELS, credentials)
    stats = sync_from(kms, s3_backend, kms_bucket, manifest, tmp_path / "models")
    assert synced(tmp_path / "models") == {
        "enc/1/model.onnx": SHA256_FILE[1],
        "enc/1/labels.txt": CRC32_FILE[1],
    }
    assert (stats.downloaded_files, stats.unverified_files) == (2, 0)

    # The bucket's ETag is kept to read exactly that object, never taken for an MD5.
    pinned = {e.key: (e.checksum_kind, e.checksum, e.etag) for e in manifest.entries}
    assert pinned == {
        SHA256_FILE[0]: (
            "sha256",
            hashlib.sha256(SHA256_FILE[1]).hexdigest(),
            fake_etag(hashlib.md5(SHA256_FILE[1]).hexdigest()),
        ),
        CRC32_FILE[0]: (
            "crc32",
            f"{zlib.crc32(CRC32_FILE[1]):08x}",
            fake_etag(hashlib.md5(CRC32_FILE[1]).hexdigest()),
        ),
    }

    kms.corrupt = True
    for n, key in enumerate((SHA256_FILE[0], CRC32_FILE[0])):
        one = Manifest(
            manifest.repository, manifest.models, tuple(e for e in manifest.entries if e.key == key)
        )
        with pytest.raises(ChecksumMismatch) as info:
            sync_from(kms, s3_backend, kms_bucket, one, tmp_path / f"corrupt{n}")
        assert info.value.key == key and info.value.expected == pinned[key][1]
        assert not (tmp_path / f"corrupt{n}" / "enc/1" / key.rsplit("/", 1)[1]).exists()


def test_the_init_containers_sync_exits_0_on_sse_kms_objects_and_4_on_a_flipped_byte(
    s3_backend: Backend, kms: KmsStandIn, kms_bucket: str, tmp_path: Path
) -> None:
    """`triton-operator sync` as the pod's init container runs it: the pod becomes Ready only on exit 0."""
    repository, credentials = through(kms, s3_backend, kms_bucket)
    (tmp_path / "manifest.json").write_text(manifest_to_json(pin_repository(repository, MODELS, credentials)))
    (tmp_path / "configs/enc").mkdir(parents=True)
    (tmp_path / "configs/enc/config.pbtxt").write_text(build_config_pbtxt("enc", MODELS[0].config))
    result = run_init_sync(tmp_path, credentials, dest="models")
    assert result.returncode == 0, result.stderr
    assert synced(tmp_path / "models") == {
        "enc/1/model.onnx": SHA256_FILE[1],
        "enc/1/labels.txt": CRC32_FILE[1],
        "enc/config.pbtxt": build_config_pbtxt("enc", MODELS[0].config).encode(),
    }
    assert json.loads(result.stdout.splitlines()[-1])["unverified_files"] == 0

    kms.corrupt = True
    result = run_init_sync(tmp_path, credentials, dest="corrupt")
    assert result.returncode == 4, result.stderr
    assert "the manifest pins" in result.stderr


def test_sse_kms_objects_without_additional_checksums_are_pinned_by_size_and_etag(
    s3_backend: Backend, kms: KmsStandIn, kms_bucket: str, tmp_path: Path
) -> None:
    kms.drop_checksums = True
    repository, credentials = through(kms, s3_backend, kms_bucket)
    manifest = pin_repository(repository, MODELS, credentials)
    stats = sync_from(kms, s3_backend, kms_bucket, manifest, tmp_path / "models")
    assert synced(tmp_path / "models") == {
        "enc/1/model.onnx": SHA256_FILE[1],
        "enc/1/labels.txt": CRC32_FILE[1],
    }
    assert (stats.downloaded_files, stats.unverified_files) == (2, 2)
    assert {(e.checksum_kind, e.checksum) for e in manifest.entries} == {("none", "")}


def test_a_second_pin_asks_only_objects_it_has_not_asked_before(
    s3_backend: Backend, kms: KmsStandIn, kms_bucket: str
) -> None:
    repository, credentials = through(kms, s3_backend, kms_bucket)
    first = pin_repository(repository, MODELS, credentials)
    heads = [p for m, p in kms.requests if m == "HEAD"]
    assert sorted(p.split("?")[0].rsplit("/", 1)[1] for p in heads) == ["labels.txt", "model.onnx"]
    kms.requests.clear()
    assert pin_repository(repository, MODELS, credentials) == first
    assert [m for m, _ in kms.requests if m == "HEAD"] == []


def test_seaweedfs_sse_s3_and_sse_c_etags_are_not_taken_for_md5(s3_backend: Backend, tmp_path: Path) -> None:
    """An S3-compatible store's SSE-S3 ETag may be no MD5 (MinIO encrypts it): the additional checksum
    verifies. An SSE-C object cannot be asked without its key: its ETag is not trusted either."""
    assert isinstance(s3_backend, S3Backend)
    bucket = s3_backend.new_bucket()
    plain, sse_s3, sse_c = b"plain " * 999, b"sse-s3 " * 999, b"sse-c " * 999
    s3_backend.client.put_object(Bucket=bucket, Key="models/enc/1/plain.bin", Body=plain)
    s3_backend.client.put_object(
        Bucket=bucket,
        Key="models/enc/1/s3.bin",
        Body=sse_s3,
        ServerSideEncryption="AES256",
        ChecksumAlgorithm="SHA256",
    )
    s3_backend.client.put_object(
        Bucket=bucket,
        Key="models/enc/1/c.bin",
        Body=sse_c,
        SSECustomerAlgorithm="AES256",
        SSECustomerKey=os.urandom(32),
    )
    manifest = pin_repository(s3_backend.repository(bucket), MODELS, s3_backend.credentials)
    assert {e.key.rsplit("/", 1)[1]: (e.checksum_kind, e.checksum) for e in manifest.entries} == {
        "plain.bin": ("md5", hashlib.md5(plain).hexdigest()),  # unencrypted: pinned as before
        "s3.bin": ("sha256", hashlib.sha256(sse_s3).hexdigest()),
        "c.bin": ("none", ""),
    }
    one = Manifest(
        manifest.repository, manifest.models, tuple(e for e in manifest.entries if "c.bin" not in e.key)
    )
    stats = sync(one, s3_backend.store(bucket), SyncOptions(dest=tmp_path / "m", concurrency=2))
    assert synced(tmp_path / "m") == {"enc/1/plain.bin": plain, "enc/1/s3.bin": sse_s3}
    assert stats.unverified_files == 0


@pytest.mark.parametrize(
    ("endpoint", "aws"),
    [
        ("", True),
        ("https://s3.eu-west-1.amazonaws.com", True),
        ("https://bucket.vpce-0a1b.s3.us-east-1.vpce.amazonaws.com", True),
        ("http://minio.storage.svc:9000", False),
        ("https://amazonaws.com.example.org", False),
    ],
)
def test_only_amazon_s3_itself_is_trusted_with_sse_s3_etags(endpoint: str, aws: bool) -> None:
    """AWS documents an SSE-S3 object's ETag as its MD5; an S3-compatible store (MinIO) may encrypt it."""
    assert is_aws_endpoint(endpoint) is aws
