"""The TritonService CRD's schema as the API server sees it, and a strict validator for the subset of
OpenAPI it uses: shared by the CRD tests and the `import` tests (tests/unit)."""

from __future__ import annotations

import re
from typing import Any

from triton_operator.core.spec.crd_schema import build_schema

SCHEMA = build_schema()
# As the API server sees the root: ObjectMeta fields other than name are checked by the server itself.
ROOT = {**SCHEMA, "properties": {**SCHEMA["properties"]}}
ROOT["properties"]["metadata"] = {
    **SCHEMA["properties"]["metadata"],
    "x-kubernetes-preserve-unknown-fields": True,
}


def validate(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """What the API server checks with fieldValidation=Strict, for the keywords this CRD uses (no CEL)."""
    errors: list[str] = []
    if schema.get("x-kubernetes-int-or-string"):
        if isinstance(value, bool) or not isinstance(value, int | str):
            errors.append(f"{path}: must be an integer or a string")
        elif isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{path}: should match {schema['pattern']}")
        return errors
    kind = schema.get("type")
    checks = {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
    }
    if not checks[str(kind)](value):
        return [f"{path}: must be of type {kind}"]
    if kind == "object":
        properties = schema.get("properties", {})
        for key, item in value.items():
            if key in properties:
                errors += validate(item, properties[key], f"{path}.{key}")
            elif "additionalProperties" in schema:
                errors += validate(item, schema["additionalProperties"], f"{path}[{key}]")
            elif not schema.get("x-kubernetes-preserve-unknown-fields"):
                errors.append(f"{path}.{key}: unknown field")
        errors += [f"{path}.{r}: required" for r in schema.get("required", []) if r not in value]
    elif kind == "array":
        if len(value) > schema.get("maxItems", len(value)) or len(value) < schema.get("minItems", 0):
            errors.append(f"{path}: has {len(value)} items")
        for index, item in enumerate(value):
            errors += validate(item, schema["items"], f"{path}[{index}]")
    elif kind == "string":
        if "enum" in schema and value not in schema["enum"]:
            errors.append(f"{path}: unsupported value {value!r}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{path}: should match {schema['pattern']}")
        if len(value) > schema.get("maxLength", len(value)):
            errors.append(f"{path}: too long")
    elif kind in ("integer", "number") and not schema.get("minimum", value) <= value <= schema.get(
        "maximum", value
    ):
        errors.append(f"{path}: out of range")
    return errors
