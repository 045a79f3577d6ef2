"""The operator's end of what `kubectl triton tune` left: tuning objects past their deadline go.

A sweep's client deletes its objects however it ends, but a client killed with SIGKILL (or whose
machine went away) cannot: its tuning Deployments would hold their GPUs for ever. Every object a
sweep makes carries the run's deadline (core.tuning.ANNOTATION_DEADLINE); a periodic pass here
lists every object with the tuning label (observe), asks core.tuning.expire what is past its
deadline (decide), then deletes those objects, their pods by the garbage collector's cascade, and
marks each record still Running as Abandoned (apply). It sleeps until the next known deadline, at
most PERIOD_SECONDS; while the operator is paused (peering) it does nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from triton_operator.adapters.kube import ConflictError, ObjectRejectedError, retry_delay
from triton_operator.core import tuning as core
from triton_operator.core.rollout.clock import utcnow

logger = logging.getLogger(__name__)

KINDS = ("Deployment", "Job", "Service", "ConfigMap")
"""What a sweep makes (its pods aside: their owners' deletion takes them)."""
PERIOD_SECONDS = 60.0
"""The longest between two passes (a sweep started since is seen within it)."""
SOONEST_SECONDS = 1.0


class TuningObjectsAPI(Protocol):
    """What the pass needs of the API server (adapters.kube.Kube)."""

    async def list_labelled(self, kind: str, namespace: str | None, label: str) -> list[dict[str, Any]]: ...

    async def delete(self, kind: str, namespace: str, name: str) -> bool: ...

    async def merge_patch(
        self, kind: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any] | None: ...


class TuningExpiry:
    """The periodic pass over tuning objects in the operator's namespaces (``where``: None for all;
    ``counts``: which namespaces are watched, for a pattern listed over all of them)."""

    def __init__(
        self,
        kube: TuningObjectsAPI,
        *,
        where: Sequence[str | None] = (None,),
        counts: Callable[[str], bool] = lambda _: True,
        paused: Callable[[], bool] = lambda: False,
        now: Callable[[], datetime] = utcnow,
        period: float = PERIOD_SECONDS,
    ) -> None:
        self.kube = kube
        self.where = list(where)
        self.counts = counts
        self.paused = paused
        self.now = now
        self.period = period
        self.deleted: list[tuple[str, str, str]] = []
        """(kind, namespace, name) of every object this pass deleted (for tests and logs)."""

    async def observe(self) -> list[dict[str, Any]]:
        objects: list[dict[str, Any]] = []
        for namespace in self.where:
            for kind in KINDS:
                found = await self.kube.list_labelled(kind, namespace, core.LABEL_TUNING)
                objects += [
                    o for o in found if self.counts(str((o.get("metadata") or {}).get("namespace", "")))
                ]
        return objects

    async def pass_once(self) -> float:
        """One pass: observe, decide (core.tuning.expire), apply. Seconds until the next one is due."""
        objects = await self.observe()
        moment = self.now()
        expiry = core.expire(objects, moment)
        for kind, namespace, name in expiry.delete:
            if await self.kube.delete(kind, namespace, name):
                logger.info("tuning %s %s/%s is past its deadline: deleted", kind, namespace, name)
                self.deleted.append((kind, namespace, name))
        for namespace, name, version, data in expiry.abandon:
            try:
                await self.kube.merge_patch("ConfigMap", namespace, name, core.record_patch(data, version))
            except ConflictError:
                continue  # its client wrote it meanwhile: the next pass reads it again
            except ObjectRejectedError as exc:
                logger.warning("could not mark tuning record %s/%s Abandoned: %s", namespace, name, exc)
                continue
            logger.info("tuning record %s/%s: Abandoned (its client stopped before its end)", namespace, name)
        upcoming = core.next_deadline(objects, moment)
        wait = self.period if upcoming is None else (upcoming - moment).total_seconds()
        return min(self.period, max(SOONEST_SECONDS, wait))

    async def run(self) -> None:
        while True:
            wait = self.period
            if not self.paused():
                try:
                    wait = await self.pass_once()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    retry = retry_delay(exc)
                    wait = min(self.period, retry) if retry is not None else self.period
                    logger.warning("the tuning expiry pass failed (again in %g s): %s", wait, exc)
            await asyncio.sleep(wait)

    def start(self) -> asyncio.Task[None]:
        return asyncio.create_task(self.run(), name="tuning expiry")

    @staticmethod
    async def stop(task: asyncio.Task[None] | None) -> None:
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
