"""The agent of a pod of a pool on real parts: seaweedfs as the store, a real tritonserver started with no
model, and the pod's assignment annotation written here as the kubelet projects it (a downwardAPI file):
the agent loads exactly the models it names, unloads the ones gone, and reports each at GET /v1/pool."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
from test_agent_inplace import (  # type: ignore[import-not-found,unused-ignore]
    TIMEOUT,
    Client,
    Pod,
    Sidecar,
    config,
    index,
    model_py,
    pod,
    sidecars,
)

from testkit import free_port
from triton_operator.adapters.agent.leaving import pod_name
from triton_operator.adapters.agent.runner import FILES_WAIT_SECONDS
from triton_operator.core.objects.names import inplace_manifest_key
from triton_operator.core.pool.assignment import PodAssignment, Wanted, build_assignment, parse_report
from tritonserver import TritonInstall, start_server

pytestmark = [pytest.mark.storage, pytest.mark.triton, pytest.mark.timeout(600)]

__all__ = ["pod", "sidecars"]  # the fixtures, used by name


def assign(path: Path, models: dict[str, Wanted]) -> None:
    """The annotation as the kubelet projects it: the whole file replaced at once."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(build_assignment(PodAssignment(models=models)))
    os.replace(tmp, path)


def pool_report(sidecar: Sidecar) -> dict[str, Any]:
    reply = requests.get(f"http://127.0.0.1:{sidecar.port}/v1/pool", timeout=TIMEOUT)
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


def wait_report(sidecar: Sidecar, done: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    deadline = time.monotonic() + TIMEOUT * 2
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        assert sidecar.process.poll() is None, sidecar.pod.sidecar_log.read_text()
        body = pool_report(sidecar)
        if done(body):
            return body
        time.sleep(0.1)
    raise AssertionError(f"waited for {what}; last report {body}\n{sidecar.pod.sidecar_log.read_text()}")


def test_the_agent_loads_the_assigned_model_then_swaps_it_for_another(
    pod: Pod, triton_install: TritonInstall, sidecars: list[Sidecar]
) -> None:
    """Assigned A: A fetched and loaded (B's bytes not fetched), reported READY, answers; assigned B
    instead: B loaded, A unloaded, its files deleted, gone from the report. Readiness: 503 until the
    assignment is read, then 200 once its models are settled (a later load does not take it out)."""
    pod.put("alpha/1/model.py", model_py(100))
    pod.put("beta/1/model.py", model_py(300))
    r1 = pod.revision("r1", {"alpha": config(pod.init_log), "beta": config(pod.init_log)})
    pod.set_base(r1)
    assignment = pod.root / "assignment"
    server = start_server(triton_install, pod.models, [], pod.root / "tritonserver.log")
    try:
        sidecar = Sidecar(pod, server.http_url, extra=("--pool-assignment", str(assignment)))
        sidecars.append(sidecar)
        code, body = sidecar.readiness()
        assert code == 503 and "assignment" in body["reason"], body
        # An empty report, and who answered (the pod's name; here, with no downward API, the host's).
        assert pool_report(sidecar) == {"models": {}, "pod": pod_name()}

        assign(assignment, {"alpha": Wanted("va", 1)})
        body = wait_report(sidecar, lambda b: b["models"].get("alpha", {}).get("state") == "READY", "alpha")
        assert isinstance(body["models"]["alpha"].pop("memory"), int)  # a CPU model: measured at its load
        assert parse_report(body) == parse_report(
            {"models": {"alpha": {"state": "READY", "version": "va", "attempt": 1, "error": ""}}}
        )
        assert sidecar.wait_ready(200, "the assignment read")["ready"] is True
        assert (pod.models / "alpha/1/model.py").read_bytes() == model_py(100)
        assert not (pod.models / "beta").exists()
        assert pod.inits() == ["alpha 1"]
        client = Client(server, model="alpha").start()
        client.wait_answers(3)
        client.stop()
        assert not client.failures and set(client.answers) == {101.0}, client.failures

        assign(assignment, {"beta": Wanted("vb", 1)})
        body = wait_report(sidecar, lambda b: set(b["models"]) == {"beta"}, "beta alone")
        body = wait_report(sidecar, lambda b: b["models"]["beta"]["state"] == "READY", "beta READY")
        assert isinstance(body["models"]["beta"].pop("memory"), int)
        assert body["models"]["beta"] == {"state": "READY", "version": "vb", "attempt": 1, "error": ""}
        states = index(server)
        assert states[("beta", "1")] == "READY" and states.get(("alpha", "1")) != "READY", states
        assert not (pod.models / "alpha").exists()  # /models holds what the pod holds
        client = Client(server, model="beta").start()
        client.wait_answers(3)
        client.stop()
        assert not client.failures and set(client.answers) == {301.0}, client.failures
        assert pod.inits() == ["alpha 1", "beta 1"]
        assert sidecar.is_ready()
    finally:
        server.stop()


HOLD_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

HOLD_MIB = {hold}


class TritonPythonModel:
    def initialize(self, args):
        self.held = b"\\x01" * (HOLD_MIB << 20)  # written bytes: resident, not lazily mapped zeros

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x.astype(np.float32))]))
        return out
"""
MiB = 1 << 20


def test_the_agent_measures_the_memory_a_cpu_model_takes_at_its_load(
    pod: Pod, triton_install: TritonInstall, sidecars: list[Sidecar]
) -> None:
    """Two Python models on the CPU, one holding nothing and one holding 200 MiB once initialized, loaded
    one after the other by the agent: each is reported with the memory its load took (tritonserver's
    growth across it plus its stub's RSS), the large one at least its 200 MiB, and 200 MiB more than
    the other within a tolerance (what the Python interpreter and tritonserver take varies)."""
    pod.put("a_small/1/model.py", HOLD_PY.format(hold=0).encode())
    pod.put("b_big/1/model.py", HOLD_PY.format(hold=200).encode())
    r1 = pod.revision("r1", {"a_small": config(pod.init_log), "b_big": config(pod.init_log)})
    pod.set_base(r1)
    assignment = pod.root / "assignment"
    server = start_server(triton_install, pod.models, [], pod.root / "tritonserver.log")
    try:
        sidecar = Sidecar(pod, server.http_url, extra=("--pool-assignment", str(assignment)))
        sidecars.append(sidecar)
        assign(assignment, {"a_small": Wanted("v1", 1), "b_big": Wanted("v1", 1)})
        body = wait_report(
            sidecar,
            lambda b: all(b["models"].get(m, {}).get("state") == "READY" for m in ("a_small", "b_big")),
            "both READY",
        )
        copies = parse_report(body)
        small, big = copies["a_small"].memory, copies["b_big"].memory
        assert small is not None and big is not None, body
        assert big >= 200 * MiB, (small, big)
        assert 170 * MiB <= big - small <= 240 * MiB, (small, big)
    finally:
        server.stop()


def test_a_failed_load_is_reported_and_tried_again_only_on_a_new_attempt(
    pod: Pod, triton_install: TritonInstall, sidecars: list[Sidecar]
) -> None:
    """Triton refuses the model: reported UNAVAILABLE with its reason for attempt 1, and not tried again
    by the agent itself; the operator's attempt 2 loads it once more (reported for attempt 2)."""
    pod.put("bad/1/model.py", model_py(200, fail=True))
    r1 = pod.revision("r1", {"bad": config(pod.init_log)})
    pod.set_base(r1)
    assignment = pod.root / "assignment"
    server = start_server(triton_install, pod.models, [], pod.root / "tritonserver.log")
    try:
        sidecar = Sidecar(pod, server.http_url, extra=("--pool-assignment", str(assignment)))
        sidecars.append(sidecar)
        assign(assignment, {"bad": Wanted("v1", 1)})
        body = wait_report(sidecar, lambda b: b["models"].get("bad", {}).get("error"), "the failure")
        bad = body["models"]["bad"]
        assert (bad["state"], bad["version"], bad["attempt"]) == ("UNAVAILABLE", "v1", 1), bad
        assert "refuses to load" in bad["error"], bad
        time.sleep(2)  # ten passes of the agent: none loads it again
        assert pod.inits() == ["bad 1"]
        assert sidecar.is_ready()  # tritonserver live, the assignment read, its one model settled (failed)

        assign(assignment, {"bad": Wanted("v1", 2)})
        body = wait_report(
            sidecar, lambda b: b["models"]["bad"]["attempt"] == 2 and b["models"]["bad"]["error"], "attempt 2"
        )
        assert (
            body["models"]["bad"]["state"] == "UNAVAILABLE"
            and "refuses to load" in body["models"]["bad"]["error"]
        )
        assert pod.inits() == ["bad 1", "bad 1"]
    finally:
        server.stop()


def test_an_entry_whose_revisions_files_do_not_come_is_said_then_loads_once_they_do(
    pod: Pod, triton_install: TritonInstall, sidecars: list[Sidecar]
) -> None:
    """alpha READY from the pod's own revision; the operator names it at version va2 of revision r3,
    which the in-place volume does not show (the ConfigMap dropped it): the agent keeps serving va, and
    after FILES_WAIT_SECONDS says once in its log, and in its report, what it waits for and where it
    looks; once the kubelet shows r3, alpha loads at va2 and waits for nothing."""
    pod.put("alpha/1/model.py", model_py(100))
    r1 = pod.revision("r1", {"alpha": config(pod.init_log)})
    pod.set_base(r1)
    pod.publish(r1, None)
    assignment = pod.root / "assignment"
    server = start_server(triton_install, pod.models, [], pod.root / "tritonserver.log")
    try:
        sidecar = Sidecar(pod, server.http_url, extra=("--pool-assignment", str(assignment)))
        sidecars.append(sidecar)
        assign(assignment, {"alpha": Wanted("va", 1)})
        wait_report(sidecar, lambda b: b["models"].get("alpha", {}).get("state") == "READY", "alpha")
        pod.put("alpha/1/model.py", model_py(200))
        r3 = pod.revision("r3", {"alpha": config(pod.init_log)})
        asked = time.monotonic()
        assign(assignment, {"alpha": Wanted("va2", 1, "r3")})
        body = wait_report(sidecar, lambda b: b["models"]["alpha"].get("waiting"), "the wait said")
        assert time.monotonic() - asked >= FILES_WAIT_SECONDS
        alpha = body["models"]["alpha"]
        assert (alpha["state"], alpha["version"]) == ("READY", "va"), alpha  # va still serves
        inplace = pod.root / "inplace" / inplace_manifest_key("r3")
        assert f"waits for revision r3's files, not in the in-place volume ({inplace}" in alpha["waiting"]
        time.sleep(1)  # five more passes: said once
        said = [line for line in pod.sidecar_log.read_text().splitlines() if "waits for revision r3" in line]
        assert len(said) == 1 and "WARNING pool: model alpha (version va2)" in said[0], said

        pod.publish(r1, r3)  # the kubelet shows r3
        body = wait_report(
            sidecar,
            lambda b: (b["models"]["alpha"]["state"], b["models"]["alpha"]["version"]) == ("READY", "va2"),
            "va2",
        )
        assert "waiting" not in body["models"]["alpha"], body
        client = Client(server, model="alpha").start()
        client.wait_answers(3)
        client.stop()
        assert not client.failures and set(client.answers) == {201.0}, client.failures
    finally:
        server.stop()


def test_the_leave_hooks_lines_land_in_the_agents_own_log(
    pod: Pod, triton_install: TritonInstall, sidecars: list[Sidecar]
) -> None:
    """The pool agent writes its pid to its state folder; `triton-operator leave`, run beside it as the
    kubelet runs the preStop, appends its lines to that process's stdout (its log here, the container's
    log in a pod): which models it asked about, who answered, how it ended."""
    pod.put("alpha/1/model.py", model_py(100))
    pod.set_base(pod.revision("r1", {"alpha": config(pod.init_log)}))
    assignment = pod.root / "assignment"
    server = start_server(triton_install, pod.models, [], pod.root / "tritonserver.log")
    try:
        sidecar = Sidecar(pod, server.http_url, extra=("--pool-assignment", str(assignment)))
        sidecars.append(sidecar)
        assign(assignment, {"alpha": Wanted("va", 1)})
        wait_report(sidecar, lambda b: b["models"].get("alpha", {}).get("state") == "READY", "alpha")
        assert (pod.state / "agent.pid").read_text().strip() == str(sidecar.process.pid)
        # alpha's "Service" is a loopback port where nothing listens (refused): nobody, so it is done.
        leaving = PodAssignment({"alpha": Wanted("va", 1)}, services={"alpha": "127.0.0.1"})
        (pod.root / "leaving").write_text(build_assignment(leaving))
        command = [sys.executable, "-m", "triton_operator.cli", "leave", "--after", "0", "--seconds", "5"]
        command += ["--agent", f"http://127.0.0.1:{sidecar.port}", "--assignment", str(pod.root / "leaving")]
        command += ["--done", str(pod.root / "done"), "--pid-file", str(pod.state / "agent.pid")]
        command += ["--port", str(free_port())]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=pod.env(), check=False)
        assert done.returncode == 0 and "leave" not in done.stderr, done.stderr
        log = pod.sidecar_log.read_text()
        assert "leave INFO leave: pod " in log and "alpha by nobody" in log, log
        assert "no model is served by this pod alone" in log, log
        assert (pod.root / "done").read_text() == "done\n"
    finally:
        server.stop()
