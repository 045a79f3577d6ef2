"""A leaving pool pod's wait, the pure parts: its assignment names each model's Service address (refused,
naming the field, when it is not an IP), its agent's report names the pod, and served_here says which
models the pod still serves alone."""

from __future__ import annotations

import json

import pytest

from triton_operator.core.pool.assignment import (
    ASSIGNMENT_ANNOTATION,
    AssignmentError,
    Copy,
    PodAssignment,
    Wanted,
    build_assignment,
    build_report,
    parse_assignment,
    parse_report,
    report_pod,
    served_here,
)


def test_the_service_addresses_round_trip_and_absent_ones_write_nothing() -> None:
    assignment = PodAssignment(
        models={"a": Wanted("v1"), "b": Wanted("v2")}, services={"a": "10.96.0.12", "b": "fd00::12"}
    )
    text = build_assignment(assignment)
    assert json.loads(text)["services"] == {"a": "10.96.0.12", "b": "fd00::12"}
    assert parse_assignment(text) == assignment
    assert "services" not in json.loads(build_assignment(PodAssignment(models={"a": Wanted("v1")})))
    assert parse_assignment(build_assignment(PodAssignment(models={"a": Wanted("v1")}))).services == {}


@pytest.mark.parametrize(
    ("services", "field", "why"),
    [
        ({"a": "not-an-ip"}, f"{ASSIGNMENT_ANNOTATION}.services.a", "not an IP address: 'not-an-ip'"),
        ({"a": "None"}, f"{ASSIGNMENT_ANNOTATION}.services.a", "not an IP address: 'None'"),
        ({"a": 12}, f"{ASSIGNMENT_ANNOTATION}.services.a.address", "expected str, not 12"),
        (["10.96.0.1"], f"{ASSIGNMENT_ANNOTATION}.services", "expected an object, not list"),
    ],
)
def test_a_bad_service_address_is_refused_naming_its_field(services: object, field: str, why: str) -> None:
    text = json.dumps({"models": {"a": {"version": "v1", "attempt": 1}}, "services": services})
    with pytest.raises(AssignmentError) as info:
        parse_assignment(text)
    assert str(info.value) == f"{field}: {why}"


def test_the_report_names_the_pod_that_answered_and_the_operator_still_reads_it() -> None:
    copies = {"a": Copy("READY", "v1")}
    report = build_report(copies, pod="pool-abc-1")
    assert report["pod"] == "pool-abc-1"
    assert report_pod(report) == "pool-abc-1"
    assert parse_report(report) == copies
    assert "pod" not in build_report(copies)
    assert report_pod(build_report(copies)) is None
    assert report_pod(None) is None
    assert report_pod({"pod": 3}) is None


def test_a_model_is_served_here_while_its_service_is_answered_by_this_pod_alone() -> None:
    assignment = PodAssignment(
        models={m: Wanted("v1") for m in "abcde"},
        services={"a": "10.96.0.1", "b": "10.96.0.2", "c": "10.96.0.3", "d": "10.96.0.4"},
    )
    copies = {
        "a": Copy("READY", "v1"),  # answered by this pod: its only serving endpoint
        "b": Copy("READY", "v1"),  # answered by another pod: its copy there is routed
        "c": Copy("READY", "v1"),  # nobody answered: no endpoint (this pod is not serving it either)
        "d": Copy("LOADING", "v1"),  # not READY here: this pod does not serve it
        "e": Copy("READY", "v1"),  # no address yet: not waited on
    }
    answered = {"a": "me", "b": "other", "c": None, "d": "me", "e": "me"}
    assert served_here(assignment, copies, answered, "me") == ["a"]
    assert served_here(assignment, copies, {**answered, "a": "other"}, "me") == []
