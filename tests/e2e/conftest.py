"""Fixtures of the tests whose pods run on the local cluster's real node: the node, and seaweedfs on
the pod bridge's gateway address (this machine), which the operator and the pods reach."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from real_pods import real_node


@pytest.fixture(scope="module")
def node(cluster: Path) -> dict[str, Any]:
    """The real node (its name and the pod bridge's gateway address); skips without one."""
    info, why = real_node()
    if info is None:
        pytest.skip(f"no real node: {why}")
    return info


@pytest.fixture(scope="module")
def store(node: dict[str, Any], seaweedfs_on: Callable[[str], Any]) -> Any:
    """seaweedfs on the pod bridge's gateway address: the operator and the pods reach it."""
    import storage_servers  # noqa: PLC0415

    try:
        server = seaweedfs_on(node["ip"])
    except storage_servers.ServerStartError as exc:
        pytest.skip(f"no S3 server on {node['ip']}: {exc}")
    server.extra["s3"] = storage_servers.s3_client(server.endpoint)
    return server
