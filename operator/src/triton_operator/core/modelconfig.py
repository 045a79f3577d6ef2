"""Triton ModelConfig: proto3 JSON from the spec <-> config.pbtxt, through protobuf, never templates."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

ModelConfig = model_config_pb2.ModelConfig


class ModelConfigError(ValueError):
    """A model's config is not a valid Triton ModelConfig; ``field`` names where."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def parse_model_config(name: str, config: dict[str, Any], *, field: str = "config") -> Any:
    """Parse a spec's proto3-JSON config into a ModelConfig message named ``name``.

    ``config.name`` may be left out (it defaults to the model name) but must not differ.
    """
    given = config.get("name")
    if given not in (None, "", name):
        raise ModelConfigError(f"{field}.name", f"is {given!r} but the model is named {name!r}")
    message = ModelConfig()
    try:
        json_format.ParseDict(config, message)
    except json_format.ParseError as exc:
        raise ModelConfigError(field, str(exc)) from exc
    message.name = name
    return message


def build_config_pbtxt(name: str, config: dict[str, Any]) -> str:
    """Render config.pbtxt text for one model of the spec."""
    return str(text_format.MessageToString(parse_model_config(name, config)))


def import_config_pbtxt(text: str) -> dict[str, Any]:
    """Read config.pbtxt text into the spec's proto3-JSON form (camelCase)."""
    message = ModelConfig()
    text_format.Parse(text, message)
    result: dict[str, Any] = json_format.MessageToDict(message)
    return result
