"""A pooled pod's agent: loads exactly the models its assignment annotation names, reports each (/v1/pool)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from triton_operator.adapters.agent.files import REVISIONS, read_text, remove_model_files
from triton_operator.adapters.agent.gpu_metrics import GpuMetrics
from triton_operator.adapters.agent.leaving import pod_name
from triton_operator.adapters.agent.model_control import LoadFailed, TritonUnreachable
from triton_operator.adapters.agent.processes import model_memory
from triton_operator.adapters.agent.runner import (
    FILES_WAIT_SECONDS,
    GOING,
    REPAIR_SECONDS,
    SYNC_FAILURES,
    Agent,
    failure_text,
)
from triton_operator.core.objects.names import POOL_LABELS_ITEM
from triton_operator.core.pod.agent_plan import (
    FILL_LOADS,
    Readiness,
    RevisionFiles,
    ensemble_steps,
    model_part,
)
from triton_operator.core.pool.assignment import (
    AssignmentError,
    Copy,
    PodAssignment,
    Wanted,
    build_report,
    parse_assignment,
)
from triton_operator.core.pool.gpu_memory import (
    GPU,
    HOST,
    GpuMemory,
    gpu_growth,
    load_figure,
    measured_kinds,
)
from triton_operator.core.pool.labels import READY, model_label_key
from triton_operator.core.spec.field_error import ModelConfigError
from triton_operator.core.spec.modelconfig import parse_config_pbtxt
from triton_operator.core.vocabulary.triton_state import VERSION_READY

logger = logging.getLogger("triton_operator.agent")

LOADING = "LOADING"
UNAVAILABLE = "UNAVAILABLE"


@dataclass
class _Missing:
    """An entry whose revision's files the agent has not found: since when (monotonic), and what it
    said once FILES_WAIT_SECONDS were over (empty: not yet), in its log and its report (the copy's
    ``waiting``, which status.pool.models[].message shows)."""

    wanted: Wanted
    since: float
    said: str = ""


@dataclass
class _Held:
    """One model the agent acted on: the version and attempt it acted on last, why that failed (empty:
    it did not), and the version Triton last loaded READY (kept through a failed reload)."""

    version: str
    attempt: int
    error: str = ""
    ready_version: str = ""
    revision: str | None = None
    memory: int | None = None
    """The memory its last measured load took (bytes: host, GPU or both, measured_kinds; None: not
    measured)."""


@dataclass
class _Job:
    """A load of a pass: the model, its entry, whether it must run with no other load (the model is
    still to be measured, or an ensemble: after its steps' loads), and whether another load overlapped
    it (then tritonserver's growth across it is not its own)."""

    model: str
    wanted: Wanted
    files: RevisionFiles
    """The files of its revision (_files), found when the pass was planned."""
    alone: bool
    overlapped: bool = False


class PoolMember:
    """The agent of a pod of a pool (docs/pool.md, "The pod side contract"): each pass reads the
    assignment (``assignment_file``, the pod's annotation pool.triton-operator.io/models as a downwardAPI
    file, which the kubelet refreshes), loads a model whose entry appeared or whose version or attempt
    changed (its files fetched verified, the node cache first, as the one-shape fill fetches one model,
    then Triton's model control), unloads one whose entry is gone (the operator took its route label
    off and waited the drain before it dropped the entry), and never retries a failed load by itself.
    A pass's unloads come first; then its loads run up to core.pod.agent_plan.FILL_LOADS at once (as
    the one-shape fill's loader threads), except that a model still to be measured (_to_measure) loads
    with no other load, so that tritonserver's growth across it (host memory, and the pod's GPUs' used
    memory as ``gpu``, tritonserver's metrics, reads it) is its own."""

    def __init__(
        self,
        agent: Agent,
        assignment_file: Path,
        labels_file: Path | None = None,
        gpu: GpuMetrics | None = None,
    ) -> None:
        self.agent = agent
        self.gpu = gpu
        """tritonserver's GPU memory gauges (None: GPU models are not measured)."""
        self._changed_at = float("-inf")
        """time.monotonic() when the last load or unload answered: a GPU reading taken less than
        ``gpu.settle_seconds`` after it may not include it yet."""
        self.assignment_file = assignment_file
        self.labels_file = labels_file or assignment_file.with_name(POOL_LABELS_ITEM)
        """The pod's labels (downward API, beside the assignment): which models are on their routes."""
        self.assignment: PodAssignment | None = None
        """The last assignment read whole (None: none read yet)."""
        self.held: dict[str, _Held] = {}
        self.states: dict[str, str] = {}
        """Triton's state of each held model (its repository index), read each pass."""
        self.acting: set[str] = set()
        """The models being fetched or loaded now (reported LOADING); changed under ``_turn``."""
        self._turn = threading.Condition()
        """Guards ``acting`` and the pass's loads in flight (which may start, which must wait)."""
        self._fetching = threading.Lock()
        """One model's files fetched at a time (the agent's sync and its saved configs are not shared
        between threads); the Triton loads run at once."""
        self.message = ""
        self.written = False
        """Whether the assignment read was written by the operator (the kubelet writes an empty file
        while the pod has no annotation yet)."""
        self.filled = False
        """Whether every model of the first assignment the operator wrote was settled (READY, or its
        attempt failed): the pod's first fill, after which readiness no longer waits on new loads."""
        self._repaired: dict[str, float] = {}
        self.missing: dict[str, _Missing] = {}
        """The entries waiting for their revision's files (_files found none), by model."""

    # -------------------------------------------------------- a pass

    def read(self) -> PodAssignment | None:
        """The assignment file read and parsed; a missing or bad one keeps the last read (said once)."""
        text = read_text(self.assignment_file)
        if text is None:
            if self.assignment is None:
                self.message = f"no assignment yet at {self.assignment_file}"
            return self.assignment
        try:
            assignment = parse_assignment(text)
        except AssignmentError as exc:
            message = f"{self.assignment_file}: {exc}; the last assignment read stands"
            if message != self.message:
                logger.error("%s", message)
            self.message = message
            return self.assignment
        self.message = ""
        self.assignment = assignment
        self.written = bool(text.strip())
        return assignment

    def tick(self) -> None:
        """One pass: unload what left the assignment, load what is new or asked again, read states."""
        assignment = self.read()
        if assignment is not None:
            self.missing = {
                m: missing
                for m, missing in self.missing.items()
                if m in assignment.models and assignment.models[m].revision == missing.wanted.revision
            }
            triton = self.agent.options.triton
            for model in sorted(set(self.held) - set(assignment.models)):
                self._unload(model)
            if triton.live():
                self._load_all(
                    [
                        (model, wanted)
                        for model, wanted in sorted(assignment.models.items())
                        if (held := self.held.get(model)) is None
                        or (held.version, held.attempt, held.revision)
                        != (wanted.version, wanted.attempt, wanted.revision)
                    ]
                )
        self._refresh()
        if assignment is not None:
            self._repair()

    def _repair(self) -> None:
        """A model that loaded and that tritonserver no longer lists as loaded or loading (it restarted:
        it starts with no model) is loaded again at its version, at most every REPAIR_SECONDS; a failed
        load is not (the operator asks again by raising its attempt)."""
        triton = self.agent.options.triton
        at = time.monotonic()
        again: list[tuple[str, Wanted]] = []
        assigned = self.assignment.models if self.assignment is not None else {}
        for model, held in sorted(self.held.items()):
            lost = held.ready_version == held.version and not held.error
            if not lost or self.states.get(model) in GOING:
                continue
            if at - self._repaired.get(model, -REPAIR_SECONDS) < REPAIR_SECONDS or not triton.live():
                continue
            self._repaired[model] = at
            logger.warning("pool: model %s is not loaded in tritonserver: loading it again", model)
            measured = model in assigned and assigned[model].measured
            again.append((model, Wanted(held.version, held.attempt, held.revision, measured=measured)))
        self._load_all(again)
        self._refresh()

    def _files(self, revision: str | None) -> RevisionFiles | None:
        """The files of ``revision`` (None: the pod's own): another one, which a change in place names,
        from the in-place volume, else from the agent's own copy (StateDir, saved at the first load
        from it: the in-place ConfigMap carries only the served revision and the one in progress, so a
        revision an entry still names may have left it by the time a restarted agent loads the entry
        again); None while the kubelet has not shown it yet."""
        base = self.agent.options.base
        if revision is None or revision == base.revision:
            return base
        found = self.agent.inplace.revision(revision)
        return found if found is not None else self.agent.state.load(revision)

    def _wait_files(self, model: str, wanted: Wanted) -> None:
        """``model``'s entry waits for its revision's files: said once (a warning, and the copy's
        ``waiting`` in the report) when FILES_WAIT_SECONDS are over, naming where the agent looks."""
        now = time.monotonic()
        missing = self.missing.get(model)
        if missing is None:
            missing = self.missing[model] = _Missing(wanted, now)
        missing.wanted = wanted
        if missing.said or now - missing.since < FILES_WAIT_SECONDS:
            return
        revision = str(wanted.revision)
        own = self.agent.state.path / REVISIONS / revision
        missing.said = (
            f"waits for revision {revision}'s files, not {self.agent.inplace.where(revision)} "
            f"nor in the agent's own copy ({own}) "
            f"after {FILES_WAIT_SECONDS:g}s"
        )
        logger.warning("pool: model %s (version %s): %s", model, wanted.version, missing.said)

    def _reloading(self, model: str) -> bool:
        """Whether a load of ``model`` reloads it: a version of it is READY here (in tritonserver, which
        keeps it, and its stubs, until the new version is in: the growth across it is not one copy's)."""
        held = self.held.get(model)
        return held is not None and bool(held.ready_version) and self.states.get(model) == VERSION_READY

    def _kinds(self, config: str) -> frozenset[str]:
        """The memory a load of a model with this config.pbtxt is measured in (measured_kinds, from its
        instance groups' kinds; none when it does not parse): none for a model with GPU instances when
        this agent reads no GPU metrics."""
        try:
            groups = parse_config_pbtxt(config).instance_group
        except ModelConfigError:
            return frozenset()
        kinds = measured_kinds(type(g).Kind.Name(g.kind) for g in groups)
        return frozenset() if GPU in kinds and self.gpu is None else kinds

    def _to_measure(self, model: str, wanted: Wanted, files: RevisionFiles) -> bool:
        """Whether ``model``'s load is to measure its memory, so that it runs with no other load: its
        instances run on the CPU, the GPU or both (_kinds), it is not a reload (_reloading: never
        measured), and neither this agent (an earlier load here) nor the operator (the entry's
        ``measured``: status.pool keeps its figure) has its memory yet."""
        config = files.configs.get(model)
        if config is None or not self._kinds(config) or wanted.measured or self._reloading(model):
            return False
        held = self.held.get(model)
        return held is None or held.memory is None

    def _load_all(self, loads: list[tuple[str, Wanted]]) -> None:
        """Each of ``loads`` (in their order, ensembles last), up to FILL_LOADS at once on loader
        threads as the one-shape fill's (Agent.fill); a load that is to measure its model, or an
        ensemble's, waits for the loads before it, and the next ones wait for it. Returns once every
        load has answered."""
        found: list[tuple[bool, _Job]] = []
        for model, wanted in loads:
            files = self._files(wanted.revision)
            if files is None:
                # The operator wrote the in-place ConfigMap before naming its revision here; the kubelet
                # shows it a little later: nothing is done this pass, the next one tries again.
                self.message = (
                    f"model {model}: revision {wanted.revision}'s files are not in the in-place volume yet"
                )
                self._wait_files(model, wanted)
                continue
            missing = self.missing.pop(model, None)
            if missing is not None and missing.said:
                logger.info(
                    "pool: model %s: revision %s's files are there after %.0fs",
                    model,
                    wanted.revision,
                    time.monotonic() - missing.since,
                )
            ensemble = bool(ensemble_steps(files.configs.get(model, "")))
            alone = ensemble or self._to_measure(model, wanted, files)
            found.append((ensemble, _Job(model, wanted, files, alone=alone)))
        jobs = [job for _, job in sorted(found, key=lambda f: f[0])]  # stable: the ensembles last
        running: list[_Job] = []

        def take() -> _Job | None:
            with self._turn:
                while jobs:
                    job = jobs[0]
                    together = not job.alone and not any(r.alone for r in running)
                    if not running or (together and len(running) < FILL_LOADS):
                        jobs.pop(0)
                        if running:  # neither this load's growth nor theirs is one model's
                            job.overlapped = True
                            for other in running:
                                other.overlapped = True
                        running.append(job)
                        self.acting.add(job.model)
                        return job
                    self._turn.wait()
                return None

        def loader() -> None:
            while (job := take()) is not None:
                try:
                    self._load(job)
                except Exception:  # a bug: said; the pass goes on with the other loads
                    logger.exception("pool: loading model %s failed", job.model)
                finally:
                    with self._turn:
                        running.remove(job)
                        self.acting.discard(job.model)
                        self._turn.notify_all()

        if len(jobs) <= 1:
            loader()
            return
        threads = [
            threading.Thread(target=loader, name=f"agent-pool-loads-{i}", daemon=True)
            for i in range(min(FILL_LOADS, len(jobs)))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _load(self, job: _Job) -> None:
        model, wanted, files = job.model, job.wanted, job.files
        version, attempt, revision = wanted.version, wanted.attempt, wanted.revision
        held = self.held.get(model)
        ready_version = held.ready_version if held is not None else ""
        memory = held.memory if held is not None else None
        reloading = self._reloading(model)
        self.held[model] = entry = _Held(
            version, attempt, ready_version=ready_version, revision=revision, memory=memory
        )
        try:
            if model not in files.configs:
                raise LoadFailed("load", model, f"revision {files.revision} has no model {model!r}")
            with self._fetching:
                if self.agent.state.load(files.revision) is None:
                    self.agent.state.save(files)  # the configs sync writes, as a revision's apply saves them
                logger.info(
                    "pool: loading model %s (version %s, attempt %d, revision %s)",
                    model,
                    version,
                    attempt,
                    files.revision,
                )
                self.agent._sync(files, None, manifest=model_part(files.manifest, model))
            # A reload of a model READY here is not measured: tritonserver holds both versions, and
            # both versions' stubs, until the new one is in; the figure of its first load stands.
            kinds = frozenset() if reloading else self._kinds(files.configs[model])
            before = self._memory(model) if HOST in kinds else None
            # The GPUs are read only around a load that runs alone (one still to be measured): each
            # reading waits for tritonserver's gauges to include the loads and unloads before it.
            gpu_before = self._gpu_reading() if GPU in kinds and job.alone else None
            try:
                self.agent.options.triton.load(model)
            finally:
                self._changed_at = time.monotonic()
        except (LoadFailed, TritonUnreachable, *SYNC_FAILURES) as exc:
            if isinstance(exc, TritonUnreachable) and not self.agent.options.triton.live():
                # tritonserver went away under the load (it crashed, the kubelet restarts it): not a
                # failed load, which the operator would back off from while the pod, Ready again,
                # kept the model's route label. The record goes back to what it was: once tritonserver
                # is back the next pass loads it (a new entry, version or attempt), or _repair does (a
                # model it held READY), and the readiness waits for it meanwhile.
                logger.warning("pool: model %s: tritonserver went away during its load (%s)", model, exc)
                if held is None:
                    self.held.pop(model, None)
                else:
                    self.held[model] = held
                return
            entry.error = failure_text(exc)
            logger.error("pool: model %s (version %s, attempt %d): %s", model, version, attempt, entry.error)
        else:
            after = self._memory(model) if before is not None else None
            entry.ready_version = version
            self.states[model] = VERSION_READY  # Triton's load answered: READY until the next reading
            with self._turn:
                overlapped = job.overlapped
            gpu_after = None
            if gpu_before is not None and not overlapped:
                # Reported READY at once; the load still holds the pod's loads back (it is running)
                # until tritonserver's GPU gauges include it.
                with self._turn:
                    self.acting.discard(model)
                gpu_after = self._gpu_reading()
            host = None
            if before is not None and after is not None:
                host = max(0, after[0] - before[0]) + after[1]
            gpu = None
            if gpu_before is not None and gpu_after is not None:
                gpu = gpu_growth(gpu_before, gpu_after)
            figure = None if overlapped else load_figure(kinds, host, gpu)
            if figure is not None:
                # No other load overlapped this one: tritonserver's growth across it (host memory,
                # with the stubs its instances run in; the pod's GPUs' used memory) is this model's.
                entry.memory = figure
                logger.info("pool: model %s took %d bytes at its load", model, entry.memory)
            elif kinds:
                # Another load overlapped (tritonserver's growth is not this model's alone), or a
                # reading it needs was not there: the figure measured before (here, or status.pool's)
                # stands.
                logger.info("pool: model %s: its memory is not measured at this load", model)

    def _gpu_reading(self) -> dict[str, GpuMemory] | None:
        """The pod's GPUs' memory as tritonserver's metrics say, once ``gpu.settle_seconds`` have passed
        since the last load or unload answered (its gauges are refreshed each metrics interval)."""
        if self.gpu is None:
            return None
        wait = self._changed_at + self.gpu.settle_seconds - time.monotonic()
        if wait > 0:
            self.agent.options.wait(wait)
        return self.gpu.read()

    def _memory(self, model: str) -> tuple[int, int] | None:
        """tritonserver's resident memory and that of ``model``'s Python stubs (None: not visible)."""
        return model_memory(self.agent.options.dest, model, self.agent.options.proc)

    def _unload(self, model: str) -> None:
        logger.info("pool: unloading model %s (no longer assigned)", model)
        try:
            self.agent.options.triton.unload(model)
        except (LoadFailed, TritonUnreachable) as exc:
            logger.error("pool: unloading model %s: %s; tried again next pass", model, exc)
            return
        finally:
            self._changed_at = time.monotonic()
        del self.held[model]
        self.states.pop(model, None)
        self._repaired.pop(model, None)
        remove_model_files(self.agent.options.dest, (), (model,))  # /models holds what the pod holds

    def _refresh(self) -> None:
        try:
            index = self.agent.options.triton.index()
        except TritonUnreachable:
            return
        states: dict[str, str] = {}
        for version in index:
            if version.model in self.held and states.get(version.model) != VERSION_READY:
                states[version.model] = version.state
        self.states = states

    def _unrouted(self, assignment: PodAssignment, states: dict[str, str]) -> list[str]:
        """The models of ``assignment`` READY here that the operator has not labelled ready yet (its
        route label): before the first fill counts as done, so that the pod becomes Ready, and a
        rollout retires the pods it replaces, only once its models are on their routes. Nothing when
        the pod has no labels file (a pod rendered before it was projected)."""
        text = read_text(self.labels_file)
        if text is None:
            return []
        labels = parse_labels(text)
        return sorted(
            m
            for m in assignment.models
            if states.get(m) == VERSION_READY and labels.get(model_label_key(m)) != READY
        )

    # -------------------------------------------------------- what it serves

    def report(self) -> dict[str, Any]:
        """GET /v1/pool: each held model's Triton state, version, last attempt and its error, and the
        memory its last load took where measured (core.pool.assignment.build_report)."""
        copies = {}
        with self._turn:
            acting = set(self.acting)
        for model, held in list(self.held.items()):
            state = LOADING if model in acting else self.states.get(model, UNAVAILABLE)
            if state not in (VERSION_READY, LOADING):
                state = UNAVAILABLE
            version = held.ready_version if state == VERSION_READY and held.ready_version else held.version
            copies[model] = Copy(
                state=state, version=version, attempt=held.attempt, error=held.error, memory=held.memory
            )
        for model, missing in list(self.missing.items()):
            if not missing.said:
                continue
            # A model held at another version keeps its copy (Triton still serves it); one not held
            # is reported UNAVAILABLE, as the operator counts a copy that is not there.
            wanted = missing.wanted
            had = copies.get(model) or Copy(state=UNAVAILABLE, version=wanted.version, attempt=wanted.attempt)
            copies[model] = replace(had, waiting=missing.said)
        return build_report(copies, pod=pod_name())

    def ready(self) -> Readiness:
        """Readiness (GET /v1/ready, the pod's readinessProbe). Not ready until the operator has written
        the pod's assignment and every model in it is settled, READY or its attempt failed, and each
        READY one is on its routes (labelled; the pod's first fill): a new pod must not count as Ready,
        for a rollout or a Deployment's surge, while it serves nothing of what it was given. From then
        on, ready while tritonserver is live and holds every model it had READY (a restarted
        tritonserver starts with none: not ready until the agent has loaded them again); a model
        loading later (a move, a new version) does not take the pod out, as the pod serves its other
        models meanwhile and the model's own route label waits for READY."""
        assignment = self.assignment
        if assignment is None or not self.written:
            return Readiness(False, self.message or "no assignment from the operator yet")
        if not self.agent.options.triton.live():
            return Readiness(False, "tritonserver does not answer")
        states = dict(self.states)
        if not self.filled:
            with self._turn:
                acting = set(self.acting)
            waiting = sorted(
                m
                for m in assignment.models
                if states.get(m) != VERSION_READY
                and (m in acting or m not in self.held or not self.held[m].error)
            )
            if waiting:
                return Readiness(False, f"loading its models: {', '.join(waiting)}", models=states)
            unrouted = self._unrouted(assignment, states)
            if unrouted:
                return Readiness(False, f"waiting for its route labels: {', '.join(unrouted)}", models=states)
            self.filled = True
        lost = sorted(
            m
            for m, held in list(self.held.items())
            if held.ready_version == held.version
            and not held.error
            and m in assignment.models
            and states.get(m) != VERSION_READY
        )
        if lost:
            return Readiness(
                False, f"tritonserver lost models it held READY: {', '.join(lost)}", models=states
            )
        return Readiness(True, "", models=states)


def parse_labels(text: str) -> dict[str, str]:
    """The downward API's labels file: one `key="value"` a line (the value quoted as Go quotes it)."""
    labels = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            labels[key.strip()] = value.strip().strip('"')
    return labels


def wait_loop(member: PoolMember, interval: float, stop: Any) -> None:
    """The sidecar's loop for a pooled pod: a pass every ``interval`` s until ``stop`` is set."""
    while not stop.is_set():
        try:
            member.tick()
        except Exception:  # a bug: said, and tried again next pass
            logger.exception("the pool agent's pass failed")
        stop.wait(interval)
