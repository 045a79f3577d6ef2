"""The agent's work: resolve the pod's target revision, sync it into /models, load it through Triton."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from triton_operator.adapters.agent.files import (
    InPlaceDir,
    StateDir,
    present_revisions,
    read_target,
    remove_model_files,
)
from triton_operator.adapters.agent.triton import LoadFailed, ModelControl, TritonUnreachable
from triton_operator.adapters.nodecache.client import NodeCacheClient
from triton_operator.adapters.storage import open_store
from triton_operator.adapters.storage.base import StoreError
from triton_operator.adapters.sync.engine import SyncOptions, sync
from triton_operator.adapters.sync.progress import Progress, silent
from triton_operator.adapters.sync.results import SyncError, SyncStats, human
from triton_operator.core.agent import (
    Record,
    RevisionFiles,
    Steps,
    model_states,
    plan,
    resolve_target,
    status_of,
)
from triton_operator.core.field_error import ModelConfigError
from triton_operator.core.manifest import ManifestError, SelectionFailed
from triton_operator.core.rollout.clock import format_time

logger = logging.getLogger("triton_operator.agent")

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
    """How long the init container waits at its end for its uploads to the node cache (the sidecar
    does not wait: its uploads finish while Triton loads)."""


def now() -> str:
    return format_time(datetime.now(UTC))


def failure_text(exc: BaseException) -> str:
    if isinstance(exc, OSError) and not isinstance(exc, StoreError) and exc.strerror:
        return f"{exc.filename or ''}: {exc.strerror}".lstrip(": ")
    return str(exc) or type(exc).__name__


class Agent:
    """One pod's agent. ``once`` is the init container: the target synced into /models as
    `triton-operator sync` would, and recorded. ``tick`` is one pass of the sidecar: when the target
    differs from what is applied, the steps of core.agent.plan (sync of the target, which fetches only
    what changed and skips what its state file knows unchanged; removed models deleted; loads and
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
        self._status: dict[str, Any] = self._status_now()

    # -------------------------------------------------------- the target

    def resolve(self) -> RevisionFiles:
        """The files of the revision the pod should serve now (core.agent.resolve_target)."""
        state = self.inplace.state()
        named = {r for r in ((state.stable, state.next) if state else ()) if r}
        present = present_revisions(self.inplace, named)
        self.inplace.forget_others(named)
        base = self.options.base
        target = resolve_target(read_target(self.options.target_file), state, present, base.revision)
        files = self.inplace.revision(target) if target in present else None
        return files if files is not None else base

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
        self._status = self._status_now()

    def apply(self, target: RevisionFiles) -> None:
        self.message = ""
        record = self._begin(target)
        steps = self._steps(record, target)
        if self._synced != target.revision:
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
                self._fail(record, failure_text(exc))
                return
            record = record.fetched(stats.downloaded_bytes)
            self._write(record)
            remove_model_files(self.options.dest, steps.delete, steps.delete_folders)
            self._synced = target.revision
        if steps.touches_triton and not self._triton(record, steps, target):
            return
        self.message = ""
        self._refresh_models(target)  # the status says Applied with Triton's state after the loads
        self._write(record.done(now()))
        self._synced = None
        logger.info("applied revision %s (%s fetched)", target.revision, human(record.fetched_bytes))

    def _triton(self, record: Record, steps: Steps, target: RevisionFiles) -> bool:
        """The loads and unloads; False when they did not all succeed (the record says why, or the
        message says what the agent waits for)."""
        triton = self.options.triton
        if not triton.live():
            self.message = f"waiting for tritonserver at {triton.url} to load {', '.join(steps.load)}"
            self._status = self._status_now()
            return False
        try:
            for model in steps.load:
                logger.info("loading model %s", model)
                triton.load(model)
            for model in steps.unload:
                logger.info("unloading model %s", model)
                triton.unload(model)
        except LoadFailed as exc:
            self._refresh_models(target)
            self._fail(record, str(exc))
            return False
        except TritonUnreachable as exc:
            self.message = f"tritonserver did not answer, trying again: {exc}"
            return False
        return True

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
        """core.agent.plan from the saved files of the revisions the record names (read once a
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
        self, target: RevisionFiles, progress: Progress | None, *, wait_uploads: bool = False
    ) -> SyncStats:
        """Sync ``target`` into /models: from the node cache first when there is one, then the store.
        ``wait_uploads``: wait for the uploads to the node cache (the init container, whose exit would
        cut them); else they finish in the background."""
        o = self.options
        store = None
        node_cache = None
        if target.manifest.pinned and o.node_cache:
            node_cache = NodeCacheClient(o.node_cache, o.node_cache_pod)
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
            )
            stats = sync(target.manifest, store, options, progress or silent())
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
                else:
                    threading.Thread(
                        target=node_cache.close,
                        args=(o.node_cache_upload_seconds,),
                        name="node-cache-uploads",
                        daemon=True,
                    ).start()

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
        return status_of(
            self.record, self.options.base.revision, self.target, self.models, self.message
        ).to_json()

    def status(self) -> dict[str, Any]:
        """The last status (GET /v1/inplace): a snapshot the loop replaces, never one being built."""
        return self._status
