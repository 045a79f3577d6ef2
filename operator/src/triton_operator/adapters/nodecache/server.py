"""The node cache's HTTP server (aiohttp): objects by content (GET, HEAD, PUT), leases, metrics and health.

Every request but /healthz and /metrics carries ``Authorization: Bearer <token>``, the caller pod's
projected ServiceAccount token for the node cache's audience (checked by a TokenReview, remembered
briefly); without one: 401. Objects are looked up in the caller's namespace only.

GET  /v1/objects/<kind>/<checksum>   200 and the bytes, sent by sendfile(2) from the blob (checked
                                     when it was taken; the pod checks them against its pin), 404;
                                     Range: bytes=A-B (one range) 206 and those bytes, 416 a range
                                     it cannot serve
HEAD /v1/objects/<kind>/<checksum>   200 with its Content-Length, 404
PUT  /v1/objects/<kind>/<checksum>   201 kept; 400 not a cached kind, short, long, or not the
                                     leased size; 403 not named by the pod's live lease; 408 stalled;
                                     409 present or being written; 411 no Content-Length; 413 over the
                                     size limit; 422 the bytes do not match the key; 507 leases leave
                                     no room. X-Part-Size: a multipart ETag's part size (required for
                                     one). X-Check-Existing: 1 when the uploader refused the cache's
                                     copy: the cache hashes its own copy again and drops it only if
                                     that hash differs
POST /v1/leases                      {"pod": uid, "objects": [[kind, checksum, size], ...]} ->
                                     {"held": ["kind/checksum", ...], "part_sizes": {key: n}}, and
                                     with a signing key "statements": {"objects": {key: sha256},
                                     "signature": s, "blake3": {"objects": {key: blake3},
                                     "signature": s}}; 403 when pod is not the caller's own uid;
                                     413 over the bounds. With --one-download and "fetch":
                                     [key, ...] (those the pod reads from its store where the
                                     node lacks them, and uploads) it claims each that no other
                                     pod of its namespace claims, and the answer names the
                                     others, "coming": {key: seconds at most}
POST /v1/waits                       {"keys": [key, ...]} (keys of the pod's live lease) ->
                                     {"settled": [key, ...]} once one of them is no longer coming
                                     (held, or no other pod's claim or upload on it), or [] after
                                     at most 20 s; 403 a key its lease does not name
GET  /metrics, /healthz              open: totals only, nothing of a namespace, pod or object
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO, TypeVar

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from triton_operator.adapters.nodecache.review import TokenReviewer
from triton_operator.adapters.nodecache.statements import Signer
from triton_operator.adapters.nodecache.store import ContentStore, Refused, Upload
from triton_operator.adapters.nodecache.views import Views
from triton_operator.core.repository.cache_rules import (
    AUDIENCE,
    BLAKE3_STATEMENT_TAG,
    MAX_LEASE_BODY,
    MAX_LEASE_OBJECTS,
    MAX_WAIT_BODY,
    WAIT_SECONDS,
    Caller,
    NotAllowed,
    caller_from_review,
    parse_keys,
    parse_lease,
    parse_range,
    parse_wait,
    token_expiry,
    token_refusal,
)

PREFIX = "triton_node_cache"
PART_SIZE_HEADER = "X-Part-Size"
CHECK_EXISTING_HEADER = "X-Check-Existing"
SETTLE_SECONDS = 10.0
"""The longest a lease waits for the checks of its objects' uploads received a moment before."""
PREFER_ASYNC = "respond-async"
"""``Prefer: respond-async`` on an upload: answer 202 once its bytes are on the cache's disk, and
check them (against the key, and the SHA-256 that names them) after; nothing is placed unless they
match. The pod that uploads then waits for the transfer only, not for the node's hashing."""
CHUNK = 1024 * 1024
SENDFILE_PIECE = 16 * 1024 * 1024
"""An object is sent in pieces of this many bytes, each within the server's idle time."""
REVIEW_SECONDS = 30.0
"""How long a token's accepted review is remembered (by the token's SHA-256)."""
REFUSED_SECONDS = 10.0
"""How long a refused token is remembered (no second TokenReview for it meanwhile)."""
WAIT_POLL_SECONDS = 0.05
"""How often a wait looks at the claims of the keys it waits for."""
REVIEWS_KEPT = 4096
REVIEWS_AT_ONCE = 4

log = logging.getLogger(__name__)
T = TypeVar("T")


def _labelled(name: str, text: str, label: str, values: Iterable[tuple[str, int]]) -> CounterMetricFamily:
    """A node-cache counter with one label: each (label value, count) of ``values``."""
    family = CounterMetricFamily(f"{PREFIX}_{name}", f"Node cache: {text}.", labels=[label])
    for value, count in values:
        family.add_metric([value], count)
    return family


class StoreCollector(Collector):
    """The store's and the server's counts as Prometheus metrics, read at each scrape."""

    def __init__(
        self, store: ContentStore, refused_requests: dict[str, int], sent_bytes: dict[str, int]
    ) -> None:
        self.store = store
        self.refused_requests = refused_requests
        self.sent_bytes = sent_bytes

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
        yield _labelled("refused_uploads", "uploads not kept, by reason", "reason", sorted(s.refused.items()))
        yield _labelled(
            "refused_requests",
            "requests refused before any object was touched, by reason",
            "reason",
            sorted(self.refused_requests.items()),
        )
        yield _labelled(
            "sent_bytes",
            "object bytes sent, by how (sendfile: from the page cache by the kernel)",
            "how",
            [(how, self.sent_bytes.get(how, 0)) for how in ("sendfile", "copy")],
        )
        objects, used, leased = self.store.figures()
        yield GaugeMetricFamily(f"{PREFIX}_objects", "Node cache: objects (blobs) kept.", value=objects)
        yield GaugeMetricFamily(f"{PREFIX}_bytes", "Node cache: bytes kept.", value=used)
        yield GaugeMetricFamily(
            f"{PREFIX}_leased_bytes", "Node cache: bytes under a live lease.", value=leased
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_limit_bytes", "Node cache: the size limit.", value=self.store.limit
        )


class Authenticator:
    """Who a request comes from: its bearer token, reviewed by the API server (``reviewer``) for
    ``audience``, remembered for a short time in a bounded table."""

    def __init__(
        self,
        reviewer: TokenReviewer,
        audience: str = AUDIENCE,
        node: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.reviewer = reviewer
        self.audience = audience
        self.node = node
        self.clock = clock
        self._seen: collections.OrderedDict[str, tuple[float, Caller | NotAllowed]] = (
            collections.OrderedDict()
        )
        self._reviews = asyncio.Semaphore(REVIEWS_AT_ONCE)

    @staticmethod
    def token(header: str | None) -> str:
        if not header or not header.startswith("Bearer ") or not header[7:].strip():
            raise NotAllowed(401, "the node cache needs the pod's token (Authorization: Bearer)")
        return header[7:].strip()

    async def caller(self, token: str) -> Caller:
        now = self.clock()
        reason = token_refusal(token, self.audience, now)
        if reason is not None:
            raise NotAllowed(401, f"token refused: {reason}")
        key = hashlib.sha256(token.encode()).hexdigest()
        seen = self._seen.get(key)
        if seen is not None and seen[0] > now:
            if isinstance(seen[1], NotAllowed):
                raise seen[1]
            return seen[1]
        answer: Caller | NotAllowed
        try:
            answer = await self.review(token)
        except NotAllowed as refused:
            if refused.status == 503:
                raise
            answer = refused
        until = now + (REFUSED_SECONDS if isinstance(answer, NotAllowed) else REVIEW_SECONDS)
        expiry = token_expiry(token)
        self._seen[key] = (min(until, expiry) if expiry is not None else until, answer)
        self._seen.move_to_end(key)
        while len(self._seen) > REVIEWS_KEPT:
            self._seen.popitem(last=False)
        if isinstance(answer, NotAllowed):
            raise answer
        return answer

    async def review(self, token: str) -> Caller:
        """The API server's answer for ``token`` now (not remembered); NotAllowed 401/403, or 503
        when the API server could not be asked."""
        async with self._reviews:
            try:
                review = await self.reviewer.review(token, self.audience)
            except Exception as exc:
                log.warning("node cache: TokenReview failed: %s", exc)
                raise NotAllowed(503, "the token could not be reviewed now; try again") from None
        if not review.authenticated:
            raise NotAllowed(401, "token refused by the API server")
        return caller_from_review(review.username, review.extra, self.node)


class BoundedServer(web.Server):
    """aiohttp's low-level server with at most ``max_connections`` connections: one past it is
    closed as soon as it is accepted."""

    def __init__(self, handler: Any, *, max_connections: int, on_refused: Callable[[], None], **kwargs: Any):
        super().__init__(handler, **kwargs)
        self.max_connections = max_connections
        self.on_refused = on_refused

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        if len(self._connections) > self.max_connections:
            self.on_refused()
            transport.abort()


class NodeCacheServer:
    """The node cache's server on ``store``: start() binds, stop() ends; the lease audit runs while
    it serves (each lease's token reviewed again every ``audit_seconds``)."""

    def __init__(
        self,
        store: ContentStore,
        reviewer: TokenReviewer,
        *,
        audience: str = AUDIENCE,
        node: str = "",
        max_connections: int = 256,
        idle_seconds: float = 15.0,
        audit_seconds: float = 60.0,
        threads: int = 8,
        signer: Signer | None = None,
        views: Views | None = None,
        one_download: bool = False,
    ) -> None:
        self.store = store
        self.one_download = one_download
        """Leases that name what their pod fetches claim it, and others wait for its upload (a
        lease's "fetch" is ignored otherwise: each pod reads its store, as before)."""
        self.views = views
        self.signer = signer
        self.reviewer = reviewer
        self.audience = audience
        self.node = node
        self.max_connections = max_connections
        self.idle_seconds = idle_seconds
        self.audit_seconds = audit_seconds
        self.refused_requests: dict[str, int] = {}
        self.sent_bytes: dict[str, int] = {}
        self.registry = CollectorRegistry()
        self.registry.register(StoreCollector(store, self.refused_requests, self.sent_bytes))
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="node-cache-io")
        # The checks of uploads answered before them (202) run apart, at most two at once: they
        # never hold up the writes of the uploads still arriving, which share _pool.
        self._checker = ThreadPoolExecutor(max_workers=2, thread_name_prefix="node-cache-check")
        self._digesting = ThreadPoolExecutor(max_workers=1, thread_name_prefix="node-cache-blake3")
        self._stopping = threading.Event()
        self._lease_tokens: dict[str, str] = {}
        self._runner: web.ServerRunner | None = None
        self._leasing: asyncio.Lock | None = None
        self._audit: asyncio.Task[None] | None = None
        self._checks: set[asyncio.Task[None]] = set()
        self.auth: Authenticator | None = None
        self.port = 0

    async def start(self, host: str | None, port: int) -> int:
        """Bind ``host`` (None: every address, IPv4 and IPv6) and ``port`` (0: any); the port."""
        self.auth = Authenticator(self.reviewer, self.audience, self.node, self.store.clock)
        server = BoundedServer(
            self._handle,
            max_connections=self.max_connections,
            on_refused=lambda: self._count("connections"),
            keepalive_timeout=self.idle_seconds,
            max_line_size=8190,
            max_field_size=8190,
            # A body the answer leaves unread (a refused upload) is read and dropped for up to
            # this long after the answer, so that the client sees the answer; then it is closed.
            lingering_time=min(5.0, self.idle_seconds),
            access_log=None,
        )
        self._leasing = asyncio.Lock()
        self._runner = web.ServerRunner(server, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_address=True)
        await site.start()
        addresses = self._runner.addresses
        self.port = int(addresses[0][1]) if addresses else port
        self._audit = asyncio.create_task(self._audit_leases())
        # Blobs kept by a version before BLAKE3 get theirs, on a thread of their own (statements name
        # the SHA-256 of those meanwhile; uploads' checks are not held up by it).
        self._digesting.submit(self._complete_digests)
        return self.port

    def _complete_digests(self) -> None:
        try:
            done = self.store.complete_digests(self._stopping)
        except Exception:  # a failure leaves SHA-256 statements for those blobs, nothing worse
            log.exception("node cache: computing the BLAKE3 of the blobs kept before failed")
            return
        if done:
            log.info("node cache: computed the BLAKE3 of %s blobs kept before", done)

    async def stop(self) -> None:
        if self._audit is not None:
            self._audit.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
        self._stopping.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._checker.shutdown(wait=False, cancel_futures=True)
        self._digesting.shutdown(wait=False, cancel_futures=True)

    def _count(self, reason: str) -> None:
        self.refused_requests[reason] = self.refused_requests.get(reason, 0) + 1

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # ------------------------------------------------------------ routing

    async def _handle(self, request: BaseRequest) -> web.StreamResponse:
        path = request.path
        if request.method == "GET" and path == "/healthz":
            return web.Response(text="ok\n")
        if request.method == "GET" and path == "/metrics":
            body = await self._run(generate_latest, self.registry)
            return web.Response(body=body, content_type="text/plain", charset="utf-8")
        assert self.auth is not None
        try:
            token = self.auth.token(request.headers.get("Authorization"))
            caller = await self.auth.caller(token)
        except NotAllowed as refused:
            self._count(str(refused.status))
            return _refuse(refused.status, str(refused))
        parts = path.split("/")
        if len(parts) == 5 and parts[:3] == ["", "v1", "objects"]:
            if request.method in ("GET", "HEAD"):
                return await self._send_object(request, caller, parts[3], parts[4])
            if request.method == "PUT":
                return await self._put(request, caller, parts[3], parts[4])
            return _refuse(405, "method not allowed")
        if path == "/v1/leases" and request.method == "POST":
            return await self._lease(request, caller, token)
        if path == "/v1/waits" and request.method == "POST":
            return await self._wait(request, caller)
        return _refuse(404, "not found")

    # ------------------------------------------------------------ leases

    def _length(self, request: BaseRequest, what: str, limit: int) -> int | web.Response:
        """The Content-Length of a ``what`` body, or the refusal of one that has none or is over
        ``limit`` bytes (refused before a byte is read)."""
        length = request.content_length
        if length is None:
            return _refuse(411, "a Content-Length is required")
        if length > limit:
            self._count(f"{what}-size")
            return _refuse(413, f"a {what} body is at most {limit} bytes")
        return length

    async def _body(self, request: BaseRequest, what: str, length: int) -> bytes | web.Response:
        """The ``length`` bytes of a ``what`` body, each piece within the idle time; or 408."""
        try:
            async with asyncio.timeout(self.idle_seconds):
                return await request.content.readexactly(length)
        except (TimeoutError, asyncio.IncompleteReadError):
            return _refuse(408, f"the {what} body did not arrive")

    async def _lease(self, request: BaseRequest, caller: Caller, token: str) -> web.StreamResponse:
        length = self._length(request, "lease", MAX_LEASE_BODY)
        if isinstance(length, web.Response):
            return length
        assert self._leasing is not None
        # Bytes another pod of the namespace sent a moment ago may still be checked: the lease
        # waits for its namespace's checks (a bounded while) so that it finds what they place;
        # before the lock, so that no namespace's checks hold up another's leases.
        await self._run(self.store.settle, caller.namespace, None, min(self.idle_seconds, SETTLE_SECONDS))
        async with self._leasing:  # one lease body in memory at a time
            return await self._lease_body(request, caller, token, length)

    async def _lease_body(
        self, request: BaseRequest, caller: Caller, token: str, length: int
    ) -> web.StreamResponse:
        body = await self._body(request, "lease", length)
        if isinstance(body, web.Response):
            return body
        # Each [kind, checksum, size] has 3 commas with the one after it: a body with many more
        # cannot be a valid lease, and is refused before it is parsed into Python objects.
        if body.count(b",") > 3 * MAX_LEASE_OBJECTS + 8:
            return _refuse(413, f"objects: a lease names at most {MAX_LEASE_OBJECTS} objects")
        fetch = False
        coming: dict[str, float] = {}
        try:
            data = await self._run(json.loads, body)
            if isinstance(data, dict) and data.get("pod") not in (None, caller.pod):
                raise NotAllowed(403, f"pod: a pod leases for itself only ({caller.pod_name})")
            objects = parse_lease(data)
            held, parts = self.store.lease(caller.pod, caller.namespace, objects, token_expiry(token))
            fetch = self.one_download and isinstance(data, dict) and "fetch" in data
            if fetch:
                assert isinstance(data, dict)
                kept = set(held)
                wanted = [key for key in parse_keys(data["fetch"], "fetch") if key not in kept]
                coming = self.store.claim(caller.pod, caller.namespace, wanted)
        except ValueError:
            return _refuse(400, "a lease is JSON")
        except NotAllowed as refused:
            return _refuse(refused.status, str(refused))
        self._lease_tokens[caller.pod] = token
        answer: dict[str, Any] = {"held": held, "part_sizes": parts}
        if fetch:
            answer["coming"] = {key: round(seconds, 3) for key, seconds in coming.items()}
        if self.signer is not None:
            answer["statements"] = await self._run(self._statements, caller, held)
        if self.views is not None:
            answer["shared"] = await self._run(self._share, caller, held)
        return web.json_response(answer)

    async def _wait(self, request: BaseRequest, caller: Caller) -> web.StreamResponse:
        """Answer once one of the body's keys is no longer coming for the caller (another pod of its
        namespace claimed it, or an upload is writing it), or after WAIT_SECONDS with none. No
        thread is held meanwhile: the claims are looked at every WAIT_POLL_SECONDS."""
        length = self._length(request, "wait", MAX_WAIT_BODY)
        if isinstance(length, web.Response):
            return length
        body = await self._body(request, "wait", length)
        if isinstance(body, web.Response):
            return body
        try:
            keys = parse_wait(json.loads(body))
        except ValueError:
            return _refuse(400, "a wait is JSON")
        except NotAllowed as refused:
            return _refuse(refused.status, str(refused))
        if not self.store.names(caller.pod, keys):
            return _refuse(403, "keys: a wait names only objects of its pod's live lease")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_SECONDS
        while not (settled := self.store.settled(caller.pod, caller.namespace, keys)):
            if loop.time() >= deadline:
                break
            await asyncio.sleep(WAIT_POLL_SECONDS)
        return web.json_response({"settled": settled})

    def _share(self, caller: Caller, held: Iterable[str]) -> dict[str, str]:
        """Link the held keys' blobs into the caller's view of shared files, when its pod has one
        (its CSI volume); each held key -> its file's name there (none: no view) (blocking)."""
        assert self.views is not None
        blobs: dict[str, str] = {}
        for key in held:
            found = self.store.blob_of(caller.namespace, key)
            if found is not None:
                blobs[key] = found[0]
        linked = self.views.link(caller.pod, caller.namespace, blobs.values())
        return {key: blob for key, blob in blobs.items() if blob in linked}

    def _statements(self, caller: Caller, held: Iterable[str]) -> dict[str, Any]:
        """For the held keys of the caller's namespace: each one's blob (the SHA-256 the cache
        computed as it took the bytes) and one signature of the statement that those are the keys'
        bytes, for the caller's pod; and the same for their BLAKE3s (those the cache has: a blob
        kept from before may have none yet), under its own tag and signature (blocking)."""
        assert self.signer is not None
        objects: dict[str, str] = {}
        signed: list[tuple[str, int, str]] = []
        fast: dict[str, str] = {}
        fast_signed: list[tuple[str, int, str]] = []
        for key in held:
            found = self.store.blob_of(caller.namespace, key)
            if found is not None:
                blob, size, b3 = found
                objects[key] = blob
                signed.append((key, size, blob))
                if b3 is not None:
                    fast[key] = b3
                    fast_signed.append((key, size, b3))
        return {
            "objects": objects,
            "signature": self.signer.sign(caller.pod, signed),
            "blake3": {
                "objects": fast,
                "signature": self.signer.sign(caller.pod, fast_signed, BLAKE3_STATEMENT_TAG),
            },
        }

    async def _audit_leases(self) -> None:
        """Every ``audit_seconds``: review each live lease's token again; a lease whose token no
        longer passes (its pod was deleted, or the token expired) ends."""
        assert self.auth is not None
        while True:
            await asyncio.sleep(self.audit_seconds)
            try:
                await self.audit_once()
            except Exception:  # the audit goes on
                log.exception("node cache: lease audit failed")

    async def audit_once(self) -> None:
        assert self.auth is not None
        live = self.store.leases()
        for pod in [p for p in self._lease_tokens if p not in live]:
            self._lease_tokens.pop(pod, None)
        for pod, token in list(self._lease_tokens.items()):
            try:
                caller = await self.auth.review(token)
            except NotAllowed as refused:
                if refused.status == 503:
                    continue  # the API server is away: keep the lease until it answers
                caller = None
            if caller is None or caller.pod != pod:
                log.info("node cache: the lease of pod %s ends: its token no longer passes", pod)
                self.store.drop_lease(pod)
                self._lease_tokens.pop(pod, None)

    # ------------------------------------------------------------ objects

    async def _send_object(
        self, request: BaseRequest, caller: Caller, kind: str, checksum: str
    ) -> web.StreamResponse:
        asked = request.headers.get("Range")
        # A ranged read is one of several of the same object: the first counts the hit.
        first = asked is None or asked.strip().startswith("bytes=0-")
        opened = self.store.open(caller.namespace, kind, checksum, count_hit=first)
        if opened is None:
            return web.Response(status=404)
        f, size, _blob = opened
        try:
            try:
                span = parse_range(asked, size)
            except NotAllowed as refused:
                unserved = _refuse(refused.status, str(refused))
                unserved.headers["Content-Range"] = f"bytes */{size}"
                return unserved
            start, end = span or (0, size)
            response = web.StreamResponse(
                status=206 if span is not None else 200,
                headers={"Content-Type": "application/octet-stream", "Accept-Ranges": "bytes"},
            )
            if span is not None:
                response.headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
            response.content_length = end - start
            await response.prepare(request)
            if request.method == "HEAD":
                return response
            await self._send_file(request, f, start, end - start)
        finally:
            f.close()
        self.store.served(end - start)
        await response.write_eof()
        return response

    async def _send_file(self, request: BaseRequest, f: BinaryIO, offset: int, count: int) -> None:
        """``count`` bytes of ``f`` from ``offset`` to the caller: by sendfile(2), from the page cache
        to the socket, in pieces each given ``idle_seconds`` (a reader that stopped reading is cut
        off); copied through the event loop only where the transport cannot (counted by ``how``)."""
        transport = request.transport
        if transport is None:
            raise ConnectionResetError("the caller went away")
        loop = asyncio.get_running_loop()
        how = "sendfile"
        end = offset + count
        while offset < end:
            piece = min(SENDFILE_PIECE, end - offset)
            # The piece is asked of the disk ahead, from the pool: sendfile on the event loop then
            # finds it in the page cache rather than waiting for the disk there.
            await self._run(_will_need, f.fileno(), offset, piece)
            try:
                async with asyncio.timeout(self.idle_seconds):
                    try:
                        sent = await loop.sendfile(transport, f, offset, piece, fallback=False)
                    except (asyncio.SendfileNotAvailableError, NotImplementedError):
                        how = "copy"
                        sent = await loop.sendfile(transport, f, offset, piece, fallback=True)
            except TimeoutError:
                transport.abort()
                raise
            if sent <= 0:
                raise ConnectionResetError("the caller went away")
            self.sent_bytes[how] = self.sent_bytes.get(how, 0) + sent
            offset += sent

    async def _put(
        self, request: BaseRequest, caller: Caller, kind: str, checksum: str
    ) -> web.StreamResponse:
        length = request.content_length
        if length is None:
            return _refuse(411, "a Content-Length is required")
        part = request.headers.get(PART_SIZE_HEADER, "")
        if request.headers.get(CHECK_EXISTING_HEADER, "") == "1" and self.store.leased(
            caller.pod, kind, checksum
        ):
            # The uploader's check of the cache's copy failed: the cache hashes its own copy again.
            await self._run(
                self.store.recheck, caller.namespace, kind, checksum, int(part) if part.isdigit() else None
            )
        deferred = request.headers.get("Prefer", "").strip().lower() == PREFER_ASYNC
        try:
            upload = self.store.begin(
                caller.namespace,
                caller.pod,
                kind,
                checksum,
                size=length,
                part_size=int(part) if part.isdigit() else None,
                deferred=deferred,
            )
        except Refused as refused:
            return _refuse(refused.status, str(refused))
        try:
            await self._receive(request, upload)
            if deferred:
                if upload.received != upload.size:
                    raise Refused(
                        "short", 400, f"{upload.key}: {upload.received} of {upload.size} bytes arrived"
                    )
                self.store.checking(upload)
                task = asyncio.create_task(self._check(upload))
                self._checks.add(task)
                task.add_done_callback(self._checks.discard)
                return web.Response(status=202, text="received; checked before it is kept\n")
            await self._run(self.store.finish, upload)
        except Refused as refused:
            self.store.end(upload, refused.reason)
            return _refuse(refused.status, str(refused))
        except TimeoutError:
            self.store.end(upload, "stalled")
            return _refuse(408, f"{upload.key}: the upload stalled")
        except OSError as exc:  # the node's disk is full (or failing): nothing was kept
            log.warning("node cache: writing %s failed: %s", upload.key, exc)
            self.store.end(upload, "failed")
            return _refuse(507, f"{upload.key}: not kept: {exc.strerror or exc}")
        except BaseException:
            self.store.end(upload, "failed")
            raise
        self.store.end(upload)
        return web.Response(status=201, text="kept\n")

    async def _check(self, upload: Upload) -> None:
        """A deferred upload, received whole: checked and placed (or refused) on the pool."""
        refused: str | None = None
        try:
            await asyncio.get_running_loop().run_in_executor(self._checker, self.store.finish, upload)
        except Refused as exc:
            refused = exc.reason
            log.info("node cache: upload of %s not kept: %s", upload.key, exc)
        except OSError as exc:
            refused = "failed"
            log.warning("node cache: writing %s failed: %s", upload.key, exc)
        except BaseException:
            refused = "failed"
            raise
        finally:
            self.store.end(upload, refused)

    async def _receive(self, request: BaseRequest, upload: Upload) -> None:
        """The body, as the socket gives it (each piece as it was read, never joined or copied
        again), handed to the pool about 1 MiB at a time, each given room (store.take) first."""
        pending: list[bytes] = []
        count = 0
        while upload.received + count < upload.size:
            async with asyncio.timeout(self.idle_seconds):
                chunk, chunk_end = await request.content.readchunk()
            if not chunk:
                if chunk_end:  # the end of an HTTP chunk (a chunked body): more may follow
                    continue
                break
            pending.append(chunk)
            count += len(chunk)
            if count >= CHUNK or upload.received + count >= upload.size:
                self.store.take(upload, count)
                await self._run(upload.feed, *pending)
                pending, count = [], 0
        if pending:
            self.store.take(upload, count)
            await self._run(upload.feed, *pending)


def _will_need(fd: int, offset: int, count: int) -> None:
    with contextlib.suppress(OSError):
        os.posix_fadvise(fd, offset, count, os.POSIX_FADV_WILLNEED)


def _refuse(status: int, message: str) -> web.Response:
    response = web.Response(status=status, text=message + "\n")
    if status == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    return response


class ServerThread:
    """The server on its own event loop in a thread (for tests and embedders): ``start`` returns
    once it listens."""

    def __init__(self, server: NodeCacheServer, host: str | None = "127.0.0.1", port: int = 0) -> None:
        self.server = server
        self.host = host
        self.port = port
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="node-cache", daemon=True)

    def start(self) -> int:
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(
            self.server.start(self.host, self.port), self.loop
        ).result(30)
        return self.port

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.loop.close()

    async def _shutdown(self) -> None:
        await self.server.stop()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
