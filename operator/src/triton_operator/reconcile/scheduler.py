"""The per-object scheduler: one reconcile at a time per TritonService, coalescing, timers, pollers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator

from triton_operator import logs
from triton_operator.adapters.kube import (
    KubeAPI,
    retry_after,
    retry_delay,
)
from triton_operator.adapters.pool_reader import PoolReader
from triton_operator.core.edges.backoff import Backoff, Random
from triton_operator.core.objects.builders import build_event
from triton_operator.core.rollout.clock import format_time, utcnow
from triton_operator.core.vocabulary import conditions as cond
from triton_operator.metrics import METRICS, SUPERSEDED
from triton_operator.models import TritonService
from triton_operator.reconcile.analysis import TritonView
from triton_operator.reconcile.apply import SupersededError
from triton_operator.reconcile.observe import Absences
from triton_operator.reconcile.pinning import RepositoryPinner
from triton_operator.reconcile.reconcile_pass import Result, reconcile
from triton_operator.settings import Settings

logger = logging.getLogger(__name__)


REQUEUE_SLACK_SECONDS = 0.05
MAX_PASSES = 16
"""Passes that run at once, over all TritonServices. More would not go faster (one event loop, and
the API server's own CPU), but each holds what it read and built until it ends: with a thousand
TritonServices created at once, a pass each at the same time held hundreds of MB. One waiting for
its turn counts as queued, so the events meanwhile add no pass. A pass for a spec or metadata
change takes a free slot before passes for owned objects' events and timers (``PassSlots``)."""
SUPERSEDED_PASSES = 3
"""Passes in a row that may find the TritonService changed before their status write (each reads it
again and decides afresh) before the next one is left to a timer."""
SUPERSEDED_RETRY_SECONDS = 1.0
SECRET_RETRY_FIRST_SECONDS = 5.0
SECRET_RETRY_MAX_SECONDS = 300.0
"""A spec held for what its credentials Secret holds (missing, no usable keys, an endpoint off the
allow-list, refused by the store) is reconciled again after 5 s, 10 s, 20 s, ... at most every
5 minutes while it stays so: one Secret read each time (a refusal comes before any store request).
The operator may only `get` Secrets: watching them would mean reading every Secret of the cluster."""
RETRY_CAP_SECONDS = 300.0
"""A pass that failed for the API server or the network (adapters.kube.retry_delay) is tried again
after a random delay up to retry_delay's (5 s, 10 s, or 30 s for RBAC), doubling with each failure in
a row up to 5 minutes (core.edges.backoff: full jitter, so a thousand TritonServices that failed together
do not come back together), and at least the API server's Retry-After."""
REPOSITORY_RETRY_SECONDS = 30.0
"""A spec held because its repository could not be read (or is being listed) is reconciled again
after this long, whatever else asks sooner."""
HELD_FOR_GOOD = frozenset(
    {
        cond.INVALID_SPEC,
        cond.MANIFEST_TOO_LARGE,
        cond.REFUSED_BY_POLICY,
        cond.CREDENTIALS_REQUIRED,
        cond.ENDPOINT_NOT_ALLOWED,
    }
)
"""Why a spec may be held that no retry can help: the status says why. A manifest too large is tried
again when the spec changes or the repository poll pins another one; a refusal of the operator's
policy when the spec changes or the operator restarts with other settings (every TritonService
is reconciled at start); a refusal for what the credentials Secret holds is looked at again with
the Secret's backoff (SECRET_RETRY_*), so a fixed Secret is noticed without either."""


Key = tuple[str, str]


class PassSlots:
    """At most ``size`` passes at once, handed out in two queues: a pass asked for by a change of the
    TritonService itself (created, its spec, labels or annotations changed) gets a free slot before
    every pass asked for by its pods, Deployments, timers or pollers; first come, first served within
    each queue. A thousand TritonServices created at once, whose pods then turn Ready, would
    otherwise reconcile their first time behind the pods' passes of the ones before them, and a
    user's spec change would wait behind them all.

    One waiter per TritonService at most (the Reconciler takes the object's lock first), so a
    waiter is named by its key, which ``promote`` moves to the first queue."""

    def __init__(self, size: int) -> None:
        self._free = size
        self._first: OrderedDict[Key, asyncio.Future[None]] = OrderedDict()
        self._rest: OrderedDict[Key, asyncio.Future[None]] = OrderedDict()

    @property
    def waiting(self) -> list[Key]:
        """Who waits, in the order they will get a slot."""
        return [*self._first, *self._rest]

    @contextlib.asynccontextmanager
    async def slot(self, key: Key, *, first: bool) -> AsyncIterator[None]:
        await self._acquire(key, first=first)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, key: Key, *, first: bool) -> None:
        if self._free > 0 and not self._first and not self._rest:
            self._free -= 1
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        (self._first if first else self._rest)[key] = granted
        try:
            await granted
        except asyncio.CancelledError:
            for queue in (self._first, self._rest):
                if queue.get(key) is granted:
                    del queue[key]
            if granted.done() and not granted.cancelled():
                self._release()  # handed a slot in the same tick it was cancelled: pass it on
            raise

    def promote(self, key: Key) -> None:
        """A waiter for owned objects' events now also stands for a change of the TritonService."""
        granted = self._rest.pop(key, None)
        if granted is not None:
            self._first[key] = granted

    def _release(self) -> None:
        for queue in (self._first, self._rest):
            while queue:
                _, granted = queue.popitem(last=False)
                if not granted.done():
                    granted.set_result(None)
                    return
        self._free += 1


class Reconciler:
    """Serializes reconciles per TritonService, coalesces triggers, requeues, and polls repositories.

    A trigger while a reconcile for the same object is queued (not yet started) is dropped:
    the queued one reads the object and its pods afresh when it starts, so it sees the change.
    A reconcile whose plan is timed (a pause with a duration, a progress deadline) leaves one
    timer task per object that reconciles again when it is due; the next reconcile replaces it,
    so an idle object has no timer and nothing polls the API server.
    A repository with pollIntervalSeconds > 0 gets a poll task that lists the store (never the
    API server) and, only when the pinned manifest changed, asks for a reconcile (a timer due now).

    The pause gate: kopf pauses a replica while a peer of a higher or the same priority lives
    (its watch streams close, so no handler runs), but these timers and pollers are ours. While paused
    (``pause``) no reconcile starts, whoever asks, and there is no timer and no poller: they are
    cancelled, and a reconcile asked for is only noted. ``resume`` reconciles afresh every
    TritonService this replica knows of, which brings their timers and pollers back. A reconcile
    already running when the pause comes finishes (as kopf lets a running handler finish), but
    its status write is conditional on the version of the TritonService it read: after a
    handover the newer replica's status wins, and the superseded pass is not tried again while
    paused.

    A pass whose status write finds the TritonService changed since it read it (SupersededError:
    another replica, a user's control request, kopf's own annotations) did nothing after it; the
    object is read again and a new pass decides (at most SUPERSEDED_PASSES in a row, then a timer).
    """

    def __init__(
        self,
        kube: KubeAPI,
        settings: Settings,
        *,
        pinner: RepositoryPinner | None = None,
        triton: TritonView | None = None,
        pool: PoolReader | None = None,
        paused: bool = False,
        secret_retry: tuple[float, float] | None = None,
        max_passes: int = MAX_PASSES,
        random: Random | None = None,
    ) -> None:
        self.kube = kube
        self.random = random
        """The jitter of the retries of failed passes (core.edges.backoff); None: the system's."""
        self._slots = PassSlots(max_passes)
        self._first: set[Key] = set()
        """TritonServices whose next pass was asked for by a change of the object itself (``trigger``
        with ``first``): it takes a free slot before the others."""
        self.secret_retry = secret_retry
        """The first and the longest delay of the retries while a spec waits for its Secret (None:
        SECRET_RETRY_FIRST_SECONDS and SECRET_RETRY_MAX_SECONDS)."""
        self._secret_waits: dict[tuple[str, str], float] = {}
        """The next such delay of each TritonService that waits for its Secret."""
        self.settings = settings
        self.pinner = pinner
        self.triton = triton
        if triton is not None:
            # Triton's view of a pod changed (a model loaded, failed, unloaded): reconcile its owner.
            triton.reader.on_change = lambda key: self.requeue(key, 0.0)
        self.pool = pool
        if pool is not None:
            # A pool agent's report changed (a model READY, a load failed): the pool's next move.
            pool.on_change = lambda key: self.requeue(key, 0.0)
        if pinner is not None:
            # A listing ended outside any reconcile (it never holds the per-object lock): take it.
            pinner.on_listed = lambda key: self.requeue(key, 0.0)
        self._paused = paused
        self.absences = Absences()
        """The PodDisruptionBudgets known absent (reconcile.observe.Absences): emptied on pause."""
        self._known: set[tuple[str, str]] = set()
        """Every TritonService a reconcile was asked for (until it is gone): resume reconciles them."""
        self._locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        self._queued: dict[tuple[str, str], int] = {}
        self._specs: dict[tuple[str, str], TritonService] = {}
        self._pollers: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._timers: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.fingerprints: dict[tuple[str, str], int] = {}
        """What the TritonService event handler last asked a pass for, per object (its metadata's
        fingerprint: handlers.fingerprint); kept here so that ``forget`` drops it."""
        self._starting: set[tuple[str, str]] = set()
        """TritonServices a ``trigger`` task was made for that has not queued its reconcile yet."""
        self._triggers: set[asyncio.Task[None]] = set()
        self._failures: dict[tuple[str, str], str] = {}
        """The last failure of each TritonService's pass said in an Event (until a pass succeeds)."""
        self._retries: dict[tuple[str, str], int] = {}
        """How many passes of each TritonService failed in a row (until one succeeds)."""

    def _dequeue(self, key: tuple[str, str]) -> None:
        left = self._queued.get(key, 0) - 1
        if left > 0:
            self._queued[key] = left
        else:
            self._queued.pop(key, None)

    async def __call__(self, namespace: str, name: str, *, coalesce: bool = False) -> Result | None:
        """Reconcile now (after any running one); with ``coalesce``, skip if one is already queued."""
        key = (namespace, name)
        self._known.add(key)
        if self._paused:
            return None
        if coalesce and self._queued.get(key, 0) > 0:
            return None
        lock = self._locks.get(key)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[key] = lock
        self._queued[key] = self._queued.get(key, 0) + 1
        started = False
        try:
            async with lock, self._slots.slot(key, first=key in self._first):
                started = True
                self._first.discard(key)
                self._dequeue(key)
                result = await self._passes(key)
        finally:
            if not started:
                self._dequeue(key)
        if result is None:  # paused, or superseded each time (a timer comes back)
            return None
        if result.status is None:
            self.forget(namespace, name)
            return result
        if result.ts is not None:
            self._watch_repository(key, result.ts)
        self.requeue(key, self._due(key, result))
        return result

    async def _passes(self, key: tuple[str, str]) -> Result | None:
        """Reconcile passes until one is not superseded; None when paused (while it waited for the
        one before it, or once a pass was superseded) or after SUPERSEDED_PASSES superseded ones."""
        for _ in range(SUPERSEDED_PASSES):
            if self._paused:
                return None
            result = await self._pass(*key)
            if result is not None:
                return result
        self.requeue(key, SUPERSEDED_RETRY_SECONDS)
        return None

    async def _pass(self, namespace: str, name: str) -> Result | None:
        """One timed reconcile pass; None when its status write was refused (superseded)."""
        with METRICS.reconcile_timer() as outcome, logs.service_context(namespace, name):
            try:
                result = await reconcile(
                    self.kube,
                    namespace,
                    name,
                    self.settings,
                    pin_manifest=self.pinner,
                    triton=self.triton,
                    absences=self.absences,
                    pool_reports=self.pool,
                )
            except SupersededError as exc:
                outcome.outcome = SUPERSEDED
                logger.info("%s; %s", exc, "paused: not read again" if self._paused else "reading it again")
                return None
            if result.invalid:
                outcome.fail(result.reason or cond.INVALID_SPEC, outcome="invalid")
            return result

    def _due(self, key: tuple[str, str], result: Result) -> float | None:
        """When to reconcile again: the plan's time, or sooner while the spec waits for its
        credentials Secret to be fixed (with a backoff, reset once it no longer waits), and at
        most REPOSITORY_RETRY_SECONDS later while its repository could not be read."""
        due = result.requeue_after
        if result.invalid and result.reason not in HELD_FOR_GOOD:
            due = REPOSITORY_RETRY_SECONDS if due is None else min(due, REPOSITORY_RETRY_SECONDS)
        if not (result.invalid and result.secret):
            self._secret_waits.pop(key, None)
            return due
        first, longest = self.secret_retry or (SECRET_RETRY_FIRST_SECONDS, SECRET_RETRY_MAX_SECONDS)
        wait = self._secret_waits.get(key, first)
        self._secret_waits[key] = min(wait * 2, longest)
        return wait if due is None else min(wait, due)

    def requeue(self, key: tuple[str, str], delay: float | None) -> None:
        """Reconcile ``key`` again after ``delay`` seconds (replacing any timer); None: no timer."""
        timer = self._timers.pop(key, None)
        if timer is not None and timer is not asyncio.current_task():
            timer.cancel()
        if delay is not None and not self._paused:  # paused: the reconcile at resume brings it back
            self._timers[key] = asyncio.create_task(
                self._requeue(key, max(delay, 0.0) + REQUEUE_SLACK_SECONDS),
                name=f"requeue {key[0]}/{key[1]}",
            )

    def trigger(self, namespace: str, name: str, *, first: bool = False) -> None:
        """Reconcile now (after any running one) on a task of its own: the TritonService (``first``)
        or something it owns changed. Nothing when one is already queued (it reads everything
        afresh when it starts; with ``first`` it moves to the first queue for a slot) or while
        paused; a failure the API server may get over is tried again on a timer."""
        key = (namespace, name)
        self._known.add(key)  # paused: the resume reconciles it
        if self._paused:
            return
        if first:
            self._first.add(key)
            self._slots.promote(key)
        if key in self._starting or self._queued.get(key, 0) > 0:
            return
        self._starting.add(key)
        task = asyncio.create_task(self._trigger(key), name=f"trigger {namespace}/{name}")
        self._triggers.add(task)
        task.add_done_callback(self._triggers.discard)

    async def _trigger(self, key: tuple[str, str]) -> None:
        self._starting.discard(key)
        await self._pass_on_task(key)

    def pending_timer(self, namespace: str, name: str) -> bool:
        """Whether a timed reconcile is due for a TritonService (for tests and metrics)."""
        timer = self._timers.get((namespace, name))
        return timer is not None and not timer.done()

    async def _requeue(self, key: tuple[str, str], delay: float) -> None:
        await asyncio.sleep(delay)
        if self._timers.get(key) is asyncio.current_task():
            del self._timers[key]
        await self._pass_on_task(key)

    async def _pass_on_task(self, key: tuple[str, str]) -> None:
        """A coalesced pass on a task of its own (a trigger's or a timer's); one that fails is said
        (``_failed``) and, when a retry may help, tried again on a timer."""
        try:
            await self(*key, coalesce=True)  # queues itself before its first wait
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            retry = await self._failed(key, exc)
            if retry is not None and key not in self._timers:
                self.requeue(key, retry)
        else:
            self._failures.pop(key, None)
            self._retries.pop(key, None)

    async def _failed(self, key: tuple[str, str], exc: Exception) -> float | None:
        """A pass that raised: said in the log, and (as kopf says a failing handler) in a Warning
        Event on the TritonService, once for each new failure (a retry failing the same way posts
        nothing). The seconds before it is tried again; None: no retry helps (a bug)."""
        first = retry_delay(exc)
        retry = None
        if first is None:
            logger.exception("reconcile of %s/%s failed", *key)
            said = message = f"reconcile failed: {exc}"
        else:
            attempt = self._retries.get(key, 0)
            self._retries[key] = attempt + 1
            backoff = Backoff(base=first, cap=max(first, RETRY_CAP_SECONDS))
            retry = backoff.delay(attempt, retry_after=retry_after(exc), random=self.random)
            logger.warning("reconcile of %s/%s failed temporarily (again in %.1f s): %s", *key, retry, exc)
            message = f"reconcile failed temporarily (again in {retry:.1f} s): {exc}"
            said = f"reconcile failed temporarily: {exc}"  # the same failure, whatever its delay
        if self._failures.get(key) != said:
            self._failures[key] = said
            event = build_event(
                {"namespace": key[0], "name": key[1]},
                "Warning",
                cond.RECONCILE_FAILED,
                message,
                now=format_time(utcnow()),
            )
            try:
                await self.kube.post_event(event)
            except Exception as post_exc:  # best effort, as every Event
                logger.warning("event for %s/%s not posted: %s", *key, post_exc)
        return retry

    def forget(self, namespace: str, name: str) -> None:
        """Drop everything kept for a TritonService that is gone."""
        key = (namespace, name)
        self._specs.pop(key, None)
        self._first.discard(key)
        self.fingerprints.pop(key, None)
        self._failures.pop(key, None)
        self._retries.pop(key, None)
        self._secret_waits.pop(key, None)
        self._known.discard(key)
        self.absences.present(namespace, name)
        poller = self._pollers.pop(key, None)
        if poller is not None:
            poller.cancel()
        timer = self._timers.pop(key, None)
        if timer is not None and timer is not asyncio.current_task():
            timer.cancel()
        if self.pinner is not None:
            self.pinner.forget(namespace, name)
        if self.triton is not None:
            self.triton.forget(namespace, name)
        METRICS.forget(namespace, name)

    @property
    def paused(self) -> bool:
        return self._paused

    def pause(self, reason: str = "") -> None:
        """Stop acting: cancel every timer and poller, and start no reconcile until ``resume``."""
        if self._paused:
            return
        self._paused = True
        self.absences.clear()  # another replica may write one meanwhile
        current = asyncio.current_task()
        timers, pollers = self._timers, self._pollers
        self._timers, self._pollers = {}, {}
        for task in timers.values():
            if task is not current:
                task.cancel()
        for task in pollers.values():
            if task is not current:
                task.cancel()
        if self.triton is not None:
            self.triton.reader.clear()  # a paused replica reads no pod; the resume brings them back
        logger.info(
            "paused%s: no reconcile, timer or repository poll until resumed (%d timers, %d pollers stopped)",
            f" ({reason})" if reason else "",
            len(timers),
            len(pollers),
        )

    def resume(self, reason: str = "") -> None:
        """Act again: reconcile afresh every TritonService known here (soon, one task each)."""
        if not self._paused:
            return
        self._paused = False
        keys = sorted(self._known)
        logger.info(
            "resumed%s: reconciling %d TritonServices afresh", f" ({reason})" if reason else "", len(keys)
        )
        for key in keys:
            self.requeue(key, 0.0)

    def set_paused(self, paused: bool, reason: str = "") -> None:
        if paused:
            self.pause(reason)
        else:
            self.resume(reason)

    async def close(self) -> None:
        tasks = [*self._pollers.values(), *self._timers.values(), *self._triggers]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._pollers.clear()
        self._timers.clear()
        if self.pinner is not None:
            await self.pinner.close()
        if self.pool is not None:
            await self.pool.close()
        if self.triton is not None:
            await self.triton.reader.close()
            if self.triton.agents is not None:
                await self.triton.agents.close()

    def _polls(self, ts: TritonService) -> bool:
        return (
            self.pinner is not None
            and ts.spec.repository.scheme != "pvc"
            and ts.spec.repository.poll_interval_seconds > 0
        )

    def _watch_repository(self, key: tuple[str, str], ts: TritonService) -> None:
        if not self._polls(ts):
            # Nothing polls its repository: keep no copy of the spec (about 14 KiB an object); a
            # poller left from an earlier spec finds none and ends.
            self._specs.pop(key, None)
            return
        self._specs[key] = ts
        poller = self._pollers.get(key)
        if self._paused:
            return  # the reconcile at resume starts the poller
        if poller is None or poller.done():
            self._pollers[key] = asyncio.create_task(self._poll(key), name=f"poll {key[0]}/{key[1]}")

    async def _poll(self, key: tuple[str, str]) -> None:
        while True:
            ts = self._specs.get(key)
            if ts is None or not self._polls(ts) or self.pinner is None:
                return
            await asyncio.sleep(ts.spec.repository.poll_interval_seconds)
            ts = self._specs.get(key)
            if ts is None or not self._polls(ts) or self._paused:
                return
            try:
                changed = await self.pinner.refresh(ts)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("polling the repository of %s/%s failed", *key)
                continue
            if changed and not self._paused:
                # On a timer task of its own: the poller only lists, so a pause can cancel it
                # at any time without cutting a reconcile short.
                self.requeue(key, 0.0)
