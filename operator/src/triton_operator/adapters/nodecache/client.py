"""Sync's client of the node cache: a lease that says what the node holds, reads, and uploads of
what the store gave (best effort: a cache that is down or refuses never fails a sync)."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from urllib.parse import urlsplit

from triton_operator.adapters.nodecache.statements import Verifier
from triton_operator.adapters.storage.base import Sink, pump
from triton_operator.adapters.sync.hashing import BLAKE3
from triton_operator.core.repository.cache_rules import (
    BLAKE3_STATEMENT_TAG,
    BLOB_FORM,
    MAX_LEASE_BODY,
    PUBLIC_KEY_ENV,
    STATEMENT_TAG,
    TOKEN_ENV,
    TOKEN_PATH,
    WAIT_SECONDS,
    object_key,
)
from triton_operator.core.repository.manifest import ManifestEntry
from triton_operator.core.repository.shared_files import FILES_ENV

CHUNK = 1024 * 1024

log = logging.getLogger(__name__)


class NodeCacheClient:
    """The node cache at ``url`` (http://host:port), as one sync uses it from its threads.

    ``held`` takes the pod's lease on the manifest's cacheable objects and learns which the node
    holds; ``read`` streams one to a sink; ``offer`` uploads a verified file in the background;
    ``close`` waits for the uploads. Any failure to reach the cache makes it a miss, never an error.
    Each request carries the pod's projected token for the cache (``token_path``, else
    $TRITON_NODE_CACHE_TOKEN, else the path the operator mounts it at), read again each time (the
    kubelet renews it). With the cache's public key (``public_key``, else $TRITON_NODE_CACHE_PUBLIC_KEY),
    ``vouched`` names the BLAKE3 (else the SHA-256) the cache signed for a held object: the sync
    checks its bytes against that instead of the pin.
    """

    def __init__(
        self,
        url: str,
        pod: str,
        *,
        timeout: float = 30.0,
        uploads: int = 2,
        token_path: str | Path | None = None,
        public_key: str | None = None,
        lease: Sequence[ManifestEntry] | None = None,
        shared_dir: str | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{url!r}: the node cache is an http://host:port address")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.pod = pod
        self.lease = tuple(lease) if lease is not None else None
        """What the pod's lease names when a sync covers a part of it (the agent's first fill syncs one
        model at a time): the whole revision's objects. The cache keeps one lease per pod, each
        replacing the one before, and takes an upload only of an object the pod's live lease names:
        a lease of one model's objects would refuse (403) the uploads of the model before still in
        flight. None: the entries of each sync."""
        self.token_path = Path(token_path or os.environ.get(TOKEN_ENV) or TOKEN_PATH)
        self.timeout = timeout
        self.down = False
        self.held_keys: frozenset[str] = frozenset()
        self.part_sizes: dict[str, int] = {}
        self.vouched_keys: dict[str, str] = {}
        """key -> the SHA-256 the cache signed for it (statement /1)."""
        self.blake3_keys: dict[str, str] = {}
        """key -> the BLAKE3 the cache signed for it (statement /2; an older cache gives none)."""
        self.statements_refused = 0
        self.shared_dir = shared_dir if shared_dir is not None else os.environ.get(FILES_ENV, "")
        """Where the pod's view of the cache's files is mounted ("": the pod has none)."""
        self.shared_keys: dict[str, str] = {}
        """key -> the name of its file in the view, as the lease answered (checked before use)."""
        self.coming_keys: dict[str, float] = {}
        """key -> the most seconds another pod of the namespace may take to upload it (its claim)."""
        key_text = public_key if public_key is not None else os.environ.get(PUBLIC_KEY_ENV, "")
        self.verifier = Verifier.from_text(key_text, PUBLIC_KEY_ENV) if key_text.strip() else None
        self.offered = 0
        self.kept = 0
        self._local = threading.local()
        self._uploads = ThreadPoolExecutor(max_workers=uploads, thread_name_prefix="node-cache-put")
        self._pending: list[Future[None]] = []
        self._read_keys: set[str] = set()
        self._lock = threading.Lock()

    def _auth(self, headers: dict[str, str] | None = None) -> dict[str, str]:
        """``headers`` with the pod's token (none when it cannot be read: the cache answers 401)."""
        out = dict(headers or {})
        with contextlib.suppress(OSError):
            out["Authorization"] = "Bearer " + self.token_path.read_text().strip()
        return out

    def _conn(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout, blocksize=CHUNK)
            self._local.conn = conn
        return conn

    def _request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> http.client.HTTPResponse:
        """The response to a request on this thread's kept-alive connection; once more on a new
        connection when the cache had closed the old one (as it does after an object it dropped)."""
        reused = getattr(self._local, "conn", None) is not None
        try:
            conn = self._conn()
            conn.request(method, path, body, self._auth(headers))
            return conn.getresponse()
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            if not reused:
                raise
            self._reset()
            conn = self._conn()
            conn.request(method, path, body, self._auth(headers))
            return conn.getresponse()

    def _reset(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # ------------------------------------------------------------ lease

    def held(
        self, entries: Sequence[ManifestEntry], fetching: Sequence[ManifestEntry] = ()
    ) -> frozenset[str]:
        """Lease the cacheable ``entries`` for this pod; the keys the node holds (none when the
        cache cannot be reached: then the sync reads the store and offers nothing). With ``lease``,
        the lease names those too (the whole revision of a sync of a part of it). ``fetching``: those
        the sync reads from its store where the node lacks them (and offers): the pod claims each that
        no other pod of its namespace claims, and ``coming`` names the others."""
        if self.lease is not None:
            keys = {key_of(e) for e in entries}
            entries = [*entries, *(e for e in self.lease if key_of(e) not in keys)]
        objects = [[e.checksum_kind, e.checksum, e.size] for e in entries if key_of(e) is not None]
        fetch = sorted({k for e in fetching if (k := key_of(e)) is not None})
        body = json.dumps(
            {"pod": self.pod, "objects": objects, "fetch": fetch}, separators=(",", ":")
        ).encode()
        if len(body) > MAX_LEASE_BODY:
            log.warning(
                "node cache: %s objects are more than one lease may name; reading the store", len(objects)
            )
            return frozenset()
        try:
            response = self._request("POST", "/v1/leases", body, {"Content-Type": "application/json"})
            data = response.read()
            if response.status != 200:
                log.warning("node cache: lease refused (%s): %s", response.status, data[:200])
                if response.status in (401, 403):  # not this pod's to use: no reads, no uploads
                    self.down = True
                return frozenset()
            answer = json.loads(data)
            with self._lock:  # a lease again (after a wait) keeps "read once" (``read``)
                self.held_keys = frozenset(str(k) for k in answer["held"]) - self._read_keys
            sizes = answer.get("part_sizes") or {}
            self.part_sizes = {str(k): int(v) for k, v in sizes.items() if int(v) > 0}
            if self.verifier is not None:
                statements = answer.get("statements") or {}
                self.vouched_keys = self._vouched(entries, statements)
                fast = statements.get("blake3") if isinstance(statements, dict) else None
                self.blake3_keys = self._vouched(entries, fast, BLAKE3_STATEMENT_TAG) if fast else {}
            coming = answer.get("coming")
            wanted = set(fetch)
            self.coming_keys = (
                {str(k): float(v) for k, v in coming.items() if k in wanted and isinstance(v, int | float)}
                if isinstance(coming, dict)
                else {}
            )
            shared = answer.get("shared") if self.shared_dir else None
            if isinstance(shared, dict):
                self.shared_keys = {
                    str(k): v for k, v in shared.items() if isinstance(v, str) and BLOB_FORM.fullmatch(v)
                }
        except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError) as exc:
            log.warning("node cache at %s:%s not reachable: %s; reading the store", self.host, self.port, exc)
            self._reset()
            self.down = True
            return frozenset()
        return self.held_keys

    def _vouched(
        self, entries: Sequence[ManifestEntry], statements: object, tag: str = STATEMENT_TAG
    ) -> dict[str, str]:
        """The held keys the cache signed for: key -> the digest it names (``tag``: SHA-256 or
        BLAKE3), when the public key verifies the one signature over them all for this pod, these
        pinned keys and sizes; else none (every pin, or the SHA-256, is checked), the refusal
        counted and logged."""
        assert self.verifier is not None
        if not isinstance(statements, dict):
            return {}
        objects, signature = statements.get("objects"), statements.get("signature")
        sizes = {k: e.size for e in entries if (k := key_of(e)) is not None}
        signed: list[tuple[str, int, str]] = []
        ok = isinstance(objects, dict) and isinstance(signature, str)
        if ok:
            assert isinstance(objects, dict) and isinstance(signature, str)
            for key, blob in objects.items():
                if key not in self.held_keys or key not in sizes or not isinstance(blob, str):
                    ok = False
                    break
                if BLOB_FORM.match(blob) is None:
                    ok = False
                    break
                signed.append((key, sizes[key], blob))
            ok = ok and self.verifier.verify(self.pod, signed, signature, tag)
        if not ok:
            self.statements_refused += 1
            log.warning("node cache: its statements were refused (%s; each file is checked otherwise)", tag)
            return {}
        return {key: blob for key, _, blob in signed}

    def vouched(self, entry: ManifestEntry) -> tuple[str, str] | None:
        """The kind and value of the digest the cache signed for the held ``entry``: its BLAKE3,
        else its SHA-256 (None: check the pin)."""
        key = key_of(entry)
        if key is None:
            return None
        if (b3 := self.blake3_keys.get(key)) is not None:
            return BLAKE3, b3
        sha = self.vouched_keys.get(key)
        return ("sha256", sha) if sha is not None else None

    def shared(self, entry: ManifestEntry) -> tuple[str, str] | None:
        """The file of the held ``entry`` in the pod's read-only view of the cache's files, and the
        BLAKE3 the cache signed for it (the sync checks the file against it before it links to it);
        None when the pod has no view, the lease linked none or no statement vouches for it."""
        key = key_of(entry)
        if key is None or self.down or not self.shared_dir:
            return None
        name, b3 = self.shared_keys.get(key), self.blake3_keys.get(key)
        if name is None or b3 is None:
            return None
        return f"{self.shared_dir.rstrip('/')}/{name}", b3

    def coming(self, entry: ManifestEntry) -> float | None:
        """The most seconds until another pod of the namespace uploads ``entry`` (it claimed it: it
        reads it from its store now), None when no other pod does."""
        key = key_of(entry)
        return None if key is None or self.down else self.coming_keys.get(key)

    def await_uploads(self, entries: Sequence[ManifestEntry]) -> frozenset[str] | None:
        """Wait (the cache bounds it, WAIT_SECONDS) until one of ``entries``, all coming, is no
        longer: the keys of those that are not (held now, or their claimant gave up; [] after the
        cache's bound with none); None when the cache failed (the caller reads the store)."""
        keys = sorted({k for e in entries if (k := key_of(e)) is not None})
        if not keys or self.down:
            return None
        conn = http.client.HTTPConnection(self.host, self.port, timeout=WAIT_SECONDS + self.timeout)
        try:
            body = json.dumps({"keys": keys}, separators=(",", ":")).encode()
            conn.request("POST", "/v1/waits", body, self._auth({"Content-Type": "application/json"}))
            response = conn.getresponse()
            data = response.read()
            if response.status != 200:
                log.warning("node cache: wait refused (%s): %s", response.status, data[:200])
                return None
            wanted = set(keys)
            return frozenset(str(k) for k in json.loads(data)["settled"] if k in wanted)
        except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError) as exc:
            log.warning("node cache: waiting for another pod's upload failed: %s; reading the store", exc)
            return None
        finally:
            conn.close()

    def part_size(self, entry: ManifestEntry) -> int | None:
        """The part size the cache checked a held multipart object with (None: not known)."""
        key = key_of(entry)
        return self.part_sizes.get(key) if key is not None else None

    # ------------------------------------------------------------ read

    def read(self, entry: ManifestEntry, sink: Sink, start: int = 0, end: int | None = None) -> int | None:
        """Stream the cached object (or its bytes ``start``..``end``, end excluded: one of several
        ranges read at once, each on its thread's own connection) to ``sink``; the bytes sent, or
        None when the cache does not hold it or failed (the caller checks the bytes; the sink's
        own errors go through)."""
        key = key_of(entry)
        if key is None or self.down:
            return None
        with self._lock:
            # Read once: should the sync offer it after all (the bytes did not match, the read
            # failed), the store's copy is uploaded, and the cache told to check its own.
            self.held_keys = self.held_keys - {key}
            self._read_keys.add(key)
        ranged = start > 0 or (end is not None and end < entry.size)
        headers = {"Range": f"bytes={start}-{(end or entry.size) - 1}"} if ranged else None
        try:
            response = self._request("GET", f"/v1/objects/{key}", headers=headers)
            if response.status != (206 if ranged else 200):
                if response.status in (200, 206):  # not the bytes asked for: not read at all
                    self._reset()
                else:
                    response.read()
                return None
            return pump(response.readinto, sink, CHUNK)
        except (OSError, http.client.HTTPException) as exc:
            # A cache that fails (or hangs past the timeout) once is not asked again by this sync.
            log.warning("node cache: reading %s failed: %s; reading the store from now on", key, exc)
            self._reset()
            self.down = True
            return None

    # ------------------------------------------------------------ upload

    def offer(self, entry: ManifestEntry, path: Path, part_size: int | None = None) -> None:
        """Upload ``path`` (its bytes checked against ``entry``; ``part_size``: the multipart
        upload's, that its ETag was checked with) in the background, unless the node holds it
        already or the cache is down."""
        key = key_of(entry)
        if key is None or self.down or key in self.held_keys:
            return
        # The cache answers once the bytes are on its disk and checks them after (202): the sync
        # waits for the transfer, not for the node's hashing.
        headers = self._auth({"Content-Length": str(entry.size), "Prefer": "respond-async"})
        if part_size:
            headers["X-Part-Size"] = str(part_size)
        with self._lock:
            if key in self._read_keys:
                headers["X-Check-Existing"] = "1"
            self.offered += 1
            self._pending.append(self._uploads.submit(self._put, key, path, headers))

    def _put(self, key: str, path: Path, headers: dict[str, str]) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout, blocksize=CHUNK)
        try:
            with path.open("rb") as f:
                conn.putrequest("PUT", f"/v1/objects/{key}", skip_accept_encoding=True)
                for name, value in headers.items():
                    conn.putheader(name, value)
                conn.endheaders()
                # The body from the page cache to the socket by sendfile(2): no copy through Python.
                assert conn.sock is not None
                conn.sock.sendfile(f)
                response = conn.getresponse()
                response.read()
            if response.status in (201, 202):  # kept, or received to be checked and kept
                with self._lock:
                    self.kept += 1
            elif response.status == 401:
                log.warning("node cache: upload of %s refused: the pod's token was not accepted", key)
            elif response.status != 409:  # present, or another pod's upload of it
                log.info("node cache: upload of %s not kept (%s)", key, response.status)
        except (ConnectionRefusedError, TimeoutError) as exc:
            log.info("node cache: upload of %s failed: %s; no more uploads", key, exc)
            self.down = True
        except (OSError, http.client.HTTPException) as exc:  # e.g. refused before the body was read
            log.info("node cache: upload of %s not kept: %s", key, exc)
        finally:
            conn.close()

    def close(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` seconds for the uploads, then stop."""
        with self._lock:
            pending = list(self._pending)
        wait(pending, timeout=timeout)
        self._uploads.shutdown(wait=False, cancel_futures=True)
        self._reset()


def key_of(entry: ManifestEntry) -> str | None:
    return object_key(entry.checksum_kind, entry.checksum)
