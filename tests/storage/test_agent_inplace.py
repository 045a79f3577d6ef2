"""`triton-operator agent` on real parts: seaweedfs (S3) as the store, a real tritonserver (explicit model
control, --load-model=*) over the /models that `agent --once` synced, a client counting answers, and the
sidecar following the revision the pod is told to serve (the in-place volume: the ConfigMap's keys and
the target annotation in one projected volume, written here as the operator and the kubelet would
write them). The client follows the agent's readiness (GET /v1/ready) as a Service's endpoints do: the
agent takes the pod out before it unloads or loads a model."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from counting_proxy import counting_proxy
from storage_backends import Backend
from testkit import free_port
from triton_operator.adapters.agent.processes import python_stubs
from triton_operator.adapters.storage import pin_repository
from triton_operator.core.objects.names import (
    AGENT_READY_PATH,
    AGENT_STATUS_PATH,
    inplace_config_key,
    inplace_manifest_key,
)
from triton_operator.core.pod.agent_plan import ensemble_steps
from triton_operator.core.pod.startup import parse_summary
from triton_operator.core.repository.manifest import Manifest, manifest_to_json
from triton_operator.core.spec.modelconfig import build_config_pbtxt
from triton_operator.core.vocabulary.triton_state import load_failures
from triton_operator.models import ModelSpec
from tritonserver import RunningServer, TritonInstall, server_command, start_server

pytestmark = [pytest.mark.storage, pytest.mark.triton, pytest.mark.timeout(600)]

TIMEOUT = 60.0  # seconds a request or a wait may take before the test gives up (no assertion on speed)
DRAIN_SECONDS = 1.0  # the pod out of its Service before a model is touched (the client asks each time)
STATE_FILE = ".triton-sync.json"  # sync's own bookkeeping in /models (inode numbers, mtimes)

# OUTPUT0 = INPUT0 + BASE (this file's constant, one per version) + the config's "offset" parameter.
# initialize() appends "<model> <version>" to the config's "init_log" (how the test sees a load),
# then sleeps, so that requests are in flight while a load runs. FAIL makes initialize raise.
MODEL_PY = """
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

BASE = {base}
FAIL = {fail}


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        with open(params["init_log"]["string_value"], "a") as log:
            log.write(args["model_name"] + " " + args["model_version"] + chr(10))
        if FAIL:
            raise RuntimeError("version " + args["model_version"] + " refuses to load")
        self.add = np.float32(BASE + float(params["offset"]["string_value"]))
        time.sleep(1)

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", (x + self.add).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""


def model_py(base: int, *, fail: bool = False, pad: int = 0) -> bytes:
    """The model file; ``pad`` bytes of comment make it bigger (so bytes fetched tell files apart)."""
    return (MODEL_PY.format(base=base, fail=fail) + "#" * pad + "\n").encode()


def config(init_log: Path, offset: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "backend": "python",
        "maxBatchSize": 8,
        "input": [{"name": "INPUT0", "dataType": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "OUTPUT0", "dataType": "TYPE_FP32", "dims": [1]}],
        "instanceGroup": [{"kind": "KIND_CPU", "count": 1}],
        "parameters": {"offset": {"stringValue": str(offset)}, "init_log": {"stringValue": str(init_log)}},
        **extra,
    }


@dataclass(frozen=True)
class Revision:
    name: str
    manifest: Manifest
    configs: dict[str, str]


def tree(root: Path) -> dict[str, bytes | None]:
    """Every file (bytes) and folder (None) under ``root``, but sync's state file and the __pycache__
    folders that the Python backend writes next to a model.py it loads (its stub's Python ignores
    PYTHONDONTWRITEBYTECODE; a pod's fresh /models has them as soon as tritonserver loads)."""
    out: dict[str, bytes | None] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel == STATE_FILE or "__pycache__/" in rel or (rel.endswith("/__pycache__") and path.is_dir()):
            continue
        out[rel] = None if path.is_dir() else path.read_bytes()
    return out


@dataclass
class Pod:
    """One pod's files: its config volume (base revision), the in-place ConfigMap's folder, the
    downwardAPI target file, the agent's state folder, /models; and the store its models come from."""

    root: Path
    backend: Backend
    bucket: str
    init_log: Path
    sidecar_log: Path = field(init=False)

    def __post_init__(self) -> None:
        for folder in ("base/configs", "inplace", "state", "models"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        self.sidecar_log = self.root / "agent.log"
        self._keys: dict[str, str] = {}
        self._target = ""

    @property
    def models(self) -> Path:
        return self.root / "models"

    @property
    def state(self) -> Path:
        return self.root / "state"

    def put(self, key: str, data: bytes) -> None:
        self.backend.put(self.bucket, f"repo/{key}", data)

    def delete(self, key: str) -> None:
        self.backend.delete(self.bucket, f"repo/{key}")

    def revision(self, name: str, configs: dict[str, dict[str, Any]]) -> Revision:
        """Pin the bucket as it is now for ``configs`` and render them, as the operator does."""
        specs = [ModelSpec(name=n, config=c) for n, c in configs.items()]
        manifest = pin_repository(
            self.backend.repository(self.bucket, "repo"), specs, self.backend.credentials
        )
        return Revision(name, manifest, {n: build_config_pbtxt(n, c) for n, c in configs.items()})

    def set_base(self, rev: Revision) -> None:
        """The pod's config volume, as the revision's own ConfigMap mounts it."""
        (self.root / "base/manifest.json").write_text(manifest_to_json(rev.manifest))
        for model, text in rev.configs.items():
            (self.root / "base/configs" / model).mkdir(parents=True, exist_ok=True)
            (self.root / "base/configs" / model / "config.pbtxt").write_text(text)
        self.base = rev.name

    def publish(self, stable: Revision, nxt: Revision | None) -> None:
        """The in-place ConfigMap's keys: state.json and every key of the revisions named."""
        keys = {"state.json": json.dumps({"stable": stable.name, "next": nxt.name if nxt else None})}
        for rev in (stable, nxt):
            if rev is None:
                continue
            keys[inplace_manifest_key(rev.name)] = manifest_to_json(rev.manifest)
            for model, text in rev.configs.items():
                keys[inplace_config_key(rev.name, model)] = text
        self._keys = keys
        self._payload()

    def target(self, revision: str | None) -> None:
        """The pod's annotation."""
        self._target = revision or ""
        self._payload()

    def _payload(self) -> None:
        """The in-place volume as the kubelet shows it: the ConfigMap's keys and the target annotation
        (one projected volume), swapped in at once (a new ..data folder and one rename of the link, as
        the kubelet's atomic writer does; the old folder deleted)."""
        inplace = self.root / "inplace"
        data = inplace / f"..{time.monotonic_ns()}"
        data.mkdir()
        keys = {**self._keys, "target": self._target}
        for key, text in keys.items():
            (data / key).write_text(text)
        old = os.readlink(inplace / "..data") if (inplace / "..data").is_symlink() else None
        link = inplace / "..data.tmp"
        os.symlink(data.name, link)
        os.replace(link, inplace / "..data")
        for key in keys:
            if not (inplace / key).is_symlink():
                os.symlink(f"..data/{key}", inplace / key)
        if old is not None:
            shutil.rmtree(inplace / old)
        for stale in inplace.iterdir():
            if stale.is_symlink() and not (stale.exists()):
                stale.unlink()  # a key no revision holds any more

    def args(self, triton: str = "http://127.0.0.1:1", listen: str = "127.0.0.1:0") -> list[str]:
        return [
            sys.executable,
            "-m",
            "triton_operator.cli",
            "agent",
            "--manifest",
            str(self.root / "base/manifest.json"),
            "--configs",
            str(self.root / "base/configs"),
            "--base-revision",
            self.base,
            "--dest",
            str(self.models),
            "--inplace-dir",
            str(self.root / "inplace"),
            "--target-file",
            str(self.root / "inplace/target"),
            "--state-dir",
            str(self.state),
            "--triton",
            triton,
            "--listen",
            listen,
            "--interval",
            "0.2",
        ]

    def env(self) -> dict[str, str]:
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "GOOGLE_"))}
        return {**clean, **self.backend.credentials}

    def once(self, *extra: str) -> subprocess.CompletedProcess[str]:
        """`triton-operator agent --once`, the pod's init container."""
        return subprocess.run(
            [*self.args(), "--once", *extra],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=TIMEOUT * 2,
            check=False,
        )

    def fresh_sync(self, rev: Revision) -> Path:
        """What `triton-operator sync` of ``rev`` writes into an empty folder (a fresh pod's /models)."""
        work = self.root / f"fresh-{rev.name}-{time.monotonic_ns()}"
        (work / "configs").mkdir(parents=True)
        (work / "manifest.json").write_text(manifest_to_json(rev.manifest))
        for model, text in rev.configs.items():
            (work / "configs" / model).mkdir()
            (work / "configs" / model / "config.pbtxt").write_text(text)
        args = [
            sys.executable,
            "-m",
            "triton_operator.cli",
            "sync",
            "--manifest",
            str(work / "manifest.json"),
        ]
        args += ["--configs", str(work / "configs"), "--dest", str(work / "models")]
        result = subprocess.run(
            args, env=self.env(), capture_output=True, text=True, timeout=TIMEOUT, check=False
        )
        assert result.returncode == 0, result.stderr
        return work / "models"

    def inits(self) -> list[str]:
        return self.init_log.read_text().splitlines()


class Sidecar:
    """`triton-operator agent` (no --once) as the pod's model-agent container."""

    def __init__(
        self, pod: Pod, triton: str, drain: float = DRAIN_SECONDS, extra: tuple[str, ...] = ()
    ) -> None:
        self.pod = pod
        self.port = free_port()
        with pod.sidecar_log.open("ab") as log:
            self.process = subprocess.Popen(
                [*pod.args(triton, f"127.0.0.1:{self.port}"), "--drain-seconds", str(drain), *extra],
                env=pod.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.wait(lambda s: True, "the status server to answer")

    def status(self) -> dict[str, Any] | None:
        try:
            reply = requests.get(f"http://127.0.0.1:{self.port}{AGENT_STATUS_PATH}", timeout=5)
        except requests.RequestException:
            return None
        assert reply.status_code == 200, reply.text
        body: dict[str, Any] = reply.json()
        return body

    def readiness(self) -> tuple[int, dict[str, Any]]:
        """GET /v1/ready: the code (200 or 503) and the body; (0, {}) when the agent does not answer."""
        try:
            reply = requests.get(f"http://127.0.0.1:{self.port}{AGENT_READY_PATH}", timeout=5)
        except requests.RequestException:
            return 0, {}
        body: dict[str, Any] = reply.json()
        return reply.status_code, body

    def is_ready(self) -> bool:
        return self.readiness()[0] == 200

    def wait_ready(self, code: int, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + TIMEOUT
        seen: tuple[int, dict[str, Any]] = (0, {})
        while time.monotonic() < deadline:
            seen = self.readiness()
            if seen[0] == code:
                return seen[1]
            time.sleep(0.1)
        raise AssertionError(f"waited for {what}; last readiness {seen}\n{self.pod.sidecar_log.read_text()}")

    def wait(self, done: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        deadline = time.monotonic() + TIMEOUT * 2
        status = None
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"the agent exited: {self.pod.sidecar_log.read_text()}"
            status = self.status()
            if status is not None and done(status):
                return status
            time.sleep(0.1)
        raise AssertionError(f"waited for {what}; last status {status}\n{self.pod.sidecar_log.read_text()}")

    def applied(self, revision: str) -> dict[str, Any]:
        return self.wait(
            lambda s: s["state"] == "Applied" and s["revision"] == revision and s["target"] == revision,
            f"revision {revision} applied",
        )

    def kill(self) -> None:
        """SIGKILL: the agent gets no chance to tidy up."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(TIMEOUT)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class Client:
    """Asks ``model`` for INPUT0 = 0 over and over in a thread until stopped; every answer and failure.
    With ``ready``, only while it says the pod is ready, as a Service's endpoints follow the pod's
    readiness (``held``: how many times it was not)."""

    server: RunningServer
    model: str = "adder"
    ready: Callable[[], bool] | None = None
    answers: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    held: int = 0
    stop_event: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> Client:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.wait_answers(1)
        return self

    def _run(self) -> None:
        body: dict[str, Any] = {
            "inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [0.0]}]
        }
        url = f"{self.server.http_url}/v2/models/{self.model}/infer"
        with requests.Session() as http:
            while not self.stop_event.is_set():
                if self.ready is not None and not self.ready():
                    self.held += 1
                    time.sleep(0.02)
                    continue
                try:
                    reply = http.post(url, json=body, timeout=TIMEOUT)
                except requests.RequestException as exc:
                    self.failures.append(repr(exc))
                    continue
                if reply.status_code != 200:
                    self.failures.append(f"HTTP {reply.status_code}: {reply.text}")
                    continue
                self.answers.append(float(reply.json()["outputs"][0]["data"][0]))

    def wait_answers(self, n: int) -> None:
        """Until ``n`` more answers came (or a failure)."""
        want = len(self.answers) + n
        deadline = time.monotonic() + TIMEOUT
        while len(self.answers) < want and not self.failures and time.monotonic() < deadline:
            time.sleep(0.02)

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(TIMEOUT)


def in_order(answers: list[float], *values: float) -> bool:
    """Whether ``answers`` are each of ``values`` in turn (every one of them), never going back."""
    if set(answers) != set(values):
        return False
    phases = [values.index(a) for a in answers]
    return phases[0] == 0 and phases == sorted(phases)


# ---------------------------------------------------------------- fixtures


@pytest.fixture
def pod(s3_backend: Backend, tmp_path: Path) -> Pod:
    init_log = tmp_path / "inits.log"
    init_log.touch()
    return Pod(tmp_path / "pod", s3_backend, s3_backend.new_bucket(), init_log)


@pytest.fixture
def served(pod: Pod, triton_install: TritonInstall) -> Iterator[tuple[Revision, RunningServer]]:
    """Revision r1 (adder and other, version 1), synced by `agent --once` and served by tritonserver
    started as the pod starts it: explicit model control, --load-model=*."""
    pod.put("adder/1/model.py", model_py(100))
    pod.put("other/1/model.py", model_py(300))
    r1 = pod.revision("r1", {"adder": config(pod.init_log), "other": config(pod.init_log)})
    pod.set_base(r1)
    result = pod.once()
    assert result.returncode == 0, result.stderr
    server = start_server(triton_install, pod.models, ["*"], pod.root / "tritonserver.log")
    try:
        assert sorted(pod.inits()) == ["adder 1", "other 1"]
        yield r1, server
    finally:
        server.stop()


@pytest.fixture
def sidecars(pod: Pod) -> Iterator[list[Sidecar]]:
    started: list[Sidecar] = []
    yield started
    for sidecar in started:
        sidecar.stop()


def index(server: RunningServer) -> dict[tuple[str, str], str]:
    reply = requests.post(f"{server.http_url}/v2/repository/index", json={}, timeout=TIMEOUT)
    assert reply.status_code == 200, reply.text
    return {(m["name"], m.get("version", "")): m.get("state", "") for m in reply.json()}


# ---------------------------------------------------------------- --once


def test_once_writes_what_sync_writes_into_an_empty_or_a_partial_folder(pod: Pod) -> None:
    pod.put("adder/1/model.py", model_py(100))
    pod.put("adder/2/model.py", model_py(200, pad=5000))
    pod.put("adder/labels.txt", b"a\nb\n")
    pod.put("other/1/model.py", model_py(300))
    r1 = pod.revision("r1", {"adder": config(pod.init_log), "other": config(pod.init_log)})
    pod.set_base(r1)

    result = pod.once()
    assert result.returncode == 0, result.stderr
    fresh = pod.fresh_sync(r1)
    assert tree(pod.models) == tree(fresh)
    assert sorted(tree(pod.models)) == [
        "adder",
        "adder/2",
        "adder/2/model.py",
        "adder/config.pbtxt",
        "adder/labels.txt",
        "other",
        "other/1",
        "other/1/model.py",
        "other/config.pbtxt",
    ]
    record = json.loads((pod.state / "agent.json").read_text())
    assert (record["applied"], record["pending"], record["fetchedBytes"]) == (
        "r1",
        None,
        r1.manifest.total_bytes,
    )

    # A partial /models (a file gone, one cut short, a stray version): --once makes it whole again.
    (pod.models / "adder/labels.txt").unlink()
    (pod.models / "other/1/model.py").write_bytes(b"cut")
    (pod.models / "other/7").mkdir()
    (pod.models / "other/7/model.py").write_bytes(b"stray")
    result = pod.once()
    assert result.returncode == 0, result.stderr
    assert tree(pod.models) == tree(fresh)


def test_once_fails_with_syncs_exit_status_and_termination_message(pod: Pod) -> None:
    pod.put("adder/1/model.py", model_py(100))
    r1 = pod.revision("r1", {"adder": config(pod.init_log)})
    pod.set_base(r1)
    pod.put("adder/1/model.py", model_py(101))  # overwritten after it was pinned
    termination = pod.root / "termination-log"
    termination.touch()
    result = pod.once("--termination-log", str(termination))
    assert result.returncode == 3, result.stderr  # sync's EXIT_CHANGED
    assert "adder/1/model.py" in termination.read_text()
    assert json.loads((pod.state / "agent.json").read_text())["applied"] is None


def test_once_syncs_the_revision_the_pod_is_told_to_serve(pod: Pod) -> None:
    """A pod that starts during an in-place rollout, annotated with `next`: its init container syncs
    next, not its own base revision; the agent's record says so."""
    pod.put("adder/1/model.py", model_py(100))
    r1 = pod.revision("r1", {"adder": config(pod.init_log)})
    pod.put("adder/2/model.py", model_py(200))
    r2 = pod.revision("r2", {"adder": config(pod.init_log)})
    pod.set_base(r1)
    pod.publish(r1, r2)
    pod.target("r2")
    result = pod.once()
    assert result.returncode == 0, result.stderr
    assert tree(pod.models) == tree(pod.fresh_sync(r2))
    assert json.loads((pod.state / "agent.json").read_text())["applied"] == "r2"


def test_once_after_a_rollback_deletes_the_models_the_target_does_not_have(pod: Pod) -> None:
    """A pod whose sandbox restarts after it served r2 (which added a model) while its target went
    back to r1: tritonserver loads every model /models holds, so r2's model must not be left there."""
    pod.put("adder/1/model.py", model_py(100))
    r1 = pod.revision("r1", {"adder": config(pod.init_log)})
    pod.put("extra/1/model.py", model_py(400))
    r2 = pod.revision("r2", {"adder": config(pod.init_log), "extra": config(pod.init_log)})
    pod.set_base(r1)
    pod.publish(r1, r2)
    pod.target("r2")
    assert pod.once().returncode == 0
    assert (pod.models / "extra/1/model.py").is_file()

    pod.publish(r1, None)
    pod.target(None)
    result = pod.once()
    assert result.returncode == 0, result.stderr
    assert tree(pod.models) == tree(pod.fresh_sync(r1))
    assert json.loads((pod.state / "agent.json").read_text())["applied"] == "r1"
    assert sorted(p.name for p in (pod.state / "revisions").iterdir()) == ["r1"]


# ---------------------------------------------------------------- the sidecar


def test_a_new_version_then_a_config_change_go_live_in_place_without_a_failed_request(
    pod: Pod, served: tuple[Revision, RunningServer], sidecars: list[Sidecar]
) -> None:
    r1, server = served
    sidecar = Sidecar(pod, server.http_url)
    sidecars.append(sidecar)
    status = sidecar.applied("r1")
    assert status["base"] == "r1" and status["models"] == {"adder": "READY", "other": "READY"}
    ready = sidecar.wait_ready(200, "the pod to be ready")
    assert ready["revision"] == "r1" and ready["models"] == {"adder": "READY", "other": "READY"}

    client = Client(server, ready=sidecar.is_ready).start()
    try:
        # A new version of adder: only its object is fetched, only adder is loaded.
        new_object = model_py(200, pad=3000)
        pod.put("adder/2/model.py", new_object)
        r2 = pod.revision("r2", {"adder": config(pod.init_log), "other": config(pod.init_log)})
        pod.publish(r1, r2)
        pod.target("r2")
        # out of the Service as the change begins, fetched meanwhile, then the rest of the drain
        # (or, a fetch longer than it, the unload) before adder is touched
        draining = sidecar.wait(
            lambda s: s["state"] == "Draining" and "out of the Service" in s["message"], "the pod to drain"
        )
        assert draining["revision"] == "r1" and "out of the Service" in draining["message"], draining
        assert (pod.models / "adder/2/model.py").read_bytes() == new_object  # fetched already
        code, why = sidecar.readiness()
        assert code == 503 and why["reason"].startswith("draining"), why
        status = sidecar.applied("r2")
        client.wait_answers(3)
        assert status["fetchedBytes"] == len(new_object)
        assert status["models"] == {"adder": "READY", "other": "READY"}
        assert sorted(pod.inits()) == ["adder 1", "adder 2", "other 1"]  # other was not reloaded
        assert tree(pod.models) == tree(pod.fresh_sync(r2))
        assert ("adder", "2") in index(server) and index(server)[("adder", "2")] == "READY"

        # A config-only change (the offset, max_batch_size, dynamic batching): nothing fetched.
        r3 = pod.revision(
            "r3",
            {
                "adder": config(
                    pod.init_log,
                    offset=10,
                    maxBatchSize=4,
                    dynamicBatching={"maxQueueDelayMicroseconds": "100"},
                ),
                "other": config(pod.init_log),
            },
        )
        pod.publish(r2, r3)
        pod.target("r3")
        status = sidecar.applied("r3")
        client.wait_answers(3)
        assert status["fetchedBytes"] == 0
        served_config = requests.get(f"{server.http_url}/v2/models/adder/config", timeout=TIMEOUT).json()
        assert served_config["max_batch_size"] == 4 and "dynamic_batching" in served_config
        assert tree(pod.models) == tree(pod.fresh_sync(r3))
    finally:
        client.stop()
    assert client.failures == [], f"{client.failures[:3]}\n{server.log_tail()}"
    assert in_order(client.answers, 101.0, 201.0, 210.0), sorted(set(client.answers))
    assert sorted(pod.inits()) == ["adder 1", "adder 2", "adder 2", "other 1"]
    assert client.held > 0  # the pod left the "Service" for each change
    # never a load over a loaded model: version 1 unloaded before version 2 loaded
    log = server.log()
    assert log.index("successfully unloaded 'adder' version 1") < log.index("loading: adder:2"), log
    assert sidecar.wait_ready(200, "the pod back in")["revision"] == "r3"


def test_a_version_that_fails_to_load_is_failed_and_the_way_back_loads_the_old_one(
    pod: Pod, served: tuple[Revision, RunningServer], sidecars: list[Sidecar]
) -> None:
    r1, server = served
    sidecar = Sidecar(pod, server.http_url)
    sidecars.append(sidecar)
    sidecar.applied("r1")
    sidecar.wait_ready(200, "the pod to be ready")
    client = Client(server, ready=sidecar.is_ready).start()
    try:
        # Version 2 of adder fails to load; r2 also adds a model, never loaded (adder's load comes first).
        pod.put("adder/2/model.py", model_py(200, fail=True))
        pod.put("extra/1/model.py", model_py(400))
        r2 = pod.revision(
            "r2",
            {"adder": config(pod.init_log), "other": config(pod.init_log), "extra": config(pod.init_log)},
        )
        pod.publish(r1, r2)
        pod.target("r2")
        status = sidecar.wait(lambda s: s["state"] == "Failed", "the load of r2 to fail")
        assert status["revision"] == "r1" and status["target"] == "r2"
        assert "adder" in status["message"] and "refuses to load" in status["message"], status
        assert status["models"]["adder"] != "READY"  # the target's version 2 is not
        # the pod stays out of its Service until a revision loads whole (adder 1 was unloaded)
        why = sidecar.wait_ready(503, "the pod out of its Service")
        assert "r2 failed to load" in why["reason"] and "adder" in why["reason"], why
        loads = pod.inits().count("adder 2")
        time.sleep(2)  # ten passes of the agent: it does not try the same target again
        assert pod.inits().count("adder 2") == loads == 1
        again = sidecar.status()
        assert again is not None and (again["state"], again["target"]) == ("Failed", "r2")

        # The operator rolls back: the annotation goes, state.json names r1 alone.
        pod.publish(r1, None)
        pod.target(None)
        status = sidecar.applied("r1")
        assert status["message"] == "" and status["models"] == {"adder": "READY", "other": "READY"}
        assert sidecar.wait_ready(200, "the pod back in")["revision"] == "r1"
        client.wait_answers(3)
        assert tree(pod.models) == tree(pod.fresh_sync(r1))  # extra's folder is gone with r2's files
        assert index(server)[("adder", "1")] == "READY"
    finally:
        client.stop()
    assert client.failures == [], f"{client.failures[:3]}\n{server.log_tail()}"
    assert set(client.answers) == {101.0}
    assert sorted(pod.inits()) == ["adder 1", "adder 1", "adder 2", "other 1"]


def test_a_model_added_then_one_removed(
    pod: Pod, served: tuple[Revision, RunningServer], sidecars: list[Sidecar]
) -> None:
    r1, server = served
    sidecar = Sidecar(pod, server.http_url)
    sidecars.append(sidecar)
    sidecar.applied("r1")
    pod.put("extra/4/model.py", model_py(400))
    configs = {"adder": config(pod.init_log), "other": config(pod.init_log), "extra": config(pod.init_log)}
    r2 = pod.revision("r2", configs)
    pod.publish(r1, r2)
    pod.target("r2")
    status = sidecar.applied("r2")
    assert status["models"] == {"adder": "READY", "extra": "READY", "other": "READY"}
    assert status["fetchedBytes"] == len(model_py(400))
    assert sorted(pod.inits()) == ["adder 1", "extra 4", "other 1"]
    assert tree(pod.models) == tree(pod.fresh_sync(r2))

    sidecar.wait_ready(200, "the pod to be ready")
    client = Client(server, "adder", ready=sidecar.is_ready).start()
    try:
        del configs["other"]
        r3 = pod.revision("r3", configs)
        pod.publish(r2, r3)
        pod.target("r3")
        status = sidecar.applied("r3")
        assert status["models"] == {"adder": "READY", "extra": "READY"}
        client.wait_answers(3)
    finally:
        client.stop()
    assert client.failures == [] and set(client.answers) == {101.0}
    assert not (pod.models / "other").exists()
    assert tree(pod.models) == tree(pod.fresh_sync(r3))
    assert index(server).get(("other", "1")) != "READY"
    reply = requests.get(f"{server.http_url}/v2/models/other/ready", timeout=TIMEOUT)
    assert reply.status_code != 200
    assert sorted(pod.inits()) == ["adder 1", "extra 4", "other 1"]  # nothing reloaded


def test_a_model_whose_backend_stub_dies_takes_the_pod_out_of_its_service(
    pod: Pod, served: tuple[Revision, RunningServer], sidecars: list[Sidecar]
) -> None:
    """tritonserver 2.51 still reports a Python model READY once its stub process died
    (tests/triton/test_inplace_readiness.py); the agent sees the stub gone and the pod leaves."""
    _, server = served
    sidecar = Sidecar(pod, server.http_url)
    sidecars.append(sidecar)
    sidecar.applied("r1")
    assert sidecar.wait_ready(200, "the pod to be ready")["models"] == {"adder": "READY", "other": "READY"}
    stubs = python_stubs(pod.models)
    assert stubs == {"adder": 1, "other": 1}, stubs
    (pid,) = [p for p, argv in stub_processes() if argv[1].startswith(f"{pod.models}/adder/")]
    os.kill(pid, signal.SIGKILL)
    why = sidecar.wait_ready(503, "the pod out of its Service")
    assert why["models"]["other"] == "READY" and "stub" in why["models"]["adder"], why
    assert why["reason"].startswith("revision r1: model adder is dead"), why
    assert index(server)[("adder", "1")] == "READY"  # what Triton itself says meanwhile
    time.sleep(2)
    assert sidecar.readiness()[0] == 503  # and it stays out: the model is dead


def stub_processes() -> list[tuple[int, list[str]]]:
    out = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().decode().split("\0")
        except (OSError, UnicodeDecodeError):
            continue
        if len(argv) > 1 and argv[0].endswith("triton_python_backend_stub"):
            out.append((int(entry.name), argv))
    return out


def test_an_agent_stopped_between_fetch_and_load_comes_back_consistent(
    pod: Pod, served: tuple[Revision, RunningServer], sidecars: list[Sidecar]
) -> None:
    r1, server = served
    current: list[Sidecar] = []  # the agent of the moment (none: tritonserver as it started)
    client = Client(server, ready=lambda: not current or current[-1].is_ready()).start()
    try:
        new_object = model_py(200, pad=2000)
        pod.put("adder/2/model.py", new_object)
        r2 = pod.revision("r2", {"adder": config(pod.init_log), "other": config(pod.init_log)})
        pod.publish(r1, r2)
        pod.target("r2")
        # A sidecar that fetched, then waits out its drain before the loads: killed there, between
        # fetch and load. (It used to be one that could not reach tritonserver; a tritonserver
        # process over /models that does not answer is now one still starting, and the agent leaves
        # /models alone until it answers: test_a_new_pod_whose_target_moves_while_...)
        dead = Sidecar(pod, server.http_url, drain=TIMEOUT * 10)
        sidecars.append(dead)
        current.append(dead)
        status = dead.wait(
            lambda s: "waiting" in s["message"] and "before unloading" in s["message"],
            "the agent to drain before it loads",
        )
        assert status["state"] == "Draining" and status["revision"] == "r1" and status["target"] == "r2"
        assert (pod.models / "adder/2/model.py").read_bytes() == new_object
        dead.kill()
        assert json.loads((pod.state / "agent.json").read_text())["pending"] == "r2"

        # Back, with tritonserver reachable: it finishes r2 without fetching it again.
        sidecar = Sidecar(pod, server.http_url)
        sidecars.append(sidecar)
        current.append(sidecar)
        status = sidecar.applied("r2")
        assert status["fetchedBytes"] == len(new_object)  # the bytes of the change, fetched once
        client.wait_answers(3)
        assert tree(pod.models) == tree(pod.fresh_sync(r2))

        # Stopped and started again with nothing to do: consistent at once, nothing loaded again.
        sidecar.stop()
        loads = sorted(pod.inits())
        again = Sidecar(pod, server.http_url)
        sidecars.append(again)
        current.append(again)
        status = again.applied("r2")
        time.sleep(1)
        assert sorted(pod.inits()) == loads == ["adder 1", "adder 2", "other 1"]
    finally:
        client.stop()
    assert client.failures == [], f"{client.failures[:3]}\n{server.log_tail()}"
    assert in_order(client.answers, 101.0, 201.0), sorted(set(client.answers))


def test_an_ensemble_and_its_new_step_added_together_load_once_each(
    pod: Pod, served: tuple[Revision, RunningServer], sidecars: list[Sidecar]
) -> None:
    """An ensemble and a new step it needs, added in one change: both load, once each, and answer.
    (The agent loads the step first; tritonserver 2.51 would also take the other order: it loads an
    ensemble's steps along with it, and a load of a loaded model whose files did not change does
    nothing.)"""
    r1, server = served
    sidecar = Sidecar(pod, server.http_url)
    sidecars.append(sidecar)
    sidecar.applied("r1")
    pod.put("zstep/1/model.py", model_py(500))
    # A file where Python would make its __pycache__ folder: the Python backend then writes nothing
    # into zstep/1 when it loads it. (Triton loads an ensemble's steps along with it, again when a
    # step's folder changed since it was loaded: a new __pycache__ would count as a change.)
    pod.put("zstep/1/__pycache__", b"no bytecode here\n")
    chain = {
        "platform": "ensemble",
        "maxBatchSize": 8,
        "input": [{"name": "X", "dataType": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "Y", "dataType": "TYPE_FP32", "dims": [1]}],
        "ensembleScheduling": {
            "step": [
                {
                    "modelName": "zstep",
                    "modelVersion": "-1",
                    "inputMap": {"INPUT0": "X"},
                    "outputMap": {"OUTPUT0": "Y"},
                }
            ]
        },
    }
    configs = {
        "adder": config(pod.init_log),
        "other": config(pod.init_log),
        "chain": chain,
        "zstep": config(pod.init_log),
    }
    r2 = pod.revision("r2", configs)
    assert ensemble_steps(r2.configs["chain"]) == ("zstep",)
    pod.publish(r1, r2)
    pod.target("r2")
    status = sidecar.applied("r2")
    assert status["models"] == {"adder": "READY", "chain": "READY", "other": "READY", "zstep": "READY"}
    body: dict[str, Any] = {"inputs": [{"name": "X", "shape": [1, 1], "datatype": "FP32", "data": [0.0]}]}
    reply = requests.post(f"{server.http_url}/v2/models/chain/infer", json=body, timeout=TIMEOUT)
    assert reply.status_code == 200 and reply.json()["outputs"][0]["data"] == [501.0], reply.text
    assert sorted(pod.inits()) == ["adder 1", "other 1", "zstep 1"]
    assert tree(pod.models) == tree(pod.fresh_sync(r2))


def test_a_change_reads_only_the_changed_objects_and_trusts_the_record_of_the_rest(pod: Pod) -> None:
    """What the last sync recorded (size, mtime, inode, checksum) is not hashed again: an unchanged
    file is neither read from the store nor from the disk. Shown with a file changed behind the
    agent's back, size and mtime kept: it stays as it is (hashing it would have fetched it again)."""
    pod.put("adder/1/model.py", model_py(100))
    pod.put("other/1/model.py", model_py(300, pad=4000))
    r1 = pod.revision("r1", {"adder": config(pod.init_log), "other": config(pod.init_log)})
    pod.set_base(r1)
    assert pod.once().returncode == 0

    other = pod.models / "other/1/model.py"
    before = other.stat()
    tampered = other.read_bytes().replace(b"BASE = 300", b"BASE = 999")
    assert len(tampered) == before.st_size
    with other.open("r+b") as f:  # in place: the same inode
        f.write(tampered)
    os.utime(other, ns=(before.st_atime_ns, before.st_mtime_ns))

    pod.put("adder/2/model.py", model_py(200))
    r2 = pod.revision("r2", {"adder": config(pod.init_log), "other": config(pod.init_log)})
    pod.publish(r1, r2)
    pod.target("r2")
    result = pod.once()
    assert result.returncode == 0, result.stderr
    record = json.loads((pod.state / "agent.json").read_text())
    assert (record["applied"], record["fetchedBytes"]) == ("r2", len(model_py(200)))
    assert other.read_bytes() == tampered


def test_a_new_pod_whose_target_moves_while_tritonserver_starts_still_starts(
    pod: Pod, triton_install: TritonInstall, sidecars: list[Sidecar]
) -> None:
    """A pod the ReplicaSet creates during a rollout (no annotation: its init container syncs stable,
    r1) while the rollout completes (state.json becomes {stable: r2}): the sidecar starts beside a
    tritonserver that is still loading /models (--load-model=*; its HTTP port opens only after).
    Before, the sidecar placed r2 at once: adder/1/model.py was deleted under the load in progress,
    the Python stub failed to start and tritonserver hung, never listening, until the kubelet's
    startup probe restarted it. Now the sidecar leaves /models alone until tritonserver answers, then
    drains, unloads and loads r2 as for any change."""
    pod.put("adder/1/model.py", model_py(100))
    r1 = pod.revision("r1", {"adder": config(pod.init_log)})
    pod.put("adder/2/model.py", model_py(200))
    r2 = pod.revision("r2", {"adder": config(pod.init_log)})
    pod.set_base(r1)
    pod.publish(r1, r2)
    result = pod.once()
    assert result.returncode == 0, result.stderr
    assert json.loads((pod.state / "agent.json").read_text())["applied"] == "r1"

    ports = (free_port(), free_port(), free_port())
    log_path = pod.root / "tritonserver.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            server_command(triton_install, pod.models, ["*"], ports),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=triton_install.env,
            cwd=triton_install.root,
            start_new_session=True,
        )
    server = RunningServer(process, *ports, log_path=log_path)
    try:
        sidecar = Sidecar(pod, server.http_url)
        sidecars.append(sidecar)
        pod.publish(r2, None)  # the rollout completes while tritonserver loads r1

        deadline = time.monotonic() + TIMEOUT
        ready = False
        while not ready and process.poll() is None and time.monotonic() < deadline:
            try:
                ready = requests.get(f"{server.http_url}/v2/health/ready", timeout=5).status_code == 200
            except requests.RequestException:
                time.sleep(0.1)
        assert ready, (
            f"tritonserver (exit status {process.poll()}) never answered ready within {TIMEOUT:g} s:\n"
            f"{server.log_tail()}\n{pod.sidecar_log.read_text()}"
        )

        status = sidecar.applied("r2")
        assert status["models"] == {"adder": "READY"}, status
        assert tree(pod.models) == tree(pod.fresh_sync(r2))
        assert pod.inits() == ["adder 1", "adder 2"]
        sidecar.wait_ready(200, "the pod back in its Service with r2")
        client = Client(server)
        client.start()
        client.stop()
        assert client.failures == [] and client.answers and set(client.answers) == {201.0}, client
    finally:
        server.stop()


# ---------------------------------------------------------------- one pod shape: the first fill


def test_a_pod_of_the_one_shape_answers_for_a_model_before_a_later_ones_bytes_are_in(
    pod: Pod, triton_install: TritonInstall, sidecars: list[Sidecar]
) -> None:
    """tritonserver starts with no model (explicit control); the agent (--triton-starts-empty) fetches
    both models in one sync and loads the big one as soon as its bytes are in, while the small model's
    are still on their way (the store holds that request back for HOLD_SECONDS): the big model
    answers before them; the pod is Ready only once both are READY."""
    pod.put("big/1/model.py", model_py(100, pad=8 * 1024 * 1024))
    pod.put("small/1/model.py", model_py(300))
    r1 = pod.revision("r1", {"big": config(pod.init_log), "small": config(pod.init_log)})
    with counting_proxy(pod.backend.endpoint, hold=(b"small/1/model.py", b"nothing releases it")) as proxy:
        through = dataclasses.replace(r1.manifest.repository, endpoint=proxy.endpoint)
        pod.set_base(Revision("r1", dataclasses.replace(r1.manifest, repository=through), r1.configs))
        server = start_server(triton_install, pod.models, [], pod.root / "tritonserver.log")
        try:
            sidecar = Sidecar(pod, server.http_url, extra=("--triton-starts-empty",))
            sidecars.append(sidecar)

            def big_ready() -> bool:
                return (
                    requests.get(f"{server.http_url}/v2/models/big/ready", timeout=TIMEOUT).status_code == 200
                )

            client = Client(server, model="big", ready=big_ready).start()
            try:
                client.wait_answers(3)
                assert len(client.answers) >= 3 and not client.failures, client.failures
                # answers while the small model's bytes are not in, and the pod not Ready
                assert not (pod.models / "small/1/model.py").exists()
                assert sidecar.readiness()[0] == 503
                assert proxy.hold_timeouts == 0
                body = sidecar.wait_ready(200, "every model READY")
                assert body["models"] == {"big": "READY", "small": "READY"}
                assert proxy.hold_timeouts == 1  # the small model's bytes came only after the hold
                client.wait_answers(3)
            finally:
                client.stop()
            assert not client.failures, client.failures
            assert set(client.answers) == {101.0}
            assert sorted(pod.inits()) == ["big 1", "small 1"]
            status = sidecar.applied("r1")
            assert status["models"] == {"big": "READY", "small": "READY"}
            # the fill's summary, as the sync init container would leave it (status.timeToServe)
            summary = parse_summary(status["summary"])
            assert summary is not None, status
            assert (summary.objects, summary.fetched, summary.present) == (2, status["fetchedBytes"], 0)
            assert summary.fetched == len(model_py(100, pad=8 * 1024 * 1024)) + len(model_py(300))
            # sync's record of what it placed holds both models: a later change in place hashes
            # neither again
            recorded = json.loads((pod.models / STATE_FILE).read_text())["files"]
            assert set(recorded) == {"big/1/model.py", "small/1/model.py"}
        finally:
            server.stop()


def test_a_model_that_fails_to_load_in_the_first_fill_exits_the_agent_naming_it(
    pod: Pod, triton_install: TritonInstall
) -> None:
    """The agent of a pod of the one shape exits 1 when Triton refuses a model of its first fill, with
    Triton's reason as its termination message (what the operator quotes in Degraded and the rollback
    Event); the model that loaded stays loaded, and a restarted agent tries again. (The store holds
    bad's bytes back for HOLD_SECONDS: good, fetched in the same sync, is in and loaded first.)"""
    pod.put("good/1/model.py", model_py(100, pad=4096))
    pod.put("bad/1/model.py", model_py(200, fail=True))
    r1 = pod.revision("r1", {"good": config(pod.init_log), "bad": config(pod.init_log)})
    server = start_server(triton_install, pod.models, [], pod.root / "tritonserver.log")
    termination = pod.root / "termination-log"
    try:
        with counting_proxy(pod.backend.endpoint, hold=(b"bad/1/model.py", b"nothing releases it")) as proxy:
            through = dataclasses.replace(r1.manifest.repository, endpoint=proxy.endpoint)
            pod.set_base(Revision("r1", dataclasses.replace(r1.manifest, repository=through), r1.configs))
            for attempt in (1, 2):
                termination.write_text("")
                result = subprocess.run(
                    [
                        *pod.args(server.http_url, f"127.0.0.1:{free_port()}"),
                        "--triton-starts-empty",
                        "--termination-log",
                        str(termination),
                    ],
                    env=pod.env(),
                    capture_output=True,
                    text=True,
                    timeout=TIMEOUT * 2,
                    check=False,
                )
                assert result.returncode == 1, (attempt, result.stderr)
                message = termination.read_text()
                assert message.startswith("load of model 'bad' failed: "), message
                (failure,) = load_failures(message)
                assert (failure.model, failure.version) == ("bad", "1")
                assert "refuses to load" in failure.reason
            assert pod.inits().count("bad 1") == 2  # tried again by the restarted agent
            assert index(server)[("good", "1")] == "READY"
            assert proxy.hold_timeouts == 1  # bad's bytes came after the hold, in the first attempt only
    finally:
        server.stop()
