"""The pod's model agent, pure: which revision the pod serves, and the steps from the one it has to it.

``triton-operator agent`` (commands/agent.py, adapters/agent/) runs in each pod of a TritonService
whose spec says ``rollout.modelUpdates: InPlace``: it follows the in-place ConfigMap
``<deployment>-inplace`` the operator writes and the pod's annotation naming its target revision.
Everything it decides is here, with no I/O:

* ``resolve_target``: the revision the pod should serve, from its annotation (a downwardAPI file),
  the in-place ConfigMap's state.json and which revisions' files that ConfigMap holds;
* ``plan``: the steps from the revision the pod last applied (and any it was part way to) to that
  target, from core.rollout.rollout_kind.model_diff: the objects to fetch, the files and folders to delete,
  the config.pbtxt files to write, the models to load (an ensemble's steps before the ensemble) and the
  models to unload (an ensemble before its steps);
* ``Record``: what the agent keeps in its state folder (the revision applied, the one being applied,
  a failure), written only after the step it records;
* ``went_back``: a state.json older than one seen (the kubelet showing a lagging copy), not followed;
* ``model_states`` and ``Status``: Triton's per-model state of the target's versions, and the JSON
  the agent serves at GET :8009/v1/inplace;
* ``readiness``: the pod's readiness the agent serves at GET :8009/v1/ready (the pod's
  readinessProbe): every model of the revision it serves READY, and not out of its Service for a
  change;
* ``fill_order`` and ``next_load``: the first fill of a pod of the one shape (tritonserver started
  with no model): one sync of every model's files, each model's before the next's, and each model
  loaded as soon as its own bytes are in and, for an ensemble, its steps are loaded, while the rest
  download; ``model_part``: one model's part of a manifest (a pool member's sync of one model).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from triton_operator.core.objects.names import (
    INPLACE_MANIFEST_SUFFIX,
    inplace_config_key,
    inplace_manifest_key,
)
from triton_operator.core.repository.manifest import CONFIG_FILE, Manifest, ManifestEntry
from triton_operator.core.rollout.rollout_kind import ModelDiff, model_diff
from triton_operator.core.spec.field_error import ModelConfigError
from triton_operator.core.spec.modelconfig import parse_config_pbtxt
from triton_operator.core.vocabulary.triton_state import VERSION_READY, VERSION_UNAVAILABLE, ModelVersionState

APPLIED = "Applied"
APPLYING = "Applying"
DRAINING = "Draining"
FAILED = "Failed"

RECORD_FORMAT = 1


# ---------------------------------------------------------------- a revision's files


@dataclass(frozen=True)
class RevisionFiles:
    """What a pod needs of a revision: its pinned manifest and each model's rendered config.pbtxt."""

    revision: str
    manifest: Manifest
    configs: Mapping[str, str]

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(sorted(self.configs))


def revision_keys(revision: str, manifest: Manifest) -> tuple[str, ...]:
    """The in-place ConfigMap's keys that hold ``revision``: its manifest, then a config per model."""
    return (inplace_manifest_key(revision), *(inplace_config_key(revision, m.name) for m in manifest.models))


def revisions_named(keys: Iterable[str]) -> set[str]:
    """The revisions whose manifest key is among ``keys`` (a ConfigMap volume's file names)."""
    return {k[: -len(INPLACE_MANIFEST_SUFFIX)] for k in keys if k.endswith(INPLACE_MANIFEST_SUFFIX)}


# ---------------------------------------------------------------- which revision


@dataclass(frozen=True)
class InPlaceState:
    """The in-place ConfigMap's state.json: the revision every pod serves, and the one rolling out."""

    stable: str
    next: str | None = None


def parse_inplace_state(text: str | None) -> InPlaceState | None:
    """state.json's ``{"stable": rev, "next": rev | null}``; None when missing or not that shape.

    >>> parse_inplace_state('{"stable": "a1", "next": null}')
    InPlaceState(stable='a1', next=None)
    """
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, Mapping):
        return None
    stable, nxt = data.get("stable"), data.get("next")
    if not isinstance(stable, str) or not stable or not (nxt is None or isinstance(nxt, str)):
        return None
    return InPlaceState(stable, nxt or None)


def resolve_target(
    annotation: str | None, state: InPlaceState | None, present: Iterable[str], base: str
) -> str:
    """The revision the pod should serve.

    The pod's annotation when it names ``next`` or ``stable`` of state.json and that revision's files
    are ``present``; else ``stable`` (when its files are present or it is the base); else the base
    revision, whose files the pod's own config volume holds.

    >>> resolve_target("b2", InPlaceState("a1", "b2"), {"a1", "b2"}, "a1")
    'b2'
    >>> resolve_target("b2", InPlaceState("a1", None), {"a1", "b2"}, "a1")
    'a1'
    >>> resolve_target("", None, (), "a1")
    'a1'
    """
    have = set(present) | {base}
    wanted = (annotation or "").strip()
    if state is not None:
        if wanted and wanted in (state.next, state.stable) and wanted in have:
            return wanted
        if state.stable in have:
            return state.stable
    return base


def went_back(last: InPlaceState | None, seen: InPlaceState | None) -> bool:
    """Whether ``seen`` is an older state.json than ``last``, shown late by the kubelet: the operator
    only ever makes ``next`` the new ``stable`` (a rollout completed) and never names the old stable
    again with that revision as ``next`` (an undo is a new rollout: ``next`` is the older one), so
    ``{stable: S, next: N}`` after ``{stable: N}`` (or after ``{stable: N, next: M}``) is a lag, never
    an instruction. ``{stable: N, next: S}`` after ``{stable: S, next: N}`` is not: the rollout to N
    completed and its undo began between two refreshes of the pod's volume (the kubelet refreshes it
    on the pod's own change or its periodic sync, so a pod may skip ``{stable: N}``).

    >>> went_back(InPlaceState("n2"), InPlaceState("s1", "n2"))
    True
    >>> went_back(InPlaceState("s1", "n2"), InPlaceState("n2"))
    False
    >>> went_back(InPlaceState("n2"), InPlaceState("n2", "s1"))
    False
    >>> went_back(InPlaceState("s1", "n2"), InPlaceState("n2", "s1"))
    False
    """
    return (
        last is not None
        and seen is not None
        and seen.next is not None
        and seen.next == last.stable
        and seen.stable not in {last.stable, last.next}
    )


# ---------------------------------------------------------------- the steps


@dataclass(frozen=True)
class Steps:
    """From the revision a pod has to its target, in the order the agent takes them: fetch
    ``fetch`` (``bytes`` in all) and write ``configs``, delete ``delete`` (files) and
    ``delete_folders`` (removed models), then, the pod out of its Service, ``unload`` each model in
    that order (ensembles before their steps: every model changed or removed, and the ensembles over
    a changed step) and ``load`` each in that order (steps before their ensembles: every model
    changed or added, and those ensembles again). A model is never loaded over its loaded self:
    Triton documents what that keeps serving for POLL mode only."""

    fetch: tuple[ManifestEntry, ...] = ()
    delete: tuple[str, ...] = ()
    delete_folders: tuple[str, ...] = ()
    configs: tuple[tuple[str, str], ...] = ()
    """(path under /models, text) of each config.pbtxt the target changes or adds."""
    load: tuple[str, ...] = ()
    unload: tuple[str, ...] = ()

    @property
    def bytes(self) -> int:
        return sum(e.size for e in self.fetch)

    @property
    def touches_triton(self) -> bool:
        return bool(self.load or self.unload)


EMPTY_STEPS = Steps()


def ensemble_steps(config: str) -> tuple[str, ...]:
    """The models an ensemble's rendered config.pbtxt names as steps; () for any other model (or a
    config that does not parse: Triton says why when it loads it)."""
    try:
        message = parse_config_pbtxt(config)
    except ModelConfigError:
        return ()
    if message.platform != "ensemble":
        return ()
    return tuple(dict.fromkeys(str(step.model_name) for step in message.ensemble_scheduling.step))


def load_order(names: Iterable[str], configs: Mapping[str, str]) -> tuple[str, ...]:
    """``names`` with every ensemble after those of its steps that are among them (Triton loads an
    ensemble only once its steps are loaded); otherwise by name.

    >>> load_order(["b", "a"], {})
    ('a', 'b')
    """
    todo = sorted(set(names))
    deps = {n: {s for s in ensemble_steps(configs.get(n, "")) if s in todo and s != n} for n in todo}
    out: list[str] = []
    while todo:
        ready = [n for n in todo if not deps[n] - set(out)] or todo[:1]  # a cycle: Triton refuses it
        out.append(ready[0])
        todo.remove(ready[0])
    return tuple(out)


def _merge(diffs: Sequence[ModelDiff]) -> ModelDiff:
    fetch = {e.dest: e for d in diffs for e in d.objects_to_fetch}
    return ModelDiff(
        changed=tuple(sorted({n for d in diffs for n in d.changed})),
        added=tuple(sorted({n for d in diffs for n in d.added})),
        removed=tuple(sorted({n for d in diffs for n in d.removed})),
        objects_to_fetch=tuple(fetch[k] for k in sorted(fetch)),
        objects_to_remove=tuple(sorted({p for d in diffs for p in d.objects_to_remove})),
    )


def _nothing(revision: str, manifest: Manifest) -> RevisionFiles:
    return RevisionFiles(revision, Manifest(manifest.repository, (), (), pinned=manifest.pinned), {})


def plan(
    applied: RevisionFiles | None, target: RevisionFiles, *, partial: Sequence[RevisionFiles] = ()
) -> Steps:
    """The steps from ``applied`` (None: nothing yet) to ``target``.

    ``partial``: revisions the agent started to apply and did not finish (it was stopped, or a load
    failed): /models may hold some of their files and Triton some of their models, so what differs
    between each of them and the target is done as well. A model of the target loaded again that did
    not change is harmless: Triton serves the old copy until the new one is loaded."""
    start = applied if applied is not None else _nothing("", target.manifest)
    diff = _merge(
        [model_diff(r.manifest, r.configs, target.manifest, target.configs) for r in (start, *partial)]
    )
    keep = {e.dest for e in target.manifest.entries}
    written = set(diff.changed) | set(diff.added)
    every_config: dict[str, str] = {}
    for r in (*partial, start):
        every_config.update(r.configs)
    every_config.update(target.configs)
    gone = set(diff.changed) | set(diff.removed)
    over = {m for m in target.configs if m not in written and set(ensemble_steps(target.configs[m])) & gone}
    return Steps(
        fetch=diff.objects_to_fetch,
        delete=tuple(p for p in diff.objects_to_remove if p not in keep),
        delete_folders=diff.removed,
        configs=tuple((f"{m}/{CONFIG_FILE}", target.configs[m]) for m in sorted(written)),
        load=load_order(written | over, target.configs),
        unload=tuple(reversed(load_order(gone | over, every_config))),
    )


# ---------------------------------------------------------------- the agent's record


@dataclass(frozen=True)
class Record:
    """The agent's bookkeeping in its state folder.

    ``applied``: the revision whose files /models holds and whose models Triton serves, written only
    after every step succeeded. ``pending``: the revision the agent is applying, or whose apply
    ``failed`` (with the reason: Triton's message for a load). ``partial``: earlier revisions it left
    part way (stopped, failed, or the target changed before they were applied): /models may hold some
    of their files and Triton some of their models, until an apply succeeds. ``fetched_bytes``: bytes
    read from the store for the last change (over every try of it)."""

    applied: str | None = None
    pending: str | None = None
    partial: tuple[str, ...] = ()
    failed: str = ""
    fetched_bytes: int = 0
    updated_at: str = ""

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": RECORD_FORMAT,
                "applied": self.applied,
                "pending": self.pending,
                "partial": list(self.partial),
                "failed": self.failed,
                "fetchedBytes": self.fetched_bytes,
                "updatedAt": self.updated_at,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | None) -> Record:
        """A record read back; an empty one when missing or unreadable (the agent then starts over)."""
        try:
            data = json.loads(text or "")
        except ValueError:
            return cls()
        if not isinstance(data, Mapping) or data.get("format") != RECORD_FORMAT:
            return cls()

        def text_or_none(key: str) -> str | None:
            value = data.get(key)
            return value if isinstance(value, str) and value else None

        fetched = data.get("fetchedBytes")
        partial = data.get("partial")
        return cls(
            applied=text_or_none("applied"),
            pending=text_or_none("pending"),
            partial=tuple(p for p in partial if isinstance(p, str) and p)
            if isinstance(partial, list)
            else (),
            failed=str(data.get("failed") or ""),
            fetched_bytes=fetched if isinstance(fetched, int) and not isinstance(fetched, bool) else 0,
            updated_at=str(data.get("updatedAt") or ""),
        )

    def needs(self, target: str) -> bool:
        """Whether the agent has work to reach ``target``: not when it is applied and nothing is
        pending, and not when it is the target whose apply failed (no retry on its own)."""
        if self.pending is None:
            return self.applied != target or bool(self.partial)
        return not (self.pending == target and self.failed)

    def start(self, target: str, at: str) -> Record:
        """The record while ``target`` is applied: what was pending (or failed) joins ``partial``; the
        bytes fetched so far count on while the target stays the same."""
        left = [*self.partial, *([self.pending] if self.pending else [])]
        return Record(
            applied=self.applied,
            pending=target,
            partial=tuple(dict.fromkeys(r for r in left if r != target)),
            fetched_bytes=self.fetched_bytes if self.pending == target and not self.failed else 0,
            updated_at=at,
        )

    def fetched(self, n: int) -> Record:
        return dataclasses.replace(self, fetched_bytes=self.fetched_bytes + n)

    def fail(self, reason: str, at: str) -> Record:
        return dataclasses.replace(self, failed=reason or "failed", updated_at=at)

    def done(self, at: str) -> Record:
        """``pending`` applied: every partial revision undone with it."""
        return Record(applied=self.pending, fetched_bytes=self.fetched_bytes, updated_at=at)

    def revisions(self) -> set[str]:
        """Every revision the record names: the state folder keeps their files, and only theirs."""
        return {r for r in (self.applied, self.pending, *self.partial) if r}


# ---------------------------------------------------------------- status


def model_states(index: Sequence[ModelVersionState], target: RevisionFiles) -> dict[str, str]:
    """Triton's state of each model of ``target``: READY when every version the target pins is READY,
    else the state of the first that is not (UNAVAILABLE when Triton does not list it)."""
    by_model: dict[str, dict[str, str]] = {}
    for entry in index:
        by_model.setdefault(entry.model, {})[entry.version] = entry.state
    versions = {m.name: m.versions for m in target.manifest.models}
    out: dict[str, str] = {}
    for name in target.models:
        seen = by_model.get(name, {})
        wanted = versions.get(name) or ()
        if not wanted:
            out[name] = (
                VERSION_READY
                if VERSION_READY in seen.values()
                else next(iter(seen.values()), VERSION_UNAVAILABLE)
            )
            continue
        states = [seen.get(v, VERSION_UNAVAILABLE) for v in wanted]
        out[name] = next((s for s in states if s != VERSION_READY), VERSION_READY)
    return out


@dataclass(frozen=True)
class Status:
    """What the agent serves at GET :8009/v1/inplace, read by the operator to gate each step."""

    base: str
    revision: str | None
    target: str
    state: str
    message: str = ""
    models: Mapping[str, str] = field(default_factory=dict)
    fetched_bytes: int = 0
    updated_at: str = ""
    summary: str = ""
    """The first fill's summary, as `triton-operator sync` writes it (core.pod.startup.format_summary):
    in a pod of the one shape, where no init container leaves it as its termination message."""

    def to_json(self) -> dict[str, Any]:
        out = {
            "base": self.base,
            "revision": self.revision,
            "target": self.target,
            "state": self.state,
            "message": self.message,
            "models": dict(sorted(self.models.items())),
            "fetchedBytes": self.fetched_bytes,
            "updatedAt": self.updated_at,
        }
        return {**out, "summary": self.summary} if self.summary else out


def status_of(
    record: Record,
    base: str,
    target: str,
    models: Mapping[str, str],
    message: str = "",
    *,
    draining: bool = False,
) -> Status:
    """The status from the record: Failed with Triton's message while the failed revision is the
    target, Applied once the target is applied and nothing is pending, Draining while the pod is out
    of its Service for the loads (``draining``), else Applying."""
    if record.failed and record.pending == target:
        state, message = FAILED, record.failed
    elif record.pending is None and record.applied == target:
        state = APPLIED
    elif draining:
        state = DRAINING
    else:
        state = APPLYING
    return Status(
        base=base,
        revision=record.applied,
        target=target,
        state=state,
        message=message,
        models=models,
        fetched_bytes=record.fetched_bytes,
        updated_at=record.updated_at,
    )


# ---------------------------------------------------------------- readiness

PYTHON_BACKEND = "python"


def python_models(files: RevisionFiles) -> tuple[str, ...]:
    """The models of ``files`` that Triton's Python backend serves (each instance a stub process)."""
    out = []
    for name, text in files.configs.items():
        try:
            message = parse_config_pbtxt(text)
        except ModelConfigError:
            continue
        if message.backend == PYTHON_BACKEND:
            out.append(name)
    return tuple(sorted(out))


@dataclass(frozen=True)
class Readiness:
    """What the agent serves at GET :8009/v1/ready (the pod's readinessProbe): ready only when every
    model of the revision the pod serves is READY, and the pod is not out of its Service for a change."""

    ready: bool
    reason: str
    revision: str | None = None
    models: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "ready": self.ready,
            "reason": self.reason,
            "revision": self.revision,
            "models": dict(sorted(self.models.items())),
        }


def readiness(serving: RevisionFiles | None, models: Mapping[str, str], blocked: str = "") -> Readiness:
    """``serving``: the revision whose models Triton should serve now (None: none is whole);
    ``models``: each of its models' state as the agent checked it (READY or why not); ``blocked``: why
    the pod is out of its Service whatever its models say (draining for a change, a failed load).

    >>> from triton_operator.core.repository.manifest import StoreRef
    >>> files = RevisionFiles("r1", Manifest(StoreRef("s3://b/m"), (), ()), {"a": "", "b": ""})
    >>> readiness(files, {"a": "READY", "b": "READY"}).ready
    True
    >>> readiness(files, {"a": "READY", "b": "UNAVAILABLE"}).reason
    'revision r1: model b is UNAVAILABLE'
    >>> readiness(files, {"a": "READY", "b": "READY"}, "draining").reason
    'draining'
    """
    if blocked:
        return Readiness(False, blocked, serving.revision if serving else None, models)
    if serving is None:
        return Readiness(False, "no revision is applied whole yet", None, models)
    bad = [
        f"model {m} is {models.get(m) or VERSION_UNAVAILABLE}"
        for m in serving.models
        if models.get(m) != VERSION_READY
    ]
    if bad:
        return Readiness(False, f"revision {serving.revision}: {'; '.join(bad)}", serving.revision, models)
    return Readiness(True, f"every model of revision {serving.revision} is READY", serving.revision, models)


# ---------------------------------------------------------------- the first fill


def model_part(manifest: Manifest, model: str) -> Manifest:
    """The part of ``manifest`` that is ``model``'s: its entry and its objects (a sync of it places
    that model's folder only, and its config)."""
    return Manifest(
        manifest.repository,
        tuple(m for m in manifest.models if m.name == model),
        tuple(e for e in manifest.entries if e.dest.partition("/")[0] == model),
        pinned=manifest.pinned,
    )


FILL_DOWNLOAD_BYTES_PER_SECOND = 250 * 1024 * 1024
"""What fill_order takes a pod's download to run at: a cold pod's one sync of the real-size
repository, 2,551 MiB in about 10 s (docs/benchmarks.md, "Time to serve a real-size repository")."""
FILL_NODE_CACHE_BYTES_PER_SECOND = 1024 * 1024 * 1024
"""What fill_order takes a read from a warm node cache to run at: 2,551 MiB at 1.25 GiB/s, every byte
checked against the cache's signed BLAKE3 (docs/benchmarks.md, "A warm node with BLAKE3 statements")."""
FILL_LOADS = 2
"""How many models the first fill loads at once (each as soon as its bytes are in): tritonserver loads
models on threads of its own (``--model-load-thread-count``, 4 by default, as it loads a whole
repository at its start). One load at a time left a core idle while the others came in: a Python
model's load is mostly its stub's start on one core (1.4 to 2 s each for the real-size repository's
small models on this machine, docs/benchmarks.md, "Time to serve a real-size repository")."""
FILL_LOAD_SECONDS = 0.7
"""What it takes a model's load to cost apart from its bytes (Triton's load of a model, a Python
backend's stub start): 6 models loaded in about 4.1 s there, the bytes' checks a fraction of it."""
FILL_LOAD_BYTES_PER_SECOND = 1200 * 1024 * 1024
"""What it takes a load to read its bytes at: encoder checks its 500 MiB in about 0.4 s there."""


def fill_order(files: RevisionFiles, held: Iterable[str] = ()) -> tuple[str, ...]:
    """The order the first fill fetches models in (sync's model_order: each model's files before the
    next's), by Johnson's rule for two machines in a row, the download then the loads (one at a
    time): first the models whose download is shorter than their load, shortest download first (the
    small ones: loaded while the big ones download, and the loader is busy from the start), then the
    others, longest load first (what is left after the last byte is the load of a model whose
    download was longer than it). Each model's download and load are estimated from its bytes
    (FILL_DOWNLOAD_BYTES_PER_SECOND, FILL_LOAD_SECONDS, FILL_LOAD_BYTES_PER_SECOND); the bytes of
    the objects the node cache holds (``held``: their ``kind/checksum`` keys, as its lease answered)
    at FILL_NODE_CACHE_BYTES_PER_SECOND. Ties by name.

    >>> from triton_operator.core.repository.manifest import StoreRef
    >>> m = Manifest(
    ...     StoreRef("s3://b/m"),
    ...     (),
    ...     (
    ...         ManifestEntry("k", "big/1/w", 2 << 30, "md5", "x"),
    ...         ManifestEntry("k", "medium/1/w", 500 << 20, "md5", "x"),
    ...         ManifestEntry("k", "small/1/w", 1 << 20, "md5", "x"),
    ...     ),
    ... )
    >>> files = RevisionFiles("r1", m, {"small": "", "big": "", "medium": "", "ensemble": ""})
    >>> fill_order(files)
    ('ensemble', 'small', 'big', 'medium')
    >>> fill_order(files, {"md5/x"})  # every object in the node cache: each load outlasts its read
    ('ensemble', 'small', 'medium', 'big')
    """
    warm = frozenset(held)
    size = dict.fromkeys(files.models, 0)
    seconds = dict.fromkeys(files.models, 0.0)
    for entry in files.manifest.entries:
        model = entry.dest.partition("/")[0]
        if model in size:
            size[model] += entry.size
            rate = (
                FILL_NODE_CACHE_BYTES_PER_SECOND
                if f"{entry.checksum_kind}/{entry.checksum}" in warm
                else FILL_DOWNLOAD_BYTES_PER_SECOND
            )
            seconds[model] += entry.size / rate

    def download(model: str) -> float:
        return seconds[model]

    def load(model: str) -> float:
        return FILL_LOAD_SECONDS + size[model] / FILL_LOAD_BYTES_PER_SECOND

    first = sorted((m for m in size if download(m) < load(m)), key=lambda m: (download(m), m))
    last = sorted((m for m in size if download(m) >= load(m)), key=lambda m: (-load(m), m))
    return (*first, *last)


def next_load(
    files: RevisionFiles, placed: Iterable[str], loaded: Iterable[str], tried: Iterable[str] = ()
) -> str | None:
    """The next model the first fill loads: one whose bytes are ``placed``, not ``loaded`` or
    ``tried`` yet, and whose ensemble steps (those of the revision) are loaded; in load_order. None
    while there is none.

    >>> from triton_operator.core.repository.manifest import StoreRef
    >>> files = RevisionFiles("r1", Manifest(StoreRef("s3://b/m"), (), ()), {"a": "", "b": ""})
    >>> next_load(files, {"b"}, ()), next_load(files, {"a", "b"}, {"a"}), next_load(files, {"a"}, {"a"})
    ('b', 'b', None)
    """
    have, done, skip = set(placed), set(loaded), set(tried)
    for model in load_order(files.models, files.configs):
        if model in done or model in skip or model not in have:
            continue
        steps = {s for s in ensemble_steps(files.configs.get(model, "")) if s in files.configs and s != model}
        if steps <= done:
            return model
    return None
