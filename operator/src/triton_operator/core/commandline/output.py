"""Machine-readable output (`-o json|yaml|name`) shared by kubectl-triton and triton-operator's commands."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

FORMATS: tuple[str, ...] = ("json", "yaml", "name")
"""The values of `-o`: JSON and YAML as the API returns the objects, `name` as kubectl prints it."""


def as_list(items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Several objects as kubectl's `get -o json` returns them: a v1 List."""
    return {"apiVersion": "v1", "kind": "List", "items": list(items), "metadata": {"resourceVersion": ""}}


def object_name(obj: Mapping[str, Any]) -> str:
    """`kind.group/name` as `kubectl get -o name` prints it (no group for the core API: `configmap/x`)."""
    api_version = str(obj.get("apiVersion") or "")
    group = api_version.rpartition("/")[0] if "/" in api_version else ""
    kind = str(obj.get("kind") or "").lower()
    name = str((obj.get("metadata") or {}).get("name") or "")
    return f"{kind}.{group}/{name}" if group else f"{kind}/{name}"


def dump(document: Any, fmt: str) -> str:
    """A document as JSON (indent 4, as kubectl) or YAML (keys in the API's order), no final newline."""
    if fmt == "json":
        return json.dumps(document, indent=4, ensure_ascii=False)
    if fmt == "yaml":
        return str(yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=100)).rstrip("\n")
    raise ValueError(f"-o {fmt!r}: expected one of {', '.join(FORMATS)}")


def render_objects(items: Sequence[Mapping[str, Any]], fmt: str, *, single: bool = False) -> str:
    """Objects in ``fmt``: one object alone when ``single`` (kubectl's `get NAME`), else a v1 List;
    `name`: one `kind.group/name` line each."""
    if fmt == "name":
        return "\n".join(object_name(o) for o in items)
    if single and len(items) == 1:
        return dump(dict(items[0]), fmt)
    return dump(as_list(items), fmt)
