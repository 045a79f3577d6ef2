"""How many copies each pooled model wants from Triton's per-model figures, and the pods their sum needs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation

from triton_operator.core.pool.placement import PoolModel, pods_needed

ADD = "Busy"
"""A copy is added: requests wait longer than busyQueueMicroseconds."""
DROP = "Idle"
"""A copy is dropped: idle for scaleDownStabilizationSeconds."""
IDLE_WAITING = "IdleWaiting"
"""Idle, but not for long enough yet: nothing changes (the hysteresis)."""
HOLD = "Steady"
"""Neither busy nor idle."""
LEAST = "MinCopies"
"""Raised to its least copies, or it cannot drop below them."""
LOADING = "CopyLoading"
"""Busy, but a copy placed for it is not READY yet: no other is added until it serves."""
MOST = "MaxCopies"
"""Busy, but at its most copies."""
MEMORY_SHORT = "MemoryShort"
"""Copies taken back because the pods cannot hold them: least recently used first."""

_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12}


def rate(text: str) -> Decimal:
    """A Kubernetes quantity as a decimal number ("500m" -> 0.5, "2k" -> 2000); ValueError otherwise."""
    number, suffix = text, ""
    if text and text[-1] in _SUFFIXES:
        number, suffix = text[:-1], text[-1]
    try:
        value = Decimal(number)
    except InvalidOperation:
        raise ValueError(f"{text!r} is not a number such as 2, 0.5 or 500m") from None
    if not value.is_finite() or value < 0:
        raise ValueError(f"{text!r} is not a number such as 2, 0.5 or 500m")
    return value.scaleb(_SUFFIXES[suffix])


@dataclass(frozen=True)
class Thresholds:
    """spec.pool.scaling as numbers: add above ``busy_queue_us``, drop below ``idle_rate`` per copy after
    ``stabilization_s`` seconds idle."""

    busy_queue_us: float = 10_000
    idle_rate: float = 1.0
    stabilization_s: float = 300


@dataclass(frozen=True)
class ModelLoad:
    """One model's figures over the last window, from Triton's per-model metrics across its copies."""

    name: str
    copies: int
    queue_us: float | None
    """Average queue time per request (Triton's nv_inference_queue_duration_us over its request count);
    None: no request in the window."""
    inferences_per_second: float
    loading: int = 0
    """Copies placed for it that are not READY yet (not counted in ``copies``)."""


@dataclass(frozen=True)
class CopiesDecision:
    """Each model's wanted copies and why, when each model's idleness began (to carry to the next call)."""

    wanted: dict[str, int]
    reasons: dict[str, str]
    idle_since: dict[str, float]


def decide_copies(
    loads: Sequence[ModelLoad],
    limits: Mapping[str, tuple[int, int | None]],
    thresholds: Thresholds,
    now: float,
    idle_since: Mapping[str, float],
) -> CopiesDecision:
    """One more copy for a busy model, one fewer for a model idle for long enough, within its
    (least, most) of ``limits``. ``idle_since`` is what the previous call returned: a model counts as
    idle from the first call that found it idle, and a drop starts its wait again. A model neither busy
    nor idle keeps its copies, so a load between the two thresholds moves nothing (the hysteresis); a
    busy model whose new copy is still loading gets no other until that one serves."""
    wanted: dict[str, int] = {}
    reasons: dict[str, str] = {}
    since: dict[str, float] = {}
    for load in loads:
        least, most = limits.get(load.name, (1, None))
        copies = load.copies
        busy = load.queue_us is not None and load.queue_us > thresholds.busy_queue_us
        idle = (
            not busy and copies > least and load.inferences_per_second / (copies - 1) < thresholds.idle_rate
        )
        if copies < least:
            wanted[load.name], reasons[load.name] = least, LEAST
        elif busy and load.loading > 0:
            wanted[load.name], reasons[load.name] = copies + load.loading, LOADING
        elif busy:
            if most is not None and copies >= most:
                wanted[load.name], reasons[load.name] = most, MOST
            else:
                wanted[load.name], reasons[load.name] = copies + 1, ADD
        elif idle:
            started = idle_since.get(load.name, now)
            if now - started >= thresholds.stabilization_s:
                wanted[load.name], reasons[load.name] = copies - 1, DROP
                since[load.name] = now
            else:
                wanted[load.name], reasons[load.name] = copies, IDLE_WAITING
                since[load.name] = started
        elif most is not None and copies > most:
            wanted[load.name], reasons[load.name] = most, MOST
        else:
            wanted[load.name], reasons[load.name] = copies, HOLD
    return CopiesDecision(wanted, reasons, since)


@dataclass(frozen=True)
class PoolSize:
    """The pods the wanted copies need, and the copies taken back to fit the most pods allowed."""

    pods: int
    wanted: dict[str, int]
    trimmed: tuple[str, ...]


def fit_pool(models: Sequence[PoolModel], budget: int, most_pods: int) -> PoolSize:
    """The pool's size for these models' wanted copies (what the sum needs), at most ``most_pods``. When
    memory is short, copies beyond a model's least are taken back one at a time, from the least recently
    used model first (``last_used``; never used counts as oldest), until the rest fit. Least copies are
    never taken back: when they alone need more pods, the size says so."""
    current = list(models)
    trimmed: list[str] = []
    while pods_needed(current, budget) > most_pods:
        spare = [m for m in current if m.target > m.min_copies]
        if not spare:
            break
        victim = min(
            spare,
            key=lambda m: (m.last_used if m.last_used is not None else float("-inf"), m.name),
        )
        trimmed.append(victim.name)
        current = [replace(m, wanted=m.target - 1) if m is victim else m for m in current]
    return PoolSize(pods_needed(current, budget), {m.name: m.target for m in current}, tuple(trimmed))
