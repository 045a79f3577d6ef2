"""The pool agents' reports (GET <pod IP>:8009/v1/pool), read in the background, each read bounded."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence

from triton_operator.adapters.agent_http import AgentAnswerError, AgentHttp
from triton_operator.core.objects.names import AGENT_PORT
from triton_operator.core.pool.assignment import AssignmentError, Copy, parse_report

logger = logging.getLogger(__name__)

POOL_REPORT_PATH = "/v1/pool"
"""The agent's pool report (docs/pool.md's contract): GET http://<podIP>:AGENT_PORT/v1/pool -> JSON."""
MAX_REPORT_BYTES = 256 * 1024

Key = tuple[str, str]
Reports = dict[str, dict[str, Copy]]


class PoolReader:
    """Keeps the latest report of each pool pod's agent, by TritonService. A pass takes the latest
    readings (``latest``) and asks for fresh ones (``want``): the read runs on a task of its own,
    never in the middle of a pass, one at a time per TritonService, each request bounded (``timeout``
    for its whole answer, ``max_bytes`` of body, ``concurrency`` in flight, only to pod IPs in
    ``cidrs`` when set). A pod whose agent does not answer keeps its last report (a transient
    timeout takes no model off its routes); a pod no longer asked for is forgotten. ``on_change``:
    called with the TritonService's key when a read found something new (its next pass)."""

    def __init__(
        self,
        *,
        timeout: float = 2.0,
        concurrency: int = 32,
        cidrs: Sequence[str] = (),
        port: int = AGENT_PORT,
        max_bytes: int = MAX_REPORT_BYTES,
    ) -> None:
        self.on_change: Callable[[Key], None] | None = None
        self._http = AgentHttp(
            port=port, timeout=timeout, max_bytes=max_bytes, concurrency=concurrency, cidrs=cidrs
        )
        self._latest: dict[Key, Reports] = {}
        self._tasks: dict[Key, asyncio.Task[None]] = {}

    @property
    def requests(self) -> int:
        """Requests sent to agents so far."""
        return self._http.requests

    def latest(self, namespace: str, name: str) -> Reports:
        """The latest report of each pod of the TritonService (pod name -> model -> its copy)."""
        return {pod: dict(copies) for pod, copies in self._latest.get((namespace, name), {}).items()}

    def want(self, namespace: str, name: str, pods: Mapping[str, str | None]) -> None:
        """Read the agents of ``pods`` (name -> IP) on a task of its own, unless a read of this
        TritonService is under way; with no pods, forget the TritonService."""
        key = (namespace, name)
        if not pods:
            self._latest.pop(key, None)
            return
        running = self._tasks.get(key)
        if running is not None and not running.done():
            return
        self._tasks[key] = asyncio.get_running_loop().create_task(self._read(key, dict(pods)))

    async def _read(self, key: Key, pods: Mapping[str, str | None]) -> None:
        names = sorted(pods)
        found = await asyncio.gather(*(self.read_one(pods[n]) for n in names))
        before = self._latest.get(key, {})
        after = {
            n: report if report is not None else before[n]
            for n, report in zip(names, found, strict=True)
            if report is not None or n in before
        }
        self._latest[key] = after
        if after != before and self.on_change is not None:
            self.on_change(key)

    async def read_one(self, ip: str | None) -> dict[str, Copy] | None:
        """One agent's report; None when it could not be read (no allowed IP, no answer in time, too
        large, not a report)."""
        try:
            body = await self._http.get(ip, POOL_REPORT_PATH)
        except AgentAnswerError:
            return None
        try:
            return parse_report(json.loads(body))
        except (ValueError, AssignmentError) as exc:
            logger.warning("pool report of %s unreadable: %s", ip, exc)
            return None

    async def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await self._http.close()
