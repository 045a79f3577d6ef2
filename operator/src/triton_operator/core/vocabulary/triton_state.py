"""Pure per-model state from Triton's own view: repository index readings and exit logs to status.models."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from triton_operator.models import ModelStatus, RevisionModelState, TritonService, VersionState

# Where it comes from:
#   * a running pod: Triton's repository index (POST /v2/repository/index on the HTTP port), one
#     entry per model version it knows: {"name", "version", "state", "reason"}; state READY,
#     UNAVAILABLE, LOADING, UNLOADING.
#   * a pod whose tritonserver exited (a model failed to load: tritonserver exits, the pod
#     crash-loops): the tail of its log, which Kubernetes keeps as the container's termination
#     message (terminationMessagePolicy FallbackToLogsOnError). Triton logs there, e.g.
#       E1123 07:28:08.350882 1 model_lifecycle.cc:642] "failed to load 'bad' version 1: Internal: ..."
# Per revision, the pods' views are merged: a version is READY only when every pod that reported it
# says so; otherwise the worst state seen, with the reason of the pod that gave it.

# Triton's model version states (not condition types: core.vocabulary.conditions.READY is the Ready
# condition).
VERSION_READY = "READY"
VERSION_UNAVAILABLE = "UNAVAILABLE"
_RANK = {VERSION_READY: 0, "LOADING": 1, "UNLOADING": 2, VERSION_UNAVAILABLE: 3}
REASON_MAX = 300
"""Triton's reasons can carry a Python traceback: the status keeps the first line, this long at most."""

_LOAD_FAILED = (
    re.compile(r"failed to load '(?P<model>[^']+)' version (?P<version>\d+): (?P<reason>.*)"),
    # tritonserver's last line when it exits for it (the log tail Kubernetes keeps is 2 KiB: this
    # line is often the only one of them left in it)
    re.compile(
        r"load failed for model '(?P<model>[^']+)': version (?P<version>\d+) is at UNAVAILABLE state: "
        r"(?P<reason>.*)"
    ),
)


@dataclasses.dataclass(frozen=True)
class ModelVersionState:
    """One model version as Triton reports it."""

    model: str
    version: str
    state: str
    reason: str = ""


def short_reason(reason: str) -> str:
    """The first line of a Triton reason (escaped newlines included), bounded to REASON_MAX."""
    first = reason.replace("\\n", "\n").strip().split("\n", 1)[0].strip().rstrip('"')
    return first if len(first) <= REASON_MAX else first[: REASON_MAX - 3] + "..."


def parse_index(payload: Any) -> tuple[ModelVersionState, ...]:
    """Triton's repository index (the JSON body of POST /v2/repository/index) as version states.

    >>> parse_index([{"name": "m", "version": "1", "state": "READY"}, {"name": "n"}])
    (ModelVersionState(model='m', version='1', state='READY', reason=''),)
    """
    out = []
    for entry in payload if isinstance(payload, list) else []:
        if not isinstance(entry, Mapping) or not entry.get("name") or not entry.get("version"):
            continue  # a model Triton knows of but has not tried to load (no version yet)
        out.append(
            ModelVersionState(
                model=str(entry["name"]),
                version=str(entry["version"]),
                state=str(entry.get("state") or VERSION_UNAVAILABLE),
                reason=short_reason(str(entry.get("reason") or "")),
            )
        )
    return tuple(out)


def load_failures(log: str | None) -> tuple[ModelVersionState, ...]:
    """The model versions Triton says failed to load, from the tail of its log.

    >>> log = 'E1123 lifecycle.cc:642] "failed to load \\'add\\' version 2: Internal: boom\\\\n\\\\nAt:"'
    >>> load_failures(log)
    (ModelVersionState(model='add', version='2', state='UNAVAILABLE', reason='Internal: boom'),)
    >>> load_failures("error: creating server: Invalid argument - load failed for model 'add': version 2 "
    ...               "is at UNAVAILABLE state: Internal: RuntimeError: boom at import")[0].reason
    'Internal: RuntimeError: boom at import'

    """
    out: dict[tuple[str, str], ModelVersionState] = {}
    for line in (log or "").splitlines():
        for pattern in _LOAD_FAILED:
            match = pattern.search(line)
            if match:
                key = (match["model"], match["version"])
                out[key] = ModelVersionState(
                    key[0], key[1], VERSION_UNAVAILABLE, short_reason(match["reason"])
                )
    return tuple(out.values())


def merge(views: Iterable[Sequence[ModelVersionState]]) -> dict[str, list[ModelVersionState]]:
    """The pods' views of one revision merged, by model: per version the worst state seen."""
    worst: dict[tuple[str, str], ModelVersionState] = {}
    for view in views:
        for entry in view:
            key = (entry.model, entry.version)
            seen = worst.get(key)
            if seen is None or _RANK.get(entry.state, 3) > _RANK.get(seen.state, 3):
                worst[key] = entry
    out: dict[str, list[ModelVersionState]] = {}
    for (model, _version), entry in sorted(worst.items(), key=lambda kv: (kv[0][0], _version_key(kv[0][1]))):
        out.setdefault(model, []).append(entry)
    return out


def _version_key(version: str) -> tuple[int, str]:
    return (int(version), "") if version.isdigit() else (0, version)


def _side(revision: str, versions: Sequence[ModelVersionState]) -> RevisionModelState:
    return RevisionModelState(
        revision=revision,
        versions=[VersionState(version=v.version, state=v.state, reason=v.reason or None) for v in versions],
    )


def model_statuses(
    ts: TritonService,
    *,
    stable: str | None,
    canary: str | None,
    views: Mapping[str, Mapping[str, list[ModelVersionState]]],
) -> list[dict[str, Any]]:
    """status.models: per model of the spec, the versions its versionPolicy pins, and Triton's own
    view of the serving (stable) revision and of a canary while one runs (``views``: `merge`d per
    revision; a side with no reading is left out). ``ready`` is build_status's to set."""
    out: list[dict[str, Any]] = []
    for model in ts.spec.models:
        policy = model.config.get("versionPolicy") or {}
        specific = policy.get("specific") if isinstance(policy, dict) else None
        versions = specific.get("versions") if isinstance(specific, dict) else None
        sides: dict[str, RevisionModelState] = {}
        for key, revision in (("serving", stable), ("canary", canary)):
            seen = views.get(revision or "", {}).get(model.name)
            if revision and seen:
                sides[key] = _side(revision, seen)
        entry = ModelStatus(name=model.name, versions=[str(v) for v in versions or []], **sides)
        out.append(entry.model_dump(by_alias=True, exclude_unset=True, exclude_none=True, mode="json"))
    return out


def failed_versions(views: Mapping[str, list[ModelVersionState]]) -> list[ModelVersionState]:
    """Every version of a revision that Triton reports UNAVAILABLE with a reason."""
    return [v for versions in views.values() for v in versions if v.state == VERSION_UNAVAILABLE and v.reason]


def describe_failures(failures: Sequence[ModelVersionState]) -> str:
    """Triton's reasons in one line: `model 'm' version 2: reason; ...`."""
    return "; ".join(f"model {f.model!r} version {f.version}: {f.reason}" for f in failures)


def index_json(payload: bytes) -> Any:
    """The index's JSON body; None when it is not JSON."""
    try:
        return json.loads(payload)
    except ValueError:
        return None
