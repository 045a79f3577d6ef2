"""Azure Blob Storage (and azurite) through azure-storage-blob: ranged reads by blob version or etag."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import requests
from azure.core import MatchConditions
from azure.core import exceptions as aexc
from azure.core.pipeline.transport import RequestsTransport
from azure.storage.blob import BlobServiceClient

from triton_operator.adapters.storage.base import (
    AccessDenied,
    BucketNotFound,
    ObjectChanged,
    Sink,
    StoreBase,
    StoreConfigError,
    StoreError,
    StoreUnavailable,
    mount_pool,
    redacted_cause,
)
from triton_operator.core.repository.manifest import ObjectInfo

CONNECTION_STRING = "AZURE_STORAGE_CONNECTION_STRING"
ACCOUNT_KEY = "AZURE_STORAGE_KEY"
SAS_TOKEN = "AZURE_STORAGE_SAS_TOKEN"
CHUNK = 4 * 1024 * 1024


def parse_connection_string(text: str) -> dict[str, str]:
    """``Key=Value;...`` into a dict with upper-case keys; raises StoreConfigError naming the variable."""
    out: dict[str, str] = {}
    for number, part in enumerate(text.strip().rstrip(";").split(";"), 1):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep:
            # By its position, not its text: a stray ";" may have cut the account key in two.
            raise StoreConfigError(CONNECTION_STRING, f"segment {number} is not Key=Value")
        out[key.strip().upper()] = value.strip()
    return out


class AzureStore(StoreBase):
    """One container and prefix of a storage account."""

    def __init__(
        self,
        uri: str,
        account: str,
        container: str,
        prefix: str,
        *,
        credentials: Mapping[str, str],
        endpoint: str = "",
        max_connections: int = 16,
        timeout: float = 60.0,
        max_attempts: int = 3,
    ) -> None:
        super().__init__(uri, container, prefix, credentials)
        credential: Any = None
        account_url = endpoint
        if credentials.get(CONNECTION_STRING):
            cs = parse_connection_string(credentials[CONNECTION_STRING])
            name = cs.get("ACCOUNTNAME", "")
            if name and name != account:
                raise StoreConfigError(
                    CONNECTION_STRING, f"is for account {name!r} but repository.uri names account {account!r}"
                )
            if cs.get("ACCOUNTKEY"):
                credential = {"account_name": account, "account_key": cs["ACCOUNTKEY"]}
            elif cs.get("SHAREDACCESSSIGNATURE"):
                credential = cs["SHAREDACCESSSIGNATURE"]
            else:
                raise StoreConfigError(CONNECTION_STRING, "has neither AccountKey nor SharedAccessSignature")
            if not account_url:
                account_url = cs.get("BLOBENDPOINT", "")
            if not account_url:
                protocol = cs.get("DEFAULTENDPOINTSPROTOCOL", "https")
                suffix = cs.get("ENDPOINTSUFFIX", "core.windows.net")
                account_url = f"{protocol}://{account}.blob.{suffix}"
        elif credentials.get(ACCOUNT_KEY):
            credential = {"account_name": account, "account_key": credentials[ACCOUNT_KEY]}
        elif credentials.get(SAS_TOKEN):
            credential = credentials[SAS_TOKEN]
        else:
            try:
                from azure.identity import DefaultAzureCredential  # noqa: PLC0415 - optional
            except ImportError as exc:
                raise AccessDenied(
                    uri,
                    f"no credentials: set {CONNECTION_STRING}, {ACCOUNT_KEY} or {SAS_TOKEN} in the "
                    "credentials secret (workload identity needs the azure-identity package)",
                ) from redacted_cause(exc)
            credential = DefaultAzureCredential()
        if not account_url:
            account_url = f"https://{account}.blob.core.windows.net"
        session = requests.Session()
        mount_pool(session, max_connections)
        try:
            self.service = BlobServiceClient(
                account_url.rstrip("/"),
                credential=credential,
                transport=RequestsTransport(session=session, session_owner=False),
                retry_total=max(0, max_attempts - 1),
                retry_connect=max(0, max_attempts - 1),
                retry_read=max(0, max_attempts - 1),
                retry_status=max(0, max_attempts - 1),
                connection_timeout=timeout,
                read_timeout=timeout,
                max_single_get_size=CHUNK,
                max_chunk_get_size=CHUNK,
            )
        except ValueError as exc:
            raise StoreConfigError("repository.endpoint", f"{account_url!r}: {exc}") from redacted_cause(exc)
        self.container = self.service.get_container_client(container)

    def _error(self, exc: Exception, what: str) -> StoreError:
        code = str(getattr(exc, "error_code", "") or "")
        status = int(getattr(getattr(exc, "response", None), "status_code", 0) or 0)
        if code == "ContainerNotFound":
            return BucketNotFound(self.uri, self.bucket)
        if isinstance(exc, aexc.ClientAuthenticationError) or status in (401, 403):
            return AccessDenied(self.uri, f"{code or status} on {what} in container {self.bucket!r}")
        if status:
            # The answer of an HTTP call: only the storage service's own error (its code and the first
            # line of its message) is quoted, never a body the SDK could not read as one (an endpoint
            # a connection string names may be anything that answers HTTP).
            said = (str(exc).splitlines() or [""])[0] if code else "(its response is not shown)"
            if status >= 500:
                return StoreUnavailable(self.uri, f"{what}: {code or status}: {said}")
            return StoreError(f"{self.uri}: {what}: {code or status}: {said}")
        if isinstance(exc, aexc.ServiceRequestError | aexc.ServiceResponseError | OSError):
            return StoreUnavailable(self.uri, f"{what}: {exc}")
        first_line = str(exc).splitlines()[0] if str(exc) else repr(exc)
        return StoreError(f"{self.uri}: {what}: {first_line}")

    _ERRORS = (aexc.AzureError, requests.RequestException, OSError)

    @staticmethod
    def _info(props: Any) -> ObjectInfo:
        md5 = props.content_settings.content_md5 if props.content_settings else None
        return ObjectInfo(
            key=props.name,
            size=int(props.size or 0),
            etag=str(props.etag or ""),
            md5=bytes(md5).hex() if md5 else "",
            generation=str(getattr(props, "version_id", None) or ""),
        )

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        try:
            for props in self.container.list_blobs(name_starts_with=prefix or None):
                yield self._info(props)
        except self._ERRORS as exc:
            raise self._error(exc, f"listing prefix {prefix!r}") from redacted_cause(exc)

    def head(self, key: str) -> ObjectInfo | None:
        try:
            props = self.container.get_blob_client(key).get_blob_properties()
        except aexc.ResourceNotFoundError:
            return None
        except self._ERRORS as exc:
            raise self._error(exc, f"reading metadata of {key!r}") from redacted_cause(exc)
        return self._info(props)

    def read_range(
        self, key: str, start: int, end: int | None, sink: Sink, *, etag: str = "", generation: str = ""
    ) -> int:
        if end is not None and end <= start:
            return 0
        kwargs: dict[str, Any] = {"max_concurrency": 1, "validate_content": False}
        if start or end is not None:
            kwargs["offset"] = start
            kwargs["length"] = None if end is None else end - start
        pinned = ""
        if generation:
            # A blob version (account with blob versioning) never changes: reading it by its id is
            # exact on its own, so no If-Match is sent with it.
            kwargs["version_id"] = generation
            pinned = f"version {generation}"
        elif etag:
            kwargs["etag"] = etag
            kwargs["match_condition"] = MatchConditions.IfNotModified
            pinned = f"etag {etag}"
        count = 0
        try:
            downloader = self.container.download_blob(key, **kwargs)
            for chunk in downloader.chunks():
                sink(chunk)
                count += len(chunk)
        except (aexc.ResourceModifiedError, aexc.ResourceNotFoundError) as exc:
            if (etag or generation) and getattr(exc, "error_code", "") != "ContainerNotFound":
                # the pinned version was deleted, or (etag only) the blob was overwritten
                current = self.describe(self.head(key))
                raise ObjectChanged(self.uri, key, pinned, current) from redacted_cause(exc)
            raise self._error(exc, f"reading {key!r}") from redacted_cause(exc)
        except self._ERRORS as exc:
            raise self._error(exc, f"reading {key!r}") from redacted_cause(exc)
        return count

    def close(self) -> None:
        self.service.close()
