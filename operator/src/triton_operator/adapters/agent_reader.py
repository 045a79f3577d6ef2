"""Bounded reads of the pods' model-agents (GET <pod IP>:8009/v1/inplace) during an in-place update."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence

from triton_operator.adapters.agent_http import AgentAnswerError, AgentHttp
from triton_operator.core.objects.names import AGENT_PORT, AGENT_STATUS_PATH
from triton_operator.core.rollout.inplace import AgentStatus, parse_agent_status

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
        self._http = AgentHttp(
            port=port, timeout=timeout, max_bytes=max_bytes, concurrency=concurrency, cidrs=cidrs
        )

    @property
    def requests(self) -> int:
        """Requests sent to agents so far."""
        return self._http.requests

    def allowed(self, ip: str | None) -> bool:
        return self._http.allowed(ip)

    async def read(self, pods: Mapping[str, str | None]) -> dict[str, AgentStatus]:
        """Pod name -> its agent's status (or why it could not be read), for pods name -> IP."""
        names = sorted(pods)
        results = await asyncio.gather(*(self.read_one(pods[n]) for n in names))
        return dict(zip(names, results, strict=True))

    async def read_one(self, ip: str | None) -> AgentStatus:
        try:
            body = await self._http.get(ip, AGENT_STATUS_PATH)
        except AgentAnswerError as exc:
            return AgentStatus(error=str(exc))
        try:
            return parse_agent_status(json.loads(body))
        except ValueError:
            return AgentStatus(error="not JSON")

    async def close(self) -> None:
        await self._http.close()
