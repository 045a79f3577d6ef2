"""A paused replica does nothing: kopf's peering rule (core.edges.peering_rules), the monitor that applies it
to the peering objects (adapters.peering), and the Reconciler's pause gate (no kopf, no cluster)."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import pytest

from triton_operator.adapters.peering import EVERY_NAMESPACE, PeeringMonitor, PeeringScope, peering_scope
from triton_operator.commands.run import peering_identity
from triton_operator.core.edges.peering_rules import (
    PeeringVerdict,
    match_namespace,
    parse_peers,
    peering_verdict,
)
from triton_operator.models import TritonService
from triton_operator.reconcile import scheduler
from triton_operator.reconcile.reconcile_pass import Result
from triton_operator.reconcile.scheduler import Reconciler
from triton_operator.settings import Settings

NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)
ME = "me@host/1"


def entry(priority: int, *, seen: datetime.datetime = NOW, lifetime: int = 60) -> dict[str, Any]:
    return {"priority": priority, "lifetime": lifetime, "lastseen": seen.isoformat()}


def verdict(*statuses: Mapping[str, Any] | None, priority: int = 10) -> PeeringVerdict:
    return peering_verdict(list(statuses), identity=ME, priority=priority, now=NOW)


# ----------------------------------------------------------------- kopf's rule


def test_alone_or_with_lower_peers_the_replica_acts() -> None:
    assert not verdict({}).paused
    assert not verdict({ME: entry(10)}).paused
    assert not verdict({ME: entry(10), "low": entry(5)}).paused


def test_a_live_peer_of_a_higher_priority_pauses_it_until_its_keepalive_runs_out() -> None:
    seen = NOW - datetime.timedelta(seconds=20)
    v = verdict({ME: entry(10), "high": entry(20, seen=seen)})
    assert v.paused
    assert [p.identity for p in v.blockers] == ["high"]
    assert v.recheck_after == pytest.approx(40.0)
    assert "high (priority 20)" in v.message


def test_a_peer_of_the_same_priority_pauses_both_as_kopf_does() -> None:
    assert verdict({ME: entry(10), "twin": entry(10)}).paused


def test_a_dead_peer_pauses_nobody() -> None:
    gone = NOW - datetime.timedelta(seconds=61)
    assert not verdict({"high": entry(20, seen=gone)}).paused
    # lifetime 0 is how kopf takes itself out when it stops cleanly
    assert not verdict({"high": entry(20, lifetime=0)}).paused


def test_kopf_defaults_for_missing_fields() -> None:
    (peer,) = parse_peers({"old": {}}, NOW)
    assert peer.priority == 0 and peer.deadline == NOW + datetime.timedelta(seconds=60)
    assert verdict({"old": {"priority": "20"}}).paused
    assert not verdict({"gone": None}).paused  # a removed entry


def test_any_followed_object_pauses_it() -> None:
    """Namespaced peering: one object per served namespace; kopf pauses when any says so."""
    assert verdict({ME: entry(10)}, {"high": entry(20)}).paused
    assert not verdict({ME: entry(10)}, {ME: entry(10)}).paused


@pytest.mark.parametrize(
    ("name", "pattern", "matches"),
    [
        ("ml", "ml", True),
        ("ml-prod", "ml-*", True),
        ("other", "ml-*", False),
        ("myapp-pr-123", "myapp-*, !*-pr-*, *pr-123", True),
        ("myapp-pr-456", "myapp-*, !*-pr-*, *pr-123", False),
        ("anything", "!kube-*", True),
        ("kube-system", "!kube-*", False),
    ],
)
def test_namespace_patterns_match_as_in_kopf(name: str, pattern: str, matches: bool) -> None:
    assert match_namespace(name, pattern) is matches


# ----------------------------------------------------------------- against kopf's own code
# core.edges.peering_rules copies kopf's rule; these compare it with kopf's own functions on the same inputs,
# so a kopf release that changes the rule fails here (pyproject.toml bounds kopf to the tested minor).

SECONDS = datetime.timedelta(seconds=1)


def _kopf_cases() -> list[tuple[dict[str, Any], int]]:
    now = datetime.datetime.now(datetime.UTC)

    def seen(ago: int, priority: int, lifetime: int = 60) -> dict[str, Any]:
        return {"priority": priority, "lifetime": lifetime, "lastseen": (now - ago * SECONDS).isoformat()}

    return [
        ({}, 10),
        ({ME: seen(1, 10)}, 10),
        ({ME: seen(1, 10), "low": seen(1, 5)}, 10),
        ({ME: seen(1, 10), "high": seen(20, 20)}, 10),
        ({ME: seen(1, 10), "twin": seen(5, 10)}, 10),
        ({"twin": seen(5, 10)}, 10),
        ({"high": seen(120, 20)}, 10),  # dead: past lastseen + lifetime
        ({"high": seen(1, 20, lifetime=0)}, 10),  # kopf's own clean exit
        ({"high": seen(50, 20, lifetime=30)}, 10),
        ({"high": seen(10, 20, lifetime=30)}, 10),
        ({"old": {}}, 0),  # missing fields: priority 0, seen now, lifetime 60
        ({"old": {}}, 1),
        ({"old": {"priority": 3}}, 3),
        ({"low": seen(1, -5)}, -10),
        ({ME: seen(1, 0), "a": seen(1, 0), "b": seen(200, 99)}, 0),
    ]


async def _kopf_pauses(status: dict[str, Any], priority: int) -> bool:
    from kopf._cogs.aiokits.aiotoggles import Toggle  # noqa: PLC0415 - kopf's internals, for the comparison
    from kopf._cogs.configs.configuration import OperatorSettings  # noqa: PLC0415
    from kopf._core.engines.peering import Identity, process_peering_event  # noqa: PLC0415

    settings = OperatorSettings()
    settings.peering.name = "tp"
    settings.peering.priority = priority
    paused = Toggle(False)
    woken = asyncio.Event()
    woken.set()  # no sleep until a blocker's keep-alive runs out, no touch
    await process_peering_event(
        raw_event={"type": "MODIFIED", "object": {"metadata": {"name": "tp"}, "status": status}},
        namespace=None,
        resource=None,  # type: ignore[arg-type]
        identity=Identity(ME),
        settings=settings,
        autoclean=False,
        stream_pressure=woken,
        conflicts_found=paused,
    )
    return paused.is_on()


async def test_the_pause_rule_is_kopfs_own_on_the_same_inputs() -> None:
    cases = _kopf_cases()
    now = datetime.datetime.now
    ours = [
        peering_verdict([status], identity=ME, priority=priority, now=now(datetime.UTC)).paused
        for status, priority in cases
    ]
    kopfs = [await _kopf_pauses(status, priority) for status, priority in cases]
    assert ours == kopfs
    assert True in ours and False in ours  # both verdicts are compared


@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        (name, pattern)
        for name in ("ml", "ml-prod", "other", "myapp-pr-123", "myapp-pr-456", "kube-system", "x")
        for pattern in ("ml", "ml-*", "myapp-*, !*-pr-*, *pr-123", "!kube-*", "*", "ml,other", "!ml, x")
    ],
)
def test_namespace_patterns_match_as_kopfs_own_function(name: str, pattern: str) -> None:
    from kopf._cogs.structs.references import match_namespace as kopfs  # noqa: PLC0415

    assert match_namespace(name, pattern) is kopfs(name, pattern)  # type: ignore[arg-type]


def test_the_scope_follows_what_kopf_follows() -> None:
    class Peering:
        name, priority, clusterwide, standalone, mandatory = "tp", 7, False, False, True

    scope = peering_scope(Peering(), identity=ME, namespaces=("a", "b"))
    assert scope is not None
    assert scope.watches() == ["a", "b"]
    assert scope.required() == [("a", "tp"), ("b", "tp")]
    assert scope.follows("a") and not scope.follows("c") and not scope.follows(None)
    globbed = PeeringScope("tp", ME, 7, clusterwide=False, namespaces=("ml-*",))
    assert globbed.watches() == [EVERY_NAMESPACE] and globbed.follows("ml-1") and not globbed.follows("x")
    cluster = PeeringScope("tp", ME, 7, clusterwide=True)
    assert cluster.watches() == [None] and cluster.required() == [(None, "tp")]

    Peering.standalone = True
    assert peering_scope(Peering(), identity=ME, namespaces=()) is None
    Peering.standalone = False
    assert peering_scope(Peering(), identity=None, namespaces=()) is None


def test_the_replica_is_named_in_the_peering_as_kopf_would_name_it() -> None:
    """`run` names the replica and hands the name to kopf, so both look for the same entry."""
    assert peering_identity({"POD_ID": "triton-operator-7d9f-abcde"}) == "triton-operator-7d9f-abcde"
    user_host, stamp, suffix = peering_identity({}).split("/")
    assert "@" in user_host and len(stamp) == 14 and len(suffix) == 3


# ----------------------------------------------------------------- the monitor


class FakeWatch:
    """Watch streams fed by the test: every call opens a new stream (a queue)."""

    def __init__(self) -> None:
        self.streams: list[asyncio.Queue[tuple[str, dict[str, Any]] | Exception]] = []
        self.opened = asyncio.Event()

    async def __call__(self, where: str | None) -> AsyncGenerator[tuple[str, Mapping[str, Any]], None]:
        queue: asyncio.Queue[tuple[str, dict[str, Any]] | Exception] = asyncio.Queue()
        self.streams.append(queue)
        self.opened.set()
        while True:
            item = await queue.get()
            if isinstance(item, Exception):
                raise item
            yield item

    async def send(self, kind: str, status: Mapping[str, Any], name: str = "tp", ns: str = "ml") -> None:
        await self.opened.wait()
        body = {"metadata": {"name": name, "namespace": ns}, "status": dict(status)}
        self.streams[-1].put_nowait((kind, body))


async def until(check: Any, timeout: float = 2.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)


async def test_the_monitor_pauses_until_it_has_seen_the_peering_object_then_follows_kopfs_rule() -> None:
    scope = PeeringScope("tp", ME, 10, clusterwide=False, namespaces=("ml",))
    watch = FakeWatch()
    seen: list[bool] = []
    monitor = PeeringMonitor(scope, watch, lambda v: seen.append(v.paused), retry_seconds=0.05)
    task = monitor.start()
    try:
        await until(lambda: seen == [True])  # not seen yet: paused, as kopf starts
        await watch.send("ADDED", {ME: entry(10, seen=datetime.datetime.now(datetime.UTC))})
        await until(lambda: seen == [True, False])
        # another object's events, or another namespace's, change nothing
        await watch.send("MODIFIED", {"high": entry(99)}, name="other")
        await watch.send("MODIFIED", {"high": entry(99)}, ns="elsewhere")
        await asyncio.sleep(0.05)
        assert seen == [True, False]

        # a higher peer appears, with a keep-alive that runs out in 0.5 s: paused, then on again
        # with no further event (kopf's own re-check at the peer's deadline). The paused state may
        # last less than a poll of until() on a loaded machine, hence seen[:3].
        now = datetime.datetime.now(datetime.UTC)
        short = {
            "priority": 20,
            "lifetime": 1,
            "lastseen": (now - datetime.timedelta(seconds=0.5)).isoformat(),
        }
        await watch.send("MODIFIED", {ME: entry(10, seen=now), "high": short})
        await until(lambda: seen[:3] == [True, False, True])
        await until(lambda: seen == [True, False, True, False])

        # the peer comes back, then takes itself out cleanly (its entry removed)
        await watch.send("MODIFIED", {ME: entry(10, seen=now), "high": entry(20, seen=now)})
        await until(lambda: seen[-1] is True)
        await watch.send("MODIFIED", {ME: entry(10, seen=now)})
        await until(lambda: seen[-1] is False)

        # a broken stream is opened again; the verdict stands meanwhile
        streams = len(watch.streams)
        watch.streams[-1].put_nowait(RuntimeError("connection reset"))
        await until(lambda: len(watch.streams) == streams + 1)
        assert seen[-1] is False

        # the object deleted: paused (kopf cannot publish its keep-alive either)
        await watch.send("DELETED", {})
        await until(lambda: seen[-1] is True)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# ----------------------------------------------------------------- the Reconciler's gate


def make_ts(name: str = "svc", poll: int = 0) -> TritonService:
    return TritonService.model_validate(
        {
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {
                "repository": {"uri": "s3://models/prod", "pollIntervalSeconds": poll},
                "models": [{"name": "add", "config": {"backend": "python"}}],
            },
        }
    )


class Calls:
    """Stands in for the module's reconcile(): counts calls, returns what the test sets."""

    def __init__(self, ts: TritonService, requeue_after: float | None = None) -> None:
        self.ts = ts
        self.requeue_after = requeue_after
        self.count = 0
        self.hold: asyncio.Event | None = None
        self.entered = asyncio.Event()

    async def __call__(self, kube: Any, namespace: str, name: str, settings: Any, **_: Any) -> Result:
        self.count += 1
        self.entered.set()
        if self.hold is not None:
            await self.hold.wait()
        return Result(status={}, revision="r", ts=self.ts, requeue_after=self.requeue_after)


class FakePinner:
    def __init__(self) -> None:
        self.refreshes = 0

    async def refresh(self, ts: TritonService) -> bool:
        self.refreshes += 1
        return True  # the bucket changed every time: every poll asks for a reconcile

    def forget(self, namespace: str, name: str) -> None:
        pass

    async def close(self) -> None:
        pass


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    fake = Calls(make_ts())
    monkeypatch.setattr(scheduler, "reconcile", fake)
    return fake


def reconciler(paused: bool = False, pinner: FakePinner | None = None) -> Reconciler:
    return Reconciler(Any, Settings(), pinner=pinner, paused=paused)  # type: ignore[arg-type]


async def test_a_paused_reconciler_reconciles_nothing_and_catches_up_on_resume(calls: Calls) -> None:
    r = reconciler(paused=True)
    assert await r("ml", "svc") is None
    assert await r("ml", "other", coalesce=True) is None
    assert calls.count == 0
    r.resume("test")
    await until(lambda: calls.count == 2)  # both asked-for TritonServices, afresh
    await r.close()


async def test_pause_cancels_the_timers_and_resume_brings_them_back(calls: Calls) -> None:
    calls.requeue_after = 0.2  # a timed rollout step: come back in 0.2 s
    r = reconciler()
    await r("ml", "svc")
    assert r.pending_timer("ml", "svc")
    r.pause("a peer of a higher priority")
    assert r.paused and not r.pending_timer("ml", "svc")
    await asyncio.sleep(0.5)
    assert calls.count == 1  # the timer never fired
    r.resume()
    await until(lambda: calls.count >= 2)
    await until(lambda: r.pending_timer("ml", "svc"))  # the reconcile at resume set it again
    await r.close()


async def test_pause_stops_the_repository_poller_and_resume_restarts_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ts = make_ts(poll=1)
    ts.spec.repository.poll_interval_seconds = 0.1  # type: ignore[assignment]  # keeps the test fast
    calls = Calls(ts)
    monkeypatch.setattr(scheduler, "reconcile", calls)
    pinner = FakePinner()
    r = reconciler(pinner=pinner)
    await r("ml", "svc")
    await until(lambda: pinner.refreshes >= 2 and calls.count >= 2)  # polls, and reconciles on change
    r.pause()
    await asyncio.sleep(0.05)  # a poll-triggered reconcile in flight may finish
    refreshes, count = pinner.refreshes, calls.count
    await asyncio.sleep(0.5)
    assert (pinner.refreshes, calls.count) == (refreshes, count), "a paused replica listed or reconciled"
    r.resume()
    await until(lambda: pinner.refreshes > refreshes and calls.count > count + 1)
    await r.close()


async def test_a_reconcile_running_when_the_pause_comes_finishes_but_schedules_nothing(calls: Calls) -> None:
    calls.requeue_after = 0.1
    calls.hold = asyncio.Event()
    r = reconciler()
    running = asyncio.create_task(r("ml", "svc"))
    await calls.entered.wait()
    queued = asyncio.create_task(r("ml", "svc"))  # waits for the running one
    await asyncio.sleep(0.01)
    r.pause()
    calls.hold.set()
    result = await running
    assert result is not None and result.requeue_after == 0.1
    assert await queued is None  # paused while it waited: never started
    assert calls.count == 1 and not r.pending_timer("ml", "svc")
    await asyncio.sleep(0.3)
    assert calls.count == 1
    calls.hold = None
    r.resume()
    await until(lambda: calls.count == 2)
    await r.close()


async def test_a_tritonservice_gone_is_not_reconciled_at_resume(calls: Calls) -> None:
    r = reconciler(paused=True)
    await r("ml", "svc")
    r.forget("ml", "svc")
    r.resume()
    await asyncio.sleep(0.2)
    assert calls.count == 0
