"""The generated TritonService CRD: structural, complete, derived from the models and the protobuf."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import descriptor_pb2, descriptor_pool
from pydantic import BaseModel
from tritonclient.grpc import model_config_pb2

from crd_schema import ROOT, SCHEMA, validate
from testkit import REPO
from triton_operator.commands import crd as crd_command
from triton_operator.core.spec.crd_schema import (
    MAX_NAME_LENGTH,
    build_crd,
    dump_yaml,
    message_schema,
    model_config_schema,
    render_crd_yaml,
)
from triton_operator.models import (
    MAX_MODELS,
    CanaryStep,
    ModelSpec,
    TritonServiceSpec,
    TritonServiceStatus,
)

CHECKED_IN = REPO / "crds" / "tritonservices.yaml"
F = descriptor_pb2.FieldDescriptorProto


def schema_at(schema: dict[str, Any], *path: str) -> dict[str, Any]:
    """Follow property names; "[]" steps into array items, "{}" into map values."""
    node = schema
    for step in path:
        if step == "[]":
            node = node["items"]
        elif step == "{}":
            node = node["additionalProperties"]
        else:
            node = node["properties"][step]
    return node


def nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, child in schema.get("properties", {}).items():
        yield from nodes(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from nodes(schema["additionalProperties"], f"{path}{{}}")


SPEC = SCHEMA["properties"]["spec"]
CONFIG = schema_at(SPEC, "models", "[]", "config")


DESIGN_EXAMPLE = yaml.safe_load(
    """
apiVersion: triton-operator.io/v1alpha1
kind: TritonService
metadata: {name: resnet, namespace: ml}
spec:
  image: nvcr.io/nvidia/tritonserver:25.01-py3
  replicas: 2
  resources: {gpus: 1, gpuResourceName: nvidia.com/gpu, cpu: "4", memory: 16Gi}
  shmSize: 1Gi
  serverArgs: ["--log-verbose=0"]
  repository:
    uri: s3://models/prod
    endpoint: http://minio.minio:9000
    credentialsSecret: models-s3
    pollIntervalSeconds: 60
  models:
    - name: resnet50
      path: resnet50
      config:
        platform: onnxruntime_onnx
        maxBatchSize: 32
        versionPolicy: {specific: {versions: ["3"]}}
        dynamicBatching: {preferredBatchSize: [8, 16], maxQueueDelayMicroseconds: "100"}
        instanceGroup: [{kind: KIND_GPU, count: 2}]
  rollout:
    strategy: Canary
    steps: [{setWeight: 10}, {pause: {durationSeconds: 60}}, {setWeight: 50}, {pause: {}}]
    progressDeadlineSeconds: 600
    trafficRouting: {gatewayAPI: {httpRoute: resnet, grpcRoute: resnet-grpc}}
"""
)


def with_change(path: str, value: Any) -> dict[str, Any]:
    """DESIGN_EXAMPLE with one value set at a dotted path (numbers index lists)."""
    obj: dict[str, Any] = yaml.safe_load(yaml.safe_dump(DESIGN_EXAMPLE))
    *parents, last = path.split(".")
    node: Any = obj
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    node[int(last) if last.isdigit() else last] = value
    return obj


def test_design_example_is_valid() -> None:
    assert validate(DESIGN_EXAMPLE, ROOT) == []


@pytest.mark.parametrize(
    ("path", "value", "error"),
    [
        ("spec.models.0.config.maxBatchSise", 8, ".spec.models[0].config.maxBatchSise: unknown field"),
        (
            "spec.models.0.config.dynamicBatching.maxDelay",
            8,
            ".spec.models[0].config.dynamicBatching.maxDelay: unknown",
        ),
        (
            "spec.models.0.config.dynamicBatching.maxQueueDelayMicroseconds",
            "soon",
            "maxQueueDelayMicroseconds: should",
        ),
        (
            "spec.models.0.config.dynamicBatching.maxQueueDelayMicroseconds",
            True,
            "maxQueueDelayMicroseconds: must be",
        ),
        (
            "spec.models.0.config.instanceGroup",
            [{"kind": "KIND_TPU"}],
            "instanceGroup[0].kind: unsupported value",
        ),
        ("spec.models.0.config.maxBatchSize", -1, ".spec.models[0].config.maxBatchSize: out of range"),
        ("spec.models.0.config.maxBatchSize", 2**31, ".spec.models[0].config.maxBatchSize: out of range"),
        (
            "spec.models.0.config.maxBatchSize",
            "32",
            ".spec.models[0].config.maxBatchSize: must be of type integer",
        ),
        (
            "spec.models.0.config.parameters",
            {"k": {"string_value": "v"}},
            "parameters[k].string_value: unknown field",
        ),
        ("spec.models.0.config.name", "Not/A/Name", ".spec.models[0].config.name: should match"),
        ("spec.models.0.path", "../../etc", ".spec.models[0].path: should match"),
        ("spec.models.0.name", "has space", ".spec.models[0].name: should match"),
        ("spec.models.0.extra", 1, ".spec.models[0].extra: unknown field"),
        ("spec.resources.memory", "lots", ".spec.resources.memory: should match"),
        ("spec.repository.uri", "ftp://x", ".spec.repository.uri: should match"),
        ("spec.rollout.strategy", "Linear", ".spec.rollout.strategy: unsupported value"),
        ("spec.rollout.steps.0.setWeight", 101, ".spec.rollout.steps[0].setWeight: out of range"),
        ("spec.replicas", -1, ".spec.replicas: out of range"),
        ("metadata.name", "x" * (MAX_NAME_LENGTH + 1), ".metadata.name: too long"),
        ("metadata.name", "Resnet", ".metadata.name: should match"),
    ],
)
def test_schema_rejects(path: str, value: Any, error: str) -> None:
    errors = validate(with_change(path, value), ROOT)
    assert len(errors) == 1, errors
    assert error in errors[0]


@pytest.mark.parametrize(
    ("path", "value"), [("spec.resources.cpu", 4), ("spec.shmSize", "512Mi"), ("spec.resources.memory", 8)]
)
def test_quantities_are_int_or_string(path: str, value: Any) -> None:
    assert validate(with_change(path, value), ROOT) == []


# ---------------------------------------------------------------- structural


def test_schema_is_structural() -> None:
    """Every node has a type (but int-or-string ones), properties and additionalProperties never meet."""
    problems = []
    for path, node in nodes(SCHEMA):
        if node.get("x-kubernetes-int-or-string"):
            if "type" in node:
                problems.append(f"{path}: int-or-string with a type")
            continue
        if "type" not in node:
            problems.append(f"{path}: no type")
        if "properties" in node and "additionalProperties" in node:
            problems.append(f"{path}: properties and additionalProperties")
        if node.get("type") == "array" and "items" not in node:
            problems.append(f"{path}: array without items")
        if node.get("x-kubernetes-preserve-unknown-fields") and node.get("type") not in (None, "object"):
            problems.append(f"{path}: preserve-unknown-fields on a {node['type']}")
    assert problems == []


FORBIDDEN = {"$ref", "$defs", "title", "anyOf", "oneOf", "allOf", "not", "const", "uniqueItems", "nullable"}


def test_no_keywords_a_crd_rejects_or_pydantic_leftovers() -> None:
    found = [(path, key) for path, node in nodes(SCHEMA) for key in node if key in FORBIDDEN]
    found += [
        (path, "additionalProperties: bool")
        for path, node in nodes(SCHEMA)
        if isinstance(node.get("additionalProperties"), bool)
    ]
    found += [
        (path, "default: null")
        for path, node in nodes(SCHEMA)
        if "default" in node and node["default"] is None
    ]
    assert found == []


def test_patterns_are_re2_compatible() -> None:
    """Go's RE2 has no lookarounds and no backreferences; Python's re would accept them."""
    patterns = [node["pattern"] for _, node in nodes(SCHEMA) if "pattern" in node]
    assert patterns
    bad = [p for p in patterns if re.search(r"\(\?[=!<]|\\[1-9]", p)]
    assert bad == []
    for pattern in patterns:
        re.compile(pattern)


def test_every_cel_rule_has_a_message() -> None:
    rules = [
        (path, rule) for path, node in nodes(SCHEMA) for rule in node.get("x-kubernetes-validations", [])
    ]
    assert len(rules) >= 5
    assert [path for path, rule in rules if not rule.get("message") or not rule.get("rule")] == []


# ---------------------------------------------------------------- from the pydantic models


def _aliases(model: type[BaseModel]) -> set[str]:
    return {field.alias or name for name, field in model.model_fields.items()}


@pytest.mark.parametrize(
    ("model", "path"),
    [
        (TritonServiceSpec, ()),
        (ModelSpec, ("models", "[]")),
        (CanaryStep, ("rollout", "steps", "[]")),
    ],
)
def test_every_model_field_is_in_the_schema(model: type[BaseModel], path: tuple[str, ...]) -> None:
    node = schema_at(SPEC, *path)
    assert set(node["properties"]) == _aliases(model)
    required = {field.alias or name for name, field in model.model_fields.items() if field.is_required()}
    assert set(node.get("required", [])) == required


def test_status_schema_keeps_unknown_fields_and_every_field() -> None:
    status = SCHEMA["properties"]["status"]
    assert status["x-kubernetes-preserve-unknown-fields"] is True
    assert set(status["properties"]) == _aliases(TritonServiceStatus)


@pytest.mark.parametrize(
    ("path", "field"),
    [
        (("replicas",), TritonServiceSpec.model_fields["replicas"]),
        (("shmSize",), TritonServiceSpec.model_fields["shm_size"]),
    ],
)
def test_defaults_come_from_the_models(path: tuple[str, ...], field: Any) -> None:
    assert schema_at(SPEC, *path)["default"] == field.default


def test_free_form_kubernetes_objects_keep_unknown_fields() -> None:
    for path in (
        ("tolerations", "[]"),
        ("affinity",),
        ("env", "[]"),
        ("volumes", "[]"),
        ("volumeMounts", "[]"),
    ):
        node = schema_at(SPEC, *path)
        assert node == {"type": "object", "x-kubernetes-preserve-unknown-fields": True} | (
            {"description": node["description"]} if "description" in node else {}
        ), path


def test_model_cel_rules_and_their_cost_bounds() -> None:
    models = schema_at(SPEC, "models")
    assert models["maxItems"] == MAX_MODELS
    assert "self.filter(n, n.name == m.name).size() == 1" in models["x-kubernetes-validations"][0]["rule"]
    item = models["items"]
    assert item["properties"]["name"]["maxLength"] == 128
    assert CONFIG["properties"]["name"]["maxLength"] == 128
    assert "self.config.name == self.name" in item["x-kubernetes-validations"][0]["rule"]
    step = schema_at(SPEC, "rollout", "steps", "[]")
    assert "has(self.setHeaderRoute)" in step["x-kubernetes-validations"][0]["rule"]
    assert schema_at(SPEC, "rollout", "steps")["maxItems"] > 0


# ---------------------------------------------------------------- from the protobuf descriptor


def test_config_reaches_max_queue_delay_as_int_or_string() -> None:
    node = schema_at(CONFIG, "dynamicBatching", "maxQueueDelayMicroseconds")
    assert node["x-kubernetes-int-or-string"] is True
    assert "type" not in node
    assert re.search(node["pattern"], "100") and not re.search(node["pattern"], "-1")


def _check_message(schema: dict[str, Any], descriptor: Any, path: str, seen: tuple[str, ...]) -> list[str]:
    """Each field of the descriptor is in the schema under its JSON name, with a matching shape."""
    problems: list[str] = []
    if descriptor.full_name in seen:
        return problems
    properties = schema.get("properties", {})
    if set(properties) != {f.json_name for f in descriptor.fields}:
        problems.append(f"{path}: properties {sorted(properties)}")
    for field in descriptor.fields:
        node = properties.get(field.json_name, {})
        where = f"{path}.{field.json_name}"
        is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
        if is_map:
            value_field = field.message_type.fields_by_name["value"]
            if node.get("type") != "object" or "additionalProperties" not in node:
                problems.append(f"{where}: not a map")
                continue
            if value_field.message_type is not None:
                problems += _check_message(
                    node["additionalProperties"],
                    value_field.message_type,
                    where + "{}",
                    (*seen, descriptor.full_name),
                )
            continue
        if field.is_repeated:
            if node.get("type") != "array":
                problems.append(f"{where}: not an array")
                continue
            node = node["items"]
        if field.message_type is not None:
            problems += _check_message(node, field.message_type, where, (*seen, descriptor.full_name))
        elif field.enum_type is not None and node.get("enum") != [v.name for v in field.enum_type.values]:
            problems.append(f"{where}: enum {node.get('enum')}")
    return problems


def test_config_schema_has_every_field_of_the_descriptor() -> None:
    assert _check_message(CONFIG, model_config_pb2.ModelConfig.DESCRIPTOR, "config", ()) == []


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (("maxBatchSize",), {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}),
        (("optimization", "graph", "level"), {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1}),
        (
            ("dynamicBatching", "defaultQueuePolicy", "maxQueueSize"),
            {"type": "integer", "minimum": 0, "maximum": 2**32 - 1},
        ),
        (("input", "[]", "dims", "[]"), {"x-kubernetes-int-or-string": True, "pattern": r"^-?[0-9]+$"}),
        (("versionPolicy", "specific", "versions", "[]"), {"x-kubernetes-int-or-string": True}),
        (("sequenceBatching", "direct", "minimumSlotUtilization"), {"type": "number"}),
        (("modelMetrics", "metricControl", "[]", "histogramOptions", "buckets", "[]"), {"type": "number"}),
        (("responseCache", "enable"), {"type": "boolean"}),
        (("platform",), {"type": "string"}),
        (("parameters", "{}", "stringValue"), {"type": "string"}),
        (("ensembleScheduling", "step", "[]", "inputMap", "{}"), {"type": "string"}),
        (
            ("dynamicBatching", "priorityQueuePolicy", "{}", "timeoutAction"),
            {"type": "string", "enum": ["REJECT", "DELAY"]},
        ),
        (("instanceGroup", "[]", "rateLimiter", "resources", "[]", "global"), {"type": "boolean"}),
    ],
)
def test_protobuf_types_map_to_openapi(path: tuple[str, ...], expected: dict[str, Any]) -> None:
    node = schema_at(CONFIG, *path)
    assert {k: node[k] for k in expected if k in node} == expected


def test_oneofs_become_cel_rules_only_outside_lists() -> None:
    rules = {
        path: node["x-kubernetes-validations"]
        for path, node in nodes(CONFIG)
        if "x-kubernetes-validations" in node
    }
    assert set(rules) == {"", ".versionPolicy", ".sequenceBatching"}
    assert any("has(self.ensembleScheduling)" in r["rule"] for r in rules[""])
    assert "has(self.oldest)" in rules[".sequenceBatching"][0]["rule"]
    # inside lists they would cost too much; the operator checks them (modelWarmup inputs, state)
    assert "x-kubernetes-validations" not in schema_at(CONFIG, "modelWarmup", "[]", "inputs", "{}")


def _pool_with(*messages: tuple[str, list[tuple[str, str, int]]]) -> descriptor_pool.DescriptorPool:
    """A pool with proto3 messages: (name, [(field, type name or scalar, label)])."""
    proto = descriptor_pb2.FileDescriptorProto(name="schema_test.proto", package="t", syntax="proto3")
    for name, fields in messages:
        message = proto.message_type.add(name=name)
        for number, (field_name, type_name, label) in enumerate(fields, start=1):
            json_name = re.sub(r"_(\w)", lambda m: m.group(1).upper(), field_name)
            if type_name == "string":
                message.field.add(
                    name=field_name, number=number, type=F.TYPE_STRING, label=label, json_name=json_name
                )
            else:
                message.field.add(
                    name=field_name,
                    number=number,
                    type=F.TYPE_MESSAGE,
                    type_name=f".t.{type_name}",
                    label=label,
                    json_name=json_name,
                )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return pool


def test_recursive_messages_stop_with_unchecked_objects() -> None:
    pool = _pool_with(
        (
            "Node",
            [
                ("label", "string", F.LABEL_OPTIONAL),
                ("child_node", "Node", F.LABEL_OPTIONAL),
                ("kids", "Node", F.LABEL_REPEATED),
            ],
        )
    )
    schema = message_schema(pool.FindMessageTypeByName("t.Node"))
    assert schema_at(schema, "label") == {"type": "string"}
    for path in (("childNode",), ("kids", "[]")):
        node = schema_at(schema, *path)
        assert node["type"] == "object"
        assert node["x-kubernetes-preserve-unknown-fields"] is True
        assert "properties" not in node


def test_depth_is_capped() -> None:
    pool = _pool_with(
        ("A", [("b", "B", F.LABEL_OPTIONAL)]),
        ("B", [("c", "C", F.LABEL_OPTIONAL)]),
        ("C", [("leaf", "string", F.LABEL_OPTIONAL)]),
    )
    deep = message_schema(pool.FindMessageTypeByName("t.A"), max_depth=3)
    assert schema_at(deep, "b", "c", "leaf") == {"type": "string"}
    capped = message_schema(pool.FindMessageTypeByName("t.A"), max_depth=2)
    assert schema_at(capped, "b", "c")["x-kubernetes-preserve-unknown-fields"] is True
    assert "properties" not in schema_at(capped, "b", "c")


def test_model_config_schema_is_what_the_crd_embeds() -> None:
    assert {k: v for k, v in CONFIG.items() if k != "description"} == {
        k: v for k, v in model_config_schema().items() if k != "description"
    }
    assert "ModelConfig" in CONFIG["description"] or "config.pbtxt" in CONFIG["description"]


# ---------------------------------------------------------------- the CRD object and its file


def test_crd_names_versions_and_columns() -> None:
    crd = build_crd()
    assert crd["metadata"]["name"] == "tritonservices.triton-operator.io"
    spec = crd["spec"]
    assert spec["group"] == "triton-operator.io"
    assert spec["scope"] == "Namespaced"
    assert spec["names"] | {} == {
        "kind": "TritonService",
        "listKind": "TritonServiceList",
        "plural": "tritonservices",
        "singular": "tritonservice",
        "shortNames": ["tsvc", "triton"],
    }
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {
        "Ready": '.status.conditions[?(@.type=="Ready")].status',
        "Stable": ".status.stableRevision",
        "Canary": ".status.canaryRevision",
        "Weight": ".status.canaryWeight",
        "Age": ".metadata.creationTimestamp",
    }
    assert version["schema"]["openAPIV3Schema"] == SCHEMA


def test_checked_in_crd_matches_the_generator() -> None:
    """Snapshot: regenerate with `triton-operator crd --output crds/tritonservices.yaml`."""
    assert CHECKED_IN.read_text() == render_crd_yaml()


def test_crd_yaml_reads_back_to_the_same_object_and_fits_client_side_apply() -> None:
    text = render_crd_yaml()
    assert yaml.safe_load(text) == build_crd()
    # kubectl's client-side apply stores the whole object in an annotation of at most 256 KiB
    assert len(text.encode()) < 262144


@pytest.mark.parametrize(
    "word", ["y", "Y", "n", "N", "yes", "no", "on", "off", "true", "null", "~", "1", "0x1"]
)
def test_dump_yaml_quotes_what_yaml_1_1_would_not_read_as_a_string(word: str) -> None:
    text = dump_yaml({"name": word, "list": [word]})
    assert f"name: {word}\n" not in text
    assert yaml.safe_load(text) == {"name": word, "list": [word]}


# ---------------------------------------------------------------- the command


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    crd_command.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


def test_crd_command_prints_writes_and_checks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["crd"]) == 0
    assert capsys.readouterr().out == render_crd_yaml()

    target = tmp_path / "out" / "crd.yaml"
    assert _run(["crd", "--output", str(target)]) == 0
    assert target.read_text() == render_crd_yaml()
    capsys.readouterr()

    assert _run(["crd", "--check", str(target)]) == 0
    assert capsys.readouterr().out == ""

    target.write_text(render_crd_yaml().replace("maxItems: 256", "maxItems: 9"))
    assert _run(["crd", "--check", str(target)]) == 1
    captured = capsys.readouterr()
    assert "-                maxItems: 9" in captured.out and "+                maxItems: 256" in captured.out
    assert "triton-operator crd --output" in captured.err

    assert _run(["crd", "--check", str(tmp_path / "missing.yaml")]) == 1
    assert "does not exist" in capsys.readouterr().out


def test_crd_command_output_and_check_exclude_each_other() -> None:
    with pytest.raises(SystemExit):
        _run(["crd", "--output", "a", "--check", "b"])
