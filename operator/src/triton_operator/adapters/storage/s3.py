"""S3 and S3-compatible stores through boto3: listing, conditional ranged reads, typed errors."""

from __future__ import annotations

import dataclasses
import http.client
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    InvalidRegionError,
    NoCredentialsError,
    PartialCredentialsError,
    ResponseStreamingError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)
from urllib3.exceptions import HTTPError as Urllib3HTTPError

from triton_operator.adapters.storage.base import (
    AccessDenied,
    BucketNotFound,
    ObjectChanged,
    Sink,
    StoreBase,
    StoreConfigError,
    StoreError,
    StoreUnavailable,
    TransferCheck,
    pump,
    redacted_cause,
)
from triton_operator.adapters.storage.s3_http import DENIED, UNAVAILABLE, crc_check
from triton_operator.core.repository.manifest import ObjectInfo, hex_from_base64, s3_etag_md5

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

CHUNK = 1024 * 1024

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class _Trust:
    """What a HEAD told of one object: whether its ETag is a digest, and its additional checksums."""

    etag_is_digest: bool
    sha256: str = ""
    sha1: str = ""
    crc32c: str = ""
    crc32: str = ""

    def apply(self, obj: ObjectInfo) -> ObjectInfo:
        if self.etag_is_digest:
            return obj  # as listed: a plain bucket pins exactly what it pinned before
        return dataclasses.replace(
            obj,
            md5="",
            etag_is_digest=False,
            sha256=self.sha256 or obj.sha256,
            sha1=self.sha1,
            crc32c=self.crc32c or obj.crc32c,
            crc32=self.crc32,
        )


_UNTRUSTED = _Trust(etag_is_digest=False)
_TRUST_CACHE_MAX = 200_000
# (endpoint, bucket, key, etag, version, size) -> what its HEAD said. An object with that ETag and
# version is that object: pinning every poll interval asks only objects new since the last one.
_trust_cache: dict[tuple[str, str, str, str, str, int], _Trust] = {}
_trust_lock = threading.Lock()


def is_aws_endpoint(endpoint: str) -> bool:
    """Whether the endpoint is Amazon S3's own (no endpoint set, or an amazonaws.com host)."""
    host = (urlsplit(endpoint).hostname or "") if endpoint else "s3.amazonaws.com"
    return host == "amazonaws.com" or host.endswith(".amazonaws.com")


class S3Store(StoreBase):
    """One bucket and prefix of an S3 API; the boto3 client is shared by all threads."""

    def __init__(
        self,
        uri: str,
        bucket: str,
        prefix: str,
        *,
        credentials: Mapping[str, str],
        endpoint: str = "",
        addressing_style: str = "auto",
        region: str = "",
        max_connections: int = 16,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        max_attempts: int = 3,
    ) -> None:
        super().__init__(uri, bucket, prefix, credentials)
        self.endpoint = endpoint
        self.max_connections = max_connections
        style = addressing_style or "auto"
        if style == "auto" and endpoint:
            style = "path"  # S3-compatible stores rarely resolve bucket.host names
        region_field = next(
            (
                field
                for field, value in (
                    ("repository.s3.region", region),
                    ("AWS_REGION", credentials.get("AWS_REGION")),
                    ("AWS_DEFAULT_REGION", credentials.get("AWS_DEFAULT_REGION")),
                )
                if value
            ),
            "repository.s3.region",
        )
        region = region or credentials.get("AWS_REGION", "") or credentials.get("AWS_DEFAULT_REGION", "")
        if not region and endpoint:
            region = "us-east-1"
        session = boto3.session.Session(
            aws_access_key_id=credentials.get("AWS_ACCESS_KEY_ID") or None,
            aws_secret_access_key=credentials.get("AWS_SECRET_ACCESS_KEY") or None,
            aws_session_token=credentials.get("AWS_SESSION_TOKEN") or None,
            region_name=region or None,
        )
        config = Config(
            signature_version="s3v4",
            s3=cast(Any, {"addressing_style": style}),
            max_pool_connections=max(10, max_connections),
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"max_attempts": max_attempts, "mode": "standard"},
            # S3-compatible stores differ in the newer CRC checksum headers; ETags/MD5 suffice here.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        try:
            self.client: S3Client = session.client("s3", endpoint_url=endpoint or None, config=config)
        except (BotoCoreError, ValueError) as exc:
            # A region is part of the host name botocore builds (s3.REGION.amazonaws.com): one that
            # is not a region name is refused here, before any request; so is a malformed endpoint.
            field = region_field if isinstance(exc, InvalidRegionError) else "repository.endpoint"
            raise StoreConfigError(field, str(exc)) from redacted_cause(exc)
        self._listed_versioned: bool | None = None
        """What the last ``list`` found of the bucket's versioning (None: nothing listed yet)."""

    # ------------------------------------------------------------ errors

    def _error(self, exc: Exception, what: str) -> StoreError:
        if isinstance(exc, ClientError):
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            message = str(err.get("Message", "")) or code
            if code == "NoSuchBucket":
                return BucketNotFound(self.uri, self.bucket)
            if code in DENIED or status in (401, 403):
                return AccessDenied(
                    self.uri, f"{code or status} on {what} in bucket {self.bucket!r}: {message}"
                )
            if code in UNAVAILABLE or status >= 500:
                return StoreUnavailable(self.uri, f"{code or status} on {what}: {message}")
            return StoreError(f"{self.uri}: {code or status} on {what}: {message}")
        if isinstance(exc, NoCredentialsError | PartialCredentialsError):
            return AccessDenied(
                self.uri,
                f"no usable credentials for bucket {self.bucket!r} ({exc}); set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY in the credentials secret or give the pod an IAM role",
            )
        if isinstance(
            exc, BotoConnectionError | HTTPClientError | ResponseStreamingError | Urllib3HTTPError | OSError
        ):
            return StoreUnavailable(self.uri, f"{what}: {exc}")
        if isinstance(exc, BotoCoreError):
            return StoreError(f"{self.uri}: {what}: {exc}")
        return StoreError(f"{self.uri}: {what}: {exc!r}")

    # ------------------------------------------------------------ the protocol

    def versioned(self) -> bool:
        """Whether the bucket keeps object versions (versioning Enabled, or Suspended with old versions).

        After a ``list`` this is what that listing found (it asked already: pinning asks once);
        before one, the bucket is asked. A store that does not implement GetBucketVersioning
        counts as unversioned.
        """
        if self._listed_versioned is not None:
            return self._listed_versioned
        return self._bucket_versioning()

    def _bucket_versioning(self) -> bool:
        try:
            answer = self.client.get_bucket_versioning(Bucket=self.bucket)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("NotImplemented", "MethodNotAllowed", "501"):
                return False
            raise self._error(exc, "reading the bucket's versioning") from redacted_cause(exc)
        except (BotoCoreError, Urllib3HTTPError, OSError) as exc:
            raise self._error(exc, "reading the bucket's versioning") from redacted_cause(exc)
        return str(answer.get("Status", "")) in ("Enabled", "Suspended")

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object under ``prefix``; in a versioned bucket each carries its VersionId, so a pod
        reads exactly that version even after an upload to the same key."""
        try:
            self._listed_versioned = self._bucket_versioning()
            if self._listed_versioned:
                yield from self._list_versions(prefix)
                return
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                for item in page.get("Contents", []):
                    etag = str(item.get("ETag", "")).strip('"')
                    yield ObjectInfo(
                        key=item["Key"], size=int(item.get("Size", 0)), etag=etag, md5=s3_etag_md5(etag)
                    )
        except (ClientError, BotoCoreError, Urllib3HTTPError, OSError) as exc:
            raise self._error(exc, f"listing prefix {prefix!r}") from redacted_cause(exc)

    def _list_versions(self, prefix: str) -> Iterator[ObjectInfo]:
        """The latest version of each key (keys whose latest version is a delete marker are gone)."""
        paginator = self.client.get_paginator("list_object_versions")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            for item in page.get("Versions", []):
                if not item.get("IsLatest"):
                    continue
                etag = str(item.get("ETag", "")).strip('"')
                yield ObjectInfo(
                    key=item["Key"],
                    size=int(item.get("Size", 0)),
                    etag=etag,
                    md5=s3_etag_md5(etag),
                    generation=str(item.get("VersionId") or ""),
                )

    def head(self, key: str) -> ObjectInfo | None:
        try:
            r = self.client.head_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if status == 404:
                return None
            raise self._error(exc, f"reading metadata of {key!r}") from redacted_cause(exc)
        except (BotoCoreError, Urllib3HTTPError, OSError) as exc:
            raise self._error(exc, f"reading metadata of {key!r}") from redacted_cause(exc)
        etag = str(r.get("ETag", "")).strip('"')
        version = str(r.get("VersionId") or "")
        return ObjectInfo(
            key, int(r.get("ContentLength", 0)), etag=etag, md5=s3_etag_md5(etag), generation=version
        )

    def trusted(self, objects: Sequence[ObjectInfo]) -> Sequence[ObjectInfo]:
        """Each object as far as its ETag can be trusted: one HEAD (ChecksumMode=ENABLED) per
        object not asked before, ``max_connections`` at a time.

        The ETag of an SSE-KMS or SSE-C object (or of one an S3-compatible store encrypted, like
        MinIO's SSE-S3) is no MD5 of its content: its md5 is dropped and the HEAD's additional
        checksums of the whole object (SHA256, SHA1, CRC32C, CRC32; never a composite one of the
        parts) take its place; with none, the object is pinned by size and ETag only.
        """
        keys = [self._trust_key(o) for o in objects]
        with _trust_lock:
            known = {k: _trust_cache[k] for k in keys if k in _trust_cache}
        todo = [o for o, k in zip(objects, keys, strict=True) if k not in known]
        if todo:
            with ThreadPoolExecutor(
                max_workers=min(len(todo), max(1, self.max_connections)), thread_name_prefix="s3-head"
            ) as pool:
                answers = list(pool.map(self._ask_trust, todo))
            refused = [obj.key for obj, (_, denied) in zip(todo, answers, strict=True) if denied]
            if refused:
                logger.warning(
                    "%s: %d objects (%s first) could not be asked for their encryption and checksums "
                    "(HEAD refused or the object changed since the listing): they are pinned by size "
                    "and ETag only",
                    self.uri,
                    len(refused),
                    refused[0],
                )
            with _trust_lock:
                if len(_trust_cache) + len(answers) > _TRUST_CACHE_MAX:
                    _trust_cache.clear()
                for obj, (trust, _) in zip(todo, answers, strict=True):
                    known[self._trust_key(obj)] = _trust_cache[self._trust_key(obj)] = trust
        return [known[k].apply(o) for o, k in zip(objects, keys, strict=True)]

    def _trust_key(self, obj: ObjectInfo) -> tuple[str, str, str, str, str, int]:
        return (self.endpoint, self.bucket, obj.key, obj.etag, obj.generation, obj.size)

    def _ask_trust(self, obj: ObjectInfo) -> tuple[_Trust, bool]:
        """What a HEAD of the listed object says, and whether it could not be asked."""
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": obj.key}
        if obj.etag:
            params["IfMatch"] = f'"{obj.etag}"'
        if obj.generation and obj.generation != "null":
            params["VersionId"] = obj.generation
        what = f"reading metadata of {obj.key!r}"
        # A store that refuses ChecksumMode is asked again without it; S3 answers a HEAD of an
        # SSE-C object without the customer's key with 400 either way.
        for checksum_mode in ("ENABLED", ""):
            if not checksum_mode:
                params.pop("ChecksumMode")
            else:
                params["ChecksumMode"] = checksum_mode
            try:
                r = self.client.head_object(**params)
                break
            except ClientError as exc:
                status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
                if status in (401, 403, 404, 412):
                    return _UNTRUSTED, True
                if status != 400:
                    raise self._error(exc, what) from redacted_cause(exc)
            except (BotoCoreError, Urllib3HTTPError, OSError) as exc:
                raise self._error(exc, what) from redacted_cause(exc)
        else:
            return _UNTRUSTED, False  # SSE-C
        sse = str(r.get("ServerSideEncryption") or "")
        sse_s3_on_aws = sse == "AES256" and is_aws_endpoint(self.endpoint)
        if not r.get("SSECustomerAlgorithm") and (not sse or sse_s3_on_aws):
            # AWS documents the ETag of a plain or SSE-S3 upload as its MD5 (a multipart one's as
            # the MD5 of its parts' MD5s); an S3-compatible store that encrypts (MinIO) may give any.
            return _Trust(etag_is_digest=True), False
        if str(r.get("ChecksumType") or "FULL_OBJECT") != "FULL_OBJECT":
            return _UNTRUSTED, False  # a composite checksum is of the parts, not of the bytes
        return (
            _Trust(
                etag_is_digest=False,
                sha256=hex_from_base64(r.get("ChecksumSHA256")),
                sha1=hex_from_base64(r.get("ChecksumSHA1")),
                crc32c=hex_from_base64(r.get("ChecksumCRC32C")),
                crc32=hex_from_base64(r.get("ChecksumCRC32")),
            ),
            False,
        )

    def read_range(
        self, key: str, start: int, end: int | None, sink: Sink, *, etag: str = "", generation: str = ""
    ) -> int:
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": key}
        if end is not None:
            if end <= start:
                return 0
            params["Range"] = f"bytes={start}-{end - 1}"
        elif start:
            params["Range"] = f"bytes={start}-"
        if etag:
            params["IfMatch"] = f'"{etag.strip(chr(34))}"'
        if generation and generation != "null":
            params["VersionId"] = generation
        what = f"reading {key!r}"
        try:
            response = self.client.get_object(**params)
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            code = exc.response.get("Error", {}).get("Code", "")
            if etag and (
                status == 412 or code == "PreconditionFailed" or code in ("NoSuchKey", "NoSuchVersion")
            ):
                current = self.describe(self.head(key))
                raise ObjectChanged(self.uri, key, f"etag {etag}", current) from redacted_cause(exc)
            raise self._error(exc, what) from redacted_cause(exc)
        except (BotoCoreError, Urllib3HTTPError, OSError) as exc:
            raise self._error(exc, what) from redacted_cause(exc)
        body = response["Body"]
        raw: Any = getattr(body, "_raw_stream", None)
        fp = getattr(raw, "_fp", None)
        count = 0
        try:
            if isinstance(fp, http.client.HTTPResponse) and hasattr(raw, "release_conn"):
                # The body straight from the socket into one reused buffer (http.client's readinto):
                # botocore's and urllib3's reads allocate and copy every chunk on the way.
                count = pump(fp.readinto, sink, CHUNK)
                expected = response.get("ContentLength")
                if fp.isclosed() and (expected is None or count == expected):
                    raw.release_conn()  # read to its end: the connection serves the next read
                else:
                    raise ResponseStreamingError(
                        error=f"the connection closed after {count} of {expected} bytes"
                    )
            else:
                for chunk in body.iter_chunks(CHUNK):
                    sink(chunk)
                    count += len(chunk)
        except (BotoCoreError, Urllib3HTTPError, http.client.HTTPException, OSError) as exc:
            raise self._error(exc, what) from redacted_cause(exc)
        finally:
            body.close()
        return count

    def part_size(self, key: str, etag: str) -> int | None:
        """HEAD with PartNumber=1 tells the first part's size of a multipart upload."""
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": key, "PartNumber": 1}
        if etag:
            params["IfMatch"] = f'"{etag.strip(chr(34))}"'
        try:
            r = self.client.head_object(**params)
        except (ClientError, BotoCoreError, Urllib3HTTPError, OSError):
            return None
        if int(r.get("PartsCount", 0) or 0) < 1:
            return None
        size = int(r.get("ContentLength", 0))
        return size or None

    def transfer_check(
        self, key: str, etag: str, generation: str, part_size: int | None, pinned: str
    ) -> TransferCheck | None:
        """The object's CRC32C or CRC32 as S3 keeps it (a HEAD with ChecksumMode=ENABLED, on the
        condition of the pinned ETag and version): of the whole object, or S3's composite of a
        multipart upload's parts (then with the part size). Only when the pinned digest is that
        ETag (an unencrypted upload's MD5 or multipart ETag): the store answers the HEAD, and
        serves the ranges, only for the object with that ETag, so its CRC is of the pinned bytes.
        Any failure answers None: the pinned digest is checked instead."""
        etag = etag.strip('"')
        if not etag or pinned != etag.lower():
            return None
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": key, "ChecksumMode": "ENABLED"}
        params["IfMatch"] = f'"{etag}"'
        if generation and generation != "null":
            params["VersionId"] = generation
        try:
            r = self.client.head_object(**params)
        except (ClientError, BotoCoreError, Urllib3HTTPError, OSError):
            return None
        return crc_check(r, etag, part_size, lambda: self.part_size(key, etag))

    def close(self) -> None:
        self.client.close()
