"""The local cluster always comes down clean: `e2e/cluster.py down` while kubelet is still starting
and removing pods, and `make run` (e2e/run.py) stopped by SIGTERM or SIGHUP, leave nothing behind
(`e2e/cluster.py leftovers` lists nothing).

These bring the local cluster (with its real node) up and down themselves, so they run only where
they own it: no $KUBECONFIG and the local cluster not already up (so `make test`'s cluster is never
touched); else they skip, saying why. ``TRITON_E2E_DOWN_RACE_ROUNDS`` (default 1) repeats the
up -> pod churn -> down -> leftovers round (the stress test).

  TRITON_E2E_DOWN_RACE_ROUNDS=20 PYTHONPATH=$PWD/operator/src .venv/bin/pytest tests/e2e/test_teardown.py -q
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import cluster  # e2e/cluster.py
import node  # e2e/node.py
from testkit import wait_for

pytestmark = pytest.mark.cluster

REPLICAS = 6
ROOT = Path(__file__).resolve().parents[2]
ROUNDS = int(os.environ.get("TRITON_E2E_DOWN_RACE_ROUNDS", "1"))


def _kubectl(*args: str, stdin: str | None = None, check: bool = True) -> str:
    cmd = [str(cluster.bin_dir() / "kubectl"), f"--kubeconfig={cluster.kubeconfig_path()}", *args]
    proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=60, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr}")
    return proc.stdout


def _pause_deployment(name: str, replicas: int) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    **node.placement(),
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "pause", "image": node.PAUSE_IMAGE, "imagePullPolicy": "Never"}],
                },
            },
        },
    }


def _running(name: str) -> int:
    pods = json.loads(_kubectl("get", "pods", "-n", "default", "-l", f"app={name}", "-o", "json"))
    return sum(1 for p in pods["items"] if (p.get("status") or {}).get("phase") == "Running")


class Churn:
    """Scales a Deployment between 0 and REPLICAS in a loop (pods created and deleted) until stopped."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            for n in (0, REPLICAS):
                # the API server goes away during down: failures end the churn, they are expected
                _kubectl("scale", f"deployment/{self.name}", f"--replicas={n}", "-n", "default", check=False)
                self.stop.wait(random.uniform(0.1, 0.6))


@pytest.fixture
def own_cluster() -> Iterator[None]:
    """This test owns the local cluster: it may bring it up and down; down and clean afterwards."""
    if os.environ.get("KUBECONFIG"):
        pytest.skip("$KUBECONFIG is set: this test brings the local cluster up and down itself")
    if cluster.is_up():
        pytest.skip("the local cluster is already up (someone else's): this test brings it up and down")
    try:
        yield
    finally:
        cluster.down(quiet=True)


def _up() -> None:
    """cluster.up(), tried a second time after a failed start (what this module tests is down; an up
    that lost a free port to another process on this machine is not its subject, and is reported)."""
    try:
        cluster.up()
    except (RuntimeError, TimeoutError) as e:
        sys.stderr.write(f"cluster.up() failed, trying once more: {e}\n"[:2000])
        cluster.down(quiet=True)
        cluster.up()


@pytest.mark.parametrize("round_no", range(ROUNDS))
def test_down_while_pods_churn_leaves_nothing(own_cluster: None, round_no: int) -> None:
    _up()
    real, why = cluster.real_node()
    if real is None:
        pytest.skip(f"no real node: {why}")
    name = f"churn-{round_no}"
    _kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(_pause_deployment(name, REPLICAS)))
    wait_for(lambda: _running(name) == REPLICAS, timeout=120, what=f"{REPLICAS} pause pods Running")
    churn = Churn(name)
    churn.thread.start()
    # some pods are being deleted, others created, when down starts
    _kubectl("delete", "pod", "-n", "default", "-l", f"app={name}", "--wait=false")
    time.sleep(random.uniform(0.0, 1.5))
    try:
        cluster.down()
    finally:
        churn.stop.set()
        churn.thread.join(timeout=90)
    assert cluster.leftovers() == []
    # a second down finds nothing to do and does not fail
    cluster.down()
    assert cluster.leftovers() == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_make_run_stopped_by_a_signal_brings_the_cluster_down(own_cluster: None, sig: signal.Signals) -> None:
    """`make run` (e2e/run.py) serving, then SIGTERM or SIGHUP to it alone (as `timeout`, a closed
    terminal or a CI cancel send it): it stops everything it started, the cluster included."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "e2e" / "run.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert proc.stdout is not None
    seen: list[str] = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if "the operator keeps running" in line:
                break
        else:
            pytest.fail(f"e2e/run.py exited ({proc.wait()}) before serving:\n{''.join(seen[-40:])}")
        proc.send_signal(sig)
        rest, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # stopping a serving `make run` is its normal end, as Ctrl-C is: exit status 0
    assert proc.returncode == 0, "".join(seen[-20:]) + rest
    assert "stopping the local cluster" in rest
    assert not cluster.is_up()
    assert cluster.leftovers() == []
