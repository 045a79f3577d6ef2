"""serverArgs cannot defeat the readiness contract, and an ensemble step cannot ask for a version its
model does not load."""

from __future__ import annotations

import pytest

from triton_operator.core.spec.validation.ensemble import ensemble_version_errors
from triton_operator.core.spec.validation.server_args import server_args_errors
from triton_operator.core.spec.validation.spec import check_spec
from triton_operator.models import TritonServiceSpec
from triton_rules import adder, ensemble


@pytest.mark.parametrize(
    ("args", "index", "words"),
    [
        (["--strict-readiness=false"], 0, "--strict-readiness=false would report the server ready"),
        (["--strict-readiness", "OFF"], 1, "--strict-readiness=OFF would report the server ready"),
        (["--exit-on-error=0"], 0, "--exit-on-error=0 would keep tritonserver running"),
        (["--log-verbose=1", "--exit-on-error", "False"], 2, "would keep tritonserver running"),
        (["--exit-on-error=maybe"], 0, "--exit-on-error takes true or false, not 'maybe'"),
        (["--http-restricted-api=health:k=v"], 0, "restricts the health endpoints the probes call"),
        (["--http-restricted-api", "model-repository,Health:k=v"], 1, "restricts the health endpoints"),
        (["--log-verbose=1 --http-port=9000"], 0, "holds a space"),
        (["--log-verbose", "1 2"], 1, "holds a space"),
        (["--log-verbose=1\t"], 0, "holds a space"),
    ],
)
def test_server_args_that_break_the_readiness_contract_are_refused(
    args: list[str], index: int, words: str
) -> None:
    errors = server_args_errors(args)
    assert [e.field for e in errors] == [f"spec.serverArgs[{index}]"], errors
    assert words in errors[0].message


@pytest.mark.parametrize(
    "args",
    [
        ["--strict-readiness=true", "--exit-on-error=ON"],
        ["--strict-readiness", "1", "--exit-on-error", "true"],
        ["--http-restricted-api=model-repository,shared-memory:admin-key=secret"],
        ["--grpc-restricted-api=health:k=v"],  # the probes use HTTP
        ["--backend-config=python,shm-default-byte-size=1048576"],
    ],
)
def test_server_args_that_keep_the_contract_pass(args: list[str]) -> None:
    assert server_args_errors(args) == []


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


@pytest.mark.parametrize(
    ("args", "index"),
    [
        (["--log-verbose"], 0),
        (["--log-info=1", "--log-verbose"], 1),
        (["--strict-readiness"], 0),
        (["--trace-file", "--log-verbose=1"], 0),
        (["--log-verbose", "--exit-on-error=true"], 0),
    ],
)
def test_a_flag_without_its_value_is_refused(args: list[str], index: int) -> None:
    errors = server_args_errors(args)
    assert [e.field for e in errors] == [f"spec.serverArgs[{index}]"], errors
    assert f"{args[index]} takes a value and has none" in errors[0].message


def test_a_trailing_flag_without_its_value_fails_the_spec() -> None:
    raw = {
        "repository": {"uri": "pvc://models/x"},
        "models": [{"name": "add", "config": adder()}],
        "serverArgs": ["--log-verbose=1", "--log-verbose"],
    }
    _, errors = check_spec(raw)
    assert [e.field for e in errors] == ["spec.serverArgs[1]"]
