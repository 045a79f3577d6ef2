"""How many copies each pooled model wants from Triton's per-model figures, and the pods their sum needs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation

from triton_operator.core.pool.placement import PoolModel, placeable, pods_needed

ADD = "Busy"
"""A copy is added: busy for scaleUpStabilizationSeconds."""
BUSY_WAITING = "BusyWaiting"
"""Busy, but not for long enough yet: nothing changes (the hysteresis upwards)."""
DROP = "Idle"
"""A copy is dropped: idle for scaleDownStabilizationSeconds."""
IDLE_WAITING = "IdleWaiting"
"""Idle, but not for long enough yet: nothing changes (the hysteresis downwards)."""
HOLD = "Steady"
"""Neither busy nor idle."""
LEAST = "MinCopies"
"""Raised to its least copies, or it cannot drop below them."""
LOADING = "CopyLoading"
"""Busy, but a copy it wants is not READY yet: no other is added until it serves."""
MOST = "MaxCopies"
"""Busy, but at its most copies."""
MEMORY_SHORT = "MemoryShort"
"""Copies taken back because the pods cannot hold them: least recently used first."""
NO_READINGS = "NoReadings"
"""No figures over a window yet (Triton's metrics not read twice): nothing changes."""

LAST_USED_PRECISION_SECONDS = 300.0
"""status.pool's lastUsed is the start of the last period this long in which the model served a
request: precise enough to find the least recently used model when memory is short, and the status
is not written again for each window that saw a request (at most once a period)."""


def used_at(now: float) -> float:
    """When a model that served a request in the window at ``now`` was last used, as kept: the start
    of ``now``'s period (LAST_USED_PRECISION_SECONDS, on the epoch's boundaries)."""
    return now - now % LAST_USED_PRECISION_SECONDS


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
    """spec.pool.scaling as numbers: busy above ``busy_queue_us`` of queue time (or, when set, above
    ``busy_rate`` inferences per second per copy) for ``up_stabilization_s``: one more copy; idle below
    ``idle_rate`` per copy with one copy fewer for ``stabilization_s``: one copy less."""

    busy_queue_us: float = 10_000
    idle_rate: float = 1.0
    stabilization_s: float = 300
    busy_rate: float | None = None
    up_stabilization_s: float = 30


@dataclass(frozen=True)
class Figures:
    """One model's load over the window, all the pool's pods together (Triton's per-model counters'
    increases: reconcile.analysis reads them)."""

    inferences_per_second: float
    queue_us: float | None
    """Average queue time per request; None: no request in the window."""
    requests: float = 0.0
    """Requests in the window (any: the model was used in it)."""


@dataclass(frozen=True)
class ModelLoad:
    """One model's figures over the last window, from Triton's per-model metrics across its copies."""

    name: str
    copies: int
    """Copies READY and on its routes (those that served the window's requests)."""
    queue_us: float | None
    """Average queue time per request (Triton's nv_inference_queue_duration_us over its request count);
    None: no request in the window."""
    inferences_per_second: float
    """All its copies together."""
    loading: int = 0
    """Copies placed for it that are not READY yet (not counted in ``copies``)."""


@dataclass(frozen=True)
class Streak:
    """Since when a model has been busy or idle without a copy added or dropped (None: it is not)."""

    busy_since: float | None = None
    idle_since: float | None = None


@dataclass(frozen=True)
class CopiesDecision:
    """Each model's wanted copies, why (a reason and a sentence), and its streak to carry to the next call."""

    wanted: dict[str, int]
    reasons: dict[str, str]
    messages: dict[str, str]
    streaks: dict[str, Streak]


def _busy_why(load: ModelLoad, thresholds: Thresholds) -> str:
    """Which of spec.pool.scaling's thresholds makes it busy, as a phrase: the thresholds, not the
    figures, so the sentence in status changes only when the model's state does (the figures are the
    operator's metrics)."""
    if load.queue_us is not None and load.queue_us > thresholds.busy_queue_us:
        return f"over {thresholds.busy_queue_us / 1000:g} ms in the queue a request"
    return f"over {thresholds.busy_rate or 0:g} inferences/s a copy"


def _idle_why(thresholds: Thresholds) -> str:
    return f"under {thresholds.idle_rate:g} inferences/s a copy with one copy fewer"


def _limits(least: int, most: int | None, base: int) -> tuple[int, str | None]:
    if base < least:
        return least, LEAST
    if most is not None and base > most:
        return most, MOST
    return base, None


def decide_copies(
    loads: Sequence[ModelLoad],
    limits: Mapping[str, tuple[int, int | None]],
    thresholds: Thresholds,
    now: float,
    streaks: Mapping[str, Streak],
    *,
    current: Mapping[str, int] | None = None,
) -> CopiesDecision:
    """Each model's wanted copies from its figures: one more for a model busy for
    ``up_stabilization_s``, one fewer for a model idle for ``stabilization_s``, within its (least, most)
    of ``limits``; ``current`` the copies each wanted so far (status.pool's wantedCopies; default its
    READY and loading copies). ``streaks`` is what the previous call returned: a model counts as busy
    (idle) from the first call that found it so, each copy added (dropped) starts its wait again, and a
    call that finds it neither ends both. A model neither busy nor idle keeps its copies, so a load
    between the two thresholds moves nothing; a busy model whose wanted copies do not all serve yet
    gets no other (and its busy wait starts once they do): its queue is judged with them serving."""
    current = current or {}
    wanted: dict[str, int] = {}
    reasons: dict[str, str] = {}
    messages: dict[str, str] = {}
    out: dict[str, Streak] = {}
    for load in loads:
        name = load.name
        least, most = limits.get(name, (1, None))
        base, bound = _limits(least, most, current.get(name, load.copies + load.loading))
        per_copy = load.inferences_per_second / max(load.copies, 1)
        busy = (load.queue_us is not None and load.queue_us > thresholds.busy_queue_us) or (
            thresholds.busy_rate is not None and load.copies > 0 and per_copy > thresholds.busy_rate
        )
        idle = not busy and base > least and load.inferences_per_second / (base - 1) < thresholds.idle_rate
        streak = streaks.get(name, Streak())
        # The sentences name thresholds and waits, never the window's figures (the operator's metrics
        # have them): a pass whose figures moved and whose decision did not writes no status.
        why = _busy_why(load, thresholds) if busy else _idle_why(thresholds)
        if busy and most is not None and base >= most:
            wanted[name], reasons[name] = base, MOST
            messages[name] = f"busy ({why}) but at its maxCopies ({most})"
        elif busy and (load.loading > 0 or load.copies < base):
            wanted[name], reasons[name] = base, LOADING
            messages[name] = f"busy ({why}); waits for its {base} wanted copies to serve before another"
        elif busy:
            started = streak.busy_since if streak.busy_since is not None else now
            wait = thresholds.up_stabilization_s
            if now - started >= wait:
                wanted[name], reasons[name] = base + 1, ADD
                messages[name] = f"busy ({why}) for {wait:.0f}s: one more copy"
                out[name] = Streak(busy_since=now)
            else:
                wanted[name], reasons[name] = base, BUSY_WAITING
                messages[name] = f"busy ({why}): one more copy once busy for {wait:.0f}s"
                out[name] = Streak(busy_since=started)
        elif idle:
            started = streak.idle_since if streak.idle_since is not None else now
            wait = thresholds.stabilization_s
            if now - started >= wait:
                wanted[name], reasons[name] = base - 1, DROP
                messages[name] = f"idle ({why}) for {wait:.0f}s: one copy less"
                out[name] = Streak(idle_since=now)
            else:
                wanted[name], reasons[name] = base, IDLE_WAITING
                messages[name] = f"idle ({why}): one copy less once idle for {wait:.0f}s"
                out[name] = Streak(idle_since=started)
        elif bound is not None or (base == least and load.inferences_per_second < thresholds.idle_rate):
            wanted[name], reasons[name] = base, bound or LEAST
            messages[name] = f"held at its {'minCopies' if base == least else 'maxCopies'} ({base})"
        else:
            wanted[name], reasons[name] = base, HOLD
            messages[name] = "neither busy nor idle"
    return CopiesDecision(wanted, reasons, messages, out)


@dataclass(frozen=True)
class PoolSize:
    """The pods the wanted copies need, and the copies taken back to fit the most pods allowed."""

    pods: int
    wanted: dict[str, int]
    trimmed: tuple[str, ...]


def fit_pool(
    models: Sequence[PoolModel],
    budget: int,
    most_pods: int,
    rates: Mapping[str, float] | None = None,
) -> PoolSize:
    """The pool's size for these models' wanted copies (what the sum needs), at most ``most_pods``. When
    memory is short, copies beyond a model's least are taken back one at a time, from the least recently
    used model first (``last_used``; never used counts as oldest), until the rest fit. Models used as
    recently (``last_used`` is kept to LAST_USED_PRECISION_SECONDS, so the busy models of a period tie)
    give back first the copy that serves least: the lowest ``rates`` (inferences per second over the
    window, all copies together) per copy it would keep, then by name. Least copies are never taken back:
    when they alone need more pods, the size says so. A model larger than a pod (measured so) counts for
    no pod: it is never placed."""
    current = placeable(models, budget)
    rates = rates or {}
    trimmed: list[str] = []
    while pods_needed(current, budget) > most_pods:
        spare = [m for m in current if m.target > m.min_copies]
        if not spare:
            break
        victim = min(
            spare,
            key=lambda m: (
                m.last_used if m.last_used is not None else float("-inf"),
                rates.get(m.name, 0.0) / (m.target - 1),
                m.name,
            ),
        )
        trimmed.append(victim.name)
        current = [replace(m, wanted=m.target - 1) if m is victim else m for m in current]
    wanted = {m.name: m.target for m in models} | {m.name: m.target for m in current}
    return PoolSize(pods_needed(current, budget), wanted, tuple(trimmed))
