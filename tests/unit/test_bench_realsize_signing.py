"""bench/real_pods/realsize.py runs the node cache as the chart does by default: signing its statements
with a key whose public half the operator hands the pods (their agents then check the BLAKE3 the cache
signed, not the pin); ``--unsigned`` runs it without one. Checked without a cluster: the cache's command
line and the operator's environment name one key, which both the cache and the operator accept."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

from testkit import REPO
from triton_operator.adapters.nodecache.statements import Signer
from triton_operator.settings import Settings


@pytest.fixture(scope="module")
def realsize() -> ModuleType:
    sys.path.insert(0, str(REPO))
    try:
        return importlib.import_module("bench.real_pods.realsize")
    finally:
        sys.path.remove(str(REPO))


def test_signed_by_default_with_one_key(realsize: ModuleType, tmp_path: Path) -> None:
    key = realsize.signing_key_for(realsize.parse([]), tmp_path)
    assert key is not None
    realsize.write_signing_key(key)
    command = realsize.cache_command(tmp_path / "root", "1Gi", "127.0.0.1", 8790, key)
    assert command[command.index("--signing-key") + 1] == str(key)
    settings = Settings.from_env(realsize.signing_env(key))
    # The operator hands the pods the public half of the key the cache signs with.
    assert settings.node_cache_public_key == Signer.from_file(key).public_key()
    assert key.stat().st_mode & 0o077 == 0


def test_unsigned_names_no_key(realsize: ModuleType, tmp_path: Path) -> None:
    key = realsize.signing_key_for(realsize.parse(["--unsigned"]), tmp_path)
    assert key is None
    command = realsize.cache_command(tmp_path / "root", "1Gi", "127.0.0.1", 8790, key)
    assert "--signing-key" not in command
    assert realsize.signing_env(key) == {}
    assert Settings.from_env(realsize.signing_env(key)).node_cache_public_key is None


def test_vouched_said_per_pod(realsize: ModuleType) -> None:
    case = realsize.Case("scale-up", vouched=[(4, 4), (4, 0)])
    assert realsize.vouched(case) == ", node cache hits checked by its signed digest: 4 of 4 + 0 of 4"
    assert realsize.vouched(realsize.Case("cold", vouched=[(0, 0)])) == ""


def test_with_shared_files_the_cache_serves_the_csi_driver_the_operator_gives_pods(
    realsize: ModuleType, tmp_path: Path
) -> None:
    """``--shared-files``: the cache's command names the real node's kubelet folder and the node, the
    operator of the second tree gives pods the volume; the CSIDriver is the chart's
    (tests/packaging/test_chart_node_cache.py renders it)."""
    node = {"name": "real-node-1", "containerd_socket": "/s/node/containerd.sock"}
    command = realsize.cache_command(
        tmp_path,
        "1Gi",
        "10.0.0.1",
        8790,
        None,
        shared_files=realsize.kubelet_root(node),
        node_name="real-node-1",
    )
    assert command[-4:] == ["--shared-files", "/s/node/kubelet", "--node-name", "real-node-1"]
    assert "--shared-files" not in realsize.cache_command(tmp_path, "1Gi", "10.0.0.1", 8790, None)
    assert Settings.from_env(realsize.SHARED_ENV).node_cache_shared_files
    assert realsize.parse(["--shared-files"]).shared_files and not realsize.parse([]).shared_files
    driver = realsize.csi_driver().to_dict()
    assert driver["metadata"]["name"] == "files.node-cache.triton-operator.io"
    assert driver["spec"] == {
        "attachRequired": False,
        "podInfoOnMount": True,
        "volumeLifecycleModes": ["Ephemeral"],
        "fsGroupPolicy": "None",
    }
