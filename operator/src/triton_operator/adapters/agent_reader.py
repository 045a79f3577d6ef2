"""Bounded reads of the pods' model-agents (GET <pod IP>:8009/v1/inplace) during an in-place update."""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from triton_operator.adapters.agent_http import AgentAnswerError, AgentHttp
from triton_operator.core.objects.names import AGENT_PORT, AGENT_STATUS_PATH
from triton_operator.core.pod.startup import FillTimeline, parse_timeline
from triton_operator.core.rollout.inplace import AgentStatus, parse_agent_status

# The bounds: only while an in-place update moves (reconcile.reconcile_pass asks), one request per pod per
# pass, all at once but at most `concurrency` in flight, each ended with its body within `timeout`
# seconds and `max_bytes` of body, only to pod IPs in `cidrs` (when set). A pod not answering in
# time is an unreadable status: its step waits (the progress deadline bounds the wait).

MAX_STATUS_BYTES = 256 * 1024
FILLS_KEPT = 4096
"""Pods (by uid) whose agent's fill this process asked for, kept: each is asked once (oldest forgotten)."""
FILL_KEY = "fill"
"""The agent status's first fill (core.pod.startup.FillTimeline; adapters.agent.runner.FILL)."""


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
        self.since = datetime.now(UTC)
        """This process's start: pods Ready before it are starts it did not see (as metrics.py's)."""
        self._fills: OrderedDict[str, FillTimeline | None] = OrderedDict()

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

    async def read_fills(self, pods: Mapping[str, str | None]) -> None:
        """Ask the agents of ``pods`` (uid -> IP) for their first fill (GET AGENT_STATUS_PATH, its
        ``fill``), each pod once in this process, answered or not: the operator reads it once per new
        Ready pod (reconcile.observe.observe_agents), never a pass. ``fill`` returns what was read."""
        ask = sorted(uid for uid in pods if uid not in self._fills)
        if not ask:
            return
        for uid in ask:  # asked: not again, even when the agent does not answer
            self._fills[uid] = None
        while len(self._fills) > FILLS_KEPT:
            self._fills.popitem(last=False)
        answers = await asyncio.gather(*(self._fill(pods[uid]) for uid in ask))
        for uid, timeline in zip(ask, answers, strict=True):
            if uid in self._fills:
                self._fills[uid] = timeline

    def asked(self, uid: str) -> bool:
        """Whether the agent of the pod ``uid`` was asked for its fill already."""
        return uid in self._fills

    def fill(self, uid: str) -> FillTimeline | None:
        """The first fill the agent of the pod ``uid`` said (None: not asked, no answer, none)."""
        return self._fills.get(uid)

    async def _fill(self, ip: str | None) -> FillTimeline | None:
        try:
            body = json.loads(await self._http.get(ip, AGENT_STATUS_PATH))
        except (AgentAnswerError, ValueError):
            return None
        return parse_timeline(body.get(FILL_KEY)) if isinstance(body, Mapping) else None

    async def close(self) -> None:
        await self._http.close()
