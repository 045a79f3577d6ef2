"""Which pods of a pool hold which models: stable bin-packing by memory, copies spread over pods and nodes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

WANTED = "Wanted"
"""The model has the copies its load asks for."""
MAX_COPIES = "MaxCopies"
"""Its load asks for more, but it has its maxCopies."""
TOO_FEW_PODS = "TooFewPods"
"""It would have more copies, but every pod already holds one (copies go on distinct pods)."""
BUDGET_FULL = "BudgetFull"
"""It would have more copies, but no pod without it has the memory left."""
LARGER_THAN_POD = "LargerThanPod"
"""One copy needs more memory than a pod's whole budget (measured larger than declared): never placed."""


@dataclass(frozen=True)
class PoolPod:
    """One pod of the pool: its name, the node it runs on (None: not scheduled yet) and its memory budget;
    ``reserved``: memory it holds outside placement (a copy of a model larger than a pod, which stays
    on its routes until it goes), not given to other models."""

    name: str
    node: str | None
    budget: int
    reserved: int = 0

    @property
    def room(self) -> int:
        """The memory placement may give to models on it."""
        return max(0, self.budget - self.reserved)


@dataclass(frozen=True)
class PoolModel:
    """One model to place: the memory one copy holds, its least and most copies, the copies its load wants.

    ``wanted`` is clamped to [min_copies, max_copies]; ``last_used`` (seconds, any clock; None: never)
    orders which copies go first when memory is short: the least recently used, beyond its least copies.
    """

    name: str
    memory: int
    min_copies: int = 1
    max_copies: int | None = None
    wanted: int = 1
    last_used: float | None = None

    @property
    def target(self) -> int:
        """The copies the model aims at: wanted within its least and most."""
        most = self.max_copies if self.max_copies is not None else max(self.wanted, self.min_copies)
        return max(self.min_copies, min(self.wanted, most))


@dataclass(frozen=True)
class ModelPlacement:
    """Where one model is, how many copies it aims at, and why it has no more (a reason and a sentence)."""

    name: str
    pods: tuple[str, ...]
    target: int
    reason: str
    message: str

    @property
    def copies(self) -> int:
        return len(self.pods)


@dataclass(frozen=True)
class Placement:
    """The outcome: each pod's models, each model's placement, and the loads and unloads it takes to get
    there from the current placement (pairs of pod and model)."""

    pods: dict[str, tuple[str, ...]]
    models: dict[str, ModelPlacement]
    loads: tuple[tuple[str, str], ...] = field(default=())
    unloads: tuple[tuple[str, str], ...] = field(default=())

    def least_unmet(self, models: Sequence[PoolModel]) -> list[str]:
        """The models with fewer copies than their least, in the order given."""
        return [m.name for m in models if self.models[m.name].copies < m.min_copies]


class _Bins:
    """The working state: each pod's models and free memory, each model's pods and nodes."""

    def __init__(self, pods: Sequence[PoolPod], models: Mapping[str, PoolModel]) -> None:
        self.pods = {p.name: p for p in pods}
        self.models = models
        self.held: dict[str, set[str]] = {p.name: set() for p in pods}
        self.free: dict[str, int] = {p.name: p.room for p in pods}
        self.where: dict[str, set[str]] = {name: set() for name in models}

    def node(self, pod: str) -> str:
        node = self.pods[pod].node
        return node if node is not None else f"pod/{pod}"

    def add(self, pod: str, model: str) -> None:
        self.held[pod].add(model)
        self.free[pod] -= self.models[model].memory
        self.where[model].add(pod)

    def remove(self, pod: str, model: str) -> None:
        self.held[pod].discard(model)
        self.free[pod] += self.models[model].memory
        self.where[model].discard(pod)

    def best_pod(self, model: str) -> str | None:
        """The pod for one more copy: not holding it, with the memory; fewest copies on its node, then the
        tightest fit (best fit keeps room whole elsewhere), then by name (deterministic)."""
        memory = self.models[model].memory
        nodes: dict[str, int] = {}
        for pod in self.where[model]:
            nodes[self.node(pod)] = nodes.get(self.node(pod), 0) + 1
        best: tuple[int, int, str] | None = None
        for pod, free in self.free.items():
            if free < memory or model in self.held[pod]:
                continue
            key = (nodes.get(self.node(pod), 0), free - memory, pod)
            if best is None or key < best:
                best = key
        return best[2] if best is not None else None


def _eviction_key(model: PoolModel, copies: int) -> tuple[int, float, str]:
    """Which copy goes first: one beyond the least copies, then the least recently used, then by name."""
    beyond = 0 if copies > model.min_copies else 1
    return (beyond, model.last_used if model.last_used is not None else float("-inf"), model.name)


def _keep(bins: _Bins, current: Mapping[str, Sequence[str]]) -> None:
    """Keep the current assignments that are still valid: known pods and models, within each model's
    target copies and each pod's budget."""
    for pod in sorted(current):
        if pod not in bins.held:
            continue
        for model in sorted(set(current[pod])):
            # A model larger than a pod is kept nowhere (its memory there is the pod's ``reserved``).
            if model in bins.models and bins.models[model].memory <= bins.pods[pod].budget:
                bins.add(pod, model)
    # Copies beyond a model's target go: first from the nodes holding most of its copies, then from the
    # fullest pods.
    for name, entry in bins.models.items():
        while len(bins.where[name]) > entry.target:
            counts: dict[str, int] = {}
            for held in bins.where[name]:
                counts[bins.node(held)] = counts.get(bins.node(held), 0) + 1
            drop = min(bins.where[name], key=lambda p: (-counts[bins.node(p)], bins.free[p], p))
            bins.remove(drop, name)
    # A pod over its budget (it shrank, or a model was measured larger) sheds copies, the first to go
    # first (_eviction_key).
    for pod in sorted(bins.held):
        while bins.free[pod] < 0:
            drop = min(bins.held[pod], key=lambda m: _eviction_key(bins.models[m], len(bins.where[m])))
            bins.remove(pod, drop)


def _make_room(bins: _Bins, model: str) -> str | None:
    """A pod for a least copy of ``model`` made by unloading copies beyond other models' least, the least
    recently used first; None when no pod can be freed that way (nothing is unloaded then)."""
    memory = bins.models[model].memory
    for pod in sorted(bins.held, key=lambda p: (-bins.free[p], p)):
        if model in bins.held[pod] or bins.pods[pod].room < memory:
            continue
        spare = sorted(
            (m for m in bins.held[pod] if len(bins.where[m]) > bins.models[m].min_copies),
            key=lambda m: _eviction_key(bins.models[m], len(bins.where[m])),
        )
        free, victims = bins.free[pod], []
        for victim in spare:
            if free >= memory:
                break
            victims.append(victim)
            free += bins.models[victim].memory
        if free >= memory:
            for victim in victims:
                bins.remove(pod, victim)
            return pod
    return None


def _fill(bins: _Bins, order: Sequence[PoolModel]) -> None:
    """Place the rest in rounds of one copy of each model (in ``order``) until each has its target or
    nothing more fits. A least copy that finds no room takes it from copies beyond other models' least
    (_make_room); as that frees room, the rounds run again, until a run changes nothing: the result is a
    fixpoint, so placing again from it moves nothing."""
    while True:
        changed = False
        lacking = [m for m in order if len(bins.where[m.name]) < m.target]
        while lacking:
            still = []
            for model in lacking:
                pod = bins.best_pod(model.name)
                if pod is None and len(bins.where[model.name]) < model.min_copies:
                    pod = _make_room(bins, model.name)
                if pod is None:
                    continue
                bins.add(pod, model.name)
                changed = True
                if len(bins.where[model.name]) < model.target:
                    still.append(model)
            lacking = still
        if not changed:
            return


def _explain(bins: _Bins, model: PoolModel) -> ModelPlacement:
    pods = tuple(sorted(bins.where[model.name]))
    copies, target = len(pods), model.target
    largest = max((p.budget for p in bins.pods.values()), default=0)
    if bins.pods and model.memory > largest:
        reason = LARGER_THAN_POD
        message = (
            f"one copy needs {model.memory} bytes (the larger of its declared memory and the memory"
            f" measured at its load), more than a pod's {largest}: it cannot be placed; raise"
            " spec.pool.memoryPerPod or lower the model's memory"
        )
    elif copies >= target:
        if model.max_copies is not None and copies >= model.max_copies and model.wanted > model.max_copies:
            reason, message = MAX_COPIES, f"{copies} copies, its maxCopies; its load asks for {model.wanted}"
        else:
            reason, message = WANTED, f"{copies} copies, as its load asks"
    elif target > len(bins.pods):
        reason = TOO_FEW_PODS
        message = (
            f"{copies} of {target} copies: the pool has {len(bins.pods)} pods,"
            " and a copy needs a pod of its own"
        )
    else:
        reason = BUDGET_FULL
        message = f"{copies} of {target} copies: no other pod has {model.memory} bytes of its budget left"
    return ModelPlacement(model.name, pods, target, reason, message)


def place(
    pods: Sequence[PoolPod],
    models: Sequence[PoolModel],
    current: Mapping[str, Sequence[str]] | None = None,
) -> Placement:
    """Place ``models`` on ``pods``, starting from ``current`` (pod name -> its models).

    Stable: what is still valid stays where it is, then the rest is placed in rounds of one copy of each
    model (the models with most copies first, then the largest: first fit decreasing), each on the pod
    that fits it tightest, on the node with fewest copies of it; a least copy without room takes it from
    copies beyond other models' least, the least recently used first. Only when least copies would stay
    unplaced although a placement from nothing places them all is everything placed again.
    Deterministic: the same input gives the same output."""
    by_name = {m.name: m for m in models}
    if len(by_name) != len(models):
        raise ValueError("model names must be unique")
    # The models with the most copies first (their copies spread before the pods fill), then the largest.
    order = sorted(models, key=lambda m: (-m.target, -m.memory, m.name))
    bins = _Bins(pods, by_name)
    _keep(bins, current or {})
    _fill(bins, order)
    if current and any(len(bins.where[m.name]) < m.min_copies for m in models):
        fresh = _Bins(pods, by_name)
        _fill(fresh, order)
        unmet = sum(max(0, m.min_copies - len(bins.where[m.name])) for m in models)
        if sum(max(0, m.min_copies - len(fresh.where[m.name])) for m in models) < unmet:
            bins = fresh
    before = {(pod, model) for pod, held in (current or {}).items() for model in held}
    after = {(pod, model) for pod, held in bins.held.items() for model in held}
    return Placement(
        pods={pod: tuple(sorted(held)) for pod, held in bins.held.items()},
        models={m.name: _explain(bins, m) for m in models},
        loads=tuple(sorted(after - before)),
        unloads=tuple(sorted(before - after)),
    )


def placeable(models: Sequence[PoolModel], budget: int) -> list[PoolModel]:
    """The models one copy of which fits a pod of ``budget`` bytes (the others are never placed: their
    status says LARGER_THAN_POD)."""
    return [m for m in models if m.memory <= budget]


def pods_needed(models: Sequence[PoolModel], budget: int) -> int:
    """The fewest pods of ``budget`` bytes on which ``place`` puts every model's target copies (each copy
    on a pod of its own), searched from the lower bound (the memory of all copies, the most copies of one
    model) up. Raises ValueError when a model is larger than the budget (``placeable`` leaves those out)."""
    for model in models:
        if model.memory > budget:
            raise ValueError(f"model {model.name!r} needs {model.memory} bytes, more than a pod's {budget}")
    if not models:
        return 0

    def enough(count: int) -> bool:
        placed = place([PoolPod(f"{i:06d}", None, budget) for i in range(count)], models)
        return all(placed.models[m.name].copies >= m.target for m in models)

    total = sum(m.memory * m.target for m in models)
    low = max(-(-total // budget), *(m.target for m in models))
    # With as many pods as copies every copy finds an empty pod: that many is always enough.
    high, step = low, 1
    while not enough(high):
        low, high, step = high + 1, min(high + step, sum(m.target for m in models)), step * 2
    while low < high:
        middle = (low + high) // 2
        if enough(middle):
            high = middle
        else:
            low = middle + 1
    return high
