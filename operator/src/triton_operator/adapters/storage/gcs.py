"""Google Cloud Storage (and fake-gcs-server) through google-cloud-storage: generation-pinned reads."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import google.auth
import requests
from google.api_core import exceptions as gexc
from google.api_core.retry import Retry
from google.auth import exceptions as auth_exc
from google.auth.credentials import AnonymousCredentials
from google.auth.transport.requests import AuthorizedSession
from google.cloud import storage
from google.cloud.storage.retry import DEFAULT_RETRY
from google.oauth2 import service_account

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
    mount_pool,
    redacted_cause,
)
from triton_operator.core.repository.manifest import ObjectInfo, hex_from_base64

CREDENTIALS_KEY = "GOOGLE_APPLICATION_CREDENTIALS_JSON"
READ_SCOPE = "https://www.googleapis.com/auth/devstorage.read_only"
OAUTH_ERRORS = frozenset(
    {
        "invalid_request",
        "invalid_client",
        "invalid_grant",
        "unauthorized_client",
        "unsupported_grant_type",
        "invalid_scope",
        "access_denied",
    }
)
"""The error codes of RFC 6749 (5.2): the only part of a token endpoint's answer a message quotes."""


def token_refusal(exc: auth_exc.RefreshError, token_host: str) -> str:
    """Why no access token could be had, without the token endpoint's response.

    google-auth puts the endpoint's whole answer (JSON or text) into the RefreshError: a token_uri
    is a URL a credential names, and whatever answers there must not reach the status through us.
    Only a standard OAuth error code is kept.
    """
    data = exc.args[1] if len(exc.args) > 1 else None
    code = data.get("error") if isinstance(data, dict) else None
    where = f"the token endpoint {token_host}" if token_host else "the token endpoint"
    said = f": {code}" if isinstance(code, str) and code in OAUTH_ERRORS else ""
    return f"{where} gave no access token{said} (its response is not shown)"


class _SinkFile:
    """The file-like object google-cloud-storage writes a download into."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.count = 0

    def write(self, data: bytes) -> int:
        self.sink(bytes(data))
        self.count += len(data)
        return len(data)


class GCSStore(StoreBase):
    """One bucket and prefix of GCS; reads name the pinned generation, so they are exact."""

    def __init__(
        self,
        uri: str,
        bucket: str,
        prefix: str,
        *,
        credentials: Mapping[str, str],
        endpoint: str = "",
        max_connections: int = 16,
        timeout: float = 60.0,
        retry_timeout: float = 60.0,
    ) -> None:
        super().__init__(uri, bucket, prefix, credentials)
        self.timeout = timeout
        self.retry: Retry = DEFAULT_RETRY.with_timeout(retry_timeout)
        endpoint = endpoint or credentials.get("STORAGE_EMULATOR_HOST", "")
        if endpoint and "://" not in endpoint:
            endpoint = "http://" + endpoint
        creds: Any
        session: requests.Session
        raw = credentials.get(CREDENTIALS_KEY, "")
        self.token_host = ""
        if raw:
            try:
                info = json.loads(raw)
                creds = service_account.Credentials.from_service_account_info(  # type: ignore[no-untyped-call]
                    info, scopes=[READ_SCOPE]
                )
            except (ValueError, KeyError, TypeError) as exc:
                raise StoreConfigError(
                    CREDENTIALS_KEY, f"is not a usable service-account JSON key: {exc}"
                ) from redacted_cause(exc)
            self.token_host = urlsplit(str(getattr(creds, "_token_uri", "") or "")).netloc.rpartition("@")[2]
            session = AuthorizedSession(creds)  # type: ignore[no-untyped-call]
        elif endpoint:
            creds = AnonymousCredentials()  # type: ignore[no-untyped-call]  # emulators take anonymous calls
            session = requests.Session()
        else:
            try:  # application default credentials / GKE workload identity
                creds, _ = google.auth.default(scopes=[READ_SCOPE])
            except auth_exc.DefaultCredentialsError as exc:
                raise AccessDenied(
                    uri,
                    f"no credentials: set {CREDENTIALS_KEY} in the credentials secret "
                    "or use workload identity",
                ) from redacted_cause(exc)
            session = AuthorizedSession(creds)  # type: ignore[no-untyped-call]
        mount_pool(session, max_connections)
        options = {"api_endpoint": endpoint} if endpoint else None
        try:
            self.client = storage.Client(
                project=None, credentials=creds, _http=session, client_options=options
            )
        except ValueError as exc:  # e.g. a key of another universe_domain than the client's
            raise StoreConfigError(CREDENTIALS_KEY, f"cannot be used here: {exc}") from redacted_cause(exc)
        self._bucket = self.client.bucket(bucket)

    def _error(self, exc: Exception, what: str) -> StoreError:
        refusal = exc.cause if isinstance(exc, gexc.RetryError) else exc
        if isinstance(refusal, auth_exc.RefreshError):
            return AccessDenied(
                self.uri, f"{what} in bucket {self.bucket!r}: {token_refusal(refusal, self.token_host)}"
            )
        if isinstance(exc, gexc.NotFound):
            return StoreError(f"{self.uri}: {what}: not found ({exc.message})")
        if isinstance(
            exc, gexc.Forbidden | gexc.Unauthorized | auth_exc.RefreshError | auth_exc.DefaultCredentialsError
        ):
            return AccessDenied(self.uri, f"{what} in bucket {self.bucket!r}: {exc}")
        if isinstance(
            exc,
            gexc.ServerError
            | gexc.TooManyRequests
            | gexc.RetryError
            | auth_exc.TransportError
            | requests.ConnectionError
            | requests.Timeout
            | OSError,
        ):
            return StoreUnavailable(self.uri, f"{what}: {exc}")
        return StoreError(f"{self.uri}: {what}: {exc}")

    _ERRORS = (gexc.GoogleAPIError, auth_exc.GoogleAuthError, requests.RequestException, OSError)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        try:
            for blob in self.client.list_blobs(
                self.bucket, prefix=prefix, retry=self.retry, timeout=self.timeout
            ):
                yield self._info(blob)
        except gexc.NotFound as exc:
            raise BucketNotFound(self.uri, self.bucket) from redacted_cause(exc)
        except self._ERRORS as exc:
            raise self._error(exc, f"listing prefix {prefix!r}") from redacted_cause(exc)

    @staticmethod
    def _info(blob: Any) -> ObjectInfo:
        return ObjectInfo(
            key=blob.name,
            size=int(blob.size or 0),
            etag=str(blob.etag or ""),
            md5=hex_from_base64(blob.md5_hash),
            crc32c=hex_from_base64(blob.crc32c),
            generation=str(blob.generation or ""),
        )

    def head(self, key: str) -> ObjectInfo | None:
        try:
            blob = self._bucket.get_blob(key, retry=self.retry, timeout=self.timeout)
        except self._ERRORS as exc:
            raise self._error(exc, f"reading metadata of {key!r}") from redacted_cause(exc)
        return None if blob is None else self._info(blob)

    def versioned(self) -> bool | None:
        """Whether the bucket has object versioning on: every object has a generation, but without
        versioning an overwrite deletes the old one and a read pinned to it fails.

        None when the credentials may not read the bucket's metadata (storage.buckets.get, which
        roles/storage.objectViewer lacks): reading objects needs no more than that.
        """
        try:
            bucket = self.client.get_bucket(self.bucket, retry=self.retry, timeout=self.timeout)
        except gexc.NotFound as exc:
            raise BucketNotFound(self.uri, self.bucket) from redacted_cause(exc)
        except (gexc.Forbidden, gexc.Unauthorized):
            return None
        except self._ERRORS as exc:
            raise self._error(exc, "reading the bucket's versioning") from redacted_cause(exc)
        return bool(bucket.versioning_enabled)

    def describe(self, info: ObjectInfo | None) -> str:
        return "deleted" if info is None else f"generation {info.generation}"

    def read_range(
        self, key: str, start: int, end: int | None, sink: Sink, *, etag: str = "", generation: str = ""
    ) -> int:
        if end is not None and end <= start:
            return 0
        blob = self._bucket.blob(key, generation=int(generation) if generation else None)
        out = _SinkFile(sink)
        try:
            blob.download_to_file(
                out,
                start=start if (start or end is not None) else None,
                end=end - 1 if end is not None else None,
                raw_download=True,  # the stored bytes, never gunzipped
                checksum=None,  # the syncer verifies whole files
                retry=self.retry,
                timeout=self.timeout,
            )
        except gexc.NotFound as exc:
            if generation:
                current = self.head(key)
                raise ObjectChanged(
                    self.uri, key, f"generation {generation}", self.describe(current)
                ) from redacted_cause(exc)
            raise self._error(exc, f"reading {key!r}") from redacted_cause(exc)
        except self._ERRORS as exc:
            raise self._error(exc, f"reading {key!r}") from redacted_cause(exc)
        return out.count

    def transfer_check(
        self, key: str, etag: str, generation: str, part_size: int | None, pinned: str
    ) -> TransferCheck | None:
        """The CRC32C GCS keeps of every object generation, when the read names the pinned
        generation (whose bytes never change) and that generation's MD5 is the pinned digest. Any
        failure answers None: the pinned digest is checked instead."""
        if not generation or not pinned:
            return None
        try:
            blob = self._bucket.get_blob(
                key, generation=int(generation), retry=self.retry, timeout=self.timeout
            )
        except (*self._ERRORS, ValueError):
            return None
        if blob is None or hex_from_base64(blob.md5_hash) != pinned:
            return None
        crc = hex_from_base64(blob.crc32c)
        return TransferCheck("crc32c", crc) if len(crc) == 8 else None

    def close(self) -> None:
        self.client.close()
