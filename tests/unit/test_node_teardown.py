"""The real node's teardown (e2e/node.py) when kubelet removes pods while it runs, with tmp folders
standing in for the host's cgroup hierarchy, CNI cache and shim sockets (no host is touched).

What is already gone counts as removed, every step runs whatever failed before it, and the real
failures come out together at the end.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import node  # e2e/node.py (e2e/ is on pytest's pythonpath)

PODS = ("pod-a", "pod-b", "pod-c")


def _cgroup_tree(mount: Path) -> Path:
    """<mount>/triton-e2e/kubepods/<pod>/<container> folders, as kubelet makes them."""
    kubepods = mount / node.CGROUP_ROOT / "kubepods"
    for pod in PODS:
        for ctr in ("pause", "app"):
            (kubepods / pod / ctr).mkdir(parents=True)
    return kubepods


@pytest.fixture
def vanishing(monkeypatch: pytest.MonkeyPatch) -> Iterator[set[str]]:
    """Folders (by name) that 'kubelet' removes just before anyone lists them, once each."""
    names: set[str] = set()
    real_scandir: Callable[..., Any] = os.scandir

    def scandir(path: Any = ".") -> Any:
        p = Path(os.fsdecode(path)) if isinstance(path, (str, bytes, os.PathLike)) else None
        if p is not None and p.name in names:
            names.discard(p.name)
            shutil.rmtree(p)  # gone between its parent's listing and this one
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    yield names


def test_listing_cgroups_while_kubelet_removes_a_pod(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, vanishing: set[str]
) -> None:
    kubepods = _cgroup_tree(tmp_path)
    monkeypatch.setattr(node, "_cgroup_mounts", lambda: [tmp_path])
    vanishing.add("pod-b")
    dirs = node._our_cgroups()
    assert dirs == sorted(dirs, key=lambda d: -len(d.parts))  # deepest first
    assert set(dirs) == {
        tmp_path / node.CGROUP_ROOT,
        kubepods,
        *(kubepods / pod for pod in ("pod-a", "pod-c")),
        *(kubepods / pod / ctr for pod in ("pod-a", "pod-c") for ctr in ("pause", "app")),
    }


def test_removing_cgroups_that_vanish_between_listing_and_rmdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubepods = _cgroup_tree(tmp_path)
    monkeypatch.setattr(node, "_cgroup_mounts", lambda: [tmp_path])
    listed = node._our_cgroups

    def listed_then_pod_removed() -> list[Path]:
        dirs = listed()
        if (kubepods / "pod-a").exists():
            shutil.rmtree(kubepods / "pod-a")  # kubelet, after the listing
        return dirs

    monkeypatch.setattr(node, "_our_cgroups", listed_then_pod_removed)
    r = node.Removal()
    node._remove_cgroups(r)
    assert r.errors == []
    assert not (tmp_path / node.CGROUP_ROOT).exists()


def test_removal_counts_gone_as_done_and_keeps_real_failures() -> None:
    r = node.Removal()

    def raising(err: OSError) -> None:
        raise err

    assert r.call("kill", raising, ProcessLookupError(errno.ESRCH, "No such process"), default=None) is None
    r.call("rmdir x", raising, FileNotFoundError(errno.ENOENT, "No such file or directory"), default=None)
    r.call("rmdir y", raising, OSError(errno.EBUSY, "Device or resource busy"), default=None)
    assert r.sh(["sh", "-c", "echo 'iptables: No chain/target/match by that name.' >&2; exit 1"])
    assert r.sh(["sh", "-c", "echo 'umount: /x: not mounted.' >&2; exit 32"])
    assert r.sh(["sh", "-c", "echo 'Cannot find device \"triton0\"' >&2; exit 1"])
    assert not r.sh(["sh", "-c", "echo 'iptables: Resource temporarily unavailable.' >&2; exit 4"])
    assert len(r.errors) == 2
    assert "rmdir y" in r.errors[0] and "busy" in r.errors[0]
    assert "Resource temporarily unavailable" in r.errors[1]
    with pytest.raises(node.TeardownError, match="2 failed"):
        r.check()


@pytest.fixture
def fake_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """node's view of the host redirected into tmp_path; no command that changes the host runs."""
    host = tmp_path / "host"
    for name, rel in (
        ("RECORD", "run/triton-e2e/real-node.json"),
        ("VAR_LOG_CONTAINERS", "var/log/containers"),
        ("CNI_CACHE", "var/lib/cni/results"),
        ("SHIM_SOCKETS", "run/containerd/s"),
        ("DEVICE_PLUGIN_SOCKET", "var/lib/kubelet/device-plugins/kubelet.sock"),
    ):
        monkeypatch.setattr(node, name, host / rel)
    (host / "cgroup").mkdir(parents=True)
    monkeypatch.setattr(node, "_cgroup_mounts", lambda: [host / "cgroup"])
    monkeypatch.setattr(node, "_iptables_families", list)
    monkeypatch.setattr(node, "_processes", list)
    monkeypatch.setattr(node, "_mounts", list)
    monkeypatch.setattr(node, "_link_exists", lambda name: False)
    monkeypatch.setattr(node, "_bridge_ports", list, raising=False)  # (not on older node.py)
    monkeypatch.setattr(node, "_listening_unix_sockets", set)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(sys, "platform", "linux")
    return host


def test_teardown_runs_every_step_and_reports_what_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_host: Path, vanishing: set[str]
) -> None:
    sd, cache = tmp_path / "cluster", tmp_path / "cache"
    (sd / "node" / "pids").mkdir(parents=True)
    exited = subprocess.Popen(["true"])
    exited.wait()  # a pod process that is gone by the time it is signalled
    (sd / "node" / "pids" / "kubelet.pid").write_text(f"{exited.pid}\n")
    _cgroup_tree(fake_host / "cgroup")
    vanishing.add("pod-c")  # kubelet removes a pod while teardown lists them
    node.CNI_CACHE.mkdir(parents=True)
    (node.CNI_CACHE / f"{node.CNI_NETWORK}-abc-eth0").write_text("{}")
    node.SHIM_SOCKETS.mkdir(parents=True)
    (node.SHIM_SOCKETS / "0123abcd").write_text("")  # a dead shim's socket (nothing listens)

    def broken_sweep(*args: Any) -> None:
        raise RuntimeError("iptables is broken")

    monkeypatch.setattr(node, "_sweep_iptables", broken_sweep)
    with pytest.raises(RuntimeError, match="iptables is broken") as failed:
        node.teardown(sd, cache, quiet=True)
    # the steps after the failed one ran, and only the real failure is reported
    assert not (fake_host / "cgroup" / node.CGROUP_ROOT).exists()
    assert list(node.CNI_CACHE.iterdir()) == []
    assert list(node.SHIM_SOCKETS.iterdir()) == []
    assert not (sd / "node").exists()
    assert isinstance(failed.value, node.TeardownError)
    assert len(failed.value.errors) == 1
    # run again, with nothing left to remove and nothing broken: done, nothing left
    monkeypatch.setattr(node, "_sweep_iptables", lambda *args: None)
    node.teardown(sd, cache, quiet=True)
    assert node.leftovers(sd, cache) == []


def test_the_services_guard_is_the_nodes_to_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    """add_services_guard's chain and its jumps from OUTPUT and FORWARD are the node's: teardown
    deletes the jumps and the chain (with the API server's guard kept or not), and leftovers lists them."""
    saved = [
        "-P OUTPUT ACCEPT",
        "-N KUBE-SERVICES",
        f"-N {node.SERVICES_CHAIN}",
        "-N SOMEONE-ELSE",
        "-A OUTPUT -m conntrack --ctstate NEW -j KUBE-SERVICES",
        f"-A OUTPUT -j {node.SERVICES_CHAIN}",
        f"-A FORWARD -j {node.SERVICES_CHAIN}",
        "-A FORWARD -j SOMEONE-ELSE",
        f"-A {node.SERVICES_CHAIN} -d 10.96.0.0/16 -m conntrack --ctstate NEW -j DROP",
    ]
    monkeypatch.setattr(node, "_iptables_rules", lambda fam, table: saved if table == "filter" else [])
    for keep_guard in (False, True):
        drop, chains = node._our_iptables("iptables", "filter", keep_guard)
        assert chains == ["KUBE-SERVICES", node.SERVICES_CHAIN]
        assert ["OUTPUT", "-j", node.SERVICES_CHAIN] in drop
        assert ["FORWARD", "-j", node.SERVICES_CHAIN] in drop
        assert ["FORWARD", "-j", "SOMEONE-ELSE"] not in drop
