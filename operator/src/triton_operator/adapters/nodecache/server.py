"""The node cache's HTTP server: objects by content (GET, HEAD, PUT), leases, metrics and health.

GET  /v1/objects/<kind>/<checksum>   200 and the bytes (checked as they are sent: an object that
                                     no longer matches its key is dropped; a multipart ETag, which
                                     needs its part size, is checked by the reader), 404
HEAD /v1/objects/<kind>/<checksum>   200 with its Content-Length, 404
PUT  /v1/objects/<kind>/<checksum>   201 kept; 400 not a cached kind or short; 409 present or being
                                     written; 411 no Content-Length; 413 over the size limit;
                                     422 the bytes do not match the key; 507 leases leave no room.
                                     X-Part-Size: a multipart ETag's part size (required for one);
                                     X-Check-Existing: 1 when the uploader refused the cache's copy
                                     (the cache checks its copy, and drops it if it is wrong)
POST /v1/leases                      {"pod": uid, "objects": [[kind, checksum], ...]} ->
                                     {"held": ["kind/checksum", ...], "part_sizes": {key: n}}
                                     (the part size each held multipart object was checked with)
GET  /metrics, /healthz
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from triton_operator.adapters.nodecache.store import ContentStore, Refused
from triton_operator.adapters.sync.hashing import make_hasher

PREFIX = "triton_node_cache"
MAX_LEASE_BODY = 64 * 1024 * 1024
PART_SIZE_HEADER = "X-Part-Size"
CHECK_EXISTING_HEADER = "X-Check-Existing"
MAX_DRAINED = 64 * 1024 * 1024
"""An upload refused before its body is read (present, busy, too big): up to this many bytes are
read and dropped, so that the client gets the answer; past it the connection is closed."""
CHUNK = 1024 * 1024

log = logging.getLogger(__name__)


class StoreCollector(Collector):
    """The store's counts as Prometheus metrics, read at each scrape."""

    def __init__(self, store: ContentStore) -> None:
        self.store = store

    def collect(self) -> Iterator[Any]:
        s = self.store.stats
        counters = {
            "hits": ("objects served from the cache", s.hits),
            "misses": ("objects asked for that the cache does not hold", s.misses),
            "hit_bytes": ("bytes served from the cache", s.hit_bytes),
            "stored": ("objects uploaded, checked and kept", s.stored),
            "stored_bytes": ("bytes uploaded, checked and kept", s.stored_bytes),
            "evictions": ("objects evicted to fit the size limit", s.evictions),
            "evicted_bytes": ("bytes evicted to fit the size limit", s.evicted_bytes),
            "corrupt": ("objects dropped because their bytes no longer matched their key", s.corrupt),
        }
        for name, (text, value) in counters.items():
            yield CounterMetricFamily(f"{PREFIX}_{name}", f"Node cache: {text}.", value=value)
        refused = CounterMetricFamily(
            f"{PREFIX}_refused_uploads", "Node cache: uploads not kept, by reason.", labels=["reason"]
        )
        for reason, count in sorted(s.refused.items()):
            refused.add_metric([reason], count)
        yield refused
        objects, used, leased = self.store.figures()
        yield GaugeMetricFamily(f"{PREFIX}_objects", "Node cache: objects kept.", value=objects)
        yield GaugeMetricFamily(f"{PREFIX}_bytes", "Node cache: bytes kept.", value=used)
        yield GaugeMetricFamily(
            f"{PREFIX}_leased_bytes", "Node cache: bytes under a live lease.", value=leased
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_limit_bytes", "Node cache: the size limit.", value=self.store.limit
        )


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 300  # a connection idle (or stalled mid-upload) this long is closed, its thread freed
    server: NodeCacheServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug("%s " + format, self.client_address[0], *args)

    # ------------------------------------------------------------ routing

    def _object(self) -> tuple[str, str] | None:
        parts = self.path.split("?", 1)[0].split("/")
        if len(parts) == 5 and parts[:3] == ["", "v1", "objects"]:
            return parts[3], parts[4]
        return None

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._reply(200, generate_latest(self.server.registry), "text/plain; version=0.0.4")
        elif path == "/healthz":
            self._reply(200, b"ok\n")
        elif (obj := self._object()) is not None:
            self._send_object(*obj, body=True)
        else:
            self._reply(404, b"not found\n")

    def do_HEAD(self) -> None:
        obj = self._object()
        if obj is None:
            self._reply(404, b"")
            return
        self._send_object(*obj, body=False)

    def do_PUT(self) -> None:
        obj = self._object()
        if obj is None:
            self._refuse(404, "not found")
            return
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self._refuse(411, "a Content-Length is required")
            return
        store = self.server.store
        part = self.headers.get(PART_SIZE_HEADER, "")
        check = self.headers.get(CHECK_EXISTING_HEADER, "") == "1"
        try:
            upload = store.begin(
                obj[0], obj[1], int(length), int(part) if part.isdigit() else None, check_existing=check
            )
        except Refused as refused:
            if int(length) <= MAX_DRAINED:  # read it, so that the client sees the answer
                self._drain(int(length))
            self._refuse(refused.status, str(refused))
            return
        try:
            store.write(upload, self.rfile.read)
        except Refused as refused:
            self._refuse(refused.status, str(refused))
            return
        except OSError as exc:  # the node's disk is full (or failing): nothing was kept
            log.warning("node cache: writing %s failed: %s", upload.key, exc)
            self._refuse(507, f"{upload.key}: not kept: {exc.strerror or exc}")
            return
        self._reply(201, b"kept\n")

    def do_POST(self) -> None:
        if self.path.split("?", 1)[0] != "/v1/leases":
            self._refuse(404, "not found")
            return
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit() or int(length) > MAX_LEASE_BODY:
            self._refuse(411, f"a Content-Length of at most {MAX_LEASE_BODY} is required")
            return
        try:
            body = json.loads(self.rfile.read(int(length)))
            pod = body["pod"]
            objects = [(str(k), str(c)) for k, c in body["objects"]]
            if not isinstance(pod, str) or not pod:
                raise ValueError("pod")
        except (ValueError, KeyError, TypeError):
            self._reply(400, b'{"error": "expected {\\"pod\\": uid, \\"objects\\": [[kind, checksum]]}"}\n')
            return
        try:
            held = self.server.store.lease(pod, objects)
        except Refused as refused:
            self._reply(refused.status, json.dumps({"error": str(refused)}).encode())
            return
        store = self.server.store
        sizes = {k: size for k in held if (size := store.part_size(k)) is not None}
        self._reply(200, json.dumps({"held": held, "part_sizes": sizes}).encode(), "application/json")

    # ------------------------------------------------------------ answers

    def _send_object(self, kind: str, checksum: str, *, body: bool) -> None:
        store = self.server.store
        opened = store.open(kind, checksum)
        if opened is None:
            self._reply(404, b"")
            return
        f, size = opened
        with f:
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            if not body:
                return
            # A multipart ETag cannot be checked without its part size: the reader checks it (and
            # says so on its upload, X-Check-Existing).
            digest = make_hasher(kind)
            sent = 0
            while chunk := f.read(CHUNK):
                if digest is not None:
                    digest.update(chunk)
                self.wfile.write(chunk)
                sent += len(chunk)
        if sent != size or (digest is not None and digest.hexdigest() != checksum):
            # The client checks what it got too; the cache stops handing it out.
            store.drop_corrupt(kind, checksum)
            self.close_connection = True
            return
        store.served(size)

    def _drain(self, length: int) -> None:
        while length > 0 and (chunk := self.rfile.read(min(CHUNK, length))):
            length -= len(chunk)

    def _refuse(self, status: int, message: str) -> None:
        self.close_connection = True  # the body, if any, is left unread
        self._reply(status, (message + "\n").encode())

    def _reply(self, status: int, data: bytes, content_type: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


class NodeCacheServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], store: ContentStore) -> None:
        super().__init__(address, Handler)
        self.store = store
        self.registry = CollectorRegistry()
        self.registry.register(StoreCollector(store))


def serve(address: tuple[str, int], store: ContentStore) -> NodeCacheServer:
    """The server, bound and listening (serve_forever on a thread of the caller's choosing)."""
    return NodeCacheServer(address, store)


def start_in_thread(server: NodeCacheServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="node-cache", daemon=True)
    thread.start()
    return thread
