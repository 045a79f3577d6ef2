"""What core.rollout.rollout_kind relies on, shown on a real tritonserver over a repository `triton-operator
sync` wrote: in explicit model-control mode, a `load` of one changed model (a new version folder, or a new
config.pbtxt) swaps it in while it keeps answering, no request fails, the other model is not
reloaded, and a change Triton cannot load leaves the old model serving."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from triton_operator.adapters.storage import open_store, pin_repository
from triton_operator.adapters.sync.download import SyncOptions, sync
from triton_operator.core.repository.manifest import Manifest
from triton_operator.core.rollout.rollout_kind import InPlace, NewPods, RevisionParts, rollout_kind
from triton_operator.core.spec.modelconfig import build_config_pbtxt
from triton_operator.models import ModelSpec, Repository
from tritonserver import RunningServer, TritonInstall, start_server

pytestmark = [pytest.mark.triton, pytest.mark.timeout(600)]

URI = "pvc://claim/repo"
TIMEOUT = 60  # seconds a request may take before the client gives up (not an assertion on speed)

# OUTPUT0 = INPUT0 + BASE (this file's constant: its version) + the config's "offset" parameter.
# initialize() appends "<model> <version>" to the config's "init_log" (how the test sees a reload),
# then sleeps, so a reload takes long enough for the client to be answered while it runs.
MODEL_PY = """
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

BASE = {base}


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.add = np.float32(BASE + float(params["offset"]["string_value"]))
        with open(params["init_log"]["string_value"], "a") as log:
            log.write(args["model_name"] + " " + args["model_version"] + chr(10))
        time.sleep(2)

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", (x + self.add).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""


def config(init_log: Path, offset: int, **extra: Any) -> dict[str, Any]:
    return {
        "backend": "python",
        "maxBatchSize": 8,
        "input": [{"name": "INPUT0", "dataType": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "OUTPUT0", "dataType": "TYPE_FP32", "dims": [1]}],
        "instanceGroup": [{"kind": "KIND_CPU", "count": 1}],
        "parameters": {"offset": {"stringValue": str(offset)}, "init_log": {"stringValue": str(init_log)}},
        **extra,
    }


@dataclass
class Pod:
    """A pod's /models as sync fills it from a claim, and the revisions it was synced to."""

    claim: Path
    configs: Path
    models: Path

    def put(self, key: str, data: str) -> None:
        path = self.claim / "repo" / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(data)

    def revision(self, specs: list[ModelSpec]) -> tuple[RevisionParts, Manifest]:
        """Pin the claim for ``specs`` (sha256 of every object) and render the configs."""
        manifest = pin_repository(Repository(uri=URI), specs, {}, pvc_root=self.claim)
        configs = {m.name: build_config_pbtxt(m.name, m.config) for m in specs}
        pod = {"spec": {"models": [{"name": m.name} for m in specs]}, "image": "tritonserver"}
        return RevisionParts(pod, configs, {m.name: m.config for m in specs}, manifest), manifest

    def sync(self, parts: RevisionParts, manifest: Manifest) -> int:
        """What the sync container does: the rendered configs under configs/, then sync; the number
        of objects it downloaded."""
        for name, text in parts.configs.items():
            (self.configs / name).mkdir(parents=True, exist_ok=True)
            (self.configs / name / "config.pbtxt").write_text(text)
        store = open_store(manifest.repository, {}, pvc_root=self.claim)
        stats = sync(manifest, store, SyncOptions(dest=self.models, configs=self.configs))
        return stats.downloaded_files


@dataclass
class Client:
    """Asks ``model`` for INPUT0 = 0 over and over in a thread; records every answer and failure."""

    server: RunningServer
    model: str
    input_name: str = "INPUT0"
    answers: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    during_load: list[float] = field(default_factory=list)
    """Answers to requests in flight at some moment of the load: sent before it returned, answered
    after it was sent."""
    load_sent: threading.Event = field(default_factory=threading.Event)
    load_returned: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        body: dict[str, Any] = {
            "inputs": [{"name": self.input_name, "shape": [1, 1], "datatype": "FP32", "data": [0.0]}]
        }
        url = f"{self.server.http_url}/v2/models/{self.model}/infer"
        with requests.Session() as http:
            while not self.stop.is_set():
                sent_before_return = not self.load_returned.is_set()
                try:
                    reply = http.post(url, json=body, timeout=TIMEOUT)
                except requests.RequestException as exc:
                    self.failures.append(repr(exc))
                    continue
                if reply.status_code != 200:
                    self.failures.append(f"HTTP {reply.status_code}: {reply.text}")
                    continue
                value = float(reply.json()["outputs"][0]["data"][0])
                self.answers.append(value)
                if sent_before_return and self.load_sent.is_set():
                    self.during_load.append(value)

    def load_while_asking(self, model: str) -> requests.Response:
        """POST load for ``model`` while this client keeps asking; stops the client afterwards."""
        thread = threading.Thread(target=self.run, daemon=True)
        thread.start()
        try:
            while not self.answers and not self.failures:
                self.stop.wait(0.05)
            self.load_sent.set()
            reply = requests.post(f"{self.server.http_url}/v2/repository/models/{model}/load", timeout=300)
            self.load_returned.set()
            seen = len(self.answers)
            while len(self.answers) < seen + 3 and not self.failures:
                self.stop.wait(0.05)  # a few answers after the load returned
        finally:
            self.stop.set()
            thread.join(TIMEOUT)
        return reply


def inits(log: Path) -> list[str]:
    return log.read_text().splitlines()


@pytest.fixture
def pod(tmp_path: Path) -> Pod:
    return Pod(tmp_path / "claim", tmp_path / "configs", tmp_path / "models")


@pytest.fixture
def served(pod: Pod, triton_install: TritonInstall, tmp_path: Path) -> Iterator[tuple[RunningServer, Path]]:
    """`adder` and `other` at version 1, offset 1, synced and loaded; yields the server and init log."""
    log = tmp_path / "inits.log"
    log.touch()
    for name in ("adder", "other"):
        pod.put(f"{name}/1/model.py", MODEL_PY.format(base=100))
    parts, manifest = pod.revision([ModelSpec(name=n, config=config(log, 1)) for n in ("adder", "other")])
    pod.sync(parts, manifest)
    server = start_server(triton_install, pod.models, ["adder", "other"], tmp_path / "tritonserver.log")
    yield server, log
    server.stop()


def specs(log: Path, **adder: Any) -> list[ModelSpec]:
    return [
        ModelSpec(name="adder", config=config(log, **adder)),
        ModelSpec(name="other", config=config(log, 1)),
    ]


def test_a_new_version_goes_live_in_place_without_a_failed_request(
    served: tuple[RunningServer, Path], pod: Pod
) -> None:
    server, log = served
    old, _ = pod.revision(specs(log, offset=1))
    assert sorted(inits(log)) == ["adder 1", "other 1"]

    pod.put("adder/2/model.py", MODEL_PY.format(base=200))
    new, manifest = pod.revision(specs(log, offset=1))
    kind = rollout_kind(old, new)
    assert isinstance(kind, InPlace), kind
    assert kind.models_changed == ("adder",)
    assert [e.dest for e in kind.objects_to_fetch] == ["adder/2/model.py"]
    assert kind.objects_to_remove == ("adder/1/model.py",)
    # sync fetches exactly what the decision names, and leaves the repository a fresh pod would get.
    assert pod.sync(new, manifest) == len(kind.objects_to_fetch)
    assert sorted(p.relative_to(pod.models).as_posix() for p in pod.models.rglob("*.p*")) == [
        "adder/2/model.py",
        "adder/config.pbtxt",
        "other/1/model.py",
        "other/config.pbtxt",
    ]

    client = Client(server, "adder")
    reply = client.load_while_asking("adder")
    assert reply.status_code == 200, reply.text
    assert client.failures == [], f"{client.failures}\n{server.log_tail()}"
    assert client.during_load, f"no request was in flight during the load: {client.answers}"
    assert set(client.during_load) <= {101.0, 201.0}
    assert client.answers[0] == 101.0 and client.answers[-3:] == [201.0] * 3
    versions = {(m["name"], m.get("version"), m.get("state")) for m in index(server)}
    assert ("adder", "2", "READY") in versions and ("adder", "1", "READY") not in versions
    assert sorted(inits(log)) == ["adder 1", "adder 2", "other 1"]  # other was not reloaded


def test_a_config_change_goes_live_in_place_and_leaves_the_other_model_alone(
    served: tuple[RunningServer, Path], pod: Pod
) -> None:
    server, log = served
    old, _ = pod.revision(specs(log, offset=1))
    new, manifest = pod.revision(
        specs(log, offset=10, maxBatchSize=4, dynamicBatching={"maxQueueDelayMicroseconds": "100"})
    )
    kind = rollout_kind(old, new)
    assert isinstance(kind, InPlace) and kind.models_changed == ("adder",) and kind.bytes == 0
    assert pod.sync(new, manifest) == 0

    client = Client(server, "adder")
    reply = client.load_while_asking("adder")
    assert reply.status_code == 200, reply.text
    assert client.failures == [], f"{client.failures}\n{server.log_tail()}"
    assert client.answers[0] == 101.0 and client.answers[-3:] == [110.0] * 3
    assert set(client.answers) == {101.0, 110.0}
    served_config = requests.get(f"{server.http_url}/v2/models/adder/config", timeout=TIMEOUT).json()
    assert served_config["max_batch_size"] == 4 and "dynamic_batching" in served_config
    assert sorted(inits(log)) == ["adder 1", "adder 1", "other 1"]


def test_a_backend_change_is_refused_by_triton_and_the_old_model_keeps_serving(
    served: tuple[RunningServer, Path], pod: Pod
) -> None:
    server, log = served
    old, _ = pod.revision(specs(log, offset=1))
    new, manifest = pod.revision(specs(log, offset=1, backend="onnxruntime"))
    kind = rollout_kind(old, new)
    assert kind == NewPods(("model adder: backend changed (python -> onnxruntime)",))

    # Applied in place anyway: this tritonserver has no onnxruntime backend, the load fails, and the
    # loaded model answers throughout; the pod's repository no longer says what it serves.
    pod.sync(new, manifest)
    client = Client(server, "adder")
    reply = client.load_while_asking("adder")
    assert reply.status_code == 400, reply.text
    assert "onnxruntime" in reply.text
    assert client.failures == [] and set(client.answers) == {101.0}
    assert ("adder", "1", "READY") in {(m["name"], m.get("version"), m.get("state")) for m in index(server)}
    assert sorted(inits(log)) == ["adder 1", "other 1"]


def index(server: RunningServer) -> list[dict[str, Any]]:
    reply = requests.post(f"{server.http_url}/v2/repository/index", json={}, timeout=TIMEOUT)
    assert reply.status_code == 200, reply.text
    entries: list[dict[str, Any]] = reply.json()
    return entries


def test_an_instance_count_change_reloads_the_whole_model(
    served: tuple[RunningServer, Path], pod: Pod
) -> None:
    server, log = served
    old, _ = pod.revision(specs(log, offset=1))
    new, manifest = pod.revision(specs(log, offset=1, instanceGroup=[{"kind": "KIND_CPU", "count": 2}]))
    kind = rollout_kind(old, new)
    assert isinstance(kind, InPlace) and kind.models_changed == ("adder",)
    pod.sync(new, manifest)

    client = Client(server, "adder")
    reply = client.load_while_asking("adder")
    assert reply.status_code == 200, reply.text
    assert client.failures == [] and set(client.answers) == {101.0}
    # Triton documents an instance-count change as an update that adds the missing instance (one more
    # initialize); tritonserver 2.51 reloads the model: both instances of a new copy initialize, then
    # the old copy unloads. So core.rollout.rollout_kind counts it as a reload (and on a GPU, two copies at
    # once).
    assert sorted(inits(log)) == ["adder 1", "adder 1", "adder 1", "other 1"]
    served_config = requests.get(f"{server.http_url}/v2/models/adder/config", timeout=TIMEOUT).json()
    assert served_config["instance_group"][0]["count"] == 2


def ensemble(steps: list[str]) -> dict[str, Any]:
    """X -> steps[0] -> steps[1] -> ... -> Y."""
    names = ["X"] + [f"t{i}" for i in range(1, len(steps))] + ["Y"]
    return {
        "platform": "ensemble",
        "maxBatchSize": 8,
        "input": [{"name": "X", "dataType": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "Y", "dataType": "TYPE_FP32", "dims": [1]}],
        "ensembleScheduling": {
            "step": [
                {
                    "modelName": step,
                    "modelVersion": "-1",
                    "inputMap": {"INPUT0": names[i]},
                    "outputMap": {"OUTPUT0": names[i + 1]},
                }
                for i, step in enumerate(steps)
            ]
        },
    }


def test_a_step_reloaded_alone_goes_live_through_its_ensemble(
    pod: Pod, triton_install: TritonInstall, tmp_path: Path
) -> None:
    log = tmp_path / "inits.log"
    log.touch()
    for name in ("first", "second"):
        pod.put(f"{name}/1/model.py", MODEL_PY.format(base=100))

    def chain(first_offset: int) -> list[ModelSpec]:
        return [
            ModelSpec(name="first", config=config(log, first_offset)),
            ModelSpec(name="second", config=config(log, 1)),
            ModelSpec(name="chain", config=ensemble(["first", "second"])),
        ]

    old, manifest = pod.revision(chain(1))
    pod.sync(old, manifest)
    server = start_server(triton_install, pod.models, ["first", "second", "chain"], tmp_path / "triton.log")
    try:
        new, manifest = pod.revision(chain(10))
        kind = rollout_kind(old, new)
        assert isinstance(kind, InPlace)
        assert kind.models_changed == ("first",) and kind.ensembles_affected == ("chain",)
        pod.sync(new, manifest)

        client = Client(server, "chain", input_name="X")
        reply = client.load_while_asking("first")
        assert reply.status_code == 200, reply.text
        assert client.failures == [], f"{client.failures}\n{server.log_tail()}"
        assert client.during_load, f"no request was in flight during the load: {client.answers}"
        # 0 + 100 + 1 (first) + 100 + 1 (second), then first's offset 10.
        assert client.answers[0] == 202.0 and client.answers[-3:] == [211.0] * 3
        assert set(client.answers) == {202.0, 211.0}
        assert sorted(inits(log)) == ["first 1", "first 1", "second 1"]  # second was not reloaded
        # Triton loads the ensemble again over its new step (its dependency graph), once.
        assert server.log().count("successfully loaded 'chain'") == 2, server.log_tail()
    finally:
        server.stop()
