"""SpecError, the one shape every check reports in, and pydantic's errors turned into it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from triton_operator.models import field_path


@dataclass(frozen=True)
class SpecError:
    """One problem of a spec: the JSON path of the field and what is wrong with it."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def format_errors(errors: Iterable[SpecError]) -> str:
    """Errors as one message, one per line (for a condition message or a CLI error)."""
    return "\n".join(str(e) for e in errors)


def errors_from_validation(exc: ValidationError, prefix: str = "spec") -> list[SpecError]:
    """Pydantic's errors as SpecErrors at JSON paths under ``prefix``."""
    errors = []
    for item in exc.errors(include_url=False):
        message = str(item["msg"]).removeprefix("Value error, ")
        path = field_path(tuple(item["loc"]), prefix)
        if item["type"] == "extra_forbidden":
            message = "unknown field"
        elif item["type"] == "missing":
            message = "is required"
        errors.append(SpecError(path, message))
    return errors


def as_int(value: Any, default: int = 0) -> int:
    """A proto3-JSON integer (int or string of digits) already checked by config_errors."""
    if value is None:
        return default
    return int(value)
