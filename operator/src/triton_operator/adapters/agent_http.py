"""The one bounded GET of pods' model agents (time, body size, no proxy), shared by both readers."""

from __future__ import annotations

import asyncio

import httpx2


class AgentAnswerError(Exception):
    """Why an agent's answer could not be had; its text is what a status says."""


class AgentHttp:
    """One HTTP client for reads of agents, each read bounded by ``timeout`` and ``max_bytes``."""

    def __init__(self, *, timeout: float, max_bytes: int) -> None:
        self.timeout = timeout
        self.max_bytes = max_bytes
        self._client: httpx2.AsyncClient | None = None

    def client(self) -> httpx2.AsyncClient:
        if self._client is None:
            self._client = httpx2.AsyncClient(timeout=httpx2.Timeout(self.timeout), trust_env=False)
        return self._client

    async def get(self, url: str) -> bytes:
        """The body of a 200 answer to GET ``url``; AgentAnswerError says why there is none."""
        try:
            async with asyncio.timeout(self.timeout):
                async with self.client().stream("GET", url) as response:
                    if response.status_code != 200:
                        raise AgentAnswerError(f"HTTP {response.status_code}")
                    return await self._body(response)
        except TimeoutError:
            raise AgentAnswerError(f"no complete answer within {self.timeout:g}s") from None
        except httpx2.HTTPError as exc:
            raise AgentAnswerError(type(exc).__name__) from None

    async def _body(self, response: httpx2.Response) -> bytes:
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > self.max_bytes:
                raise AgentAnswerError(f"answer larger than {self.max_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
