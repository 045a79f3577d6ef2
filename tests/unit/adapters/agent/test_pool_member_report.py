"""A pooled pod's agent with a fake tritonserver and no store (its per-model fetch stubbed): what it
loads and unloads per assignment, and its report (core.pool.assignment.parse_report reads it)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from triton_operator.adapters.agent import pool_member
from triton_operator.adapters.agent.model_control import LoadFailed, TritonUnreachable
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
    parse_assignment,
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
    tmp_path: Path,
    triton: FakeTriton,
    monkeypatch: pytest.MonkeyPatch,
    *,
    inplace_dir: Path | None = None,
    names: tuple[str, ...] = ("a", "b"),
    config: str = PY,
) -> PoolMember:
    models = tuple(ManifestModel(m, m, VersionPolicy(), ("1",)) for m in names)
    base = RevisionFiles(
        "r1", Manifest(StoreRef("s3://bucket/repo"), models, ()), {m: config.format(m=m) for m in names}
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


def runs(calls: list[str]) -> list[str]:
    """``calls`` with each run of loads in a row sorted: a pass loads its models together, in any
    order (the unloads before them stay where they are)."""
    out: list[str] = []
    run: list[str] = []
    for call in [*calls, ""]:
        if call.startswith("load "):
            run.append(call)
            continue
        out += sorted(run) + ([call] if call else [])
        run = []
    return out


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
    assert runs(triton.calls) == runs(["load a", "load b"])  # the failure is not tried again by the agent
    assign(member, b=("vb", 2))
    assert runs(triton.calls) == runs(["load a", "load b", "unload a", "load b"])
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
    assert runs(triton.calls) == runs(["load a", "load b", "load a", "load b"])
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
    assert runs(triton.calls) == runs(["load a", "load b"])
    assert "not in the in-place volume yet" in member.message
    assert report(member)["a"] == Copy("READY", "v1", 1, "")  # still the old version, serving
    models = tuple(ManifestModel(m, m, VersionPolicy(), ("1",)) for m in ("a", "b"))
    (inplace / inplace_manifest_key("r2")).write_text(
        manifest_to_json(Manifest(StoreRef("s3://bucket/repo"), models, ()))
    )
    for m in ("a", "b"):
        config = PY.format(m=m) + ("max_batch_size: 8\n" if m == "a" else "")
        (inplace / inplace_config_key("r2", m)).write_text(config)
    member.tick()
    assert runs(triton.calls) == runs(["load a", "load b", "load a"])
    assert member.synced[-1] == ("r2", ["a"])  # type: ignore[attr-defined]
    assert "max_batch_size: 8" in member.agent.state.configs("r2").joinpath("a", "config.pbtxt").read_text()
    assert report(member) == {"a": Copy("READY", "v2", 1, ""), "b": Copy("READY", "v1", 1, "")}
    member.tick()
    assert len(triton.calls) == 3  # settled: nothing reloads


def test_an_entry_whose_revisions_files_never_come_is_said_once_in_the_log_and_in_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`a` (held at v1) and `c` (new) named at revision r2, whose files the in-place volume never shows:
    quiet for FILES_WAIT_SECONDS (the kubelet shows a ConfigMap late), then one warning each naming the
    model, the revision and the path looked at, and the report's copies say it (`a` still READY at v1,
    `c` UNAVAILABLE at its entry's version); once r2's files are there, loaded and no longer waiting."""
    monkeypatch.setattr(pool_member, "FILES_WAIT_SECONDS", 0.3)
    inplace = tmp_path / "inplace"
    inplace.mkdir()
    triton = FakeTriton()
    member = member_of(tmp_path, triton, monkeypatch, inplace_dir=inplace, names=("a", "b", "c"))
    assign(member, a=("v1", 1), b=("v1", 1))
    entries = {"a": Wanted("v2", 1, "r2"), "b": Wanted("v1", 1), "c": Wanted("v2", 3, "r2")}
    member.assignment_file.write_text(build_assignment(PodAssignment(models=entries)))
    with caplog.at_level("WARNING", logger="triton_operator.agent"):
        member.tick()
        assert report(member) == {"a": Copy("READY", "v1", 1, ""), "b": Copy("READY", "v1", 1, "")}
        assert not caplog.records  # not yet: the kubelet may show it a little later
        time.sleep(0.35)
        member.tick()
        member.tick()
    expected = (
        f"waits for revision r2's files, not in the in-place volume ({inplace / inplace_manifest_key('r2')} "
        f"and its configs) nor in the agent's own copy ({tmp_path / 'state' / 'revisions' / 'r2'}) after 0.3s"
    )
    assert [r.getMessage() for r in caplog.records] == [  # once each, not every pass
        f"pool: model a (version v2): {expected}",
        f"pool: model c (version v2): {expected}",
    ]
    assert report(member) == {
        "a": Copy("READY", "v1", 1, "", waiting=expected),  # Triton still serves v1
        "b": Copy("READY", "v1", 1, ""),
        "c": Copy("UNAVAILABLE", "v2", 3, "", waiting=expected),
    }
    assert member.report()["models"]["b"] == {"state": "READY", "version": "v1", "attempt": 1, "error": ""}
    models = tuple(ManifestModel(m, m, VersionPolicy(), ("1",)) for m in ("a", "b", "c"))
    (inplace / inplace_manifest_key("r2")).write_text(
        manifest_to_json(Manifest(StoreRef("s3://bucket/repo"), models, ()))
    )
    for m in ("a", "b", "c"):
        (inplace / inplace_config_key("r2", m)).write_text(PY.format(m=m))
    member.tick()
    assert report(member) == {
        "a": Copy("READY", "v2", 1, ""),
        "b": Copy("READY", "v1", 1, ""),
        "c": Copy("READY", "v2", 3, ""),
    }


def test_an_entry_that_stops_naming_the_missing_revision_is_no_longer_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool_member, "FILES_WAIT_SECONDS", 0.0)
    inplace = tmp_path / "inplace"
    inplace.mkdir()
    triton = FakeTriton()
    member = member_of(tmp_path, triton, monkeypatch, inplace_dir=inplace)
    member.assignment_file.write_text(build_assignment(PodAssignment(models={"a": Wanted("v2", 1, "r2")})))
    member.tick()
    assert "waits for revision r2's files" in report(member)["a"].waiting
    assign(member, a=("v1", 1))  # the operator names the pod's own revision again (an abort)
    assert report(member) == {"a": Copy("READY", "v1", 1, "")}


def test_a_model_named_at_a_revision_gone_from_the_in_place_volume_loads_again_after_restarts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`a` at v2 from revision r2 (a change in place, completed); later r2 leaves the in-place volume (the
    ConfigMap carries only the served revision and the one in progress) while the entry still names it.
    tritonserver restarting, then the agent itself restarting (the sidecar, with the same emptyDirs),
    each loads `a` again at v2 from r2's files as the agent saved them at its first load: no stall."""
    inplace = tmp_path / "inplace"
    inplace.mkdir()
    triton = FakeTriton()
    member = member_of(tmp_path, triton, monkeypatch, inplace_dir=inplace)
    models = tuple(ManifestModel(m, m, VersionPolicy(), ("1",)) for m in ("a", "b"))
    (inplace / inplace_manifest_key("r2")).write_text(
        manifest_to_json(Manifest(StoreRef("s3://bucket/repo"), models, ()))
    )
    for m in ("a", "b"):
        (inplace / inplace_config_key("r2", m)).write_text(
            PY.format(m=m) + ("max_batch_size: 8\n" if m == "a" else "")
        )
    text = build_assignment(PodAssignment(models={"a": Wanted("v2", 1, "r2"), "b": Wanted("v1", 1)}))
    member.assignment_file.write_text(text)
    member.tick()
    assert report(member) == {"a": Copy("READY", "v2", 1, ""), "b": Copy("READY", "v1", 1, "")}
    for key in (inplace_manifest_key("r2"), *(inplace_config_key("r2", m) for m in ("a", "b"))):
        (inplace / key).unlink()  # r2 left the in-place ConfigMap; the entry still names it
    triton.loaded.clear()  # tritonserver restarted: it starts with no model
    member.tick()
    assert runs(triton.calls) == runs(["load a", "load b", "load a", "load b"])
    assert member.ready().ready and report(member)["a"] == Copy("READY", "v2", 1, "")
    # the agent restarted too (a new process: nothing of r2 in memory), tritonserver with no model
    triton.loaded.clear()
    again = member_of(tmp_path, triton, monkeypatch, inplace_dir=inplace)
    again.tick()
    assert "not in the in-place volume" not in again.message, again.message
    assert ("r2", ["a"]) in again.synced  # type: ignore[attr-defined]
    assert report(again) == {"a": Copy("READY", "v2", 1, ""), "b": Copy("READY", "v1", 1, "")}
    assert again.ready().ready


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
    assert sorted(seen) == [("a", False), ("b", False)]  # loaded together
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


def test_tritonserver_dying_under_a_load_is_no_failed_load_and_the_model_loads_once_it_is_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash loop: tritonserver restarted with no model, killed again while the agent loads `a` back
    (and while it loads `c`, new). Neither is a failed load (no error reported, so the operator neither
    backs off nor sees an attempt to raise), the pod is not Ready while `a` is not loaded (it would be,
    its route label on, had the dead load counted as failed), and once tritonserver is back both load."""
    monkeypatch.setattr(pool_member, "REPAIR_SECONDS", 0.0)
    triton = FakeTriton()
    member = member_of(tmp_path, triton, monkeypatch, names=("a", "b", "c"))
    assign(member, a=("va", 1), b=("vb", 1))
    assert member.ready().ready
    load = triton.load

    def dies(model: str) -> None:
        triton.up = False
        triton.loaded.clear()
        raise TritonUnreachable(f"http://fake/v2/repository/models/{model}/load: connection reset")

    monkeypatch.setattr(triton, "load", dies)
    triton.loaded.clear()  # restarted with no model; killed again under the repair's first load
    member.tick()
    assert all(c.error == "" for c in report(member).values()), report(member)
    assert not member.ready().ready
    triton.up = True
    member.assignment_file.write_text(
        build_assignment(PodAssignment(models={m: Wanted(f"v{m}", 1) for m in ("a", "b", "c")}))
    )
    member.tick()  # `c`, new, loads into a tritonserver that dies under it too
    assert "c" not in member.held or report(member)["c"].error == ""
    assert not member.ready().ready
    triton.up = True
    monkeypatch.setattr(triton, "load", load)
    member.tick()
    member.tick()
    assert report(member) == {m: Copy("READY", f"v{m}", 1, "") for m in ("a", "b", "c")}
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


PY_CPU = PY + "instance_group [\n  {{\n    count: 1\n    kind: KIND_CPU\n  }}\n]\n"


@dataclass
class BlockingTriton(FakeTriton):
    """A tritonserver whose loads wait until ``go`` is set or their model is let through (``let``);
    ``loading``: what loads now, ``together``: what loaded at each load's start, ``rss``: its resident
    memory (each load adds 10 MiB once it answers)."""

    go: threading.Event = field(default_factory=threading.Event)
    gates: dict[str, threading.Event] = field(default_factory=dict)
    loading: set[str] = field(default_factory=set)
    together: list[set[str]] = field(default_factory=list)
    rss: int = 100 << 20
    lock: threading.Lock = field(default_factory=threading.Lock)

    def load(self, model: str) -> None:
        with self.lock:
            self.loading.add(model)
            self.together.append(set(self.loading))
            gate = self.gates.setdefault(model, threading.Event())
        deadline = time.monotonic() + 10
        while not (self.go.is_set() or gate.is_set()):
            assert time.monotonic() < deadline, f"load of {model} never let through"
            time.sleep(0.01)
        with self.lock:
            self.loading.discard(model)
            self.rss += 10 << 20
        super().load(model)

    def let(self, model: str) -> None:
        with self.lock:
            self.gates.setdefault(model, threading.Event()).set()

    def wait_for(self, loading: set[str]) -> None:
        deadline = time.monotonic() + 10
        while self.loading != loading and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.loading == loading


def measure_from(member: PoolMember, triton: BlockingTriton, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's memory reading: tritonserver's RSS, and 1 MiB of stubs per model loaded."""
    monkeypatch.setattr(
        member,
        "_memory",
        lambda model: (triton.rss, (1 << 20) if triton.loaded.get(model) == "READY" else 0),
    )


def test_measured_models_load_together_and_one_still_to_measure_loads_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """b and c (status.pool keeps their memory: measured) load at once, both reported LOADING while
    they do; a (never measured) loads with nothing beside it, and its figure is its own growth (10 MiB)
    and its stubs (1 MiB); b and c, loaded together, report none (status.pool's figure stands)."""
    triton = BlockingTriton()
    member = member_of(tmp_path, triton, monkeypatch, names=("a", "b", "c"), config=PY_CPU)
    measure_from(member, triton, monkeypatch)
    entries = {"a": Wanted("va"), "b": Wanted("vb", measured=True), "c": Wanted("vc", measured=True)}
    member.assignment_file.write_text(build_assignment(PodAssignment(models=entries)))
    assert '"measured":true' in member.assignment_file.read_text()
    assert parse_assignment(member.assignment_file.read_text()).models == entries
    passing = threading.Thread(target=member.tick)
    passing.start()
    triton.wait_for({"a"})
    time.sleep(0.2)  # b and c would have started by now, if they could beside a
    assert triton.loading == {"a"} and report(member)["a"].state == "LOADING"
    triton.let("a")
    triton.wait_for({"b", "c"})  # both asked of tritonserver at once
    assert {m: c.state for m, c in report(member).items()} == {"a": "READY", "b": "LOADING", "c": "LOADING"}
    triton.go.set()
    passing.join(10)
    assert triton.together[0] == {"a"} and triton.together[2] == {"b", "c"}
    assert report(member) == {
        "a": Copy("READY", "va", 1, "", memory=11 << 20),
        "b": Copy("READY", "vb", 1, ""),
        "c": Copy("READY", "vc", 1, ""),
    }


def test_two_loads_in_flight_are_both_reported_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    triton = BlockingTriton()
    member = member_of(tmp_path, triton, monkeypatch, names=("a", "b"), config=PY_CPU)
    measure_from(member, triton, monkeypatch)
    member.assignment_file.write_text(
        build_assignment(PodAssignment(models={m: Wanted("v", measured=True) for m in ("a", "b")}))
    )
    passing = threading.Thread(target=member.tick)
    passing.start()
    triton.wait_for({"a", "b"})  # both asked of tritonserver at once
    assert {m: c.state for m, c in report(member).items()} == {"a": "LOADING", "b": "LOADING"}
    assert not member.ready().ready  # its first fill: not ready while they load
    triton.go.set()
    passing.join(10)
    assert not passing.is_alive() and member.acting == set()
    assert {m: c.state for m, c in report(member).items()} == {"a": "READY", "b": "READY"}
    assert member.ready().ready


def test_a_model_this_agent_measured_reloads_beside_another_keeping_its_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model measured here (its first load, alone) reloads at its next version beside another
    (measured, per the operator): tritonserver grew by both loads meanwhile (20 MiB), which is neither
    model's; the figure measured alone stands, and the other reports none."""
    triton = BlockingTriton()
    member = member_of(tmp_path, triton, monkeypatch, names=("a", "b"), config=PY_CPU)
    measure_from(member, triton, monkeypatch)
    triton.let("a")
    assign(member, a=("v1", 1))
    assert report(member)["a"].memory == 11 << 20
    entries = {"a": Wanted("v2"), "b": Wanted("v1", measured=True)}
    member.assignment_file.write_text(build_assignment(PodAssignment(models=entries)))
    triton.gates.clear()
    passing = threading.Thread(target=member.tick)
    passing.start()
    triton.wait_for({"a", "b"})
    triton.go.set()
    passing.join(10)
    assert report(member) == {
        "a": Copy("READY", "v2", 1, "", memory=11 << 20),
        "b": Copy("READY", "v1", 1, ""),
    }


def test_a_reload_alone_is_not_measured_its_first_loads_figure_stands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model READY here reloads at its next version with nothing beside it: tritonserver holds both
    versions and both stubs until the new one is in (here 2 MiB of stubs and 10 MiB of growth), so the
    reload's growth is not one copy's memory: the figure of its first load (11 MiB) stands. Measured
    as one copy's, a reload's figure grew the model in placement and moved its copy off a full pod."""
    triton = BlockingTriton()
    member = member_of(tmp_path, triton, monkeypatch, names=("a",), config=PY_CPU)
    measure_from(member, triton, monkeypatch)
    triton.let("a")
    assign(member, a=("v1", 1))
    assert report(member)["a"].memory == 11 << 20
    monkeypatch.setattr(member, "_memory", lambda model: (triton.rss, 2 << 20))  # the old and new stubs
    assign(member, a=("v2", 1))
    assert triton.together[-1] == {"a"}  # alone: nothing overlapped it
    assert report(member) == {"a": Copy("READY", "v2", 1, "", memory=11 << 20)}


ENSEMBLE = """name: "ens"
platform: "ensemble"
ensemble_scheduling {
  step [
    {
      model_name: "step"
      model_version: -1
    }
  ]
}
"""


def test_an_ensemble_loads_alone_after_the_loads_of_its_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ens (an ensemble of step) sorts first, but loads last and with nothing beside it: its step is
    loaded by then; the other two load together."""
    triton = BlockingTriton()
    member = member_of(tmp_path, triton, monkeypatch, names=("ens", "other", "step"))
    member.agent.options.base.configs["ens"] = ENSEMBLE  # type: ignore[index]
    passing = threading.Thread(target=lambda: assign(member, ens=("v", 1), other=("v", 1), step=("v", 1)))
    passing.start()
    triton.wait_for({"other", "step"})
    triton.go.set()
    passing.join(10)
    assert triton.together[-1] == {"ens"} and triton.calls[-1] == "load ens"
    assert {m: c.state for m, c in report(member).items()} == dict.fromkeys(("ens", "other", "step"), "READY")
