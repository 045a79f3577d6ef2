"""The pod side of a pool, pure: the annotation naming a pod's models, and what its agent reports back.

The operator writes, on each pod of a pool, the annotation ``pool.triton-operator.io/models`` (JSON):

    {"models": {"<model>": {"version": "<version>", "attempt": <n>, "measured": true}, ...},
     "draining": {"<model>": <unix seconds its label came off>, ...},
     "failed": {"<model>": {"version": "...", "attempt": <n>, "retryAt": <unix seconds>,
                            "reason": "...", "message": "..."}, ...},
     "services": {"<model>": "<the ClusterIP of the model's own Service>", ...}}

``models`` is the agent's: the models the pod holds and, per model, the version (an opaque token: the
model's files and config as the operator names them) and the load attempt. The agent loads a model
when its entry appears or its version or attempt changes, unloads one when its entry goes, and never
retries a failed load by itself: the operator asks again by raising ``attempt``. ``measured`` (absent:
false) says status.pool already keeps the memory measured at the model's load: the agent may then load
it alongside another model (it loads a model that is still to be measured alone). ``draining`` and
``failed`` are the operator's own bookkeeping (kept on the pod so a restarted operator resumes); the
agent ignores them. ``services`` names, for each model the pod holds whose per-model Service has its
address yet, that address: a pod that leaves keeps serving while such a Service is answered by this pod
alone (``served_here``, `triton-operator leave`), as the kubelet no longer refreshes a terminating pod's
downwardAPI files (the last addresses written stand).

The agent reports each model it holds, loads or failed to load (GET :8009/v1/pool), as
``parse_report`` reads it:

    {"models": {"<model>": {"state": "READY|LOADING|UNAVAILABLE", "version": "<version>",
                            "attempt": <n>, "error": "<why attempt n failed, else empty>",
                            "memory": <bytes measured at its load, absent when not measured>,
                            "waiting": "<what its load waits for, absent when nothing>"}, ...},
     "pod": "<the pod's name>"}

``state`` and ``version`` are what Triton's repository index says (the version READY, or the one
loading or unavailable); a failed reload of a model that was READY leaves it READY at its old version
(Triton keeps serving it) with ``error`` set for the attempt. ``memory`` is the memory the model took at
its load, in the kind its instances take (core.pool.gpu_memory.measured_kinds: host memory on the CPU,
the pod's GPUs' memory on the GPU, both added up for groups of each kind), and only at a load no other
load overlapped, so that the growth the agent sees is that model's. ``waiting`` says what an entry's
load waits for once it has waited a few seconds: its revision's files, which the agent finds neither in
the in-place volume nor in its own copy (a model not held is then reported ``UNAVAILABLE`` at the
entry's version and attempt, as a copy that is not there counts); a report without it (an older agent)
reads as waiting for nothing.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from triton_operator import GROUP

ASSIGNMENT_ANNOTATION = f"pool.{GROUP}/models"
"""On each pod of a pool: which models it holds, at which version and attempt (the agent reads it)."""
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
"""On each pod of a pool: the ReplicaSet removes the pods of lowest cost first when the pool gets
smaller (its HPA, `kubectl scale`): a pod's cost is the copies it is given (deletion_cost)."""


class AssignmentError(ValueError):
    """An annotation or an agent's report that is not what this contract says; names the field."""


@dataclass(frozen=True)
class Wanted:
    """A model the pod is to hold: its version and the load attempt (raised to ask for a retry);
    ``revision``: the revision whose files and config hold that version (None: the pod's own; another
    while a change moves in place, which the pod reads from its in-place volume)."""

    version: str
    attempt: int = 1
    revision: str | None = None
    measured: bool = False
    """Whether the operator already keeps the memory measured at the model's load (status.pool): the
    agent need not measure it again, so it may load it together with other models."""


@dataclass(frozen=True)
class FailedLoad:
    """A load that failed: the version and attempt, when to try again, and Triton's reason."""

    version: str
    attempt: int
    retry_at: float
    reason: str
    message: str = ""


@dataclass(frozen=True)
class PodAssignment:
    """The annotation's content: the agent's ``models``, and the operator's ``draining`` and ``failed``."""

    models: Mapping[str, Wanted] = field(default_factory=dict)
    draining: Mapping[str, float] = field(default_factory=dict)
    failed: Mapping[str, FailedLoad] = field(default_factory=dict)
    services: Mapping[str, str] = field(default_factory=dict)
    """The ClusterIP of each held model's own Service (what a leaving pod asks, served_here)."""


def deletion_cost(assignment: PodAssignment) -> str:
    """A pool pod's deletion cost: how many copies its assignment gives it (what removing it would
    load elsewhere)."""
    return str(len(assignment.models))


@dataclass(frozen=True)
class Copy:
    """One model on one pod as its agent reports it (Triton's state and version, the last attempt)."""

    state: str
    version: str
    attempt: int = 1
    error: str = ""
    memory: int | None = None
    """Bytes the copy took at its load, as the agent measured them (None: not measured)."""
    waiting: str = ""
    """What the agent waits for before it can load the entry (its revision's files it has not found
    after a few seconds, and where it looks); empty: nothing (an older agent never says)."""


def build_assignment(assignment: PodAssignment) -> str:
    """The annotation's value: compact JSON with sorted keys (an unchanged assignment is an unchanged
    string, so writing it again patches nothing)."""
    body: dict[str, Any] = {
        "models": {
            m: {"version": w.version, "attempt": w.attempt}
            | ({"revision": w.revision} if w.revision else {})
            | ({"measured": True} if w.measured else {})
            for m, w in assignment.models.items()
        }
    }
    if assignment.draining:
        body["draining"] = dict(assignment.draining)
    if assignment.failed:
        body["failed"] = {
            m: {"version": f.version, "attempt": f.attempt, "retryAt": f.retry_at, "reason": f.reason}
            | ({"message": f.message} if f.message else {})
            for m, f in assignment.failed.items()
        }
    if assignment.services:
        body["services"] = dict(assignment.services)
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise AssignmentError(f"{where}: expected an object, not {type(value).__name__}")
    return value


def _field(entry: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = entry.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise AssignmentError(
            f"{where}.{key}: expected {getattr(kind, '__name__', 'a number')}, not {value!r}"
        )
    return value


def _attempt(entry: Mapping[str, Any], where: str) -> int:
    attempt = _field(entry, "attempt", int, where)
    if attempt < 1:
        raise AssignmentError(f"{where}.attempt: must be 1 or more, not {attempt}")
    return int(attempt)


def _revision(entry: Mapping[str, Any], where: str) -> str | None:
    if entry.get("revision") is None:
        return None
    revision = _field(entry, "revision", str, where)
    if not revision:
        raise AssignmentError(f"{where}.revision: must not be empty")
    return str(revision)


def _measured(entry: Mapping[str, Any], where: str) -> bool:
    value = entry.get("measured", False)
    if not isinstance(value, bool):
        raise AssignmentError(f"{where}.measured: expected true or false, not {value!r}")
    return value


def _json(text: str | None, where: str) -> Mapping[str, Any]:
    if not text:
        return {}
    try:
        return _object(json.loads(text), where)
    except json.JSONDecodeError as exc:
        raise AssignmentError(f"{where}: not JSON ({exc.msg} at {exc.pos})") from None


def parse_assignment(text: str | None) -> PodAssignment:
    """The annotation read back (None or empty: a pod that holds nothing yet); AssignmentError names the
    field that is wrong."""
    where = ASSIGNMENT_ANNOTATION
    body = _json(text, where)
    models = {
        str(name): Wanted(
            version=_field(_object(e, f"{where}.models.{name}"), "version", str, f"{where}.models.{name}"),
            attempt=_attempt(e, f"{where}.models.{name}"),
            revision=_revision(e, f"{where}.models.{name}"),
            measured=_measured(e, f"{where}.models.{name}"),
        )
        for name, e in _object(body.get("models", {}), f"{where}.models").items()
    }
    draining = {
        str(name): float(_field({"at": at}, "at", (int, float), f"{where}.draining.{name}"))
        for name, at in _object(body.get("draining", {}), f"{where}.draining").items()
    }
    failed = {}
    for name, value in _object(body.get("failed", {}), f"{where}.failed").items():
        at = f"{where}.failed.{name}"
        entry = _object(value, at)
        failed[str(name)] = FailedLoad(
            version=_field(entry, "version", str, at),
            attempt=_attempt(entry, at),
            retry_at=float(_field(entry, "retryAt", (int, float), at)),
            reason=_field(entry, "reason", str, at),
            message=str(entry.get("message") or ""),
        )
    services = {}
    for name, value in _object(body.get("services", {}), f"{where}.services").items():
        address = _field({"address": value}, "address", str, f"{where}.services.{name}")
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise AssignmentError(f"{where}.services.{name}: not an IP address: {address!r}") from None
        services[str(name)] = address
    return PodAssignment(models=models, draining=draining, failed=failed, services=services)


def build_report(copies: Mapping[str, Copy], pod: str | None = None) -> dict[str, Any]:
    """The agent's report (what it serves at GET :8009/v1/pool) from its models' copies, and the pod's
    name (which pod answered, when asked through a model's Service)."""
    return {
        "models": {
            m: {"state": c.state, "version": c.version, "attempt": c.attempt, "error": c.error}
            | ({"memory": c.memory} if c.memory is not None else {})
            | ({"waiting": c.waiting} if c.waiting else {})
            for m, c in copies.items()
        }
    } | ({"pod": pod} if pod else {})


def report_pod(payload: Any) -> str | None:
    """The pod that answered a report (None: a report without one, or no report)."""
    pod = payload.get("pod") if isinstance(payload, Mapping) else None
    return pod if isinstance(pod, str) and pod else None


def served_here(
    assignment: PodAssignment,
    copies: Mapping[str, Copy],
    answered_by: Mapping[str, str | None],
    pod: str,
) -> list[str]:
    """The models a leaving pod still serves alone: each it holds READY (``copies``, its agent's report)
    whose Service (``assignment.services``) was answered by ``pod`` itself (``answered_by``: who answered
    each Service asked; None: nobody, or not a report). kube-proxy sends a Service's requests to a
    terminating pod only while the Service has no other ready endpoint: another pod answering, or none,
    says the pod is no longer what serves the model. A model without an address is not waited on."""
    return sorted(
        m
        for m, c in copies.items()
        if c.state == "READY" and m in assignment.services and answered_by.get(m) == pod
    )


def parse_report(payload: Any) -> dict[str, Copy]:
    """An agent's report read by the operator; AssignmentError names the field that is wrong."""
    where = "the agent's /v1/pool report"
    models = _object(_object(payload, where).get("models", {}), f"{where}: models")
    copies = {}
    for name, value in models.items():
        at = f"{where}: models.{name}"
        entry = _object(value, at)
        memory = None if entry.get("memory") is None else _field(entry, "memory", int, at)
        if memory is not None and memory < 0:
            raise AssignmentError(f"{at}.memory: must be 0 or more, not {memory}")
        copies[str(name)] = Copy(
            state=_field(entry, "state", str, at),
            version=_field(entry, "version", str, at),
            attempt=_attempt(entry, at),
            error=str(entry.get("error") or ""),
            memory=memory,
            waiting=str(entry.get("waiting") or ""),
        )
    return copies
