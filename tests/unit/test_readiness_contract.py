"""An ensemble step cannot ask for a version its model does not load."""

from __future__ import annotations

import pytest

from triton_operator.core.validation.ensemble import ensemble_version_errors
from triton_operator.core.validation.spec import check_spec
from triton_operator.models import TritonServiceSpec
from triton_rules import adder, ensemble


def _pipeline(step_version: str | None, policy: dict[str, object] | None) -> dict[str, object]:
    step = adder(**({"versionPolicy": policy} if policy else {}))
    return {
        "repository": {"uri": "pvc://models/x"},
        "models": [
            {"name": "add", "config": step},
            {"name": "pipe", "config": ensemble("add", step={"modelVersion": step_version})},
        ],
    }


@pytest.mark.parametrize(
    ("step_version", "policy", "words"),
    [
        (
            "3",
            {"specific": {"versions": ["1", "2"]}},
            "asks for version 3 of 'add', but its versionPolicy loads only 1, 2",
        ),
        (None, {"specific": {"versions": ["1"]}}, "(modelVersion left out is 0; -1 asks for the latest)"),
    ],
)
def test_a_step_asking_for_a_version_the_policy_does_not_load_is_refused(
    step_version: str | None, policy: dict[str, object], words: str
) -> None:
    _, errors = check_spec(_pipeline(step_version, policy))
    assert [e.field for e in errors] == ["spec.models[1].config.ensembleScheduling.step[0].modelVersion"]
    assert words in errors[0].message


@pytest.mark.parametrize(
    ("step_version", "policy"),
    [
        ("2", {"specific": {"versions": ["1", "2"]}}),
        ("-1", {"specific": {"versions": ["1"]}}),
        ("7", None),  # latest 1: which version that is, only the pinned repository says
        ("7", {"all": {}}),
    ],
)
def test_a_step_the_declared_policy_may_serve_passes(
    step_version: str, policy: dict[str, object] | None
) -> None:
    _, errors = check_spec(_pipeline(step_version, policy))
    assert errors == []


@pytest.mark.parametrize(
    ("step_version", "pinned", "refused"),
    [("2", {1}, True), ("1", {1}, False), ("-1", {1}, False), (None, {1}, True), (None, {0, 1}, False)],
)
def test_a_step_is_checked_against_the_pinned_versions(
    step_version: str | None, pinned: set[int], refused: bool
) -> None:
    spec = TritonServiceSpec.model_validate(_pipeline(step_version, None))
    errors = ensemble_version_errors(spec, {"add": pinned})
    assert [e.field for e in errors] == (
        ["spec.models[1].config.ensembleScheduling.step[0].modelVersion"] if refused else []
    )
    if refused:
        assert "the pinned repository holds only 1" in errors[0].message
