"""Bounded reads of the pods' model-agents (GET <pod IP>:8009/v1/inplace) during an in-place update."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence

import httpx2

from triton_operator.core.objects.names import AGENT_PORT, AGENT_STATUS_PATH
from triton_operator.core.rollout.inplace import AgentStatus, parse_agent_status
from triton_operator.settings import may_read, read_networks

# The bounds: only while an in-place update moves (reconcile.reconcile_pass asks), one request per pod per
# pass, all at once but at most `concurrency` in flight, each ended with its body within `timeout`
# seconds and `max_bytes` of body, only to pod IPs in `cidrs` (when set). A pod not answering in
# time is an unreadable status: its step waits (the progress deadline bounds the wait).

MAX_STATUS_BYTES = 256 * 1024


class AgentReader:
    """Reads the agents of the pods it is given, in parallel, each read bounded."""

    def __init__(
        self,
        *,
        timeout: float = 2.0,
        concurrency: int = 32,
        cidrs: Sequence[str] = (),
        port: int = AGENT_PORT,
        max_bytes: int = MAX_STATUS_BYTES,
    ) -> None:
        self.timeout = timeout
        self.port = port
        self.max_bytes = max_bytes
        self._networks = read_networks(cidrs)
        self._limit = asyncio.Semaphore(concurrency)
        self._client: httpx2.AsyncClient | None = None
        self.requests = 0

    def allowed(self, ip: str | None) -> bool:
        return may_read(ip, self._networks)

    async def read(self, pods: Mapping[str, str | None]) -> dict[str, AgentStatus]:
        """Pod name -> its agent's status (or why it could not be read), for pods name -> IP."""
        names = sorted(pods)
        results = await asyncio.gather(*(self.read_one(pods[n]) for n in names))
        return dict(zip(names, results, strict=True))

    async def read_one(self, ip: str | None) -> AgentStatus:
        if not self.allowed(ip):
            return AgentStatus(error="no pod IP, or one outside the allowed ranges")
        assert ip is not None
        host = f"[{ip}]" if ":" in ip else ip
        url = f"http://{host}:{self.port}{AGENT_STATUS_PATH}"
        async with self._limit:
            self.requests += 1
            try:
                async with asyncio.timeout(self.timeout):
                    async with self.client().stream("GET", url) as response:
                        if response.status_code != 200:
                            return AgentStatus(error=f"HTTP {response.status_code}")
                        body = await self._body(response)
            except TimeoutError:
                return AgentStatus(error=f"no complete answer within {self.timeout:g}s")
            except _TooLargeError:
                return AgentStatus(error=f"answer larger than {self.max_bytes} bytes")
            except httpx2.HTTPError as exc:
                return AgentStatus(error=type(exc).__name__)
        try:
            return parse_agent_status(json.loads(body))
        except ValueError:
            return AgentStatus(error="not JSON")

    def client(self) -> httpx2.AsyncClient:
        if self._client is None:
            self._client = httpx2.AsyncClient(timeout=httpx2.Timeout(self.timeout), trust_env=False)
        return self._client

    async def _body(self, response: httpx2.Response) -> bytes:
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > self.max_bytes:
                raise _TooLargeError
            chunks.append(chunk)
        return b"".join(chunks)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


class _TooLargeError(Exception):
    """A status body went past the reader's ``max_bytes``."""
