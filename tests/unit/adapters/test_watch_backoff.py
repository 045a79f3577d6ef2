"""The operator's own watches (adapters.owned_watch, adapters.peering) retry a failing stream with
core.edges.backoff: growing, jittered, capped delays that wait out the API server's Retry-After (on main:
a fixed 5 s, every stream of every replica in lockstep)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncGenerator
from types import ModuleType

import httpx2
import pytest

from triton_operator.adapters import owned_watch, peering
from triton_operator.adapters.owned_watch import OwnedWatch
from triton_operator.adapters.peering import PeeringMonitor, PeeringScope, WatchEvent


def recording_sleep(monkeypatch: pytest.MonkeyPatch, module: ModuleType, stop_after: int) -> list[float]:
    """The delays ``module`` sleeps, its loop ended (cancelled) at the ``stop_after``-th."""
    slept: list[float] = []

    async def sleep(delay: float) -> None:
        slept.append(delay)
        if len(slept) >= stop_after:
            raise asyncio.CancelledError

    monkeypatch.setattr(module.asyncio, "sleep", sleep)
    return slept


def failing_api(retry_after_from: int) -> tuple[httpx2.AsyncClient, list[httpx2.Request]]:
    """An API server that answers every request 503, with Retry-After: 2 from the given request on."""
    requests: list[httpx2.Request] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        requests.append(request)
        headers = {"Retry-After": "2"} if len(requests) > retry_after_from else {}
        return httpx2.Response(503, headers=headers, json={"kind": "Status", "code": 503})

    return httpx2.AsyncClient(transport=httpx2.MockTransport(answer), base_url="https://api"), requests


async def run_one_stream(watch: OwnedWatch) -> None:
    with pytest.raises(asyncio.CancelledError):
        await watch._run(owned_watch._Stream("/api/v1/pods"))


async def test_an_owned_watch_backs_off_and_waits_out_retry_after(monkeypatch: pytest.MonkeyPatch) -> None:
    http, requests = failing_api(retry_after_from=2)
    slept = recording_sleep(monkeypatch, owned_watch, stop_after=6)
    await run_one_stream(OwnedWatch(http, lambda ns, name: None, random=lambda: 1.0))
    # 5, 10 (doubling), then Retry-After: 2 on top of the jitter, never past the 60 s cap
    assert slept == [5.0, 10.0, 22.0, 42.0, 60.0, 60.0]
    assert len(requests) == 6


async def test_two_owned_watches_do_not_retry_together(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = []
    for seed in (1, 2):
        http, _ = failing_api(retry_after_from=99)
        slept = recording_sleep(monkeypatch, owned_watch, stop_after=4)
        await run_one_stream(OwnedWatch(http, lambda ns, name: None, random=random.Random(seed).random))
        assert all(0.0 <= d <= c for d, c in zip(slept, [5.0, 10.0, 20.0, 40.0], strict=True))
        runs.append(slept)
    assert runs[0] != runs[1]
    assert all(a != b for a, b in zip(*runs, strict=True))


async def test_the_peering_monitor_backs_off_too(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(where: str | None) -> AsyncGenerator[WatchEvent, None]:
        async def events() -> AsyncGenerator[WatchEvent, None]:
            raise OSError("connection refused")
            yield  # pragma: no cover - a generator

        return events()

    scope = PeeringScope("tp", "me", 10, clusterwide=True)
    slept = recording_sleep(monkeypatch, peering, stop_after=7)
    monitor = PeeringMonitor(scope, broken, lambda verdict: None, random=lambda: 1.0)
    with pytest.raises(asyncio.CancelledError):
        await monitor._follow(None)
    assert slept == [5.0, 10.0, 20.0, 30.0, 30.0, 30.0, 30.0]
