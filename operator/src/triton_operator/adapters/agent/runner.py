"""The agent's work: resolve the pod's target revision, sync it into /models, load it through Triton."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from triton_operator.adapters.agent.files import (
    InPlaceDir,
    StateDir,
    present_revisions,
    remove_model_files,
)
from triton_operator.adapters.agent.model_control import LoadFailed, ModelControl, TritonUnreachable
from triton_operator.adapters.agent.processes import stub_instances, tritonserver_running
from triton_operator.adapters.nodecache.client import NodeCacheClient
from triton_operator.adapters.storage import open_store
from triton_operator.adapters.storage.base import StoreError
from triton_operator.adapters.sync.download import SyncOptions, sync
from triton_operator.adapters.sync.progress import Progress, silent
from triton_operator.adapters.sync.results import SyncError, SyncStats, human
from triton_operator.core.pod.agent_plan import (
    FILL_LOADS,
    InPlaceState,
    Readiness,
    Record,
    RevisionFiles,
    Steps,
    fill_order,
    load_order,
    model_states,
    next_load,
    plan,
    python_models,
    readiness,
    resolve_target,
    status_of,
    went_back,
)
from triton_operator.core.pod.startup import FillTimeline, format_summary
from triton_operator.core.repository.manifest import Manifest, ManifestError, SelectionFailed
from triton_operator.core.repository.shared_files import FILES_ENV
from triton_operator.core.rollout.clock import format_time
from triton_operator.core.spec.field_error import ModelConfigError
from triton_operator.core.vocabulary.triton_state import VERSION_READY

logger = logging.getLogger("triton_operator.agent")

GOING = frozenset({"READY", "LOADING", "UNLOADING"})
"""A model version's states in Triton's repository index that are not yet unloaded."""
UNLOAD_POLL_SECONDS = 0.1
PROBE_POLL_SECONDS = 0.1
"""How often a drain looks whether the kubelet's probe has failed often enough."""

FILES_WAIT_SECONDS = 5.0
"""How long the agent waits for the files of a revision it is told to serve or load (the kubelet shows
the in-place ConfigMap a little after the operator wrote it) before it says so, once in its log and in
what the operator reads (the status's message; a pool's report, pool_member)."""
SYNC_FAILURES = (SyncError, StoreError, SelectionFailed, ManifestError, ModelConfigError, OSError)
"""What a sync of a revision can fail with (adapters.sync, the stores); commands.sync names each."""


@dataclass(frozen=True)
class AgentOptions:
    """Where the agent reads and writes, and how it fetches (sync's options)."""

    dest: Path
    state_dir: Path
    base: RevisionFiles
    """The pod's own revision (its config volume): the target when nothing else is named."""
    inplace_dir: Path | None = None
    target_file: Path | None = None
    credentials: Mapping[str, str] = field(default_factory=dict)
    cache: Path | None = None
    concurrency: int = 16
    part_size: int = 64 * 1024 * 1024
    pvc_root: Path | None = None
    volume_limit: int | None = None
    triton: ModelControl = field(default_factory=ModelControl)
    node_cache: str | None = None
    """The node cache's URL (http://host:port), read before the store and given what the store gave,
    as `triton-operator sync` does; None: the store only."""
    node_cache_pod: str = ""
    """The pod's uid, which names its lease on the node cache's objects."""
    node_cache_upload_seconds: float = 300.0
    """How long the init container, and the first fill before the pod is Ready, wait for their uploads
    to the node cache (an in-place change does not wait: its uploads finish while Triton loads)."""
    drain_seconds: float = 0.0
    """How long the pod is out of its Service before the agent unloads or loads a model: with
    ``probe_failures``, counted once the kubelet's probe has failed that many times (the operator
    passes the spec's drainSeconds: the endpoints and routers catching up); without, from the moment
    readiness went false (it passed the probe's period x failureThreshold plus drainSeconds)."""
    probe_failures: int = 0
    """The readiness probe's failureThreshold: before it unloads or loads a model, the agent waits
    until it has answered the kubelet's probe 503 that many times in a row (the kubelet has taken
    the pod out), then ``drain_seconds`` for the endpoints, kube-proxy and routers. 0: no count,
    ``drain_seconds`` from the moment readiness went false (a pod rendered before the count)."""
    drain_timeout: float = 60.0
    """The most seconds the agent waits for those probe failures; past it the agent goes on (a
    warning in its log and status message: the kubelet probes late or not at all), after
    ``drain_seconds`` more."""
    wait: Callable[[float], object] = time.sleep
    """How the agent waits out the drain (the sidecar passes its stop event's wait)."""
    proc: Path = Path("/proc")
    """Where the Python backend's stub processes are looked for (the pod shares its process namespace)."""
    fills: bool = False
    """A pod of the one shape: tritonserver starts with no model, and the agent fills /models and
    loads each model as soon as its bytes are in (Agent.fill); a failure of that first fill raises
    FillFailed (the command exits with its reason), and a tritonserver that restarted gets its
    models loaded again."""


FILL = "fill"
"""The status's key (and the state folder's file) of the first fill's timeline."""
IN_PLACE = "inPlace"
"""The status's key (and the state folder's file) of the last in-place change's timeline."""
FILLED = "the bytes of every model are in"
"""What the status message of a first fill says once its last byte is in (and its loads go on)."""
REPAIR_SECONDS = 5.0
"""How long the agent waits before it loads again a model tritonserver lost (a restart)."""


class FillFailed(Exception):  # noqa: N818
    """The first fill of a pod of the one shape failed: ``cause`` is the sync's error or Triton's
    LoadFailed, whose text names the model and why."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(failure_text(cause))
        self.cause = cause


def now() -> str:
    return format_time(datetime.now(UTC))


def failure_text(exc: BaseException) -> str:
    if isinstance(exc, OSError) and not isinstance(exc, StoreError) and exc.strerror:
        return f"{exc.filename or ''}: {exc.strerror}".lstrip(": ")
    return str(exc) or type(exc).__name__


class Agent:
    """One pod's agent. ``once`` is the init container: the target synced into /models as
    `triton-operator sync` would, and recorded. ``tick`` is one pass of the sidecar: when the target
    differs from what is applied, the steps of core.pod.agent_plan.plan (sync of the target, which fetches
    only what changed and skips what its state file knows unchanged; removed models deleted; loads and
    unloads through Triton), recorded only once they all succeeded."""

    def __init__(self, options: AgentOptions) -> None:
        self.options = options
        self.state = StateDir(options.state_dir)
        self.inplace = InPlaceDir(options.inplace_dir)
        self.record = self.state.record()
        self.target = options.base.revision
        self.message = ""
        self.models: dict[str, str] = {}
        self._synced: str | None = None  # the pending revision this process synced already
        self.node_cache_counts: tuple[int, int] | None = None
        """The last sync's node cache (hits, misses); None when it ran without the node cache."""
        self._plan: tuple[tuple[str | None, tuple[str, ...], str], Steps] | None = None
        self._last_view: tuple[InPlaceState | None, str] | None = self.state.seen()
        # Readiness (GET /v1/ready): ``_serving`` is the revision Triton serves whole (None while a
        # change is part way), ``_blocked`` why the pod is out of its Service whatever its models
        # say, ``_out_since`` since when readiness has been false for that (monotonic).
        self._serving: RevisionFiles | None = None
        self._blocked = ""
        self._out_since = time.monotonic()
        self._draining = False
        # The kubelet's readiness probe: how many of its last answers in a row were 503, and since
        # when that reached probe_failures (the kubelet has the pod out of its Service).
        self._probes = threading.Lock()
        self._probe_503 = 0
        self._probe_out_at: float | None = None
        self._stub_known: dict[str, frozenset[str]] = {}
        """Each Python model's instances seen with a live stub while READY (since the agent loaded it)."""
        self._readiness: tuple[Readiness, float] = (readiness(None, {}, "not checked yet"), 0.0)
        if options.fills and self.record.applied is None and self.record.failed:
            # The first fill failed and the agent exited: its restart tries again (as the kubelet
            # tried the sync init container again).
            self.record = dataclasses.replace(self.record, failed="")
        self._repaired: dict[str, float] = {}
        self.summary = ""
        """The first fill's summary line (format_summary), once it is done."""
        self.timeline: FillTimeline | None = self.state.timeline(FILL)
        """The first fill's record (its status's ``fill``): kept in the state folder across restarts."""
        self.inplace_timeline: FillTimeline | None = self.state.timeline(IN_PLACE)
        """The last revision applied in place, or being applied (its status's ``inPlace``)."""
        if self.record.pending is None and self.record.applied is not None:
            self._serving = self._files(self.record.applied)
        elif self.record.pending is not None:
            self._blocked = f"revision {self.record.pending} was left part way: applying it again"
        self._awaited: tuple[str, float] | None = None
        """The revision the pod's target names that the agent cannot follow yet, and since when."""
        self.waiting = ""
        """What the agent says it waits for once FILES_WAIT_SECONDS are over (_await_target)."""
        self._status: dict[str, Any] = self._status_now()

    # -------------------------------------------------------- the target

    def resolve(self) -> RevisionFiles:
        """The files of the revision the pod should serve now (core.pod.agent_plan.resolve_target), from one
        payload of the in-place volume; a state.json older than one already seen
        (core.pod.agent_plan.went_back: the kubelet showing a lagging copy) is not followed: the last look
        stands."""
        view = self.inplace.view(self.options.target_file)
        state, annotation = view.state, view.target
        if self._last_view is not None and went_back(self._last_view[0], state):
            logger.warning(
                "state.json shows %s after %s: an older copy, not followed", state, self._last_view[0]
            )
            state, annotation = self._last_view
        elif self._last_view != (state, annotation):
            self._last_view = (state, annotation)
            self.state.write_seen(state, annotation)
        named = {r for r in ((state.stable, state.next) if state else ()) if r}
        present = present_revisions(self.inplace, named, view.root)
        self.inplace.forget_others(named)
        base = self.options.base
        target = resolve_target(annotation, state, present, base.revision)
        files = self.inplace.revision(target, view.root) if target in present else None
        self._await_target((annotation or "").strip(), target)
        return files if files is not None else base

    def _await_target(self, named: str, target: str) -> None:
        """The pod's target annotation names ``named`` and the agent follows ``target``: another one
        (its files not in the in-place volume, or state.json not naming it) waits; once it has waited
        FILES_WAIT_SECONDS, said once in the log and in the status's message."""
        if not named or named == target:
            if self._awaited is not None and self.waiting:
                logger.info("revision %s: no longer waited for", self._awaited[0])
            self._awaited, self.waiting = None, ""
            return
        now = time.monotonic()
        if self._awaited is None or self._awaited[0] != named:
            self._awaited, self.waiting = (named, now), ""
        if self.waiting or now - self._awaited[1] < FILES_WAIT_SECONDS:
            return
        self.waiting = (
            f"the pod's target names revision {named}, whose files are not {self.inplace.where(named)} "
            f"or which its state.json does not name, after {FILES_WAIT_SECONDS:g}s: "
            f"it serves {target} meanwhile"
        )
        logger.warning("%s", self.waiting)

    # -------------------------------------------------------- the init container

    def once(self, progress: Progress | None = None) -> SyncStats:
        """Sync the target into /models (empty, partial, or left by an earlier pod of this one) and
        record it; raises what sync raises. Models an earlier record served that the target does not
        are deleted: tritonserver loads every model /models holds."""
        target = self.resolve()
        self.target = target.revision
        record = self._begin(target)
        steps = self._steps(record, target)
        stats = self._sync(target, progress, wait_uploads=True)
        remove_model_files(self.options.dest, steps.delete, steps.delete_folders)
        self._write(record.fetched(stats.downloaded_bytes).done(now()))
        self._serving, self._blocked = target, ""
        logger.info(
            "synced revision %s into %s (%s fetched)",
            target.revision,
            self.options.dest,
            human(stats.downloaded_bytes),
        )
        return stats

    # -------------------------------------------------------- the sidecar

    def tick(self, *, models: bool = True) -> None:
        """One pass: resolve the target, apply it if needed; read Triton's per-model state when
        ``models`` (or after an apply)."""
        target = self.resolve()
        if target.revision != self.target:
            logger.info("target revision %s (was %s)", target.revision, self.target)
        self.target = target.revision
        if self.record.needs(target.revision):
            self.apply(target)
            models = True
        if models:
            self._refresh_models(target)
            serving = self._serving
            fills = self.options.fills and not self._blocked
            if fills and serving is not None and serving.revision == target.revision:
                self.repair(serving)
        self._status = self._status_now()

    def apply(self, target: RevisionFiles) -> None:
        if self.options.fills and self.record.applied is None:
            self.fill(target)
            return
        if self._synced != target.revision and self._starting():
            return
        self.message = ""
        record = self._begin(target)
        steps = self._steps(record, target)
        if self.inplace_timeline is None or self.inplace_timeline.revision != target.revision:
            self._timeline(IN_PLACE, FillTimeline(target.revision, datetime.now(UTC)))
        if self._synced != target.revision:
            kept = (self._serving, self._blocked, self._draining, self._out_since)
            if steps.touches_triton:
                # Out of the Service before the fetch: the kubelet's probe and drainSeconds run while
                # the bytes come in, and only what is left of them after the last byte is waited.
                self.leave(target)
            logger.info(
                "applying revision %s over %s: fetch %d objects (%s), load %s, unload %s",
                target.revision,
                record.applied,
                len(steps.fetch),
                human(steps.bytes),
                ", ".join(steps.load) or "-",
                ", ".join(steps.unload) or "-",
            )
            try:
                stats = self._sync(target, None)
            except SYNC_FAILURES as exc:
                # Nothing was unloaded: the pod serves what it served, back in the Service.
                self._serving, self._blocked, self._draining, self._out_since = kept
                self._fail(record, failure_text(exc))
                return
            record = record.fetched(stats.downloaded_bytes)
            self._write(record)
            remove_model_files(self.options.dest, steps.delete, steps.delete_folders)
            self._synced = target.revision
            self._timeline(IN_PLACE, self._fetched(self.inplace_timeline, stats))
        if steps.touches_triton and not self._triton(record, steps, target):
            return
        self.message = ""
        self._refresh_models(target)  # the status says Applied with Triton's state after the loads
        for model in (*steps.load, *steps.unload):
            self._stub_known.pop(model, None)
        self._serving, self._blocked, self._draining = target, "", False
        if self.inplace_timeline is not None:
            self._timeline(IN_PLACE, dataclasses.replace(self.inplace_timeline, loaded=datetime.now(UTC)))
        self._write(record.done(now()))
        self._synced = None
        logger.info("applied revision %s (%s fetched)", target.revision, human(record.fetched_bytes))
        # Readiness checked now rather than at the checker's next round (up to MODELS_SECONDS later):
        # the kubelet's next probe finds the pod back, and the next batch of pods can go sooner.
        self.check()

    def _starting(self) -> bool:
        """Whether tritonserver is running over /models but does not answer yet: it is loading what
        /models holds (--load-model=*; its HTTP port opens once those loads are done). /models is left
        alone until then: a file swapped or deleted under a load in progress fails it, and a Python
        model whose model.py is gone leaves tritonserver hanging, never listening, until the kubelet's
        startup probe restarts it. (With no tritonserver process, as between two starts of a crashing
        one, the target is placed: the next start loads it.)"""
        triton = self.options.triton
        if triton.live() or not tritonserver_running(self.options.dest, self.options.proc):
            return False
        self.message = (
            f"waiting for tritonserver to finish loading what {self.options.dest} holds before "
            f"placing revision {self.target}"
        )
        self._status = self._status_now()
        return True

    def leave(self, target: RevisionFiles) -> None:
        """Readiness false from now on (state Draining): the kubelet's probe starts failing. The moment
        counts from the first time, as after a failed load (the pod already out)."""
        if not self._blocked:
            self._out_since = time.monotonic()
        self._serving = None
        self._draining = True
        self._blocked = f"draining: out of the Service while revision {target.revision} loads"
        self._status = self._status_now()

    def drain(self, target: RevisionFiles, steps: Steps) -> None:
        """Out of the Service before any model is touched: readiness false (leave; already since the
        fetch began, in apply), then wait until the kubelet's probe has failed and the endpoints dropped
        the pod: with probe_failures, until the agent has answered the probe 503 that many times in a
        row (at most drain_timeout), then drain_seconds; without, drain_seconds after readiness went
        false. No wait when that is past already, as after a failed load or a fetch longer than it."""
        if not self._draining:
            self.leave(target)
        what = f"unloading {', '.join(steps.unload) or '-'} and loading {', '.join(steps.load) or '-'}"
        out_at, late = (self._out_since, "") if not self.options.probe_failures else self._probed_out(what)
        left = out_at + self.options.drain_seconds - time.monotonic()
        if left > 0:
            self.message = (
                f"out of the Service: {late}waiting {left:.3g} s for the endpoints to drop the pod "
                f"before {what}"
            )
            self._status = self._status_now()
            logger.info("%s", self.message)
            self.options.wait(left)

    def probe_answered(self, ready: bool) -> None:
        """The status server answered the kubelet's readiness probe (200: ``ready``, else 503)."""
        with self._probes:
            if ready:
                self._probe_503, self._probe_out_at = 0, None
                return
            self._probe_503 += 1
            if self._probe_out_at is None and self._probe_503 >= self.options.probe_failures:
                self._probe_out_at = time.monotonic()

    def _probed_out(self, what: str) -> tuple[float, str]:
        """When the kubelet took the pod out: the moment the agent had answered its readiness probe
        503 probe_failures times in a row (at once when it had already, as after a failed load).
        Waits for that at most drain_timeout seconds; past it, the moment it gave up and why (said in
        the log and the status message)."""
        o = self.options
        began = time.monotonic()
        while True:
            with self._probes:
                out_at, seen = self._probe_out_at, self._probe_503
            if out_at is not None:
                logger.info(
                    "the kubelet's readiness probe was answered 503 %d times in a row "
                    "(its failureThreshold: %d)",
                    seen,
                    o.probe_failures,
                )
                return out_at, ""
            waited = time.monotonic() - began
            if waited >= o.drain_timeout:
                late = (
                    f"the kubelet's readiness probe was answered 503 {seen} of {o.probe_failures} times "
                    f"within {o.drain_timeout:g} s (it probes late or not at all; requests the endpoints "
                    "still send to this pod may fail): "
                )
                logger.warning("out of the Service: %s%s after %g s more", late, what, o.drain_seconds)
                return time.monotonic(), late
            self.message = (
                f"out of the Service: waiting for the kubelet's readiness probe to fail {o.probe_failures} "
                f"times ({seen} so far, {waited:.0f} of at most {o.drain_timeout:g} s) before {what}"
            )
            self._status = self._status_now()
            if o.wait(min(PROBE_POLL_SECONDS, o.drain_timeout - waited)) is True:
                return time.monotonic(), ""  # stopping

    def _unloaded(self, models: set[str]) -> None:
        """Until Triton lists no version of ``models`` as loaded or unloading: its unload answers at
        once and finishes in the background (a load sent meanwhile would go over the model still
        there). Raises LoadFailed when that takes longer than a load may."""
        triton = self.options.triton
        deadline = time.monotonic() + triton.load_timeout
        while models:
            busy = {e.model: e.state for e in triton.index() if e.model in models and e.state in GOING}
            if not busy:
                return
            if time.monotonic() > deadline:
                model, state = sorted(busy.items())[0]
                raise LoadFailed("unload", model, f"still {state} after {triton.load_timeout:g} s")
            time.sleep(UNLOAD_POLL_SECONDS)

    def _triton(self, record: Record, steps: Steps, target: RevisionFiles) -> bool:
        """Out of the Service, the unloads then the loads (never a load over a loaded model); False
        when they did not all succeed (the record says why, or the message says what the agent waits
        for)."""
        triton = self.options.triton
        if not triton.live():
            self.message = f"waiting for tritonserver at {triton.url} to load {', '.join(steps.load)}"
            self._status = self._status_now()
            return False
        self.drain(target, steps)
        if self.inplace_timeline is not None and self.inplace_timeline.drained is None:
            self._timeline(IN_PLACE, dataclasses.replace(self.inplace_timeline, drained=datetime.now(UTC)))
        try:
            for model in steps.unload:
                logger.info("unloading model %s", model)
                self.message = f"out of the Service: unloading model {model}"
                self._status = self._status_now()
                triton.unload(model)
            self._unloaded(set(steps.unload))
            for model in steps.load:
                logger.info("loading model %s", model)
                self.message = f"out of the Service: loading model {model}"
                self._status = self._status_now()
                triton.load(model)
        except LoadFailed as exc:
            self._refresh_models(target)
            self._blocked = (
                f"revision {target.revision} failed to load: {exc}; out of the Service until a revision loads"
            )
            self._draining = False
            self._fail(record, str(exc))
            return False
        except TritonUnreachable as exc:
            self.message = f"tritonserver did not answer, trying again: {exc}"
            return False
        return True

    # -------------------------------------------------------- the first fill (one pod shape)

    def fill(self, target: RevisionFiles) -> None:
        """The pod's first revision, with tritonserver started empty: one sync of every model's files
        (verified, from the node cache first, under one lease), each model's fetched before the next's
        (core.pod.agent_plan.fill_order: sync's model_order, again once the node cache's lease says
        which objects it holds: a warm node's reads are faster than the store's); a model is placed
        as soon as its own last file is in (sync's Progress.model_placed), and loader threads (up to
        core.pod.agent_plan.FILL_LOADS loads at once) load it then, once its ensemble steps are loaded
        (core.pod.agent_plan.next_load), while the rest download. The uploads to the node cache are
        waited for before the pod may be Ready. Nothing was served yet: no drain. Raises FillFailed."""
        record = self._begin(target)
        steps = self._steps(record, target)
        self._blocked, self._serving = "", None
        order = fill_order(target)
        logger.info(
            "filling revision %s: fetch %s (%s), loading each model as soon as its bytes are in",
            target.revision,
            ", ".join(order) or "-",
            human(steps.bytes),
        )
        placed: set[str] = set()
        loaded: set[str] = set()
        tried: set[str] = set()
        failure: list[BaseException] = []
        fetched = [False]
        turn = threading.Condition()

        def progress() -> None:
            with turn:
                done = f"{len(loaded)} of {len(order)} models loaded"
                left = [m for m in order if m not in placed]
            if fetched[0]:
                self.message = f"filling: {FILLED}; {done}"
            else:
                self.message = f"filling: fetching {', '.join(left)}; {done}"
            self._status = self._status_now()

        def model_placed(model: str) -> None:
            with turn:
                placed.add(model)
                turn.notify_all()
            logger.info("model %s: every file in", model)
            progress()

        stopped = threading.Event()

        def loader() -> None:
            triton = self.options.triton
            while True:
                with turn:
                    while True:
                        if failure or stopped.is_set():
                            return
                        model = next_load(target, placed, loaded, tried)
                        if model is not None:
                            tried.add(model)
                            break
                        if fetched[0]:
                            return
                        turn.wait(0.5)
                while not triton.live():
                    if self.options.wait(0.1) is True:
                        stopped.set()
                        return
                try:
                    logger.info("loading model %s", model)
                    triton.load(model)
                except LoadFailed as exc:
                    with turn:
                        failure.append(exc)
                        turn.notify_all()
                    return
                except TritonUnreachable as exc:  # tritonserver restarting: the model again
                    logger.warning("loading model %s: %s; trying again", model, exc)
                    with turn:
                        tried.discard(model)
                    continue
                logger.info("model %s loaded", model)
                with turn:
                    loaded.add(model)
                    turn.notify_all()
                progress()

        threads = [
            threading.Thread(target=loader, name=f"agent-loads-{i}", daemon=True) for i in range(FILL_LOADS)
        ]
        for thread in threads:
            thread.start()
        began = time.monotonic()
        self.timeline = FillTimeline(target.revision, datetime.now(UTC))
        uploads: list[NodeCacheClient] = []
        stats = SyncStats()
        progress()
        try:
            stats = self._sync(
                target,
                silent(on_model_placed=model_placed),
                uploads=uploads,
                model_order=order,
                reorder=lambda held: self._reordered(target, held),
            )
            self.timeline = self._fetched(self.timeline, stats)  # the last byte in and verified
            record = record.fetched(stats.downloaded_bytes)
            self._write(record)
        except SYNC_FAILURES as exc:
            with turn:
                failure.append(exc)
                turn.notify_all()
        finally:
            with turn:
                fetched[0] = True
                turn.notify_all()
            progress()
            # The node's cache gets every object before the pod is Ready (as the sync init container
            # waited at its end): a scale-up right after reads none from the store. The loads go on.
            for node_cache in uploads:
                node_cache.close(self.options.node_cache_upload_seconds)
            for thread in threads:
                thread.join()
        if failure:
            self._refresh_models(target)
            self._fail(record, failure_text(failure[0]))
            raise FillFailed(failure[0])
        if stopped.is_set():
            return
        remove_model_files(self.options.dest, steps.delete, steps.delete_folders)
        self.message = ""
        self.summary = format_summary(
            stats.files,
            stats.downloaded_bytes,
            stats.bytes - stats.downloaded_bytes,
            time.monotonic() - began,
            node_cache=self.node_cache_counts,
            vouched=stats.vouched_files,
            shared=stats.shared_files,
        )
        self._refresh_models(target)
        # Every model loaded: recorded (and kept across restarts) before the pod may be Ready.
        if self.timeline is not None:
            self._timeline(FILL, dataclasses.replace(self.timeline, loaded=datetime.now(UTC)))
        self._serving, self._blocked, self._draining = target, "", False
        self._write(record.done(now()))
        logger.info("filled revision %s (%s fetched)", target.revision, human(record.fetched_bytes))

    def repair(self, serving: RevisionFiles) -> None:
        """In a pod of the one shape, load again the models of ``serving`` that tritonserver lists as
        neither loaded nor loading (it restarted: it starts with no model), each at most every
        REPAIR_SECONDS; readiness stays false until they are READY again."""
        triton = self.options.triton
        lost = [m for m, state in self.models.items() if state not in GOING]
        if not lost or not triton.live():
            return
        at = time.monotonic()
        for model in load_order(lost, serving.configs):
            if at - self._repaired.get(model, -REPAIR_SECONDS) < REPAIR_SECONDS:
                continue
            self._repaired[model] = at
            logger.warning("model %s is %s in tritonserver: loading it again", model, self.models[model])
            try:
                triton.load(model)
            except (LoadFailed, TritonUnreachable) as exc:
                logger.error("loading model %s again failed: %s", model, exc)
                return
            self._stub_known.pop(model, None)

    # -------------------------------------------------------- helpers

    def _begin(self, target: RevisionFiles) -> Record:
        if (
            self.record.pending == target.revision
            and not self.record.failed
            and (self._synced == target.revision or self.state.load(target.revision) is not None)
        ):
            return self.record  # going on with it: its files and record were written when it began
        record = self.record.start(target.revision, now())
        self.state.save(target)
        self._write(record)
        return record

    def _steps(self, record: Record, target: RevisionFiles) -> Steps:
        """core.pod.agent_plan.plan from the saved files of the revisions the record names (read once a
        change: a pass that waits for tritonserver does not parse the manifests again)."""
        key = (record.applied, record.partial, target.revision)
        if self._plan is not None and self._plan[0] == key:
            return self._plan[1]
        applied = self.state.load(record.applied) if record.applied else None
        partial = [files for r in record.partial if (files := self.state.load(r)) is not None]
        steps = plan(applied, target, partial=partial)
        self._plan = (key, steps)
        return steps

    def _sync(
        self,
        target: RevisionFiles,
        progress: Progress | None,
        *,
        wait_uploads: bool = False,
        manifest: Manifest | None = None,
        uploads: list[NodeCacheClient] | None = None,
        model_order: tuple[str, ...] = (),
        reorder: Callable[[frozenset[str]], tuple[str, ...]] | None = None,
    ) -> SyncStats:
        """Sync ``target`` into /models: from the node cache first when there is one, then the store.
        ``wait_uploads``: wait for the uploads to the node cache (the init container, whose exit would
        cut them); else they finish in the background, or (``uploads``) the caller waits for them.
        ``manifest``: a part of the target's (one model's, core.pod.agent_plan.model_part) synced alone.
        ``model_order``: sync's (each model's files fetched before the next's); ``reorder``: sync's
        (the order again, from what the node cache holds)."""
        o = self.options
        part = manifest if manifest is not None else target.manifest
        store = None
        node_cache = None
        if target.manifest.pinned and o.node_cache:
            # A sync of a part (one model) leases the whole revision: its lease replaces the pod's
            # earlier one, which the uploads of the models synced before still need.
            lease = target.manifest.entries if manifest is not None else None
            node_cache = NodeCacheClient(o.node_cache, o.node_cache_pod, lease=lease)
        if target.manifest.pinned:
            store = open_store(
                target.manifest.repository,
                o.credentials,
                pvc_root=o.pvc_root,
                max_connections=o.concurrency,
                reads_only=True,
            )
        try:
            options = SyncOptions(
                dest=o.dest,
                configs=self.state.configs(target.revision),
                cache=o.cache,
                concurrency=o.concurrency,
                part_size=o.part_size,
                pvc_root=o.pvc_root,
                volume_limit=o.volume_limit,
                source=node_cache,
                shared_dir=os.environ.get(FILES_ENV, ""),
                model_order=model_order,
                reorder=reorder,
            )
            stats = sync(part, store, options, progress or silent())
            self.node_cache_counts = (
                (stats.source_hits, stats.source_misses) if node_cache is not None else None
            )
            return stats
        finally:
            if store is not None:
                store.close()
            if node_cache is not None:
                if wait_uploads:
                    node_cache.close(o.node_cache_upload_seconds)
                elif uploads is not None:
                    uploads.append(node_cache)
                else:
                    threading.Thread(
                        target=node_cache.close,
                        args=(o.node_cache_upload_seconds,),
                        name="node-cache-uploads",
                        daemon=True,
                    ).start()

    @staticmethod
    def _reordered(target: RevisionFiles, held: frozenset[str]) -> tuple[str, ...]:
        """fill_order of ``target`` once the node cache's lease named the objects it holds."""
        order = fill_order(target, held)
        if held:
            logger.info(
                "the node cache holds %s of %s objects: fetch %s",
                len(held),
                len(target.manifest.entries),
                ", ".join(order) or "-",
            )
        return order

    @staticmethod
    def _fetched(timeline: FillTimeline | None, stats: SyncStats) -> FillTimeline | None:
        """``timeline`` with its last byte in now, and where the bytes of ``stats`` came from."""
        if timeline is None:
            return None
        return dataclasses.replace(
            timeline,
            fetched=datetime.now(UTC),
            objects=stats.files,
            fetched_bytes=stats.downloaded_bytes,
            node_cache_bytes=stats.source_bytes,
            present_bytes=max(stats.bytes - stats.downloaded_bytes - stats.source_bytes, 0),
        )

    def _timeline(self, kind: str, timeline: FillTimeline | None) -> None:
        """Record ``timeline`` as the first fill's (FILL) or the last in-place change's (IN_PLACE): in
        the state folder (a restarted agent says it again) and the status."""
        if timeline is None:
            return
        if kind == FILL:
            self.timeline = timeline
        else:
            self.inplace_timeline = timeline
        self.state.write_timeline(kind, timeline)
        self._status = self._status_now()

    def _fail(self, record: Record, reason: str) -> None:
        logger.error("revision %s failed: %s", record.pending, reason)
        self._write(record.fail(reason, now()))
        self._synced = None

    def _write(self, record: Record) -> None:
        self.state.write(record)
        self.record = record
        if record.pending is None:
            self.state.prune(record.revisions())
        self._status = self._status_now()

    def _refresh_models(self, target: RevisionFiles) -> None:
        try:
            index = self.options.triton.index()
        except TritonUnreachable:
            return
        self.models = model_states(index, target)

    def _status_now(self) -> dict[str, Any]:
        status = status_of(
            self.record,
            self.options.base.revision,
            self.target,
            self.models,
            self.message or self.waiting,
            draining=self._draining,
        )
        out = dataclasses.replace(status, summary=self.summary).to_json()
        # The first fill's and the last in-place change's timelines (core.pod.startup.FillTimeline:
        # status.timeToServe's phases and bytes, read once per new Ready pod by the operator).
        if self.timeline is not None:
            out[FILL] = self.timeline.to_json()
        if self.inplace_timeline is not None:
            out[IN_PLACE] = self.inplace_timeline.to_json()
        return out

    def _files(self, revision: str) -> RevisionFiles | None:
        if revision == self.options.base.revision:
            return self.state.load(revision) or self.options.base
        return self.state.load(revision)

    # -------------------------------------------------------- readiness

    def check(self) -> Readiness:
        """Readiness now (the sidecar's checker thread, every second): every model of the revision
        Triton serves whole READY in its repository index, READY by its own ready endpoint, and, for a
        Python model, none of its backend stub processes gone (Triton 2.51 reports neither of the
        first two when a stub dies: tests/triton/test_inplace_readiness.py)."""
        serving, blocked = self._serving, self._blocked
        if blocked or serving is None:
            result = readiness(serving, {}, blocked)
        else:
            result = readiness(serving, self._health(serving))
        self._readiness = (result, time.monotonic())
        return result

    def _health(self, serving: RevisionFiles) -> dict[str, str]:
        triton = self.options.triton
        try:
            states = model_states(triton.index(), serving)
            versions = {m.name: m.versions for m in serving.manifest.models}
            for model, state in states.items():
                if state != VERSION_READY:
                    continue
                for version in versions.get(model) or ("",):
                    if not triton.ready(model, version):
                        where = f"{model}/versions/{version}" if version else model
                        states[model] = f"not ready (GET /v2/models/{where}/ready)"
                        break
        except TritonUnreachable as exc:
            return dict.fromkeys(serving.models, f"unknown: tritonserver does not answer ({exc})")
        # By instance (a stub's instance name), not by count: when Triton reloads a model on its own
        # (an ensemble's load reloads a composing model whose files' ctime changed, as a new pod's
        # view of the node cache's files changes the blobs' link count), its old and new stubs live
        # side by side for a while, then the old ones end; a count would see one "gone".
        stubs = stub_instances(self.options.dest, self.options.proc)
        for model in python_models(serving):
            live = stubs.get(model, frozenset())
            known = self._stub_known.get(model, frozenset())
            if states.get(model) == VERSION_READY:
                self._stub_known[model] = known = known | live
            if gone := known - live:
                lost = f"{len(gone)} of its {len(known)} Python backend stub processes are gone"
                states[model] = f"dead: {lost}"
        return states

    def ready(self, stale_seconds: float = 5.0) -> Readiness:
        """The last check, unless the pod left its Service since, or it is older than ``stale_seconds``."""
        result, at = self._readiness
        if self._blocked:
            return readiness(self._serving, result.models, self._blocked)
        if time.monotonic() - at > stale_seconds:
            return readiness(self._serving, result.models, f"no check for {stale_seconds:g} s")
        return result

    def status(self) -> dict[str, Any]:
        """The last status (GET /v1/inplace): a snapshot the loop replaces, never one being built."""
        return self._status
