"""Triton's HTTP API as the tests read it: server readiness, the repository index, model readiness."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import aiohttp

DEFAULT_TIMEOUT = aiohttp.ClientTimeout(total=10)


class TritonAPIError(RuntimeError):
    """Triton answered a request with an error, or could not be reached."""


def _url(base_url: str, path: str) -> str:
    return base_url.rstrip("/") + path


async def _status(base_url: str, path: str, session: aiohttp.ClientSession | None) -> int | None:
    """The HTTP status of a GET, or None when nothing answered."""
    try:
        if session is None:
            async with aiohttp.ClientSession(timeout=DEFAULT_TIMEOUT) as own:
                return await _status(base_url, path, own)
        async with session.get(_url(base_url, path)) as response:
            return response.status
    except (aiohttp.ClientError, TimeoutError):
        return None


async def server_ready(base_url: str, *, session: aiohttp.ClientSession | None = None) -> bool:
    """Whether /v2/health/ready says the server and all its loaded models are ready; False if unreachable."""
    return await _status(base_url, "/v2/health/ready", session) == 200


async def model_ready(
    base_url: str, name: str, version: str | None = None, *, session: aiohttp.ClientSession | None = None
) -> bool:
    """Whether a model (a given version, or else the version Triton picks) is ready; False if unreachable."""
    path = f"/v2/models/{quote(name, safe='')}"
    if version is not None:
        path += f"/versions/{quote(version, safe='')}"
    return await _status(base_url, path + "/ready", session) == 200


async def model_index(
    base_url: str, *, ready_only: bool = False, session: aiohttp.ClientSession | None = None
) -> list[dict[str, Any]]:
    """The repository index: one entry per model (version) with name, version, state and reason.

    Raises TritonAPIError when Triton is unreachable or refuses.
    """
    if session is None:
        async with aiohttp.ClientSession(timeout=DEFAULT_TIMEOUT) as own:
            return await model_index(base_url, ready_only=ready_only, session=own)
    url = _url(base_url, "/v2/repository/index")
    try:
        async with session.post(url, json={"ready": ready_only}) as response:
            body = await response.json(content_type=None)
            if response.status != 200:
                error = body.get("error") if isinstance(body, dict) else body
                raise TritonAPIError(f"POST {url}: HTTP {response.status}: {error}")
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise TritonAPIError(f"POST {url}: {exc}") from exc
    if not isinstance(body, list):
        raise TritonAPIError(f"POST {url}: expected a list, got {type(body).__name__}")
    return [dict(entry) for entry in body]
