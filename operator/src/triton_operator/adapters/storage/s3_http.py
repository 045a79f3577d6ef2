"""S3 reads of pinned objects (GET, HEAD) signed with SigV4 over http.client: the sync without botocore.

A pod's sync reads what the operator pinned and nothing else: ranged GETs on the pinned ETag and a
few HEADs. For that, loading botocore (its modules, then its JSON models of S3 and of the endpoint
rules) costs a third of a second of every pod's start, longer than the requests of a small model.
``S3HttpReader`` speaks those requests itself when nothing calls for botocore's machinery: static
keys, an explicit endpoint, nothing in the environment that boto3 would honour and the reader does
not (a proxy, an AWS config file; $AWS_CA_BUNDLE it honours too). ``http_refusal`` says why not
otherwise, and the store is then boto3's. Listing, and the HEADs that pin, go to a boto3 store made
on first use.
"""

from __future__ import annotations

import html
import http.client
import os
import re
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from triton_operator.adapters.storage.base import (
    AccessDenied,
    BucketNotFound,
    ObjectChanged,
    ObjectStore,
    Sink,
    StoreBase,
    StoreError,
    StoreUnavailable,
    TransferCheck,
    pump,
)
from triton_operator.adapters.storage.sigv4 import Keys, encode_path, encode_query, sign
from triton_operator.core.edges.backoff import Backoff, Random, parse_retry_after
from triton_operator.core.repository.manifest import ObjectInfo, hex_from_base64, s3_etag_md5

CHUNK = 1024 * 1024
RETRY_BACKOFF = Backoff(base=0.2, cap=5.0)
"""Delays between the attempts of one request while the store is unreachable or throttles (5xx,
429, SlowDown): up to 0.2 s, 0.4 s, ... (full jitter, so a pod's threads do not come back
together), never more than 5 s, and at least a Retry-After the store sends (up to that cap)."""
DENIED = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "AllAccessDisabled",
        "AccountProblem",
        "InvalidClientTokenId",
    }
)
"""S3 error codes that mean the credentials may not read the bucket."""
UNAVAILABLE = frozenset({"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "503", "500"})
"""S3 error codes worth asking again."""

CREDENTIAL_ENV = frozenset(
    {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION"}
)
"""The AWS_* variables the store is handed as its credentials."""
CA_BUNDLE_ENV = "AWS_CA_BUNDLE"
"""The one other AWS_* variable the reader honours as boto3 does: the CA bundle TLS trusts."""

_CODE = re.compile(r"<Code>([^<]*)</Code>")
_MESSAGE = re.compile(r"<Message>([^<]*)</Message>")
_ERROR_BODY_MAX = 64 * 1024
_REGION = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?")  # botocore's test of a region


def http_refusal(credentials: Mapping[str, str], endpoint: str, region: str, env: Mapping[str, str]) -> str:
    """Why reads of this S3 store go through boto3 rather than ``S3HttpReader``; "" when they need not.

    ``env`` is the process's environment, which boto3 reads besides the credentials it is given.
    """
    if region and not _REGION.fullmatch(region):
        return f"region {region!r} is no region name: boto3 refuses it with its reason"
    if not (credentials.get("AWS_ACCESS_KEY_ID") and credentials.get("AWS_SECRET_ACCESS_KEY")):
        return "no static keys: boto3's credential chain finds them (a web identity, an instance role)"
    if not endpoint:
        return "no endpoint: boto3 resolves Amazon S3's for the region (FIPS, dual-stack, redirects)"
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname or "@" in parts.netloc:
        return f"endpoint {endpoint!r} is not http(s)://host[:port]"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return f"endpoint {endpoint!r} has a path"
    for name in sorted(env):
        upper = name.upper()
        if upper.endswith("_PROXY") or (
            upper.startswith("AWS_") and upper not in CREDENTIAL_ENV and upper != CA_BUNDLE_ENV
        ):
            return f"${name} is set, which boto3 honours"
    config = env.get("AWS_CONFIG_FILE") or str(Path("~/.aws/config").expanduser())
    if os.path.exists(config):
        return f"{config} exists, which boto3 reads"
    return ""


def crc_check(
    answer: Mapping[str, Any], etag: str, part_size: int | None, ask_part_size: Callable[[], int | None]
) -> TransferCheck | None:
    """The CRC32C or CRC32 a HEAD with ChecksumMode=ENABLED told of the object with ``etag``: of the
    whole object, or S3's composite of a multipart upload's parts (then with the part size, asked of
    ``ask_part_size`` when ``part_size`` is None). ``answer`` holds the HEAD's fields under boto3's
    names (ETag, ChecksumCRC32C, ChecksumCRC32, ChecksumType)."""
    if str(answer.get("ETag", "")).strip('"') != etag:
        return None
    for kind, field_name in (("crc32c", "ChecksumCRC32C"), ("crc32", "ChecksumCRC32")):
        text = str(answer.get(field_name) or "")
        value, dash, parts = text.partition("-")
        digest = hex_from_base64(value)
        if len(digest) != 8:
            continue
        if not dash and str(answer.get("ChecksumType") or "FULL_OBJECT") == "FULL_OBJECT":
            return TransferCheck(kind, digest)
        if dash and parts.isdigit() and int(parts) > 0:
            size = part_size or ask_part_size()
            if size:
                return TransferCheck(f"{kind}-composite", f"{digest}-{int(parts)}", size)
    return None


class _Connection(http.client.HTTPConnection):
    """A connection whose reads wait ``read_timeout`` (its connect waits ``timeout``)."""

    read_timeout: float = 60.0

    def connect(self) -> None:
        super().connect()
        self.sock.settimeout(self.read_timeout)


class _TLSConnection(http.client.HTTPSConnection):
    read_timeout: float = 60.0

    def connect(self) -> None:
        super().connect()
        self.sock.settimeout(self.read_timeout)


def _tls_context(ca_bundle: str) -> ssl.SSLContext:
    """Verified TLS against the CA bundle botocore would use: ``ca_bundle`` ($AWS_CA_BUNDLE), else
    certifi's."""
    if ca_bundle:
        return ssl.create_default_context(cafile=ca_bundle)
    try:
        import certifi  # noqa: PLC0415 - only for https endpoints

        return ssl.create_default_context(cafile=certifi.where())
    except ImportError:  # pragma: no cover - certifi comes with requests, a dependency
        return ssl.create_default_context()


class _Answer:
    """A response's status, headers and (for errors) S3's code and message."""

    def __init__(self, response: http.client.HTTPResponse, code: str = "", message: str = "") -> None:
        self.response = response
        self.status = response.status
        self.code = code
        self.message = message

    def header(self, name: str) -> str:
        return str(self.response.getheader(name) or "")


class S3HttpReader(StoreBase):
    """Reads of one bucket and prefix of an S3 API over one keep-alive connection per thread."""

    def __init__(
        self,
        uri: str,
        bucket: str,
        prefix: str,
        *,
        credentials: Mapping[str, str],
        endpoint: str,
        region: str,
        addressing_style: str,
        full: Callable[[], ObjectStore],
        ca_bundle: str = "",
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        max_attempts: int = 3,
        backoff: Backoff = RETRY_BACKOFF,
        random: Random | None = None,
    ) -> None:
        super().__init__(uri, bucket, prefix, credentials)
        self.endpoint = endpoint
        self._keys = Keys(
            credentials["AWS_ACCESS_KEY_ID"],
            credentials["AWS_SECRET_ACCESS_KEY"],
            credentials.get("AWS_SESSION_TOKEN", ""),
        )
        self._region = region or "us-east-1"
        parts = urlsplit(endpoint)
        self._https = parts.scheme == "https"
        assert parts.hostname is not None  # http_refusal checked
        port = parts.port or (443 if self._https else 80)
        virtual = addressing_style == "virtual"
        self._connect_host = f"{bucket}.{parts.hostname}" if virtual else parts.hostname
        self._port = port
        self._host_header = f"{bucket}.{parts.netloc}" if virtual else parts.netloc
        self._base = "" if virtual else f"/{bucket}"
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._attempts = max(1, max_attempts)
        self._backoff = backoff
        self._random = random
        self._context = _tls_context(ca_bundle) if self._https else None
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[http.client.HTTPConnection] = []
        self._make_full = full
        self._full: ObjectStore | None = None

    # ------------------------------------------------------------ connections

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's connection, and whether it served a request before."""
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None:
            return conn, True
        if self._context is not None:
            tls = _TLSConnection(
                self._connect_host, self._port, timeout=self._connect_timeout, context=self._context
            )
            tls.read_timeout = self._read_timeout
            conn = tls
        else:
            plain = _Connection(self._connect_host, self._port, timeout=self._connect_timeout)
            plain.read_timeout = self._read_timeout
            conn = plain
        self._local.conn = conn
        with self._lock:
            self._connections.append(conn)
        return conn, False

    def _drop(self) -> None:
        """Close this thread's connection (a response left unread, a failure): the next opens anew."""
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()
            with self._lock:
                if conn in self._connections:
                    self._connections.remove(conn)

    # ------------------------------------------------------------ requests

    def _send(self, method: str, key: str, query: Mapping[str, str], headers: Mapping[str, str]) -> _Answer:
        """One request; a reused connection the server closed meanwhile is opened again once.
        Raises OSError or http.client.HTTPException for transport failures."""
        path = encode_path(f"{self._base}/{key}")
        target = f"{path}?{encode_query(query)}" if query else path
        while True:
            conn, reused = self._connection()
            now = datetime.now(UTC)
            signed = sign(
                method, self._host_header, path, query, headers, keys=self._keys, region=self._region, now=now
            )
            try:
                conn.request(method, target, headers=signed)
                response = conn.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self._drop()
                if reused:
                    continue  # an idle keep-alive connection the server had closed
                raise
            except BaseException:
                self._drop()
                raise
            if method == "HEAD":
                response.read()  # nothing: it closes the response, so the connection serves the next
            if response.status < 300:
                return _Answer(response)
            return self._failed(response)

    def _failed(self, response: http.client.HTTPResponse) -> _Answer:
        """An error answer: S3's code and message from its XML body (a HEAD's has none)."""
        try:
            body = response.read(_ERROR_BODY_MAX)
        except (OSError, http.client.HTTPException):
            body = b""
        if not response.isclosed():
            self._drop()
        text = body.decode(errors="replace")
        code = _CODE.search(text)
        message = _MESSAGE.search(text)
        return _Answer(
            response,
            html.unescape(code.group(1)) if code else str(response.getheader("x-amz-error-code") or ""),
            html.unescape(message.group(1)) if message else "",
        )

    def _ask(
        self, method: str, key: str, what: str, query: Mapping[str, str], headers: Mapping[str, str]
    ) -> _Answer:
        """A request asked again (``max_attempts`` in all, backing off) while the store is unreachable
        or answers 5xx/SlowDown; its last answer, or StoreUnavailable."""
        for attempt in range(self._attempts):
            last = attempt == self._attempts - 1
            wait: float | None = None
            try:
                answer = self._send(method, key, query, headers)
            except (OSError, http.client.HTTPException) as exc:
                if last:
                    raise StoreUnavailable(self.uri, f"{what}: {exc!r}") from None
            else:
                if not self._transient(answer) or last:
                    return answer
                wait = parse_retry_after(answer.header("Retry-After"))
            time.sleep(self._backoff.delay(attempt, retry_after=wait, random=self._random))
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _transient(answer: _Answer) -> bool:
        return answer.status >= 500 or answer.status == 429 or answer.code in UNAVAILABLE

    def _error(self, answer: _Answer, what: str) -> StoreError:
        """The typed error of an error answer, as the boto3 store maps botocore's."""
        code, status, message = answer.code, answer.status, answer.message or answer.code
        if code == "NoSuchBucket":
            return BucketNotFound(self.uri, self.bucket)
        if code in DENIED or status in (401, 403):
            return AccessDenied(
                self.uri, f"{code or status} on {what} in bucket {self.bucket!r}: {message or status}"
            )
        if self._transient(answer):
            return StoreUnavailable(self.uri, f"{code or status} on {what}: {message or status}")
        return StoreError(f"{self.uri}: {code or status} on {what}: {message or status}")

    @staticmethod
    def _conditions(etag: str, generation: str) -> tuple[dict[str, str], dict[str, str]]:
        headers = {"If-Match": f'"{etag.strip(chr(34))}"'} if etag else {}
        query = {"versionId": generation} if generation and generation != "null" else {}
        return query, headers

    # ------------------------------------------------------------ the protocol

    def head(self, key: str) -> ObjectInfo | None:
        what = f"reading metadata of {key!r}"
        answer = self._ask("HEAD", key, what, {}, {})
        if answer.status == 404:
            return None
        if answer.status >= 300:
            raise self._error(answer, what)
        etag = answer.header("ETag").strip('"')
        return ObjectInfo(
            key,
            int(answer.header("Content-Length") or 0),
            etag=etag,
            md5=s3_etag_md5(etag),
            generation=answer.header("x-amz-version-id"),
        )

    def read_range(
        self, key: str, start: int, end: int | None, sink: Sink, *, etag: str = "", generation: str = ""
    ) -> int:
        query, headers = self._conditions(etag, generation)
        if end is not None:
            if end <= start:
                return 0
            headers["Range"] = f"bytes={start}-{end - 1}"
        elif start:
            headers["Range"] = f"bytes={start}-"
        what = f"reading {key!r}"
        answer = self._ask("GET", key, what, query, headers)
        if answer.status >= 300:
            if etag and (answer.status in (404, 412)) and answer.code != "NoSuchBucket":
                current = self.describe(self.head(key))
                raise ObjectChanged(self.uri, key, f"etag {etag}", current)
            raise self._error(answer, what)
        response = answer.response
        expected = response.length
        if "Range" in headers and answer.status != 206 and (start or expected != end):
            # A 200 is the whole object: the range asked for only when it starts at 0 and is all of it.
            self._drop()
            raise StoreError(f"{self.uri}: {what}: the store ignored the range {headers['Range']}")
        try:
            count = pump(response.readinto, sink, CHUNK)
        except (OSError, http.client.HTTPException) as exc:
            self._drop()
            raise StoreUnavailable(self.uri, f"{what}: {exc!r}") from None
        except BaseException:
            self._drop()  # the sink refused: the rest of the body stays unread on the connection
            raise
        if not response.isclosed() or (expected is not None and count != expected):
            self._drop()
            detail = f"the connection closed after {count} of {expected} bytes"
            raise StoreUnavailable(self.uri, f"{what}: {detail}")
        return count

    def part_size(self, key: str, etag: str) -> int | None:
        """HEAD with partNumber=1 tells the first part's size of a multipart upload."""
        _, headers = self._conditions(etag, "")
        try:
            answer = self._ask("HEAD", key, f"reading part 1 of {key!r}", {"partNumber": "1"}, headers)
        except StoreError:
            return None
        if answer.status >= 300 or int(answer.header("x-amz-mp-parts-count") or 0) < 1:
            return None
        return int(answer.header("Content-Length") or 0) or None

    def transfer_check(
        self, key: str, etag: str, generation: str, part_size: int | None, pinned: str
    ) -> TransferCheck | None:
        """As S3Store.transfer_check: the CRC S3 keeps of the object with the pinned ETag."""
        etag = etag.strip('"')
        if not etag or pinned != etag.lower():
            return None
        query, headers = self._conditions(etag, generation)
        headers["x-amz-checksum-mode"] = "ENABLED"
        try:
            answer = self._ask("HEAD", key, f"reading the checksum of {key!r}", query, headers)
        except StoreError:
            return None
        if answer.status >= 300:
            return None
        fields = {
            "ETag": answer.header("ETag"),
            "ChecksumCRC32C": answer.header("x-amz-checksum-crc32c"),
            "ChecksumCRC32": answer.header("x-amz-checksum-crc32"),
            "ChecksumType": answer.header("x-amz-checksum-type"),
        }
        return crc_check(fields, etag, part_size, lambda: self.part_size(key, etag))

    # ------------------------------------------------------------ what boto3 does

    def _boto3(self) -> ObjectStore:
        with self._lock:
            if self._full is None:
                self._full = self._make_full()
            return self._full

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Listed by the boto3 store (made on first use): sync never lists a pinned repository."""
        return self._boto3().list(prefix)

    def trusted(self, objects: Sequence[ObjectInfo]) -> Sequence[ObjectInfo]:
        return self._boto3().trusted(objects)

    def versioned(self) -> bool | None:
        return self._boto3().versioned()

    def close(self) -> None:
        with self._lock:
            connections, self._connections = self._connections, []
            full, self._full = self._full, None
        for conn in connections:
            conn.close()
        if full is not None:
            full.close()
