"""Log records as text or JSON lines (TRITON_OPERATOR_LOG_FORMAT), naming their TritonService if any."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, TextIO

ENV = "TRITON_OPERATOR_LOG_FORMAT"
FORMATS: tuple[str, ...] = ("text", "json")
SERVICE_ENV = "TRITON_OPERATOR_SERVICE"
"""NAMESPACE/NAME of the TritonService a pod's sync or agent works for (set by the operator)."""
REVISION_ENV = "TRITON_OPERATOR_REVISION"
"""The revision a pod's sync or agent works for (set by the operator)."""
FIELDS: tuple[str, ...] = ("namespace", "tritonservice", "revision")
"""What a record carries of its TritonService, where there is one (not `name`: a LogRecord's own)."""

_service: ContextVar[Mapping[str, str] | None] = ContextVar("triton_operator_log_service", default=None)


class LogFormatError(ValueError):
    """A log format setting that is not one of FORMATS."""


def log_format(environ: Mapping[str, str] | None = None) -> str:
    """TRITON_OPERATOR_LOG_FORMAT: text (the default when unset) or json; anything else is an error
    naming the variable (a process stops on it rather than log in a format nobody asked for)."""
    env = os.environ if environ is None else environ
    value = env.get(ENV)
    if value is None:
        return "text"
    if value not in FORMATS:
        raise LogFormatError(f"{ENV}={value!r}: expected one of {', '.join(FORMATS)}")
    return value


@contextmanager
def service_context(namespace: str, name: str, revision: str | None = None) -> Iterator[None]:
    """Every record logged inside (in this task) names this TritonService."""
    fields = {"namespace": namespace, "tritonservice": name}
    if revision:
        fields["revision"] = revision
    token = _service.set(fields)
    try:
        yield
    finally:
        _service.reset(token)


def set_revision(revision: str) -> None:
    """The revision of the TritonService of the current service_context, once it is known."""
    current = _service.get()
    if current is not None:
        _service.set({**current, "revision": revision})


def env_service(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The TritonService a pod's process works for, from SERVICE_ENV and REVISION_ENV (empty when unset)."""
    env = os.environ if environ is None else environ
    fields: dict[str, str] = {}
    namespace, _, name = env.get(SERVICE_ENV, "").partition("/")
    if namespace and name:
        fields.update(namespace=namespace, tritonservice=name)
    if env.get(REVISION_ENV):
        fields["revision"] = env[REVISION_ENV]
    return fields


class ServiceFilter(logging.Filter):
    """Adds namespace, tritonservice and revision to a record: its own extra first, then kopf's object
    reference (k8s_ref), then the current service_context, then the process's ``fixed`` fields."""

    def __init__(self, fixed: Mapping[str, str] | None = None, component: str | None = None) -> None:
        super().__init__()
        self.fixed = dict(fixed or {})
        self.component = component

    def filter(self, record: logging.LogRecord) -> bool:
        if self.component and not getattr(record, "component", None):
            record.component = self.component  # a field of kopf's JSON lines too (it keeps extras)
        ref = getattr(record, "k8s_ref", None) or {}
        if ref.get("kind") not in (None, "TritonService"):
            ref = {}
        from_ref = {"namespace": ref.get("namespace"), "tritonservice": ref.get("name")}
        context = _service.get() or {}
        for key in FIELDS:
            if getattr(record, key, None):
                continue
            value = from_ref.get(key) or context.get(key) or self.fixed.get(key)
            if value:
                setattr(record, key, value)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object a line, the keys kopf's JSON format uses: timestamp, severity, message, and
    logger, component, namespace, tritonservice, revision (where there is one), exc_info."""

    def __init__(self, component: str) -> None:
        super().__init__()
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "severity": severity(record.levelno),
            "message": record.getMessage(),
            "logger": record.name,
            "component": self.component,
        }
        for key in FIELDS:
            if getattr(record, key, None):
                body[key] = getattr(record, key)
        if record.exc_info:
            body["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(body, ensure_ascii=False, default=str)


def severity(levelno: int) -> str:
    """kopf's JSON severities: debug, info, warn, error, fatal."""
    if levelno <= logging.DEBUG:
        return "debug"
    if levelno <= logging.INFO:
        return "info"
    if levelno <= logging.WARNING:
        return "warn"
    return "error" if levelno <= logging.ERROR else "fatal"


def configure(
    component: str,
    fmt: str,
    *,
    level: int | str = logging.INFO,
    text_format: str = "%(asctime)s %(levelname)s %(message)s",
    stream: TextIO | None = None,
    fixed: Mapping[str, str] | None = None,
) -> logging.Handler:
    """The root logger's one handler for a process of ``component`` (sync, agent, node-cache): text
    as before, or JSON lines; either way each record names its TritonService where there is one."""
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter(component) if fmt == "json" else logging.Formatter(text_format))
    handler.addFilter(ServiceFilter(env_service() if fixed is None else fixed))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    return handler


def line(component: str, fmt: str, message: str, *, level: int = logging.ERROR, **fields: Any) -> str:
    """A line a process prints itself (not through logging): the message as is in text, else the
    same JSON object a record would be, with ``fields`` (a sync's summary, its exit status)."""
    if fmt != "json":
        return message
    record = logging.LogRecord(component, level, "", 0, message, None, None)
    ServiceFilter(env_service()).filter(record)
    body = json.loads(JsonFormatter(component).format(record))
    return json.dumps({**body, **fields}, ensure_ascii=False, default=str)
