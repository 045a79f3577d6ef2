"""The pod side of a pool (core/pool/assignment.py): the assignment annotation and the agent's report."""

from __future__ import annotations

import json

import pytest

from triton_operator.core.pool.assignment import (
    ASSIGNMENT_ANNOTATION,
    AssignmentError,
    Copy,
    FailedLoad,
    PodAssignment,
    Wanted,
    build_assignment,
    build_report,
    parse_assignment,
    parse_report,
)


def test_the_assignment_round_trips_and_is_the_same_string_for_the_same_content() -> None:
    assignment = PodAssignment(
        models={"resnet50": Wanted("3f2a", 2), "bert": Wanted("9c1d")},
        draining={"old": 1700000000.5},
        failed={"resnet50": FailedLoad("3f2a", 1, 1700000010.0, "boom", "boom\ntrace")},
    )
    text = build_assignment(assignment)
    assert parse_assignment(text) == assignment
    assert json.loads(text)["models"] == {
        "bert": {"attempt": 1, "version": "9c1d"},
        "resnet50": {"attempt": 2, "version": "3f2a"},
    }
    reordered = PodAssignment(
        models={"bert": Wanted("9c1d"), "resnet50": Wanted("3f2a", 2)},
        draining=assignment.draining,
        failed=assignment.failed,
    )
    assert build_assignment(reordered) == text
    assert build_assignment(PodAssignment()) == '{"models":{}}'
    assert parse_assignment(None) == parse_assignment("") == PodAssignment()
    assert ASSIGNMENT_ANNOTATION == "pool.triton-operator.io/models"
    # A change in place names the revision whose files hold the version (left out: the pod's own).
    moving = PodAssignment(models={"bert": Wanted("9c1e", 1, "rev2")})
    assert json.loads(build_assignment(moving))["models"]["bert"] == {
        "attempt": 1,
        "revision": "rev2",
        "version": "9c1e",
    }
    assert parse_assignment(build_assignment(moving)) == moving
    # A model whose memory status.pool keeps says so (left out: still to measure).
    known = PodAssignment(models={"bert": Wanted("9c1e", measured=True), "gpt": Wanted("1")})
    models = json.loads(build_assignment(known))["models"]
    assert models["bert"]["measured"] is True and "measured" not in models["gpt"]
    assert parse_assignment(build_assignment(known)) == known


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", r"pool.triton-operator.io/models: not JSON"),
        ("[]", r"pool.triton-operator.io/models: expected an object, not list"),
        ('{"models": {"a": {"attempt": 1}}}', r"models.a.version: expected str, not None"),
        ('{"models": {"a": {"version": "v", "attempt": 0}}}', r"models.a.attempt: must be 1 or more, not 0"),
        ('{"models": {"a": {"version": "v", "attempt": true}}}', r"models.a.attempt: expected int, not True"),
        ('{"models": {"a": {"version": "v", "attempt": 1, "revision": 3}}}', r"revision: expected str"),
        ('{"models": {"a": {"version": "v", "attempt": 1, "revision": ""}}}', r"revision: must not be"),
        ('{"models": {"a": {"version": "v", "attempt": 1, "measured": 1}}}', r"a.measured: expected true or"),
        ('{"models": {}, "draining": {"a": "soon"}}', r"draining.a.at: expected a number, not 'soon'"),
        (
            '{"models": {}, "failed": {"a": {"version": "v", "attempt": 1, "reason": "x"}}}',
            r"failed.a.retryAt",
        ),
    ],
)
def test_a_bad_assignment_names_its_field(text: str, message: str) -> None:
    with pytest.raises(AssignmentError, match=message):
        parse_assignment(text)


def test_the_agent_s_report_round_trips_and_a_bad_one_names_its_field() -> None:
    copies = {"a": Copy("READY", "v1"), "b": Copy("UNAVAILABLE", "v2", 3, "failed to load")}
    assert parse_report(json.loads(json.dumps(build_report(copies)))) == copies
    assert parse_report({}) == {}
    with pytest.raises(AssignmentError, match=r"/v1/pool report: models.a.state: expected str, not 3"):
        parse_report({"models": {"a": {"state": 3, "version": "v", "attempt": 1}}})


def test_what_a_copy_waits_for_round_trips_and_an_older_agents_report_waits_for_nothing() -> None:
    copies = {"a": Copy("UNAVAILABLE", "v2", 1, waiting="waits for revision r2's files")}
    body = build_report(copies)
    assert body["models"]["a"]["waiting"] == "waits for revision r2's files"
    assert parse_report(json.loads(json.dumps(body))) == copies
    assert "waiting" not in build_report({"a": Copy("READY", "v1")})["models"]["a"]  # said only when set
    older = {"models": {"a": {"state": "READY", "version": "v1", "attempt": 1, "error": ""}}}
    assert parse_report(older) == {"a": Copy("READY", "v1", 1, "", waiting="")}
