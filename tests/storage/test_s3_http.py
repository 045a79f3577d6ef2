"""The sync's own S3 reads (storage.s3_http) against seaweedfs: they answer what the boto3 store answers.

Every test reads from the real server; the boto3 store (storage.s3) is the reference each answer is
compared with, on the same objects in the same run.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from counting_proxy import counting_proxy
from storage_backends import S3Backend
from triton_operator.adapters.storage import (
    AccessDenied,
    BucketNotFound,
    ObjectChanged,
    ObjectStore,
    StoreError,
    StoreUnavailable,
    open_store,
)
from triton_operator.adapters.storage.s3 import S3Store
from triton_operator.adapters.storage.s3_http import S3HttpReader, http_refusal
from triton_operator.core.repository.manifest import StoreRef

MiB = 1024 * 1024
ODD_KEY = "m/1/a b+c=d&e?f%g ü.bin"
"""A key with every character S3 signs encoded (space, +, =, &, ?, %, and a non-ASCII one)."""


@pytest.fixture
def s3(s3_backend: S3Backend) -> S3Backend:
    return s3_backend


def pair(backend: S3Backend, bucket: str) -> tuple[ObjectStore, ObjectStore]:
    """The reader and the boto3 store of the same bucket, both closed by the caller."""
    reader = backend.store(bucket, "m", reads_only=True)
    assert isinstance(reader, S3HttpReader), "static keys and an endpoint: the sync reads over HTTP"
    full = backend.store(bucket, "m", reads_only=False)
    assert isinstance(full, S3Store)
    return reader, full


def answers(store: ObjectStore, key: str, size: int) -> dict[str, Any]:
    """Everything the sync asks of one object, as the store answers it."""
    info = store.head(key)
    assert info is not None
    part = store.part_size(key, info.etag)
    ranges = {}
    for start, end in ((0, None), (0, size), (3, min(size, 77)), (size // 2, None), (size - 1, size)):
        got = bytearray()
        count = store.read_range(key, start, end, got.extend, etag=info.etag)
        assert count == len(got)
        ranges[(start, end)] = bytes(got)
    return {
        "head": info,
        "part_size": part,
        "check": store.transfer_check(key, info.etag, info.generation, None, info.etag.lower()),
        "check_with_part": store.transfer_check(key, info.etag, info.generation, part, info.etag.lower()),
        "ranges": ranges,
        "missing": store.head(key + ".missing"),
    }


@pytest.mark.parametrize(
    ("key", "size", "upload"),
    [
        ("m/1/model.bin", 1000, {}),
        (ODD_KEY, 4096, {}),
        ("m/1/crc32c.bin", 3 * MiB + 5, {"crc": "CRC32C"}),
        ("m/1/shards.bin", 12 * MiB + 7, {"crc": "CRC32", "part_size": 5 * MiB}),
        ("m/1/plain-parts.bin", 11 * MiB, {"part_size": 5 * MiB}),
    ],
    ids=["small", "odd-key", "crc32c", "multipart-crc32", "multipart"],
)
def test_the_reader_answers_what_the_boto3_store_answers(
    s3: S3Backend, key: str, size: int, upload: dict[str, Any]
) -> None:
    bucket = s3.new_bucket()
    data = os.urandom(size)
    s3.put(bucket, key, data, **upload)
    reader, full = pair(s3, bucket)
    try:
        ours, theirs = answers(reader, key, size), answers(full, key, size)
    finally:
        reader.close()
        full.close()
    assert ours == theirs
    assert ours["ranges"][(0, None)] == data
    assert ours["ranges"][(3, min(size, 77))] == data[3:77]
    if "part_size" in upload:
        assert ours["part_size"] == upload["part_size"]
    if upload.get("crc"):
        assert ours["check_with_part"] is not None, "the CRC S3 keeps is found"


def test_a_versioned_object_is_read_at_its_pinned_version(s3: S3Backend) -> None:
    bucket = s3.new_bucket(versioned=True)
    s3.put(bucket, "m/1/w.bin", b"first")
    reader, full = pair(s3, bucket)
    try:
        pinned = next(iter(full.list("m/")))
        assert pinned.generation
        s3.put(bucket, "m/1/w.bin", b"second, longer")
        chunks: list[bytes] = []
        reader.read_range(
            "m/1/w.bin", 0, None, lambda c: chunks.append(bytes(c)), etag="", generation=pinned.generation
        )
        assert b"".join(chunks) == b"first"
        head = reader.head("m/1/w.bin")
        assert head == full.head("m/1/w.bin")
        assert head is not None and head.generation != pinned.generation
    finally:
        reader.close()
        full.close()


@pytest.mark.parametrize("change", ["overwritten", "deleted"])
def test_a_read_of_a_changed_object_raises_object_changed(s3: S3Backend, change: str) -> None:
    bucket = s3.new_bucket()
    s3.put(bucket, "m/1/w.bin", b"pinned bytes")
    reader, full = pair(s3, bucket)
    try:
        info = reader.head("m/1/w.bin")
        assert info is not None
        if change == "overwritten":
            s3.put(bucket, "m/1/w.bin", b"other bytes")
        else:
            s3.delete(bucket, "m/1/w.bin")
        raised = []
        for store in (reader, full):
            with pytest.raises(ObjectChanged) as exc:
                store.read_range("m/1/w.bin", 0, None, lambda c: None, etag=info.etag)
            raised.append(str(exc.value))
        assert raised[0] == raised[1]
        assert ("deleted" in raised[0]) == (change == "deleted")
    finally:
        reader.close()
        full.close()


def test_errors_are_typed_as_the_boto3_stores_are(s3: S3Backend) -> None:
    wrong = {**s3.credentials, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    bucket = s3.new_bucket()
    s3.put(bucket, "m/1/w.bin", b"x")
    ref = StoreRef(uri=f"s3://{bucket}/m", endpoint=s3.endpoint)
    denied = open_store(ref, wrong, reads_only=True)
    assert isinstance(denied, S3HttpReader)
    with pytest.raises(AccessDenied) as exc:
        denied.read_range("m/1/w.bin", 0, None, lambda c: None)
    assert "not-the-secret" not in str(exc.value)
    missing = open_store(
        StoreRef(uri="s3://no-such-bucket-here/m", endpoint=s3.endpoint), s3.credentials, reads_only=True
    )
    with pytest.raises(BucketNotFound):
        missing.read_range("m/1/w.bin", 0, None, lambda c: None)
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    down = open_store(
        StoreRef(uri=f"s3://{bucket}/m", endpoint=f"http://127.0.0.1:{port}"),
        s3.credentials,
        reads_only=True,
        max_attempts=2,
    )
    with pytest.raises(StoreUnavailable):
        down.read_range("m/1/w.bin", 0, None, lambda c: None)
    assert down.part_size("m/1/w.bin", "") is None  # a HEAD that cannot be asked answers "unknown"
    for store in (denied, missing, down):
        store.close()


def test_each_thread_keeps_one_connection_and_a_closed_one_is_opened_again(s3: S3Backend) -> None:
    bucket = s3.new_bucket()
    for i in range(6):
        s3.put(bucket, f"m/1/{i}.bin", bytes([i]) * 1000)
    with counting_proxy(s3.endpoint) as proxy:
        reader = open_store(
            StoreRef(uri=f"s3://{bucket}/m", endpoint=proxy.endpoint), s3.credentials, reads_only=True
        )
        try:
            for i in range(3):
                assert reader.open_range(f"m/1/{i}.bin", 0, 1000) == bytes([i]) * 1000
            assert proxy.connections == 1, "the requests of one thread share its keep-alive connection"
            proxy.close_connections()  # the server side ends the idle connection
            assert reader.open_range("m/1/3.bin", 0, 1000) == bytes([3]) * 1000
            assert proxy.connections == 2
            got: list[bytes] = []
            threads = [
                threading.Thread(target=lambda i=i: got.append(reader.open_range(f"m/1/{i}.bin", 0, 1000)))
                for i in (4, 5)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted(got) == [bytes([4]) * 1000, bytes([5]) * 1000]
            assert proxy.connections == 4, "each new thread its own connection"
        finally:
            reader.close()


def test_a_sink_that_stops_a_read_leaves_no_half_read_connection(s3: S3Backend) -> None:
    bucket = s3.new_bucket()
    s3.put(bucket, "m/1/big.bin", os.urandom(3 * MiB))
    s3.put(bucket, "m/1/small.bin", b"small")
    reader = s3.store(bucket, "m", reads_only=True)

    class StopError(Exception):
        pass

    def stop(chunk: Any) -> None:
        raise StopError

    try:
        with pytest.raises(StopError):
            reader.read_range("m/1/big.bin", 0, None, stop)
        assert reader.open_range("m/1/small.bin", 0, 5) == b"small"
    finally:
        reader.close()


def test_listing_and_pinning_go_through_boto3(s3: S3Backend) -> None:
    bucket = s3.new_bucket()
    s3.put(bucket, "m/1/w.bin", b"x" * 10)
    reader, full = pair(s3, bucket)
    try:
        listed = list(reader.list("m/"))
        assert listed == list(full.list("m/"))
        assert reader.trusted(listed) == full.trusted(listed)
        assert reader.versioned() is False
    finally:
        reader.close()
        full.close()


KEYS = {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}


@pytest.mark.parametrize(
    ("credentials", "endpoint", "region", "env", "why"),
    [
        (KEYS, "http://127.0.0.1:8333", "", {"PATH": "/bin", "AWS_REGION": "x"}, ""),
        (KEYS, "https://s3.example:9000/", "eu-west-1", {}, ""),
        ({}, "http://127.0.0.1:8333", "", {}, "no static keys"),
        ({"AWS_ACCESS_KEY_ID": "a"}, "http://127.0.0.1:8333", "", {}, "no static keys"),
        (KEYS, "", "eu-west-1", {}, "no endpoint"),
        (KEYS, "http://127.0.0.1:8333/base", "", {}, "has a path"),
        (KEYS, "ftp://127.0.0.1:8333", "", {}, "is not http(s)"),
        (KEYS, "http://127.0.0.1:8333", "not a region!", {}, "no region name"),
        (KEYS, "http://127.0.0.1:8333", "", {"HTTPS_PROXY": "http://p:3128"}, "$HTTPS_PROXY is set"),
        (KEYS, "http://127.0.0.1:8333", "", {"no_proxy": "x"}, "$no_proxy is set"),
        (KEYS, "https://127.0.0.1:8333", "", {"AWS_CA_BUNDLE": "/ca.pem"}, ""),
        (KEYS, "http://127.0.0.1:8333", "", {"AWS_MAX_ATTEMPTS": "9"}, "$AWS_MAX_ATTEMPTS is set"),
        (KEYS, "http://127.0.0.1:8333", "", {"AWS_ENDPOINT_URL_S3": "x"}, "$AWS_ENDPOINT_URL_S3 is set"),
    ],
)
def test_what_sends_the_reads_through_boto3(  # noqa: PLR0917 - one row of the table
    credentials: dict[str, str], endpoint: str, region: str, env: dict[str, str], why: str, tmp_path: Path
) -> None:
    got = http_refusal(credentials, endpoint, region, {"HOME": str(tmp_path), **env})
    if why:
        assert why in got
    else:
        assert got == ""


def test_an_aws_config_file_sends_the_reads_through_boto3(tmp_path: Path) -> None:
    assert http_refusal(KEYS, "http://127.0.0.1:8333", "", {"HOME": str(tmp_path)}) == ""
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "config").write_text("[default]\nca_bundle = /ca.pem\n")
    assert "config exists" in http_refusal(KEYS, "http://127.0.0.1:8333", "", {"HOME": str(tmp_path)})


def test_open_store_gives_boto3_where_the_reader_cannot_go(
    s3: S3Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = StoreRef(uri="s3://b/m", endpoint=s3.endpoint)
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    store = open_store(ref, s3.credentials, reads_only=True)
    assert isinstance(store, S3Store)
    store.close()
    monkeypatch.delenv("HTTPS_PROXY")
    store = open_store(ref, s3.credentials)
    assert isinstance(store, S3Store), "the operator's own stores (pinning) stay boto3's"
    store.close()


@pytest.fixture(autouse=True)
def _no_aws_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A home without ~/.aws: the machine's own AWS config must not decide which store a test gets."""
    monkeypatch.setenv("HOME", str(tmp_path))
    yield


def test_a_whole_object_answered_to_a_range_is_refused(tmp_path: Path) -> None:
    """A server that ignores Range (HTTP allows it) answers 200 with every byte: the reader takes that
    only as the range [0, size). The one fake here: a stdlib HTTP server that answers every GET with
    the same 10 bytes, since seaweedfs always honours a range."""
    import http.server  # noqa: PLC0415

    class Whole(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "10")
            self.end_headers()
            self.wfile.write(b"0123456789")

        def log_message(self, *args: Any) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Whole)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        ref = StoreRef(uri="s3://b/m", endpoint=f"http://127.0.0.1:{server.server_address[1]}")
        reader = open_store(ref, {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}, reads_only=True)
        assert isinstance(reader, S3HttpReader)
        assert reader.open_range("m/x", 0, 10) == b"0123456789"
        for start, end in ((0, 5), (3, 10)):
            with pytest.raises(StoreError, match="ignored the range"):
                reader.open_range("m/x", start, end)
        reader.close()
    finally:
        server.shutdown()
        server.server_close()


class _SleepRecorder:
    """Stands for the module ``time`` where a retry loop sleeps: notes each delay, sleeps none."""

    def __init__(self, slept: list[float]) -> None:
        import time  # noqa: PLC0415

        self.slept = slept
        self.monotonic = time.monotonic

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


class _Throttling:
    """A stdlib HTTP server that answers the first ``busy`` HEADs 503 SlowDown (with ``retry_after``
    as Retry-After when set) and the next ones 200; it notes when each request came."""

    def __init__(self, busy: int, retry_after: str | None) -> None:
        import http.server  # noqa: PLC0415
        import time  # noqa: PLC0415

        self.arrivals: list[float] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_HEAD(self) -> None:
                outer.arrivals.append(time.monotonic())
                if len(outer.arrivals) <= busy:
                    self.send_response(503)
                    if retry_after is not None:
                        self.send_header("Retry-After", retry_after)
                    self.send_header("x-amz-error-code", "SlowDown")
                else:
                    self.send_response(200)
                    self.send_header("ETag", '"0123456789abcdef0123456789abcdef"')
                self.send_header("Content-Length", "10")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def reader(self, **kwargs: Any) -> S3HttpReader:
        return S3HttpReader(
            "s3://b/m",
            "b",
            "m",
            credentials={"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"},
            endpoint=self.endpoint,
            region="",
            addressing_style="path",
            full=lambda: pytest.fail("no call goes through boto3"),
            **kwargs,
        )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_throttled_read_waits_out_the_stores_retry_after() -> None:
    """On main the reader retried after a fixed 0.1 s and 0.2 s whatever the store asked."""
    server = _Throttling(busy=2, retry_after="1")
    try:
        reader = server.reader(random=lambda: 0.0)
        info = reader.head("m/x")
        reader.close()
    finally:
        server.close()
    assert info is not None and info.size == 10
    gaps = [later - earlier for earlier, later in zip(server.arrivals, server.arrivals[1:], strict=False)]
    assert len(gaps) == 2 and all(gap >= 1.0 for gap in gaps), gaps


def test_throttled_reads_back_off_growing_and_jittered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without Retry-After: delays of up to 0.2 s, 0.4 s, 0.8 s ..., each a random share of it."""
    import random  # noqa: PLC0415

    from triton_operator.adapters.storage import s3_http  # noqa: PLC0415

    runs = []
    for jitter in (lambda: 1.0, random.Random(1).random, random.Random(2).random):
        slept: list[float] = []
        monkeypatch.setattr(s3_http, "time", _SleepRecorder(slept))
        server = _Throttling(busy=99, retry_after=None)
        try:
            reader = server.reader(random=jitter, max_attempts=5)
            with pytest.raises(StoreError, match=r"SlowDown|503"):
                reader.head("m/x")
            reader.close()
        finally:
            server.close()
        runs.append(slept)
    assert runs[0] == [0.2, 0.4, 0.8, 1.6]
    assert all(0.0 <= d <= c for run in runs[1:] for d, c in zip(run, runs[0], strict=True))
    assert all(a != b for a, b in zip(runs[1], runs[2], strict=True))
