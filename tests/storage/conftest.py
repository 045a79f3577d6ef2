"""Session fixtures that start the real GCS (fake-gcs-server) and Azure (azurite) servers, and one
backend per store; the S3 server (seaweedfs) is tests/conftest.py's, shared with the cluster tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from storage_backends import AzureBackend, Backend, GCSBackend, S3Backend
from storage_servers import (
    S3_ACCESS_KEY,
    S3_SECRET_KEY,
    Server,
    azurite_missing,
    start_azurite,
    start_fake_gcs,
)


def _stop(server: Server) -> None:
    server.stop()
    assert not server.alive, f"{server.name} (pid {server.process.pid}) still runs after stop"


@pytest.fixture(scope="session")
def fake_gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_fake_gcs(tmp_path_factory.mktemp("fake-gcs") / "fake-gcs.log")
    yield server
    _stop(server)


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    why = azurite_missing()
    if why:
        pytest.skip(why)
    server = start_azurite(tmp_path_factory.mktemp("azurite") / "azurite.log")
    yield server
    _stop(server)


@pytest.fixture(scope="session")
def s3_backend(seaweedfs: Server) -> Backend:
    return S3Backend(
        "s3",
        seaweedfs.endpoint,
        {"AWS_ACCESS_KEY_ID": S3_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY},
    )


@pytest.fixture(scope="session")
def gcs_backend(fake_gcs: Server) -> Backend:
    return GCSBackend("gcs", fake_gcs.endpoint, {})


@pytest.fixture(scope="session")
def azure_backend(azurite: Server) -> Backend:
    return AzureBackend(
        "azure", azurite.endpoint, {"AZURE_STORAGE_CONNECTION_STRING": azurite.extra["connection_string"]}
    )


@pytest.fixture(params=["s3", "gcs", "azure"])
def backend(request: pytest.FixtureRequest) -> Backend:
    """Each store in turn; a test runs once per store."""
    result: Backend = request.getfixturevalue(f"{request.param}_backend")
    return result


@pytest.fixture
def bucket(backend: Backend) -> str:
    return backend.new_bucket()
