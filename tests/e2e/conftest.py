"""Fixtures of the cluster tests beyond tests/conftest.py's: a real S3 store for the operator."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real S3 server (seaweedfs) on loopback, reachable by the operator process (not by pods)."""
    storage_dir = str(Path(__file__).resolve().parents[1] / "storage")
    if storage_dir not in sys.path:
        sys.path.insert(0, storage_dir)
    import storage_servers  # noqa: PLC0415

    base = tmp_path_factory.mktemp("seaweedfs")
    try:
        server = storage_servers.start_seaweedfs(base / "data", base / "weed.log")
    except storage_servers.ServerStartError as exc:
        pytest.skip(f"no S3 server: {exc}")
    server.extra["access"] = storage_servers.S3_ACCESS_KEY
    server.extra["secret"] = storage_servers.S3_SECRET_KEY
    yield server
    server.stop()
