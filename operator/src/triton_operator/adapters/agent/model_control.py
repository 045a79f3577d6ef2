"""Triton's HTTP model control API on loopback, with bounded timeouts: live, load, unload, index."""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from triton_operator.core.vocabulary.triton_state import ModelVersionState, parse_index, short_reason

MAX_BODY = 4 * 1024 * 1024
"""The most of one response body read (a repository index of thousands of models fits)."""


class TritonUnreachable(Exception):  # noqa: N818
    """No answer from tritonserver (not started yet, restarting, or too slow): try again later."""


class LoadFailed(Exception):  # noqa: N818
    """Triton answered a load or unload with an error: ``reason`` is its message."""

    def __init__(self, action: str, model: str, reason: str) -> None:
        super().__init__(f"{action} of model {model!r} failed: {reason}")
        self.action = action
        self.model = model
        self.reason = reason


@dataclass(frozen=True)
class ModelControl:
    """tritonserver's HTTP endpoint (``url``: http://127.0.0.1:8000); every request ends within its
    timeout: ``timeout`` for reads, ``load_timeout`` for a load or unload (a model's load can take
    minutes; Triton answers when it is done)."""

    url: str = "http://127.0.0.1:8000"
    timeout: float = 5.0
    load_timeout: float = 900.0

    def _request(self, method: str, path: str, body: Any, timeout: float) -> tuple[int, bytes]:
        parts = urlsplit(self.url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"--triton {self.url!r}: expected http://HOST:PORT")
        connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        try:
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            payload = response.read(MAX_BODY + 1)
            return response.status, payload[:MAX_BODY]
        except (OSError, http.client.HTTPException) as exc:
            # refused, reset, or a timeout (socket.timeout is an OSError)
            kind = (
                "timed out"
                if isinstance(exc, socket.timeout | TimeoutError)
                else str(exc) or type(exc).__name__
            )
            raise TritonUnreachable(f"{self.url}{path}: {kind}") from exc
        finally:
            connection.close()

    def live(self) -> bool:
        """Whether tritonserver answers (GET /v2/health/live)."""
        try:
            status, _ = self._request("GET", "/v2/health/live", None, self.timeout)
        except TritonUnreachable:
            return False
        return status == 200

    def _control(self, action: str, model: str) -> None:
        path = f"/v2/repository/models/{quote(model, safe='')}/{action}"
        status, payload = self._request("POST", path, {}, self.load_timeout)
        if status != 200:
            raise LoadFailed(action, model, _error(payload) or f"HTTP {status}")

    def load(self, model: str) -> None:
        """Load (or reload) ``model`` from the repository; raises LoadFailed with Triton's reason."""
        self._control("load", model)

    def unload(self, model: str) -> None:
        self._control("unload", model)

    def ready(self, model: str, version: str = "") -> bool:
        """Triton's own readiness of a model version (GET /v2/models/<m>[/versions/<v>]/ready): raises
        TritonUnreachable when it does not answer. (Triton 2.51 still answers 200 for a Python model
        whose backend stub died; later releases check the stub here: both are read.)"""
        path = f"/v2/models/{quote(model, safe='')}"
        if version:
            path += f"/versions/{quote(version, safe='')}"
        status, _ = self._request("GET", f"{path}/ready", None, self.timeout)
        return status == 200

    def index(self) -> tuple[ModelVersionState, ...]:
        """Triton's repository index: every model version it knows, with its state."""
        status, payload = self._request("POST", "/v2/repository/index", {}, self.timeout)
        if status != 200:
            raise TritonUnreachable(f"{self.url}/v2/repository/index: HTTP {status}")
        try:
            return parse_index(json.loads(payload))
        except ValueError as exc:
            raise TritonUnreachable(f"{self.url}/v2/repository/index: not JSON") from exc


def _error(payload: bytes) -> str:
    """Triton's error text from a body {"error": "..."} (or the body's first line)."""
    text = payload.decode("utf-8", "replace")
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), str):
        text = data["error"]
    return short_reason(text)
