"""status.pool from a placement, and the memory measured at each model's first load read back from it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from triton_operator.core.pool.assignment import Copy
from triton_operator.core.pool.placement import BUDGET_FULL, TOO_FEW_PODS, Placement, PoolModel
from triton_operator.core.vocabulary.triton_state import VERSION_READY
from triton_operator.models import Endpoints, PoolModelStatus, PoolStatus
from triton_operator.quantities import quantity_bytes

_BINARY = (("Gi", 30), ("Mi", 20), ("Ki", 10))


def as_quantity(size: int) -> str:
    """Bytes as the shortest exact Kubernetes quantity: 104857600 -> "100Mi", 1000 -> "1000"."""
    for suffix, shift in _BINARY:
        if size and size % (1 << shift) == 0:
            return f"{size >> shift}{suffix}"
    return str(size)


def measured_memory(status: PoolStatus | None) -> dict[str, int]:
    """Each model's memory measured at its first load, as status.pool keeps it (bytes); a value that is
    not a quantity of bytes is left out (the declared memory is used then)."""
    found: dict[str, int] = {}
    for model in status.models if status is not None else []:
        if model.measured_memory:
            try:
                found[model.name] = quantity_bytes(model.measured_memory)
            except ValueError:
                continue
    return found


MIB = 1 << 20
MEASURED_CHANGE = 0.1
"""How much a new measurement must differ from the kept one (a fraction of it) to replace it."""


def update_measured(
    kept: Mapping[str, int],
    reports: Mapping[str, Mapping[str, Copy]],
    models: Sequence[str],
) -> dict[str, int]:
    """Each model's measured memory after the agents' latest reports: the largest figure a READY copy of
    it reports, rounded up to a MiB; it replaces the kept one only when the two differ by more than
    MEASURED_CHANGE of the kept one (status.pool does not churn with each load's noise); a model no
    agent measured keeps its figure. Only the ``models`` given (the spec's) are kept."""
    seen: dict[str, int] = {}
    for copies in reports.values():
        for model, copy in copies.items():
            if copy.memory is not None and copy.state == VERSION_READY:
                seen[model] = max(seen.get(model, 0), -(-copy.memory // MIB) * MIB)
    out: dict[str, int] = {}
    for model in models:
        old, new = kept.get(model), seen.get(model)
        if new is not None and (old is None or abs(new - old) > old * MEASURED_CHANGE):
            out[model] = new
        elif old is not None:
            out[model] = old
    return out


def waiting_for(placed: Placement, waiting: Mapping[str, str]) -> Placement:
    """``placed`` with, for each model short of copies for want of a pod (BudgetFull, TooFewPods), the
    pool's pods that are not running yet named in its message (``waiting``: pod -> why, e.g. Pending and
    the scheduler's message): placement gives such a pod nothing (it could load nothing), so the copies
    it would hold wait for it, and the user learns which pod to look at."""
    if not waiting:
        return placed
    pods = "; ".join(f"{pod} is {why}" for pod, why in sorted(waiting.items()))
    note = f"waiting for the pool's pods that do not run yet, given copies once they run: {pods}"
    short = (BUDGET_FULL, TOO_FEW_PODS)
    return _told(placed, {name: [note] for name, entry in placed.models.items() if entry.reason in short})


def _told(placed: Placement, said: Mapping[str, Sequence[str]]) -> Placement:
    """``placed`` with what is ``said`` of a model added to its message."""
    if not said:
        return placed
    models = {
        name: replace(entry, message=f"{entry.message}; {'; '.join(said[name])}") if name in said else entry
        for name, entry in placed.models.items()
    }
    return replace(placed, models=models)


def agents_waiting(placed: Placement, reports: Mapping[str, Mapping[str, Copy]]) -> Placement:
    """``placed`` with, for each model a pod's agent says its load waits for something (a copy's
    ``waiting``: its revision's files not found, core.pool.assignment), that pod and what it waits for
    named in its message: a copy that never loads is otherwise only a copy short."""
    said: dict[str, list[str]] = {}
    for pod, copies in sorted(reports.items()):
        for model, copy in copies.items():
            if copy.waiting:
                said.setdefault(model, []).append(f"pod {pod} {copy.waiting}")
    return _told(placed, said)


def room_waits(placed: Placement, room: Sequence[tuple[str, str, Sequence[str]]]) -> Placement:
    """``placed`` with, for each model whose copy a pod is not given yet for want of room (a pod loads a
    copy only with the room beside what it still holds, core.pool.moves), that pod and the copies it
    must unload first named in its message: the copy is placed, but not loading."""
    said: dict[str, list[str]] = {}
    for pod, model, leaving in room:
        first = f" to unload {', '.join(leaving)} first" if leaving else ""
        said.setdefault(model, []).append(f"pod {pod} waits for room{first}")
    return _told(placed, said)


@dataclass(frozen=True)
class LoadShown:
    """Why a model's load asks for its wanted copies, as status.pool shows it (times already formatted;
    the window's figures are not status: the operator's metrics have them)."""

    reason: str
    message: str
    busy_since: str | None = None
    idle_since: str | None = None
    last_used: str | None = None


def pool_status(
    placed: Placement,
    models: Sequence[PoolModel],
    measured: Mapping[str, int],
    pods_needed: int | None = None,
    *,
    ready: Mapping[str, int] | None = None,
    endpoints: Mapping[str, Endpoints] | None = None,
    load: Mapping[str, LoadShown] | None = None,
) -> PoolStatus:
    """status.pool: per model (in the spec's order) its pods, copies, the copies it aims at, the memory
    placement counted and the measured one, and why it has no more copies, in a word and a sentence;
    with ``ready`` the copies READY and on its routes, with ``endpoints`` its own Service's addresses
    (``core/objects/model_routes.py``'s ``model_endpoints``), which clients read; with ``load`` why its
    load asks for its wanted copies and its waits."""
    load = load or {}
    return PoolStatus(
        pods_needed=pods_needed,
        models=[
            PoolModelStatus(
                name=model.name,
                pods=list(placed.models[model.name].pods),
                copies=placed.models[model.name].copies,
                wanted_copies=placed.models[model.name].target,
                memory=as_quantity(model.memory),
                measured_memory=as_quantity(measured[model.name]) if model.name in measured else None,
                reason=placed.models[model.name].reason,
                message=placed.models[model.name].message,
                ready_copies=ready.get(model.name, 0) if ready is not None else None,
                endpoints=(endpoints or {}).get(model.name),
                **_load_fields(load.get(model.name)),
            )
            for model in models
        ],
    )


def _load_fields(shown: LoadShown | None) -> dict[str, Any]:
    if shown is None:
        return {}
    return {
        "copies_reason": shown.reason,
        "copies_message": shown.message,
        "busy_since": shown.busy_since,
        "idle_since": shown.idle_since,
        "last_used": shown.last_used,
    }
