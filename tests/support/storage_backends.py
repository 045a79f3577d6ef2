"""One test-side client per real store, to create buckets and upload, overwrite and delete objects."""

from __future__ import annotations

import base64
import io
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import boto3
import google_crc32c
from azure.storage.blob import BlobServiceClient
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage as gcs

from triton_operator.adapters.storage import ObjectStore, open_store
from triton_operator.adapters.storage.base import Sink, TransferCheck
from triton_operator.core.repository.manifest import ObjectInfo
from triton_operator.models import Repository


@dataclass
class Backend:
    """What a test needs of a store: its Repository, credentials, and writes to the bucket."""

    name: str
    endpoint: str
    credentials: dict[str, str]

    def new_bucket(self, *, versioned: bool = False) -> str:
        """A new empty bucket; ``versioned``: one that keeps overwritten objects as old versions."""
        raise NotImplementedError

    def uri(self, bucket: str, prefix: str = "models") -> str:
        raise NotImplementedError

    def repository(self, bucket: str, prefix: str = "models") -> Repository:
        return Repository(uri=self.uri(bucket, prefix), endpoint=self.endpoint)

    def put(self, bucket: str, key: str, data: bytes, *, part_size: int | None = None) -> None:
        """Upload ``data``; with ``part_size`` as a multipart (S3) or block (Azure) upload."""
        raise NotImplementedError

    def delete(self, bucket: str, key: str) -> None:
        raise NotImplementedError

    def store(self, bucket: str, prefix: str = "models", **kwargs: Any) -> ObjectStore:
        return open_store(self.repository(bucket, prefix), self.credentials, **kwargs)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@dataclass
class S3Backend(Backend):
    client: Any = field(init=False)

    def __post_init__(self) -> None:
        self.client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.credentials["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.credentials["AWS_SECRET_ACCESS_KEY"],
            region_name="us-east-1",
            config=Config(
                s3={"addressing_style": "path"},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )

    def new_bucket(self, *, versioned: bool = False) -> str:
        bucket = _name("s3t")
        self.client.create_bucket(Bucket=bucket)
        if versioned:
            self.client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
        return bucket

    def uri(self, bucket: str, prefix: str = "models") -> str:
        return f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"

    def store(self, bucket: str, prefix: str = "models", **kwargs: Any) -> ObjectStore:
        """The store as a pod's sync opens it (``reads_only``: its own signed GETs and HEADs, boto3
        for listing); ``reads_only=False`` gives the operator's (boto3 for everything)."""
        return super().store(bucket, prefix, **{"reads_only": True, **kwargs})

    def put(self, bucket: str, key: str, data: bytes, *, part_size: int | None = None, crc: str = "") -> None:
        """Upload ``data``; ``crc`` "CRC32" asks boto3 for S3's additional checksum (composite for a
        multipart upload), "CRC32C" sends one computed here (whole-object uploads only)."""
        extra: dict[str, Any] = {}
        if crc == "CRC32":
            extra["ChecksumAlgorithm"] = "CRC32"
        elif crc == "CRC32C":
            assert not part_size, "boto3 computes CRC32C only with awscrt"
            extra["ChecksumCRC32C"] = base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()
        if part_size:
            config = TransferConfig(multipart_threshold=part_size, multipart_chunksize=part_size)
            self.client.upload_fileobj(io.BytesIO(data), bucket, key, ExtraArgs=extra, Config=config)
        else:
            self.client.put_object(Bucket=bucket, Key=key, Body=data, **extra)

    def delete(self, bucket: str, key: str) -> None:
        self.client.delete_object(Bucket=bucket, Key=key)


@dataclass
class GCSBackend(Backend):
    client: Any = field(init=False)

    def __post_init__(self) -> None:
        self.client = gcs.Client(
            project="test",
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            client_options={"api_endpoint": self.endpoint},
        )

    def new_bucket(self, *, versioned: bool = False) -> str:
        bucket = self.client.bucket(_name("gst"))
        bucket.versioning_enabled = versioned
        self.client.create_bucket(bucket)
        return str(bucket.name)

    def uri(self, bucket: str, prefix: str = "models") -> str:
        return f"gs://{bucket}/{prefix}" if prefix else f"gs://{bucket}"

    def put(self, bucket: str, key: str, data: bytes, *, part_size: int | None = None) -> None:
        self.client.bucket(bucket).blob(key).upload_from_string(data)

    def delete(self, bucket: str, key: str) -> None:
        self.client.bucket(bucket).blob(key).delete()


@dataclass
class AzureBackend(Backend):
    account: str = "devstoreaccount1"
    service: Any = field(init=False)

    def __post_init__(self) -> None:
        self.service = BlobServiceClient.from_connection_string(
            self.credentials["AZURE_STORAGE_CONNECTION_STRING"]
        )

    def new_bucket(self, *, versioned: bool = False) -> str:
        if versioned:
            # Blob versioning is an account setting that azurite does not implement: its listings
            # carry no version ids and its reads ignore one (test_azurite_keeps_no_blob_versions).
            raise NotImplementedError("azurite keeps no blob versions")
        container = _name("azt")
        self.service.create_container(container)
        return container

    def uri(self, bucket: str, prefix: str = "models") -> str:
        base = f"as://{self.account}/{bucket}"
        return f"{base}/{prefix}" if prefix else base

    def put(self, bucket: str, key: str, data: bytes, *, part_size: int | None = None) -> None:
        if part_size:
            blocks = BlobServiceClient.from_connection_string(
                self.credentials["AZURE_STORAGE_CONNECTION_STRING"],
                max_single_put_size=part_size,
                max_block_size=part_size,
            )
            blocks.get_container_client(bucket).upload_blob(key, data, overwrite=True)
        else:
            self.service.get_container_client(bucket).upload_blob(key, data, overwrite=True)

    def delete(self, bucket: str, key: str) -> None:
        self.service.get_container_client(bucket).delete_blob(key)


class CountingStore:
    """A real store with its reads counted (instrumentation, not a stand-in)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.bucket = inner.bucket
        self.prefix = inner.prefix
        self.reads: list[tuple[str, int, int | None]] = []

    def list(self, prefix: str) -> Any:
        return self.inner.list(prefix)

    def head(self, key: str) -> ObjectInfo | None:
        return self.inner.head(key)

    def read_range(
        self, key: str, start: int, end: int | None, sink: Sink, *, etag: str = "", generation: str = ""
    ) -> int:
        self.reads.append((key, start, end))
        return self.inner.read_range(key, start, end, sink, etag=etag, generation=generation)

    def open_range(self, key: str, start: int, end: int, *, etag: str = "", generation: str = "") -> bytes:
        return self.inner.open_range(key, start, end, etag=etag, generation=generation)

    def get(self, key: str, dest: Any, *, etag: str = "", generation: str = "") -> int:
        return self.inner.get(key, dest, etag=etag, generation=generation)

    def part_size(self, key: str, etag: str) -> int | None:
        return self.inner.part_size(key, etag)

    def transfer_check(
        self, key: str, etag: str, generation: str, part_size: int | None, pinned: str
    ) -> TransferCheck | None:
        return self.inner.transfer_check(key, etag, generation, part_size, pinned)

    def trusted(self, objects: Sequence[ObjectInfo]) -> Sequence[ObjectInfo]:
        return self.inner.trusted(objects)

    def versioned(self) -> bool | None:
        return self.inner.versioned()

    def close(self) -> None:
        self.inner.close()
