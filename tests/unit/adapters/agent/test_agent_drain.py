"""The sidecar's order for a change, with a fake tritonserver: fetched while serving, out of the
Service (readiness false, state Draining) for --drain-seconds, every changed model unloaded (and seen
unloaded) before any is loaded, back in only once every model is READY; a failed load keeps the pod
out until a revision loads whole."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from triton_operator.adapters.agent.model_control import LoadFailed
from triton_operator.adapters.agent.runner import Agent, AgentOptions
from triton_operator.adapters.sync.results import SyncError
from triton_operator.core.pod.agent_plan import RevisionFiles
from triton_operator.core.repository.manifest import Manifest, ManifestModel, StoreRef, VersionPolicy
from triton_operator.core.vocabulary.triton_state import ModelVersionState

PY = 'name: "{m}"\nbackend: "python"\nparameters {{ key: "offset" value {{ string_value: "{o}" }} }}\n'


def revision(name: str, offset: int) -> RevisionFiles:
    models = tuple(ManifestModel(m, m, VersionPolicy(), ("1",)) for m in ("adder", "other"))
    configs = {"adder": PY.format(m="adder", o=offset), "other": PY.format(m="other", o=0)}
    return RevisionFiles(name, Manifest(StoreRef("s3://bucket/repo"), models, ()), configs)


@dataclass
class FakeTriton:
    """Triton's model control: load, unload (in the background: UNLOADING for one index read), index."""

    url: str = "http://fake"
    timeout: float = 1.0
    load_timeout: float = 5.0
    loaded: dict[str, str] = field(default_factory=lambda: {"adder": "READY", "other": "READY"})
    calls: list[str] = field(default_factory=list)
    fail: set[str] = field(default_factory=set)
    agent: Agent | None = None
    readiness_at_calls: list[bool] = field(default_factory=list)

    def live(self) -> bool:
        return True

    def _seen(self, what: str) -> None:
        self.calls.append(what)
        assert self.agent is not None
        self.agent.check()
        self.readiness_at_calls.append(self.agent.ready().ready)

    def unload(self, model: str) -> None:
        self._seen(f"unload {model}")
        self.loaded[model] = "UNLOADING"

    def load(self, model: str) -> None:
        assert self.loaded.get(model) != "UNLOADING", f"load of {model} over a model still unloading"
        self._seen(f"load {model}")
        if model in self.fail:
            self.loaded[model] = "UNAVAILABLE"
            raise LoadFailed("load", model, "refuses to load")
        self.loaded[model] = "READY"

    def index(self) -> tuple[ModelVersionState, ...]:
        self.calls.append("index")
        out = tuple(ModelVersionState(m, "1", s, "") for m, s in sorted(self.loaded.items()))
        for m, s in list(self.loaded.items()):
            if s == "UNLOADING":
                self.loaded[m] = "UNAVAILABLE"  # finished in the background, seen at the next read
        return out

    def ready(self, model: str, version: str = "") -> bool:
        return self.loaded.get(model) == "READY"


def agent_of(tmp_path: Path, triton: FakeTriton, waits: list[float], drain: float = 7.0) -> Agent:
    def wait(seconds: float) -> None:
        waits.append(seconds)
        if drain < 1:
            time.sleep(seconds)

    options = AgentOptions(
        dest=tmp_path / "models",
        state_dir=tmp_path / "state",
        base=revision("r1", 0),
        inplace_dir=None,
        target_file=None,
        triton=triton,  # type: ignore[arg-type]
        drain_seconds=drain,
        wait=wait,
        proc=tmp_path / "no-proc",
    )
    agent = Agent(options)
    triton.agent = agent
    return agent


def go(agent: Agent, target: RevisionFiles) -> None:
    """What a pass of the sidecar does once the target changed (Agent.tick, the target resolved)."""
    agent.target = target.revision
    agent.apply(target)


def test_out_of_the_service_then_unloads_then_loads_then_back(tmp_path: Path) -> None:
    triton, waits = FakeTriton(), list[float]()
    agent = agent_of(tmp_agent := tmp_path, triton, waits)
    agent.once()  # the init container: r1 recorded
    agent = agent_of(tmp_agent, triton, waits)  # the sidecar
    assert agent.check().ready and agent.ready().ready
    triton.calls.clear()

    go(agent, revision("r2", 10))
    assert waits and 0 < waits[0] <= 7.0  # the drain (from the fetch's start), before anything was touched
    touched = [c for c in triton.calls if c != "index"]
    assert touched == ["unload adder", "load adder"]
    # the index was read after the unload and before the load: the unload seen done
    assert triton.calls.index("unload adder") < triton.calls.index("index") < triton.calls.index("load adder")
    assert triton.readiness_at_calls == [False, False]  # out of the Service at every call
    assert agent.status()["state"] == "Applied" and agent.status()["revision"] == "r2"
    # Back at once: the probe's answer is checked when the change is applied, not at the next round.
    assert agent.ready().ready and agent.ready().revision == "r2"
    assert agent.check().ready and agent.ready().revision == "r2"


def test_a_failed_load_keeps_the_pod_out_until_the_old_revision_is_back(tmp_path: Path) -> None:
    triton, waits = FakeTriton(), list[float]()
    agent_of(tmp_path, triton, waits).once()
    agent = agent_of(tmp_path, triton, waits, drain=0.3)  # a real wait here
    triton.fail = {"adder"}
    go(agent, revision("r2", 10))
    assert agent.status()["state"] == "Failed"
    assert not agent.check().ready
    assert "r2 failed to load" in agent.ready().reason
    first = len(waits)
    assert first <= 1  # (none when its fetch took longer than the drain: the drain ran during it)

    triton.fail = set()
    go(agent, revision("r1", 0))  # the rollback
    assert len(waits) == first  # out since the failure: no second wait
    assert agent.status()["state"] == "Applied" and agent.check().ready
    assert agent.ready().revision == "r1"


def test_a_pod_of_the_one_shape_drains_for_a_change_as_an_in_place_pod_does(tmp_path: Path) -> None:
    """The agent filled the pod itself (--triton-starts-empty: tritonserver started with no model,
    every model loaded by the agent); a change after that is drained, unloaded and loaded exactly as
    in a pod whose init container synced it."""
    triton, waits = FakeTriton(loaded={}), list[float]()
    agent = agent_of(tmp_path, triton, waits)
    agent.options = dataclasses.replace(agent.options, fills=True)
    go(agent, revision("r1", 0))  # the first fill: no drain, each model loaded
    assert waits == [] and sorted(c for c in triton.calls if c.startswith("load")) == [
        "load adder",
        "load other",
    ]
    assert agent.status()["state"] == "Applied" and agent.check().ready and agent.ready().ready
    triton.calls.clear()
    triton.readiness_at_calls.clear()

    go(agent, revision("r2", 10))
    assert waits and 0 < waits[0] <= 7.0  # the drain (from the fetch's start), before anything was touched
    assert [c for c in triton.calls if c != "index"] == ["unload adder", "load adder"]
    assert triton.readiness_at_calls == [False, False]  # out of the Service at every call
    assert agent.check().ready and agent.ready().revision == "r2"


def test_out_of_the_service_from_the_fetch_on_so_the_drain_runs_while_the_bytes_come_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Readiness goes false when the change begins, not once its last byte is in: the kubelet's probe
    and drainSeconds run during the fetch, and only what is left of them is waited after it."""
    triton, waits = FakeTriton(), list[float]()
    agent_of(tmp_path, triton, waits).once()
    agent = agent_of(tmp_path, triton, waits)  # waits recorded, not waited
    seen: list[tuple[bool, str]] = []
    sync = agent._sync

    def slow_sync(target: RevisionFiles, progress: object, **kw: object) -> object:
        agent.check()
        seen.append((agent.ready().ready, agent.status()["state"]))
        stats = sync(target, None)
        time.sleep(1.0)  # the bytes coming in
        return stats

    monkeypatch.setattr(agent, "_sync", slow_sync)
    go(agent, revision("r2", 10))
    assert seen == [(False, "Draining")]  # out of the Service while it fetched
    assert len(waits) == 1 and waits[0] <= 7.0 - 1.0  # only the rest of the drain after the fetch
    assert [c for c in triton.calls if c.startswith(("load", "unload"))] == ["unload adder", "load adder"]
    assert triton.readiness_at_calls == [False, False]
    assert agent.status()["state"] == "Applied" and agent.check().ready and agent.ready().revision == "r2"


def test_a_fetch_that_fails_puts_the_pod_back_in_the_service_serving_what_it_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    triton, waits = FakeTriton(), list[float]()
    agent_of(tmp_path, triton, waits).once()
    agent = agent_of(tmp_path, triton, waits)

    def failing_sync(target: RevisionFiles, progress: object, **kw: object) -> object:
        assert not agent.check().ready  # out while it fetched
        raise SyncError("the store refused: 403")

    monkeypatch.setattr(agent, "_sync", failing_sync)
    go(agent, revision("r2", 10))
    assert agent.status()["state"] == "Failed" and "403" in agent.status()["message"]
    assert waits == [] and not [c for c in triton.calls if c.startswith(("load", "unload"))]
    assert agent.check().ready and agent.ready().revision == "r1"  # back in, nothing was unloaded
