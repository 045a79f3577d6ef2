"""core.pod.agent_plan: the revision a pod's agent serves, and the steps from the one it has to it."""

from __future__ import annotations

import doctest
import hashlib
from collections.abc import Mapping
from typing import Any

import pytest

from triton_operator.core.pod import agent_plan
from triton_operator.core.pod.agent_plan import (
    APPLIED,
    APPLYING,
    FAILED,
    InPlaceState,
    Record,
    RevisionFiles,
    Steps,
    ensemble_steps,
    fill_order,
    load_order,
    model_states,
    parse_inplace_state,
    plan,
    python_models,
    readiness,
    resolve_target,
    revision_keys,
    revisions_named,
    status_of,
    went_back,
)
from triton_operator.core.repository.manifest import (
    Manifest,
    ManifestEntry,
    ManifestModel,
    StoreRef,
    VersionPolicy,
)
from triton_operator.core.spec.modelconfig import build_config_pbtxt
from triton_operator.core.vocabulary.triton_state import ModelVersionState

Files = Mapping[str, Mapping[str, bytes]]  # model -> path under the model folder -> bytes


def _python(**extra: Any) -> dict[str, Any]:
    vector = {"dataType": "TYPE_FP32", "dims": [1]}
    return {
        "backend": "python",
        "maxBatchSize": 8,
        "input": [{"name": "INPUT0", **vector}],
        "output": [{"name": "OUTPUT0", **vector}],
        "instanceGroup": [{"kind": "KIND_CPU", "count": 1}],
        **extra,
    }


def _ensemble(*steps: str) -> dict[str, Any]:
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


def revision(name: str, files: Files, configs: Mapping[str, dict[str, Any]]) -> RevisionFiles:
    """A revision serving ``files`` (an ensemble: no files, version 1) with the rendered ``configs``."""
    entries, models = [], []
    for model in sorted(configs):
        objects = files.get(model, {})
        versions = sorted({p.split("/", 1)[0] for p in objects if "/" in p} or {"1"})
        models.append(ManifestModel(model, model, VersionPolicy(), tuple(versions)))
        for path, data in sorted(objects.items()):
            digest = hashlib.sha256(data).hexdigest()
            entries.append(
                ManifestEntry(
                    f"repo/{model}/{path}", f"{model}/{path}", len(data), "sha256", digest, digest[:8]
                )
            )
    manifest = Manifest(StoreRef("s3://bucket/repo"), tuple(models), tuple(entries))
    return RevisionFiles(name, manifest, {m: build_config_pbtxt(m, c) for m, c in configs.items()})


FILES: dict[str, dict[str, bytes]] = {
    "adder": {"1/model.py": b"add v1"},
    "other": {"1/model.py": b"other v1", "labels.txt": b"a\nb\n"},
    "first": {"1/model.py": b"first v1"},
    "second": {"1/model.py": b"second v1"},
}
CONFIGS: dict[str, dict[str, Any]] = {
    "adder": _python(),
    "other": _python(),
    "first": _python(),
    "second": _python(),
    "chain": _ensemble("first", "second"),
}
OLD = revision("r1", FILES, CONFIGS)


def _new(files: Files | None = None, **configs: dict[str, Any] | None) -> RevisionFiles:
    merged = {**CONFIGS, **configs}
    return revision("r2", {**FILES, **(files or {})}, {k: v for k, v in merged.items() if v is not None})


def _summary(steps: Steps) -> dict[str, Any]:
    return {
        "fetch": [e.dest for e in steps.fetch],
        "delete": list(steps.delete),
        "delete_folders": list(steps.delete_folders),
        "configs": [path for path, _ in steps.configs],
        "load": list(steps.load),
        "unload": list(steps.unload),
    }


NONE: dict[str, list[str]] = {
    "fetch": [],
    "delete": [],
    "delete_folders": [],
    "configs": [],
    "load": [],
    "unload": [],
}

CASES = [
    pytest.param(OLD, NONE, id="the same revision: nothing"),
    pytest.param(
        _new({"adder": {"2/model.py": b"add v2"}}),
        {
            **NONE,
            "fetch": ["adder/2/model.py"],
            "delete": ["adder/1/model.py"],
            "configs": ["adder/config.pbtxt"],
            "load": ["adder"],
            "unload": ["adder"],
        },
        id="a new version of one model",
    ),
    pytest.param(
        _new({"other": {"1/model.py": b"other v1", "labels.txt": b"a\nb\nc\n"}}),
        {
            **NONE,
            "fetch": ["other/labels.txt"],
            "configs": ["other/config.pbtxt"],
            "load": ["other"],
            "unload": ["other"],
        },
        id="a file rewritten under its name",
    ),
    pytest.param(
        _new(adder=_python(maxBatchSize=4, dynamicBatching={"maxQueueDelayMicroseconds": "100"})),
        {**NONE, "configs": ["adder/config.pbtxt"], "load": ["adder"], "unload": ["adder"]},
        id="a config-only change",
    ),
    pytest.param(
        _new({"extra": {"3/model.py": b"extra"}}, extra=_python()),
        {**NONE, "fetch": ["extra/3/model.py"], "configs": ["extra/config.pbtxt"], "load": ["extra"]},
        id="a model added",
    ),
    pytest.param(
        _new(other=None),
        {
            **NONE,
            "delete": ["other/1/model.py", "other/labels.txt"],
            "delete_folders": ["other"],
            "unload": ["other"],
        },
        id="a model removed",
    ),
    pytest.param(
        _new({"first": {"1/model.py": b"first v2"}}),
        {
            **NONE,
            "fetch": ["first/1/model.py"],
            "configs": ["first/config.pbtxt"],
            "load": ["first", "chain"],
            "unload": ["chain", "first"],
        },
        id="a step alone: its ensemble is unloaded before it and loaded after it",
    ),
    pytest.param(
        _new({"zeta": {"1/model.py": b"z"}}, zeta=_python(), chain=_ensemble("first", "zeta")),
        {
            **NONE,
            "fetch": ["zeta/1/model.py"],
            "configs": ["chain/config.pbtxt", "zeta/config.pbtxt"],
            "load": ["zeta", "chain"],
            "unload": ["chain"],
        },
        id="a new step is loaded before the ensemble that names it",
    ),
]


@pytest.mark.parametrize(("target", "expected"), CASES)
def test_the_steps_from_one_revision_to_another(
    target: RevisionFiles, expected: dict[str, list[str]]
) -> None:
    steps = plan(OLD, target)
    assert _summary(steps) == expected
    assert steps.bytes == sum(e.size for e in steps.fetch)
    # every config written is the target's, of a model loaded (an ensemble over a changed step is
    # loaded again with its config unchanged)
    assert {path.split("/")[0] for path, _ in steps.configs} <= set(steps.load)
    assert dict(steps.configs) == {p: target.configs[p.split("/")[0]] for p, _ in steps.configs}
    assert steps.touches_triton == bool(expected["load"] or expected["unload"])


def test_an_ensemble_is_unloaded_before_its_step() -> None:
    old = revision("r1", FILES, {**CONFIGS, "zpipe": _ensemble("adder")})
    steps = plan(old, revision("r2", FILES, {k: v for k, v in CONFIGS.items() if k != "adder"}))
    assert steps.unload == ("zpipe", "adder")
    assert steps.delete_folders == ("adder", "zpipe")
    assert steps.delete == ("adder/1/model.py",)
    assert steps.load == ()


def test_from_nothing_every_object_is_fetched_and_every_model_loaded_steps_first() -> None:
    steps = plan(None, OLD)
    assert [e.dest for e in steps.fetch] == [e.dest for e in OLD.manifest.entries]
    assert steps.load == ("adder", "first", "other", "second", "chain")
    assert steps.bytes == OLD.manifest.total_bytes


def test_a_failed_revision_is_undone_when_the_target_goes_back() -> None:
    """r2 added a model and changed one, its load failed part way: back to r1, the changed model is
    loaded again from r1's files, the added one unloaded and its folder deleted."""
    failed = _new({"adder": {"2/model.py": b"add v2"}, "extra": {"1/model.py": b"x"}}, extra=_python())
    steps = plan(OLD, OLD, partial=[failed])
    assert _summary(steps) == {
        "fetch": ["adder/1/model.py"],
        "delete": ["adder/2/model.py", "extra/1/model.py"],
        "delete_folders": ["extra"],
        "configs": ["adder/config.pbtxt"],
        "load": ["adder"],
        "unload": ["extra", "adder"],
    }


def test_a_partial_revision_and_a_third_one_are_both_covered() -> None:
    partial = _new({"adder": {"2/model.py": b"add v2"}})
    third = revision("r3", {**FILES, "other": {"1/model.py": b"other v3", "labels.txt": b"a\nb\n"}}, CONFIGS)
    steps = plan(OLD, third, partial=[partial])
    assert steps.load == ("adder", "other")
    assert [e.dest for e in steps.fetch] == ["adder/1/model.py", "other/1/model.py"]
    assert steps.delete == ("adder/2/model.py",)


def test_a_partial_revision_that_is_the_target_adds_nothing() -> None:
    target = _new({"adder": {"2/model.py": b"add v2"}})
    assert plan(OLD, target, partial=[target]) == plan(OLD, target)


# ---------------------------------------------------------------- ensembles


def test_ensemble_steps_are_read_from_the_rendered_config() -> None:
    assert ensemble_steps(build_config_pbtxt("chain", _ensemble("b", "a", "b"))) == ("b", "a")
    assert ensemble_steps(build_config_pbtxt("adder", _python())) == ()
    assert ensemble_steps("not { a config") == ()


def test_load_order_puts_nested_ensembles_after_their_steps() -> None:
    configs = {
        "outer": build_config_pbtxt("outer", _ensemble("inner", "a")),
        "inner": build_config_pbtxt("inner", _ensemble("b")),
    }
    assert load_order(["outer", "inner", "a", "b"], configs) == ("a", "b", "inner", "outer")
    assert load_order(["outer", "a"], configs) == ("a", "outer")  # a step not loaded: no wait on it


def test_load_order_ends_even_on_a_cycle() -> None:
    configs = {"x": build_config_pbtxt("x", _ensemble("y")), "y": build_config_pbtxt("y", _ensemble("x"))}
    assert sorted(load_order(["x", "y"], configs)) == ["x", "y"]


# ---------------------------------------------------------------- which revision


@pytest.mark.parametrize(
    ("annotation", "state", "present", "expected"),
    [
        pytest.param("r2", InPlaceState("r1", "r2"), {"r1", "r2"}, "r2", id="the annotation names next"),
        pytest.param("r1", InPlaceState("r1", "r2"), {"r1", "r2"}, "r1", id="the annotation names stable"),
        pytest.param("", InPlaceState("r1", "r2"), {"r1", "r2"}, "r1", id="no annotation: stable"),
        pytest.param(None, InPlaceState("r3", None), {"r3"}, "r3", id="no target file: stable"),
        pytest.param("r9", InPlaceState("r1", "r2"), {"r1", "r2", "r9"}, "r1", id="a revision not in state"),
        pytest.param("r2", InPlaceState("r1", None), {"r1", "r2"}, "r1", id="next is over: stable"),
        pytest.param("r2", InPlaceState("r1", "r2"), {"r1"}, "r1", id="next's files not there yet"),
        pytest.param("r2", InPlaceState("r3", "r2"), set(), "base", id="no files at all: the base"),
        pytest.param("r2", InPlaceState("base", "r2"), set(), "base", id="stable is the base"),
        pytest.param("r2", None, {"r2"}, "base", id="no state.json: the base"),
        pytest.param(" r2\n", InPlaceState("r1", "r2"), {"r2"}, "r2", id="whitespace around the annotation"),
    ],
)
def test_the_target_revision(
    annotation: str | None, state: InPlaceState | None, present: set[str], expected: str
) -> None:
    assert resolve_target(annotation, state, present, "base") == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"stable": "r1", "next": "r2"}', InPlaceState("r1", "r2")),
        ('{"stable": "r1", "next": null}', InPlaceState("r1", None)),
        ('{"stable": "r1"}', InPlaceState("r1", None)),
        ('{"stable": "", "next": "r2"}', None),
        ('{"stable": "r1", "next": 3}', None),
        ("[]", None),
        ("{", None),
        ("", None),
        (None, None),
    ],
)
def test_state_json_is_read_or_refused(text: str | None, expected: InPlaceState | None) -> None:
    assert parse_inplace_state(text) == expected


def test_the_configmap_keys_of_a_revision() -> None:
    keys = revision_keys("r1", OLD.manifest)
    assert keys[0] == "r1.manifest.json"
    assert set(keys[1:]) == {f"r1.{m}.config.pbtxt" for m in CONFIGS}
    assert revisions_named([*keys, "state.json", "..data", "r2.manifest.json"]) == {"r1", "r2"}


# ---------------------------------------------------------------- the record and the status


@pytest.mark.parametrize(
    ("record", "target", "needs", "state"),
    [
        pytest.param(Record(applied="r1"), "r1", False, APPLIED, id="applied"),
        pytest.param(Record(applied="r1"), "r2", True, APPLYING, id="a new target"),
        pytest.param(Record(applied="r1", pending="r2"), "r2", True, APPLYING, id="stopped part way"),
        pytest.param(Record(applied="r1", pending="r2", failed="boom"), "r2", False, FAILED, id="failed"),
        pytest.param(Record(applied="r1", pending="r2", failed="boom"), "r1", True, APPLYING, id="rollback"),
        pytest.param(Record(applied="r1", pending="r2", failed="boom"), "r3", True, APPLYING, id="a third"),
        pytest.param(Record(), "r1", True, APPLYING, id="nothing recorded"),
    ],
)
def test_the_record_says_whether_there_is_work_and_the_state(
    record: Record, target: str, needs: bool, state: str
) -> None:
    assert record.needs(target) is needs
    status = status_of(record, "r1", target, {"adder": "READY"}, message="waiting")
    assert status.state == state
    assert status.message == ("boom" if state == FAILED else "waiting")
    assert Record.from_json(record.to_json()) == record


@pytest.mark.parametrize("text", ["", "{", "[]", '{"format": 2, "applied": "r1"}', None])
def test_an_unreadable_record_is_an_empty_one(text: str | None) -> None:
    assert Record.from_json(text) == Record()


def test_the_status_document_has_the_contract_fields() -> None:
    record = Record(applied="r2", fetched_bytes=42, updated_at="2026-11-27T13:00:00Z")
    doc = status_of(record, "r1", "r2", {"b": "READY", "a": "UNAVAILABLE"}).to_json()
    assert doc == {
        "base": "r1",
        "revision": "r2",
        "target": "r2",
        "state": "Applied",
        "message": "",
        "models": {"a": "UNAVAILABLE", "b": "READY"},
        "fetchedBytes": 42,
        "updatedAt": "2026-11-27T13:00:00Z",
    }


def test_model_states_look_at_the_versions_the_target_pins() -> None:
    target = _new({"adder": {"2/model.py": b"add v2"}})
    index = [
        ModelVersionState("adder", "1", "READY"),
        ModelVersionState("adder", "2", "UNAVAILABLE", "failed"),
        ModelVersionState("other", "1", "READY"),
        ModelVersionState("first", "1", "LOADING"),
        ModelVersionState("chain", "1", "READY"),
    ]
    assert model_states(index, target) == {
        "adder": "UNAVAILABLE",  # version 1 still serves, but the target's version 2 failed
        "other": "READY",
        "first": "LOADING",
        "second": "UNAVAILABLE",  # not in the index at all
        "chain": "READY",
    }


def test_a_record_started_keeps_what_was_left_part_way_until_done() -> None:
    applied = Record(applied="r1", updated_at="t0")
    first = applied.start("r2", "t1")
    assert first == Record(applied="r1", pending="r2", updated_at="t1")
    first = first.fetched(100)
    # Stopped part way and started again on the same target: the bytes of the change count on.
    assert first.start("r2", "t2") == Record(applied="r1", pending="r2", fetched_bytes=100, updated_at="t2")
    failed = first.fail("load of model 'adder' failed: boom", "t3")
    assert not failed.needs("r2") and failed.needs("r1") and failed.needs("r3")
    # The way back: r2's traces are undone with it, and its bytes are not this change's.
    back = failed.start("r1", "t4")
    assert back == Record(applied="r1", pending="r1", partial=("r2",), updated_at="t4")
    third = back.start("r3", "t5")
    assert third.partial == ("r2", "r1") and third.revisions() == {"r1", "r2", "r3"}
    done = third.fetched(7).done("t6")
    assert done == Record(applied="r3", fetched_bytes=7, updated_at="t6")
    assert not done.needs("r3") and done.revisions() == {"r3"}
    assert Record.from_json(third.to_json()) == third


def test_readiness_is_every_model_of_the_revision_served_ready_and_nothing_blocking() -> None:
    every = dict.fromkeys(OLD.models, "READY")
    assert readiness(OLD, every).ready
    assert readiness(OLD, every).revision == "r1"
    dead = {**every, "adder": "dead: 1 of its 1 Python backend stub processes are gone"}
    not_ready = readiness(OLD, dead)
    assert not not_ready.ready and "model adder is dead" in not_ready.reason
    missing = readiness(OLD, {k: v for k, v in every.items() if k != "other"})
    assert not missing.ready and "model other is UNAVAILABLE" in missing.reason
    drained = readiness(OLD, every, "draining: out of the Service while revision r2 loads")
    assert not drained.ready and drained.reason.startswith("draining")
    assert not readiness(None, every).ready
    assert readiness(OLD, every).to_json()["models"] == every


def test_python_models_are_those_of_the_python_backend() -> None:
    assert python_models(OLD) == ("adder", "first", "other", "second")  # not the ensemble


@pytest.mark.parametrize(
    ("last", "seen", "back"),
    [
        (InPlaceState("n2"), InPlaceState("s1", "n2"), True),  # completed, then an older copy
        (InPlaceState("s1", "n2"), InPlaceState("n2"), False),  # completing
        (InPlaceState("s1", "n2"), InPlaceState("s1"), False),  # rolled back
        (InPlaceState("n2"), InPlaceState("n2", "s1"), False),  # an undo: a new rollout
        (InPlaceState("n2"), InPlaceState("n2", "m3"), False),
        (InPlaceState("s1", "n2"), InPlaceState("n2", "s1"), False),  # an undo, the completion unseen
        (InPlaceState("n2", "m3"), InPlaceState("s1", "n2"), True),  # older than a newer rollout
        (None, InPlaceState("s1", "n2"), False),
        (InPlaceState("n2"), None, False),
    ],
)
def test_an_older_state_json_is_told_from_a_new_one(
    last: InPlaceState | None, seen: InPlaceState | None, back: bool
) -> None:
    assert went_back(last, seen) is back


def test_the_doctests_hold() -> None:
    assert doctest.testmod(agent_plan).failed == 0


def test_the_first_fill_fetches_the_models_whose_load_outlasts_their_download_first() -> None:
    """Johnson's rule on the bench's repository (docs/benchmarks.md): the small models (and the
    ensemble, no bytes) first, smallest download first; then the big ones, longest load first."""
    mib = 1024 * 1024
    sizes = {"llm": 2048 * mib, "encoder": 500 * mib, "small-2": mib, "small-1": mib, "tiny": 4096}
    entries = tuple(
        ManifestEntry(f"repo/{m}/1/w", f"{m}/1/w", size, "md5", "0" * 32) for m, size in sizes.items()
    )
    configs = {m: "" for m in (*sizes, "chain")}
    files = RevisionFiles("r1", Manifest(StoreRef("s3://bucket/repo"), (), entries), configs)
    assert fill_order(files) == ("chain", "tiny", "small-1", "small-2", "llm", "encoder")


def test_the_first_fill_on_a_warm_node_fetches_the_model_whose_load_outlasts_its_read_first() -> None:
    """With every object in the node cache (read at FILL_NODE_CACHE_BYTES_PER_SECOND), encoder's
    read is shorter than its load: it comes before llm, whose load is then what is left after the
    last byte. With only llm's objects there (a new revision changing encoder), the order is the
    cold one: encoder's download from the store outlasts its load."""
    mib = 1024 * 1024
    sizes = {"llm": 2048 * mib, "encoder": 500 * mib, "small-1": mib, "tiny": 4096}
    entries = tuple(
        ManifestEntry(f"repo/{m}/1/w{i}", f"{m}/1/w{i}", size // 4, "md5", f"{n:02d}{i}".ljust(32, "0"))
        for n, (m, size) in enumerate(sizes.items())
        for i in range(4)
    )
    files = RevisionFiles("r1", Manifest(StoreRef("s3://bucket/repo"), (), entries), {m: "" for m in sizes})
    every = {f"md5/{e.checksum}" for e in entries}
    llm_only = {f"md5/{e.checksum}" for e in entries if e.dest.startswith("llm/")}
    cold = ("tiny", "small-1", "llm", "encoder")
    assert fill_order(files) == cold
    assert fill_order(files, every) == ("tiny", "small-1", "encoder", "llm")
    assert fill_order(files, llm_only) == cold
    assert fill_order(files, {"md5/" + "f" * 32}) == cold  # keys of no entry change nothing
