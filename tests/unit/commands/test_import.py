"""`triton-operator import`: a model repository folder -> TritonService YAML -> the same config.pbtxt."""

from __future__ import annotations

import argparse
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from crd_schema import ROOT, validate  # the strict structural validator of the CRD tests
from testkit import REPO
from triton_operator.commands import import_ as import_command
from triton_operator.core.spec.crd_schema import dump_yaml
from triton_operator.core.spec.modelconfig import (
    build_config_pbtxt,
    build_imported_service,
    gpus_needed,
    parse_config_pbtxt,
)
from triton_operator.core.spec.validation.spec import check_spec

REPOS = REPO / "tests" / "data" / "repos"
CONFIG_FILES = sorted(REPOS.glob("*/*/config.pbtxt"))


def run_import(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    import_command.register(parser.add_subparsers())
    args = parser.parse_args(["import", *argv])
    code: int = args.func(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@cache
def imported(repo: str) -> tuple[str, dict[str, Any]]:
    """The import's YAML text and object for one of the example repositories (as the command builds it)."""
    models, _, errors = import_command.read_repository(REPOS / repo)
    assert errors == []
    text = dump_yaml(build_imported_service(repo, f"s3://models/{repo}", models))
    return text, yaml.safe_load(text)


def test_there_are_example_configs() -> None:
    assert len(CONFIG_FILES) >= 10
    assert {p.parent.parent.name for p in CONFIG_FILES} == {"vision", "nlp"}


@pytest.mark.parametrize("config_file", CONFIG_FILES, ids=[str(p.relative_to(REPOS)) for p in CONFIG_FILES])
def test_import_then_render_gives_an_equal_model_config(config_file: Path) -> None:
    original = parse_config_pbtxt(config_file.read_text(), source=str(config_file))
    _, service = imported(config_file.parent.parent.name)
    folder = config_file.parent.name
    (model,) = [m for m in service["spec"]["models"] if m.get("path", m["name"]) == folder]
    assert "name" not in model["config"]
    if not original.name:
        original.name = model["name"]
    spec, errors = check_spec(service["spec"])
    assert spec is not None and errors == []
    (parsed,) = [m for m in spec.models if m.name == model["name"]]
    rendered = build_config_pbtxt(parsed.name, parsed.config)
    assert parse_config_pbtxt(rendered) == original


@pytest.mark.parametrize("repo", ["vision", "nlp"])
def test_imported_service_is_valid_and_passes_the_crd_schema(repo: str) -> None:
    _, service = imported(repo)
    assert validate(service, ROOT) == []
    spec, errors = check_spec(service["spec"])
    assert spec is not None and errors == []
    assert service["spec"]["resources"]["gpus"] == gpus_needed(service["spec"]["models"])
    # 64-bit integers come out as plain numbers
    dims = [
        d for m in service["spec"]["models"] for t in m["config"].get("input", []) for d in t.get("dims", [])
    ]
    assert dims and all(isinstance(d, int) for d in dims)


def test_command_output_notes_and_names(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_import([str(REPOS / "nlp"), "--uri", "s3://models/nlp"], capsys)
    assert code == 0
    service = yaml.safe_load(out)
    assert service["apiVersion"] == "triton-operator.io/v1alpha1" and service["kind"] == "TritonService"
    assert service["metadata"] == {"name": "nlp"}
    by_name = {m["name"]: m for m in service["spec"]["models"]}
    assert sorted(by_name) == sorted(
        ["accumulator", "bert_ragged", "custom_ops", "llm", "streaming_asr", "tokenizer_autocomplete"]
    )
    assert by_name["tokenizer_autocomplete"] == {"name": "tokenizer_autocomplete", "config": {}}
    assert "tokenizer_autocomplete: no config.pbtxt; imported with an empty config" in err
    assert "empty_folder: skipped" in err
    assert "error" not in err
    # A backend the default image lacks is a warning (a custom image may ship it), not a refusal.
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "backend 'vllm' is not one of the image's backends" in warnings[0]
    assert "spec.models[3].config.backend" in warnings[0]
    # 'y' is a tensor name, and must stay a string for kubectl (YAML 1.1 reads a bare y as true)
    assert "name: 'y'" in out


def test_folder_and_config_name_differ(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_import([str(REPOS / "vision"), "--uri", "gs://b/vision"], capsys)
    assert code == 0
    models = {m["name"]: m for m in yaml.safe_load(out)["spec"]["models"]}
    assert models["yolo"]["path"] == "yolo-folder"
    assert all("path" not in m for name, m in models.items() if name != "yolo")
    assert "notes: skipped" in err


def test_without_uri_a_placeholder_and_a_note(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_import([str(REPOS / "vision")], capsys)
    assert code == 0
    assert yaml.safe_load(out)["spec"]["repository"]["uri"] == import_command.PLACEHOLDER_URI
    assert "pass --uri" in err


def _repo(tmp_path: Path, models: dict[str, str | None]) -> Path:
    """A repository with one folder per model: its config.pbtxt text (None: no file) and version 1."""
    for name, text in models.items():
        (tmp_path / name / "1").mkdir(parents=True)
        if text is not None:
            (tmp_path / name / "config.pbtxt").write_text(text)
    return tmp_path


def test_a_broken_config_names_the_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = _repo(tmp_path, {"good": 'backend: "python"\n', "bad": 'backend: "python"\nmax_batch_sise: 4\n'})
    code, out, err = run_import([str(repo), "--uri", "s3://b/p"], capsys)
    assert code == 1
    assert out == ""
    assert f"{repo / 'bad' / 'config.pbtxt'}: 2:" in err and "max_batch_sise" in err


def test_problems_of_the_spec_are_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The operator would hold such a TritonService as InvalidSpec: import says so and fails."""
    ensemble = (
        'platform: "ensemble"\ninput [{name: "A", data_type: TYPE_FP32, dims: [1]}]\n'
        'output [{name: "B", data_type: TYPE_FP32, dims: [1]}]\n'
        'ensemble_scheduling { step [{ model_name: "missing", input_map { key: "x" value: "A" }, '
        'output_map { key: "y" value: "B" } }] }\n'
    )
    repo = _repo(tmp_path, {"pipeline": ensemble})
    code, out, err = run_import([str(repo), "--uri", "s3://b/p", "--name", "pipe"], capsys)
    assert (code, out) == (1, "")
    assert "error: spec.models[0].config.ensembleScheduling.step[0].modelName: model 'missing'" in err


def test_a_folder_without_models(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "docs").mkdir()
    code, out, err = run_import([str(tmp_path)], capsys)
    assert (code, out) == (1, "")
    assert "no model folders" in err


@pytest.mark.parametrize("argv", [["/does/not/exist"], [str(REPOS / "vision"), "--name", "Bad_Name"]])
def test_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_import(argv, capsys)
    assert (code, out) == (2, "")
    assert err.startswith("error: ")


def test_output_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "svc.yaml"
    code, out, _ = run_import(
        [str(REPOS / "vision"), "--uri", "s3://b/v", "--output-file", str(target)], capsys
    )
    assert (code, out) == (0, "")
    assert yaml.safe_load(target.read_text())["spec"]["repository"]["uri"] == "s3://b/v"


@pytest.mark.parametrize(
    ("folder", "expected"),
    [
        ("model_repository", "model-repository"),
        ("Models.Prod", "models-prod"),
        ("2024-models", "triton-2024-models"),
        ("___", "triton"),
        ("x" * 80, "x" * 56),
    ],
)
def test_service_name_from_folder(tmp_path: Path, folder: str, expected: str) -> None:
    path = tmp_path / folder
    path.mkdir()
    assert import_command.service_name(path) == expected


@pytest.mark.parametrize(
    ("groups", "expected"),
    [
        ([], 0),
        ([{"kind": "KIND_CPU"}], 0),
        ([{"kind": "KIND_GPU"}], 1),
        ([{"kind": "KIND_GPU", "gpus": [0, 3]}], 4),
        ([{"kind": "KIND_GPU", "gpus": [1]}, {"kind": "KIND_CPU", "gpus": [7]}], 2),
    ],
)
def test_gpus_needed(groups: list[dict[str, Any]], expected: int) -> None:
    assert (
        gpus_needed([{"name": "m", "config": {"instanceGroup": groups}}, {"name": "n", "config": {}}])
        == expected
    )


def _write_model(root: Path, name: str, config: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)


def test_a_config_triton_would_refuse_makes_import_fail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not a warning: the TritonService printed would be held as InvalidSpec, so nothing is printed."""
    _write_model(tmp_path, "neg", 'name: "neg"\nbackend: "python"\nmax_batch_size: -1\n')
    code, out, err = run_import([str(tmp_path), "--uri", "s3://b/p"], capsys)
    assert code == 1 and out == ""
    assert "error: spec.models[0].config.maxBatchSize" in err


def test_the_gpu_count_is_explained_and_a_bad_gpu_id_is_reported_on_its_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    group = "instance_group [{ kind: KIND_GPU, gpus: [%s] }]"
    _write_model(tmp_path, "two", f'name: "two"\nbackend: "python"\n{group % "1"}\n')
    code, out, err = run_import([str(tmp_path), "--uri", "s3://b/p"], capsys)
    assert code == 0, err
    assert yaml.safe_load(out)["spec"]["resources"] == {"gpus": 2}
    assert "note: spec.resources.gpus is 2: models[0].config.instanceGroup[0].gpus names GPU 1" in err

    _write_model(tmp_path, "bad", f'name: "bad"\nbackend: "python"\n{group % "-1"}\n')
    code, out, err = run_import([str(tmp_path), "--uri", "s3://b/p"], capsys)
    assert code == 1
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors == [line for line in errors if "instanceGroup[0].gpus[0]" in line]
    assert errors and "spec.resources.gpus >" not in err


def test_output_json_and_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json  # noqa: PLC0415

    code, out, _ = run_import([str(REPOS / "vision"), "--uri", "s3://b/v", "-o", "json"], capsys)
    assert code == 0
    code_yaml, out_yaml, _ = run_import([str(REPOS / "vision"), "--uri", "s3://b/v"], capsys)
    assert code_yaml == 0
    assert json.loads(out) == yaml.safe_load(out_yaml)
    code, out, _ = run_import([str(REPOS / "vision"), "--uri", "s3://b/v", "-o", "name"], capsys)
    assert (code, out) == (0, "tritonservice.triton-operator.io/vision\n")
    target = tmp_path / "ts.json"
    code, out, _ = run_import(
        [str(REPOS / "vision"), "--uri", "s3://b/v", "-o", "json", "--output-file", str(target)], capsys
    )
    assert (code, out) == (0, "")
    assert json.loads(target.read_text())["metadata"] == {"name": "vision"}
