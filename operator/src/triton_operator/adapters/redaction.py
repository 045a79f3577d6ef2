"""The secrets this process holds, redacted from store errors, their causes and every log record."""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Mapping
from typing import Any

from triton_operator.core.edges.redact import redact, secret_values

__all__ = ["RedactedError", "install_log_redaction", "redacted_cause", "remember_secrets", "scrub"]

MAX_REMEMBERED = 4096
"""Forms of secrets kept; past it the oldest go first (rotated keys of long ago)."""

_lock = threading.Lock()
# Insertion-ordered, so the oldest is dropped first; the sorted tuple is what readers use, swapped
# whole under the lock, so a reader in another thread never sees it half-built.
_remembered: dict[str, None] = {}
_known: tuple[str, ...] = ()
_factory_installed = False


def remember_secrets(credentials: Mapping[str, str]) -> None:
    """Note the secret values of ``credentials`` (see core.edges.redact.secret_values) so that no store
    error, cause or log line of this process shows them. Every store calls it before it uses them."""
    global _known  # noqa: PLW0603 - one registry per process: log records come from every thread
    forms = secret_values(credentials)
    if all(form in _remembered for form in forms):  # the same credentials again: nothing new
        return
    with _lock:
        for form in forms:
            _remembered.pop(form, None)
            _remembered[form] = None
        while len(_remembered) > MAX_REMEMBERED:
            del _remembered[next(iter(_remembered))]
        _known = tuple(sorted(_remembered, key=len, reverse=True))


def scrub(text: str) -> str:
    """``text`` with every remembered secret and every credential pattern redacted."""
    return redact(text, _known)


class RedactedError(Exception):
    """Stands in for an SDK's exception as the cause of a StoreError: its type and redacted text,
    and its traceback (code lines only), so a logged traceback helps without showing a secret."""


def redacted_cause(exc: BaseException, _depth: int = 0) -> RedactedError:
    """``exc`` and the chain a traceback would print after it, each as a RedactedError.

    Store errors are raised ``from redacted_cause(exc)``, never ``from exc``: logging (and kopf,
    which logs what a handler raised) prints a cause's text, and an SDK's text may hold a signed
    URL or a header. The original stays out of the printed chain (``__suppress_context__``).
    """
    try:
        text = scrub(str(exc))
    except Exception:  # an SDK exception whose __str__ fails still gets its stand-in
        text = "<unprintable>"
    stand_in = RedactedError(f"{type(exc).__module__}.{type(exc).__qualname__}: {text}")
    stand_in.__traceback__ = exc.__traceback__
    after = exc.__cause__ if exc.__cause__ is not None else None
    if after is None and not exc.__suppress_context__:
        after = exc.__context__
    if after is not None and after is not exc and _depth < 8:
        stand_in.__cause__ = redacted_cause(after, _depth + 1)
    return stand_in


def _redact_record(record: logging.LogRecord) -> None:
    try:
        message = record.getMessage()
    except Exception:  # a bad format string: logging reports it itself when a handler formats it
        return
    clean = scrub(message)
    if clean != message:
        record.msg, record.args = clean, ()
    if isinstance(record.exc_info, tuple) and record.exc_info[1] is not None:
        try:
            text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        except Exception:  # an exception whose __str__ fails: the formatter says so itself
            return
        clean = scrub(text)
        if clean != text:
            # Formatters use exc_text when it is set, instead of formatting exc_info again.
            record.exc_text = clean


def install_log_redaction() -> None:
    """Redact every log record of this process as it is made (message, arguments, traceback).

    At record creation, not in a handler's filter: every handler gets the redacted record, also
    those added later (kopf's Event poster, a test's log capture), and an SDK's debug lines
    (botocore's signed headers, urllib3's request lines with a SAS signature) are caught too.
    Idempotent; the `run` and `sync` commands install it before anything is logged.
    """
    global _factory_installed  # noqa: PLW0603 - the record factory is process-wide too
    with _lock:
        if _factory_installed:
            return
        previous = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            _redact_record(record)
            return record

        logging.setLogRecordFactory(factory)
        _factory_installed = True
