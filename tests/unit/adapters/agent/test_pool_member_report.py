"""A pooled pod's agent with a fake tritonserver and no store (its per-model fetch stubbed): what it
loads and unloads per assignment, and its report (core.pool.assignment.parse_report reads it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from triton_operator.adapters.agent.model_control import LoadFailed
from triton_operator.adapters.agent.pool_member import PoolMember, parse_labels
from triton_operator.adapters.agent.runner import Agent, AgentOptions
from triton_operator.adapters.agent.status import POOL_PATH
from triton_operator.adapters.pool_reader import POOL_REPORT_PATH
from triton_operator.core.objects.names import inplace_config_key, inplace_manifest_key
from triton_operator.core.pod.agent_plan import RevisionFiles
from triton_operator.core.pool.assignment import (
    Copy,
    PodAssignment,
    Wanted,
    build_assignment,
    parse_report,
)
from triton_operator.core.repository.manifest import (
    Manifest,
    ManifestModel,
    StoreRef,
    VersionPolicy,
    manifest_to_json,
)
from triton_operator.core.vocabulary.triton_state import ModelVersionState

PY = 'name: "{m}"\nbackend: "python"\n'


@dataclass
class FakeTriton:
    url: str = "http://fake"
    loaded: dict[str, str] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    fail: set[str] = field(default_factory=set)
    up: bool = True

    def live(self) -> bool:
        return self.up

    def load(self, model: str) -> None:
        self.calls.append(f"load {model}")
        if model in self.fail:
            if self.loaded.get(model) != "READY":  # a failed reload leaves the old version serving
                self.loaded[model] = "UNAVAILABLE"
            raise LoadFailed("load", model, "refuses to load")
        self.loaded[model] = "READY"

    def unload(self, model: str) -> None:
        self.calls.append(f"unload {model}")
        self.loaded[model] = "UNAVAILABLE"

    def index(self) -> tuple[ModelVersionState, ...]:
        return tuple(ModelVersionState(m, "1", s, "") for m, s in sorted(self.loaded.items()))


def member_of(
    tmp_path: Path, triton: FakeTriton, monkeypatch: pytest.MonkeyPatch, inplace_dir: Path | None = None
) -> PoolMember:
    models = tuple(ManifestModel(m, m, VersionPolicy(), ("1",)) for m in ("a", "b"))
    base = RevisionFiles(
        "r1", Manifest(StoreRef("s3://bucket/repo"), models, ()), {m: PY.format(m=m) for m in ("a", "b")}
    )
    options = AgentOptions(
        dest=tmp_path / "models",
        state_dir=tmp_path / "state",
        base=base,
        triton=triton,  # type: ignore[arg-type]
        proc=tmp_path / "no-proc",
        inplace_dir=inplace_dir,
    )
    agent = Agent(options)
    fetched: list[str] = []

    def fetch(target: RevisionFiles, progress: Any, *, manifest: Manifest, **_: Any) -> None:
        fetched.extend(m.name for m in manifest.models)
        member.synced.append((target.revision, [m.name for m in manifest.models]))  # type: ignore[attr-defined]
        for m in manifest.models:
            (options.dest / m.name / "1").mkdir(parents=True, exist_ok=True)

    monkeypatch.setattr(agent, "_sync", fetch)
    member = PoolMember(agent, tmp_path / "pool-models")
    member.fetched = fetched  # type: ignore[attr-defined]
    member.synced = []  # type: ignore[attr-defined]
    return member


def assign(member: PoolMember, **models: tuple[str, int]) -> None:
    wanted = {m: Wanted(v, a) for m, (v, a) in models.items()}
    member.assignment_file.write_text(build_assignment(PodAssignment(models=wanted)))
    member.tick()


def report(member: PoolMember) -> dict[str, Copy]:
    return parse_report(member.report())


def test_it_loads_what_is_assigned_unloads_what_left_and_never_retries_by_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    triton = FakeTriton(fail={"b"})
    member = member_of(tmp_path, triton, monkeypatch)
    member.tick()
    assert not member.ready().ready and triton.calls == []  # no assignment read yet
    assign(member, a=("va", 1), b=("vb", 1))
    assert member.fetched == ["a", "b"]  # type: ignore[attr-defined]
    assert report(member) == {
        "a": Copy("READY", "va", 1, ""),
        "b": Copy("UNAVAILABLE", "vb", 1, "load of model 'b' failed: refuses to load"),
    }
    assert member.ready().ready  # live and the assignment read, whatever the models' states
    for _ in range(3):
        member.tick()
    assert triton.calls == ["load a", "load b"]  # the failure is not tried again by the agent
    assign(member, b=("vb", 2))
    assert triton.calls == ["load a", "load b", "unload a", "load b"]
    assert set(report(member)) == {"b"} and report(member)["b"].attempt == 2


def test_a_failed_reload_reports_the_old_version_ready_with_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    triton = FakeTriton()
    member = member_of(tmp_path, triton, monkeypatch)
    assign(member, a=("v1", 1))
    triton.fail.add("a")
    assign(member, a=("v2", 1))
    assert report(member) == {"a": Copy("READY", "v1", 1, "load of model 'a' failed: refuses to load")}


def test_a_model_the_revision_lacks_and_a_bad_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    triton = FakeTriton()
    member = member_of(tmp_path, triton, monkeypatch)
    assign(member, a=("v1", 1), zz=("v1", 1))
    zz = report(member)["zz"]
    assert zz.state == "UNAVAILABLE" and "has no model 'zz'" in zz.error
    member.assignment_file.write_text('{"models": {"a": {"version": "v1", "attempt": 0}}}')
    member.tick()
    assert "attempt: must be 1 or more" in member.message
    assert set(report(member)) == {"a", "zz"}  # the last assignment read stands
    assert triton.calls == ["load a"]


def test_a_model_tritonserver_lost_is_loaded_again_and_an_unassigned_ones_files_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    triton = FakeTriton()
    member = member_of(tmp_path, triton, monkeypatch)
    assign(member, a=("v1", 1), b=("v1", 1))
    assert (tmp_path / "models/a/1").is_dir() and (tmp_path / "models/b/1").is_dir()
    triton.loaded.clear()  # tritonserver restarted: it starts with no model
    member.tick()
    assert triton.calls == ["load a", "load b", "load a", "load b"]
    assert report(member) == {"a": Copy("READY", "v1", 1, ""), "b": Copy("READY", "v1", 1, "")}
    member.tick()
    assert len(triton.calls) == 4  # READY again: nothing to do
    assign(member, b=("v1", 1))
    assert triton.calls[-1] == "unload a"
    assert not (tmp_path / "models/a").exists() and (tmp_path / "models/b/1").is_dir()


def test_a_model_named_at_another_revision_is_fetched_from_that_revisions_files_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change in place: the entry names revision r2 (in the in-place volume), whose config of `a`
    differs; only `a` is fetched from r2 and loaded, `b` stays as it was; until the kubelet shows r2,
    nothing is done."""
    inplace = tmp_path / "inplace"
    inplace.mkdir()
    triton = FakeTriton()
    member = member_of(tmp_path, triton, monkeypatch, inplace_dir=inplace)
    assign(member, a=("v1", 1), b=("v1", 1))
    member.assignment_file.write_text(
        build_assignment(PodAssignment(models={"a": Wanted("v2", 1, "r2"), "b": Wanted("v1", 1)}))
    )
    member.tick()
    assert triton.calls == ["load a", "load b"] and "not in the in-place volume yet" in member.message
    assert report(member)["a"] == Copy("READY", "v1", 1, "")  # still the old version, serving
    models = tuple(ManifestModel(m, m, VersionPolicy(), ("1",)) for m in ("a", "b"))
    (inplace / inplace_manifest_key("r2")).write_text(
        manifest_to_json(Manifest(StoreRef("s3://bucket/repo"), models, ()))
    )
    for m in ("a", "b"):
        config = PY.format(m=m) + ("max_batch_size: 8\n" if m == "a" else "")
        (inplace / inplace_config_key("r2", m)).write_text(config)
    member.tick()
    assert triton.calls == ["load a", "load b", "load a"]
    assert member.synced[-1] == ("r2", ["a"])  # type: ignore[attr-defined]
    assert "max_batch_size: 8" in member.agent.state.configs("r2").joinpath("a", "config.pbtxt").read_text()
    assert report(member) == {"a": Copy("READY", "v2", 1, ""), "b": Copy("READY", "v1", 1, "")}
    member.tick()
    assert len(triton.calls) == 3  # settled: nothing reloads


def test_the_agent_serves_its_report_where_the_operator_reads_it() -> None:
    assert POOL_PATH == POOL_REPORT_PATH == "/v1/pool"


def test_a_new_pod_is_ready_only_once_it_holds_the_first_assignment_the_operator_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    triton = FakeTriton()
    member = member_of(tmp_path, triton, monkeypatch)
    member.assignment_file.write_text("")  # the kubelet's file while the pod has no annotation yet
    member.tick()
    assert not member.ready().ready
    assert member.ready().reason == "no assignment from the operator yet"
    seen: list[tuple[str, bool]] = []
    load = triton.load

    def load_and_look(model: str) -> None:  # readiness asked while a model of the first fill loads
        member._refresh()
        seen.append((model, member.ready().ready))
        load(model)

    monkeypatch.setattr(triton, "load", load_and_look)
    assign(member, a=("va", 1), b=("vb", 1))
    assert seen == [("a", False), ("b", False)]
    assert member.ready().ready and report(member)["b"].state == "READY"


def test_after_its_first_fill_a_pod_stays_ready_while_it_loads_more_but_not_once_tritonserver_lost_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    triton = FakeTriton(fail={"b"})
    member = member_of(tmp_path, triton, monkeypatch)
    assign(member, b=("vb", 1))
    assert member.ready().ready  # its one model failed: settled (the operator asks again)
    triton.fail.clear()
    seen: list[bool] = []
    load = triton.load

    def load_and_look(model: str) -> None:
        seen.append(member.ready().ready)
        load(model)

    monkeypatch.setattr(triton, "load", load_and_look)
    assign(member, a=("va", 1), b=("vb", 2))
    assert seen == [True, True] and member.ready().ready  # the pod serves its other models meanwhile
    monkeypatch.setattr(triton, "load", load)
    triton.loaded.clear()  # tritonserver restarted with no model
    member._refresh()
    assert not member.ready().ready
    assert member.ready().reason == "tritonserver lost models it held READY: a, b"
    member.tick()  # the agent loads them again
    assert member.ready().ready


def test_a_new_pod_is_ready_only_once_its_models_are_on_their_routes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    triton = FakeTriton(fail={"b"})
    member = member_of(tmp_path, triton, monkeypatch)
    assert member.labels_file == tmp_path / "pool-labels"  # beside the assignment, in the same payload
    member.labels_file.write_text('app="triton"\ntriton-operator.io/service="pool"\n')
    assign(member, a=("va", 1), b=("vb", 1))
    assert not member.ready().ready
    assert member.ready().reason == "waiting for its route labels: a"  # b failed: nothing to route
    member.labels_file.write_text('app="triton"\nmodel.triton-operator.io/a="ready"\n')
    assert member.ready().ready
    member.labels_file.write_text('app="triton"\n')  # a label taken off later (a move): still Ready
    assert member.ready().ready
    assert parse_labels('a="1"\nb.io/c="x=y"\n') == {"a": "1", "b.io/c": "x=y"}
