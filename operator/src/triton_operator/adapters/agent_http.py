"""The one bounded GET of pods' model agents (allowed IPs, in flight, time, body size), for both readers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import httpx2

from triton_operator.settings import may_read, read_networks


class AgentAnswerError(Exception):
    """Why an agent's answer could not be had; its text is what a status says."""


class AgentHttp:
    """One HTTP client for reads of agents on ``port``: only to pod IPs in ``cidrs`` (when set), at
    most ``concurrency`` in flight, each read bounded by ``timeout`` and ``max_bytes``."""

    def __init__(
        self, *, port: int, timeout: float, max_bytes: int, concurrency: int, cidrs: Sequence[str]
    ) -> None:
        self.port = port
        self.timeout = timeout
        self.max_bytes = max_bytes
        self._networks = read_networks(cidrs)
        self._limit = asyncio.Semaphore(concurrency)
        self._client: httpx2.AsyncClient | None = None
        self.requests = 0

    def allowed(self, ip: str | None) -> bool:
        return may_read(ip, self._networks)

    def client(self) -> httpx2.AsyncClient:
        if self._client is None:
            self._client = httpx2.AsyncClient(timeout=httpx2.Timeout(self.timeout), trust_env=False)
        return self._client

    async def get(self, ip: str | None, path: str) -> bytes:
        """The body of a 200 answer to GET ``path`` of the agent at ``ip``; AgentAnswerError says why
        there is none."""
        if not self.allowed(ip):
            raise AgentAnswerError("no pod IP, or one outside the allowed ranges")
        assert ip is not None
        host = f"[{ip}]" if ":" in ip else ip
        async with self._limit:
            self.requests += 1
            return await self._get(f"http://{host}:{self.port}{path}")

    async def _get(self, url: str) -> bytes:
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
