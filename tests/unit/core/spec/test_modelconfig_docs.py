"""`kubectl explain` on spec.models[].config: every ModelConfig field has a one-line description."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from crd_schema import SCHEMA
from triton_operator.core.spec.modelconfig import MODEL_CONFIG_DESCRIPTOR
from triton_operator.core.spec.modelconfig_docs import FIELD_DESCRIPTIONS, MAX_DESCRIPTION_LENGTH

CONFIG = SCHEMA["properties"]["spec"]["properties"]["models"]["items"]["properties"]["config"]


def _messages(descriptor: Descriptor, seen: dict[str, Descriptor]) -> dict[str, Descriptor]:
    """Every message reachable from descriptor through its fields, by full name."""
    if descriptor.full_name not in seen:
        seen[descriptor.full_name] = descriptor
        for field in descriptor.fields:
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                _messages(field.message_type, seen)
    return seen


MESSAGES = _messages(MODEL_CONFIG_DESCRIPTOR, {})
# Map entries are synthetic: a map is one object in the schema, described by its own field.
FIELDS = {
    field.full_name
    for message in MESSAGES.values()
    if not message.GetOptions().map_entry
    for field in message.fields
}


def _properties(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, schema) of every property under schema, through list items and map values too."""
    for name, child in schema.get("properties", {}).items():
        yield f"{path}.{name}", child
        yield from _properties(child, f"{path}.{name}")
    for key, step in (("items", "[]"), ("additionalProperties", "{}")):
        if isinstance(schema.get(key), dict):
            yield from _properties(schema[key], path + step)


def test_the_walk_reaches_the_whole_model_config() -> None:
    # Guards the two tests below against passing on an empty walk.
    assert len(FIELDS) > 150
    assert "inference.ModelOptimizationPolicy.Cuda.GraphSpec.LowerBound.batch_size" in FIELDS
    assert sum(1 for _ in _properties(CONFIG, "config")) > 150


def test_every_config_property_has_a_description() -> None:
    undescribed = [
        path for path, node in _properties(CONFIG, "config") if not node.get("description", "").strip()
    ]
    assert undescribed == []


def test_every_model_config_field_has_a_line() -> None:
    assert sorted(FIELDS - FIELD_DESCRIPTIONS.keys()) == []


def test_no_line_names_a_field_that_does_not_exist() -> None:
    assert sorted(FIELD_DESCRIPTIONS.keys() - FIELDS) == []


def test_lines_are_single_trimmed_lines_within_the_bound() -> None:
    bad = {
        name: text
        for name, text in FIELD_DESCRIPTIONS.items()
        if not text
        or "\n" in text
        or text != text.strip()
        or "  " in text
        or len(text) > MAX_DESCRIPTION_LENGTH
    }
    assert bad == {}


def test_schema_descriptions_are_single_lines() -> None:
    multiline = [path for path, node in _properties(CONFIG, "config") if "\n" in node.get("description", "")]
    assert multiline == []


def test_dynamic_batching_says_what_each_field_does() -> None:
    batching = CONFIG["properties"]["dynamicBatching"]
    delay = batching["properties"]["maxQueueDelayMicroseconds"]["description"]
    assert "microseconds" in delay
    assert delay.startswith(FIELD_DESCRIPTIONS["inference.ModelDynamicBatching.max_queue_delay_microseconds"])
    for field in MESSAGES["inference.ModelDynamicBatching"].fields:
        description = batching["properties"][field.json_name]["description"]
        assert description.startswith(FIELD_DESCRIPTIONS[field.full_name])


def test_type_notes_stay_after_the_line() -> None:
    # How to write a value (64-bit integers as strings, integer map keys) is kept, after the line.
    batching = CONFIG["properties"]["dynamicBatching"]["properties"]
    delay = batching["maxQueueDelayMicroseconds"]["description"]
    assert delay.endswith("uint64: an integer or a string of digits.")
    policies = batching["priorityQueuePolicy"]["description"]
    assert policies.startswith(FIELD_DESCRIPTIONS["inference.ModelDynamicBatching.priority_queue_policy"])
    assert policies.endswith("its keys are integers written as strings.")
    # Items of a repeated 64-bit field keep their note; the list itself says what it holds.
    dims = CONFIG["properties"]["input"]["items"]["properties"]["dims"]
    assert dims["description"] == FIELD_DESCRIPTIONS["inference.ModelInput.dims"]
    assert dims["items"]["description"] == "int64: an integer or a string of digits."


def test_the_model_name_line_is_the_operators_own() -> None:
    # config.name is checked against the model's name in spec.models; the line says so.
    assert "spec.models" in CONFIG["properties"]["name"]["description"]
