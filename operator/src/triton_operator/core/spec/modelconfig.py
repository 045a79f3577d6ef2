"""Triton ModelConfig: proto3 JSON from the spec <-> config.pbtxt, through protobuf, never templates."""

from __future__ import annotations

import base64
import binascii
import difflib
import importlib
import importlib.util
import math
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from triton_operator.core.spec.field_error import ModelConfigError

# Triton's ModelConfig protobuf module: the one generated file tritonclient ships, under its own name.
MODEL_CONFIG_MODULE = "tritonclient.grpc.model_config_pb2"


def load_model_config_pb2() -> ModuleType:
    """Triton's ModelConfig protobuf module, loaded from tritonclient/grpc/model_config_pb2.py without
    running tritonclient/grpc/__init__.py, which imports grpc, numpy and the whole gRPC client (about
    38 MiB the operator never uses). Registered under its own name, so a later `import tritonclient.grpc`
    (the client) finds it and the protobuf pool holds model_config.proto once."""
    if MODEL_CONFIG_MODULE in sys.modules or "tritonclient.grpc" in sys.modules:
        return importlib.import_module(MODEL_CONFIG_MODULE)
    package = importlib.util.find_spec("tritonclient")  # finds the package, does not run it
    if package is None or not package.submodule_search_locations:
        raise ModuleNotFoundError(f"No module named {MODEL_CONFIG_MODULE!r}", name=MODEL_CONFIG_MODULE)
    path = Path(next(iter(package.submodule_search_locations))) / "grpc" / "model_config_pb2.py"
    spec = importlib.util.spec_from_file_location(MODEL_CONFIG_MODULE, path)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"no {MODEL_CONFIG_MODULE} at {path}", name=MODEL_CONFIG_MODULE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODEL_CONFIG_MODULE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[MODEL_CONFIG_MODULE]
        raise
    return module


model_config_pb2 = load_model_config_pb2()
ModelConfig = model_config_pb2.ModelConfig
MODEL_CONFIG_DESCRIPTOR: Descriptor = ModelConfig.DESCRIPTOR

INT32_TYPES = frozenset(
    {FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32}
)
UINT32_TYPES = frozenset({FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32})
INT64_TYPES = frozenset(
    {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64}
)
UINT64_TYPES = frozenset({FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64})
FLOAT_TYPES = frozenset({FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE})

INT_RANGES: dict[int, tuple[int, int]] = {
    **dict.fromkeys(INT32_TYPES, (-(2**31), 2**31 - 1)),
    **dict.fromkeys(UINT32_TYPES, (0, 2**32 - 1)),
    **dict.fromkeys(INT64_TYPES, (-(2**63), 2**63 - 1)),
    **dict.fromkeys(UINT64_TYPES, (0, 2**64 - 1)),
}
INT_TYPE_NAMES: dict[int, str] = {
    **dict.fromkeys(INT32_TYPES, "int32"),
    **dict.fromkeys(UINT32_TYPES, "uint32"),
    **dict.fromkeys(INT64_TYPES, "int64"),
    **dict.fromkeys(UINT64_TYPES, "uint64"),
}
FLOAT32_MAX = 3.4028234663852886e38
_INTEGER_STRING = re.compile(r"^-?[0-9]+$")


# ---------------------------------------------------------------- descriptor helpers


def is_repeated(field: FieldDescriptor) -> bool:
    """Whether a field is repeated (maps included), across protobuf versions."""
    flag = getattr(field, "is_repeated", None)
    if isinstance(flag, bool):
        return flag
    return bool(field.label == FieldDescriptor.LABEL_REPEATED)


def is_map(field: FieldDescriptor) -> bool:
    """Whether a field is a protobuf map (a repeated synthetic *Entry message)."""
    return bool(
        field.type == FieldDescriptor.TYPE_MESSAGE
        and field.message_type is not None
        and field.message_type.GetOptions().map_entry
    )


def map_key_value(field: FieldDescriptor) -> tuple[FieldDescriptor, FieldDescriptor]:
    """The key and value fields of a map field."""
    entry = field.message_type
    return entry.fields_by_name["key"], entry.fields_by_name["value"]


# ---------------------------------------------------------------- checking proto3 JSON


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_int(value: Any, field: FieldDescriptor, path: str, errors: list[ModelConfigError]) -> None:
    kind = INT_TYPE_NAMES[field.type]
    number: int | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif (isinstance(value, float) and value.is_integer()) or (
        isinstance(value, str) and _INTEGER_STRING.match(value)
    ):
        number = int(value)
    if number is None:
        errors.append(ModelConfigError(path, f"must be an integer ({kind}), got {_describe(value)}"))
        return
    low, high = INT_RANGES[field.type]
    if not low <= number <= high:
        errors.append(ModelConfigError(path, f"{number} is out of range for {kind} [{low}, {high}]"))


def _check_float(value: Any, field: FieldDescriptor, path: str, errors: list[ModelConfigError]) -> None:
    if isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity"):
        return
    number: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    if number is None:
        errors.append(ModelConfigError(path, f"must be a number, got {_describe(value)}"))
        return
    if field.type == FieldDescriptor.TYPE_FLOAT and math.isfinite(number) and abs(number) > FLOAT32_MAX:
        errors.append(ModelConfigError(path, f"{number} is too large for a float"))


def _check_scalar(value: Any, field: FieldDescriptor, path: str, errors: list[ModelConfigError]) -> None:
    ftype = field.type
    if ftype in INT_TYPE_NAMES:
        _check_int(value, field, path, errors)
    elif ftype in FLOAT_TYPES:
        _check_float(value, field, path, errors)
    elif ftype == FieldDescriptor.TYPE_BOOL:
        if not isinstance(value, bool):
            errors.append(ModelConfigError(path, f"must be true or false, got {_describe(value)}"))
    elif ftype == FieldDescriptor.TYPE_STRING:
        if not isinstance(value, str):
            errors.append(ModelConfigError(path, f"must be a string, got {_describe(value)}"))
    elif ftype == FieldDescriptor.TYPE_BYTES:
        if not isinstance(value, str):
            errors.append(ModelConfigError(path, f"must be a base64 string, got {_describe(value)}"))
        else:
            try:
                base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                errors.append(ModelConfigError(path, f"is not valid base64: {_describe(value)}"))
    elif ftype == FieldDescriptor.TYPE_ENUM:
        names = [v.name for v in field.enum_type.values]
        if not isinstance(value, str) or value not in names:
            hint = difflib.get_close_matches(str(value), names, n=1)
            suggestion = f" (did you mean {hint[0]}?)" if hint else ""
            errors.append(
                ModelConfigError(path, f"{_describe(value)} is not one of {', '.join(names)}{suggestion}")
            )


def _check_map_key(key: Any, field: FieldDescriptor, path: str, errors: list[ModelConfigError]) -> None:
    if field.type in INT_TYPE_NAMES:
        if isinstance(key, bool) or not (
            isinstance(key, int) or (isinstance(key, str) and _INTEGER_STRING.match(key))
        ):
            errors.append(ModelConfigError(path, f"map key {_describe(key)} must be an integer"))
            return
        _check_int(int(key), field, path, errors)
    elif field.type == FieldDescriptor.TYPE_BOOL:
        if key not in ("true", "false", True, False):
            errors.append(ModelConfigError(path, f"map key {_describe(key)} must be true or false"))
    elif not isinstance(key, str):
        errors.append(ModelConfigError(path, f"map key {_describe(key)} must be a string"))


def _check_value(value: Any, field: FieldDescriptor, path: str, errors: list[ModelConfigError]) -> None:
    """One (non-repeated) value of ``field``."""
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        check_message_dict(value, field.message_type, path, errors)
    else:
        _check_scalar(value, field, path, errors)


def _check_field(value: Any, field: FieldDescriptor, path: str, errors: list[ModelConfigError]) -> None:
    if is_map(field):
        if not isinstance(value, Mapping):
            errors.append(ModelConfigError(path, f"must be an object (a map), got {_describe(value)}"))
            return
        key_field, value_field = map_key_value(field)
        for key, item in value.items():
            item_path = f"{path}[{key}]"
            _check_map_key(key, key_field, item_path, errors)
            if item is None:
                errors.append(ModelConfigError(item_path, "must not be null"))
            else:
                _check_value(item, value_field, item_path, errors)
    elif is_repeated(field):
        if not isinstance(value, list):
            errors.append(ModelConfigError(path, f"must be a list, got {_describe(value)}"))
            return
        for index, item in enumerate(value):
            item_path = f"{path}[{index}]"
            if item is None:
                errors.append(ModelConfigError(item_path, "must not be null"))
            else:
                _check_value(item, field, item_path, errors)
    else:
        _check_value(value, field, path, errors)


def check_message_dict(value: Any, descriptor: Descriptor, path: str, errors: list[ModelConfigError]) -> None:
    """Check proto3 JSON ``value`` against ``descriptor``, appending an error per problem.

    Stricter than protobuf's own parser in two ways that keep it in line with the CRD schema: only
    the camelCase JSON names are accepted, and enums only by name.
    """
    if not isinstance(value, Mapping):
        errors.append(ModelConfigError(path, f"must be an object, got {_describe(value)}"))
        return
    by_json = {f.json_name: f for f in descriptor.fields}
    by_proto = {f.name: f for f in descriptor.fields}
    oneofs_set: dict[str, list[str]] = {}
    for key, item in value.items():
        field = by_json.get(key) if isinstance(key, str) else None
        key_path = f"{path}.{key}"
        if field is None:
            proto_field = by_proto.get(key) if isinstance(key, str) else None
            if proto_field is not None:
                hint = f"; the spec uses proto3 JSON names: {proto_field.json_name}"
            else:
                close = difflib.get_close_matches(str(key), list(by_json), n=1)
                hint = f"; did you mean {close[0]}?" if close else ""
            if not hint:
                hint = f" (known: {', '.join(by_json)})"
            errors.append(ModelConfigError(key_path, f"unknown field of {descriptor.name}{hint}"))
            continue
        if item is None:  # proto3 JSON: null means the default
            continue
        if field.containing_oneof is not None:
            oneofs_set.setdefault(field.containing_oneof.name, []).append(key)
        _check_field(item, field, key_path, errors)
    for oneof_name, keys in oneofs_set.items():
        if len(keys) > 1:
            options = ", ".join(f.json_name for f in descriptor.oneofs_by_name[oneof_name].fields)
            errors.append(
                ModelConfigError(
                    f"{path}.{keys[1]}", f"set together with {keys[0]}; at most one of {options} may be set"
                )
            )


def config_errors(config: Any, *, field: str = "config") -> list[ModelConfigError]:
    """Every problem of a spec's proto3-JSON ModelConfig, each naming its JSON path under ``field``."""
    errors: list[ModelConfigError] = []
    check_message_dict(config, MODEL_CONFIG_DESCRIPTOR, field, errors)
    return errors


_PROTO_PATH = re.compile(r'at "?ModelConfig((?:\.[A-Za-z0-9_]+|\[[^\]]*\])*)"?')


def translate_parse_error(message: str, field: str) -> ModelConfigError:
    """Turn protobuf's ParseError text into an error at our JSON path (``field`` + the proto path)."""
    found = _PROTO_PATH.search(message)
    if found:
        return ModelConfigError(field + found.group(1), message)
    return ModelConfigError(field, message)


# ---------------------------------------------------------------- parse, render, import


def parse_model_config(name: str, config: Mapping[str, Any], *, field: str = "config") -> Any:
    """Parse a spec's proto3-JSON config into a ModelConfig message named ``name``.

    ``config.name`` may be left out (it defaults to the model name) but must not differ. Errors are
    ``ModelConfigError`` naming the JSON path of the first problem (``config.dynamicBatching.x``).
    """
    if not isinstance(config, Mapping):
        raise ModelConfigError(field, f"must be an object, got {_describe(config)}")
    given = config.get("name")
    if given not in (None, "", name):
        raise ModelConfigError(f"{field}.name", f"is {given!r} but the model is named {name!r}")
    errors = config_errors(config, field=field)
    if errors:
        raise errors[0]
    message = ModelConfig()
    try:
        json_format.ParseDict(dict(config), message)
    except json_format.ParseError as exc:
        raise translate_parse_error(str(exc), field) from exc
    message.name = name
    return message


def render_model_config(message: Any) -> str:
    """config.pbtxt text of a ModelConfig message (protobuf text format)."""
    return str(text_format.MessageToString(message))


def build_config_pbtxt(name: str, config: Mapping[str, Any], *, field: str = "config") -> str:
    """Render config.pbtxt text for one model of the spec."""
    return render_model_config(parse_model_config(name, config, field=field))


def parse_config_pbtxt(text: str, *, source: str = "config.pbtxt") -> Any:
    """Parse config.pbtxt text into a ModelConfig message; errors name ``source`` and the line."""
    message = ModelConfig()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        raise ModelConfigError(source, str(exc)) from exc
    return message


_SAFE_INTEGER = 2**53  # integers beyond this lose precision in JSON readers that use doubles


def _tidy_value(value: Any, field: FieldDescriptor, int64_as_number: bool) -> Any:
    if int64_as_number and (field.type in INT64_TYPES or field.type in UINT64_TYPES):
        number = int(value)
        return number if abs(number) < _SAFE_INTEGER else value
    if field.type == FieldDescriptor.TYPE_MESSAGE and isinstance(value, dict):
        return _tidy_message(value, field.message_type, int64_as_number)
    return value


def _tidy_message(data: dict[str, Any], descriptor: Descriptor, int64_as_number: bool) -> dict[str, Any]:
    """Keys in the order the .proto declares them (not by field number), 64-bit ints as asked."""
    out: dict[str, Any] = {}
    for field in descriptor.fields:
        if field.json_name not in data:
            continue
        value = data[field.json_name]
        if is_map(field):
            _, value_field = map_key_value(field)
            out[field.json_name] = {k: _tidy_value(v, value_field, int64_as_number) for k, v in value.items()}
        elif is_repeated(field):
            out[field.json_name] = [_tidy_value(v, field, int64_as_number) for v in value]
        else:
            out[field.json_name] = _tidy_value(value, field, int64_as_number)
    return out


def config_to_dict(message: Any, *, int64_as_number: bool = False) -> dict[str, Any]:
    """A ModelConfig message in the spec's proto3-JSON form (camelCase), keys in .proto order.

    proto3 JSON writes 64-bit integers as strings ("100"); with ``int64_as_number`` they are plain
    numbers (100) where a double holds them exactly. Both forms parse back to the same message.
    """
    data: dict[str, Any] = json_format.MessageToDict(message)
    return _tidy_message(data, message.DESCRIPTOR, int64_as_number)


def import_config_pbtxt(
    text: str, *, source: str = "config.pbtxt", int64_as_number: bool = False
) -> dict[str, Any]:
    """Read config.pbtxt text into the spec's proto3-JSON form (camelCase)."""
    return config_to_dict(parse_config_pbtxt(text, source=source), int64_as_number=int64_as_number)


# ---------------------------------------------------------------- import of a model repository


def build_model_entry(
    folder: str, text: str | None, *, source: str = "config.pbtxt", int64_as_number: bool = True
) -> dict[str, Any]:
    """One entry of spec.models from a repository folder and its config.pbtxt text (None: no file).

    The model is named by config.name when it has one, else by the folder; ``path`` is kept only
    when the folder differs from the name, and ``config.name`` is left out (it is the model's name).
    64-bit integers are written as numbers unless ``int64_as_number`` is False.
    """
    config = (
        import_config_pbtxt(text, source=source, int64_as_number=int64_as_number) if text is not None else {}
    )
    name = str(config.pop("name", "") or folder)
    entry: dict[str, Any] = {"name": name}
    if folder != name:
        entry["path"] = folder
    entry["config"] = config
    return entry


def _gpu_ids(group: Mapping[str, Any]) -> list[int]:
    """The usable GPU ids of an instance group: a negative or non-integer id is left to validation,
    which reports it on the group's own ``gpus`` field."""
    ids = []
    for gpu in group.get("gpus") or []:
        try:
            value = int(gpu)
        except (TypeError, ValueError):
            continue
        if value >= 0:
            ids.append(value)
    return ids


def gpus_needed_why(models: list[dict[str, Any]]) -> tuple[int, str | None]:
    """GPUs a pod needs for the KIND_GPU instance groups of ``models``, and which group decides it.

    GPU ids count from 0, so a group naming GPU 1 needs 2; a KIND_GPU group naming none needs 1.
    """
    needed, why = 0, None
    for i, model in enumerate(models):
        for j, group in enumerate(model.get("config", {}).get("instanceGroup") or []):
            if group.get("kind") != "KIND_GPU":
                continue
            ids = _gpu_ids(group)
            count = max(ids) + 1 if ids else 1
            if count > needed:
                where = f"models[{i}].config.instanceGroup[{j}]"
                why = (
                    f"{where}.gpus names GPU {max(ids)} (ids count from 0)"
                    if ids
                    else f"{where} is KIND_GPU with no gpus listed (one GPU)"
                )
                needed = count
    return needed, why


def gpus_needed(models: list[dict[str, Any]]) -> int:
    """GPUs a pod needs for the KIND_GPU instance groups of ``models`` (gpus_needed_why)."""
    return gpus_needed_why(models)[0]


def build_imported_service(name: str, uri: str, models: list[dict[str, Any]]) -> dict[str, Any]:
    """A TritonService object serving ``models`` (entries of spec.models) from ``uri``.

    When a model has KIND_GPU instances, the pod asks for as many GPUs as their ids need.
    """
    spec: dict[str, Any] = {"repository": {"uri": uri}}
    gpus = gpus_needed(models)
    if gpus:
        spec["resources"] = {"gpus": gpus}
    spec["models"] = models
    return {
        "apiVersion": "triton-operator.io/v1alpha1",
        "kind": "TritonService",
        "metadata": {"name": name},
        "spec": spec,
    }
