"""bench/real_pods/cpu_accounting.py (no cluster needed here): /proc and cgroup texts parsed, a kubelet
cgroup tree read, and two samples turned into a case's row of CPU seconds by who spent them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from testkit import bench_module

UID_NEW = "0b5f0a52-3c7e-4d0e-9a43-0d6f2f5b1a01"
UID_OLD = "7d1c2b9e-8a4f-4a3b-b7c1-5e9d0f2a3b02"
SERVER_ID = "a" * 64
AGENT_ID = "b" * 64
SANDBOX_ID = "c" * 64


@pytest.fixture(scope="module")
def acc() -> Iterator[ModuleType]:
    with bench_module("bench/real_pods/cpu_accounting.py", "bench_cpu_accounting") as module:
        yield module


def test_busy_seconds_leave_out_idle_and_iowait(acc: ModuleType) -> None:
    text = (
        "cpu  1000 50 300 9000 400 20 30 5 0 0\n"
        "cpu0 500 25 150 4500 200 10 15 2 0 0\n"
        "cpu1 500 25 150 4500 200 10 15 3 0 0\n"
        "intr 12345\nctxt 678\n"
    )
    busy, cores = acc.busy_seconds(text, 100)
    assert busy == pytest.approx((1000 + 50 + 300 + 20 + 30 + 5) / 100)
    assert cores == 2


def test_process_stat_reads_session_and_cpu_past_a_command_with_parentheses(acc: ModuleType) -> None:
    fields = ["S", "1", "4242", "4242", "0", "-1", "0", "1", "2", "3", "4", "700", "300", "40", "60"]
    # the reaped children's cutime/cstime (40, 60) left out: a shim's reaped containers are not its own
    text = f"4250 (weed (mini) x) {' '.join(fields)} 20 0 1 0 5123 99\n"
    assert acc.process_stat(text, 100) == (4242, pytest.approx(10.0), 5123)
    assert acc.process_stat("garbage", 100) is None
    stats = [(4242, 11.0), (4242, 2.5), (17, 99.0)]
    assert acc.session_seconds(stats, [4242]) == pytest.approx(13.5)


def test_the_rest_of_the_machine_by_command(acc: ModuleType) -> None:
    assert acc.command(b"/usr/bin/python3\0-m\0pytest\0tests/x.py\0") == "python3 -m pytest tests/x.py"
    assert acc.command(b"") == "[kernel threads]"
    assert len(acc.command(b"x" * 100)) == 60
    before = {(10, 1): ("a", 5.0), (11, 1): ("b", 1.0), (12, 1): ("gone", 3.0)}
    after = {(10, 1): ("a", 6.0), (11, 1): ("b", 4.0), (13, 9): ("a", 2.5), (14, 9): ("idle", 0.01)}
    assert acc.largest(before, after) == [("a", pytest.approx(3.5)), ("b", pytest.approx(3.0))]


def test_kubelet_folder_names(acc: ModuleType) -> None:
    assert acc.pod_uid(f"pod{UID_NEW}") == UID_NEW
    assert acc.pod_uid(f"kubepods-burstable-pod{UID_NEW.replace('-', '_')}.slice") == UID_NEW
    assert acc.pod_uid("burstable") is None
    assert acc.pod_uid("podman-thing") is None
    assert acc.container_id(SERVER_ID) == SERVER_ID
    assert acc.container_id(f"cri-containerd-{SERVER_ID}.scope") == SERVER_ID
    assert acc.usage_seconds("1500000000\n", v1=True) == pytest.approx(1.5)
    assert acc.usage_seconds("usage_usec 2500000\nuser_usec 1\n", v1=False) == pytest.approx(2.5)


def test_read_pods_walks_a_cgroupfs_kubepods_tree(acc: ModuleType, tmp_path: Path) -> None:
    kubepods = tmp_path / "triton-e2e" / "kubepods"
    pod = kubepods / "burstable" / f"pod{UID_NEW}"
    for folder, ns in (
        (kubepods, 9_000_000_000),
        (kubepods / "burstable", 8_000_000_000),
        (pod, 7_000_000_000),
        (pod / SERVER_ID, 5_000_000_000),
        (pod / AGENT_ID, 1_000_000_000),
    ):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "cpuacct.usage").write_text(f"{ns}\n")
    assert acc.find_kubepods([(tmp_path, True)]) == (kubepods, True)
    assert acc.read_pods(kubepods, True) == {UID_NEW: {"": 7.0, SERVER_ID: 5.0, AGENT_ID: 1.0}}


def sample(acc: ModuleType, busy: float, pods: dict[str, dict[str, float]], all_pods: float) -> object:
    parts = {"node cache": 1.0, "store": 2.0, "operator": 3.0, "cluster": 4.0, "bench": 0.5}
    return acc.Sample(busy, 2, pods, all_pods, parts)


def test_account_splits_a_case_by_who_spent_it(acc: ModuleType) -> None:
    before = sample(acc, 100.0, {UID_OLD: {"": 10.0}}, 10.0)
    new_pod = {"": 9.0, SERVER_ID: 6.0, AGENT_ID: 2.0, SANDBOX_ID: 0.5}
    after = acc.Sample(
        140.0,
        2,
        {UID_NEW: new_pod},  # the old pod deleted during the case: its cgroup gone
        22.0,
        {"node cache": 4.0, "store": 5.0, "operator": 3.5, "cluster": 6.0, "bench": 1.0},
    )
    pods = [("new-1", UID_NEW, {SERVER_ID: "tritonserver", AGENT_ID: "agent"})]
    row = acc.account("new revision", 15.0, before, after, pods)
    assert row.columns["tritonserver"] == pytest.approx(6.0)
    assert row.columns["agent"] == pytest.approx(2.0)
    assert row.columns["rest of the pods"] == pytest.approx(1.0)  # the sandbox and the rest of the pod
    assert row.columns["other pods"] == pytest.approx(12.0 - 9.0)  # the deleted pod's last seconds
    assert row.columns["node cache"] == pytest.approx(3.0)
    assert row.columns["store"] == pytest.approx(3.0)
    assert row.columns["operator"] == pytest.approx(0.5)
    assert row.columns["cluster"] == pytest.approx(2.0)
    assert row.columns["bench"] == pytest.approx(0.5)
    spent = 6 + 2 + 1 + 3 + 3 + 3 + 0.5 + 2 + 0.5
    assert row.columns["rest of the machine"] == pytest.approx(40.0 - spent)
    assert row.busy == pytest.approx(40.0)
    assert row.floor == pytest.approx(20.0)
    assert row.own == pytest.approx(spent - 0.5)
    assert row.per_pod == [("new-1", pytest.approx(6.0), pytest.approx(2.0))]
    lines = acc.table([row])
    assert lines[0].count("|") == lines[2].count("|")
    assert "| 20.0 |" in lines[2] and "**15.0**" in lines[2]


def test_account_says_dash_where_a_counter_is_missing(acc: ModuleType) -> None:
    before = acc.Sample(100.0, 2, {}, 10.0, {"node cache": 1.0, "bench": 0.0})
    after = acc.Sample(110.0, 2, {}, 12.0, {"node cache": None, "bench": 0.2})
    row = acc.account("case", 5.0, before, after, [("gone", UID_NEW, {})])
    assert row.columns["tritonserver"] is None  # its pod's cgroup not found
    assert row.columns["node cache"] is None
    assert row.columns["rest of the machine"] is None  # not a remainder of unknowns
    assert row.floor == pytest.approx(5.0)
    assert row.own is None
    assert "| - |" in acc.table([row])[2]
