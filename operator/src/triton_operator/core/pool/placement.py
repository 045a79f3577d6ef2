"""Which pods of a pool hold which models: stable bin-packing by memory, copies spread over pods and nodes."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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
        self.nodes = {p.name: p.node if p.node is not None else f"pod/{p.name}" for p in pods}

    def clone(self) -> _Bins:
        copy = _Bins((), self.models)
        copy.pods, copy.nodes = self.pods, self.nodes
        copy.held = {pod: set(held) for pod, held in self.held.items()}
        copy.free = dict(self.free)
        copy.where = {name: set(pods) for name, pods in self.where.items()}
        return copy

    def node(self, pod: str) -> str:
        return self.nodes[pod]

    def add(self, pod: str, model: str) -> None:
        self.held[pod].add(model)
        self.free[pod] -= self.models[model].memory
        self.where[model].add(pod)

    def remove(self, pod: str, model: str) -> None:
        self.held[pod].discard(model)
        self.free[pod] += self.models[model].memory
        self.where[model].discard(pod)

    def copies_by_node(self, model: str) -> dict[str, int]:
        nodes: dict[str, int] = {}
        for pod in self.where[model]:
            nodes[self.node(pod)] = nodes.get(self.node(pod), 0) + 1
        return nodes

    def best_pod(self, model: str, *, roomiest: bool = False) -> str | None:
        """The pod for one more copy: not holding it, with the memory; fewest copies on its node, then the
        tightest fit (best fit keeps room whole elsewhere; ``roomiest``: the most room left, to spread),
        then by name (deterministic)."""
        memory = self.models[model].memory
        nodes = self.copies_by_node(model)
        best: tuple[int, int, str] | None = None
        for pod, free in self.free.items():
            if free < memory or model in self.held[pod]:
                continue
            key = (nodes.get(self.node(pod), 0), memory - free if roomiest else free - memory, pod)
            if best is None or key < best:
                best = key
        return best[2] if best is not None else None

    def copies(self) -> int:
        return sum(len(pods) for pods in self.where.values())

    def unmet(self) -> int:
        """The least copies not placed."""
        return sum(max(0, m.min_copies - len(self.where[name])) for name, m in self.models.items())


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


def _rounds(bins: _Bins, order: Sequence[PoolModel]) -> None:
    """The rule alone: _fill, in rounds of one copy of each model, best fit."""
    _fill(bins, order)


def _copies_spread_first(bins: _Bins, order: Sequence[PoolModel]) -> None:
    """The models wanting several copies first, in rounds, each copy on the pod with the most room left
    (their copies find distinct pods before the others fill them), then _fill."""
    lacking = [m for m in order if m.target > 1 and len(bins.where[m.name]) < m.target]
    while lacking:
        still = []
        for model in lacking:
            pod = bins.best_pod(model.name, roomiest=True)
            if pod is None:
                continue
            bins.add(pod, model.name)
            if len(bins.where[model.name]) < model.target:
                still.append(model)
        lacking = still
    _fill(bins, order)


def _largest_totals_first(bins: _Bins, order: Sequence[PoolModel]) -> None:
    """All the copies of one model together, the models with the most memory in all (copies x memory)
    first, best fit (first fit decreasing by a model's total), then _fill."""
    for model in sorted(order, key=lambda m: (-m.memory * m.target, -m.memory, m.name)):
        while len(bins.where[model.name]) < model.target:
            pod = bins.best_pod(model.name)
            if pod is None:
                break
            bins.add(pod, model.name)
    _fill(bins, order)


_STRATEGIES: tuple[Callable[[_Bins, Sequence[PoolModel]], None], ...] = (
    _rounds,
    _copies_spread_first,
    _largest_totals_first,
)
"""The orders placement tries from the same start; the first is the rule alone, and each ends with _fill,
so each result is a fixpoint of _fill (nothing more fits anywhere)."""


def _portfolio(start: _Bins, order: Sequence[PoolModel]) -> list[_Bins]:
    """Each strategy's result from ``start`` (left as it is)."""
    results = []
    for strategy in _STRATEGIES:
        bins = start.clone()
        strategy(bins, order)
        results.append(bins)
        if all(len(bins.where[m.name]) >= m.target for m in order):
            break  # every copy placed: no other order does better, and the first wins a tie
    return results


def _as_good(bins: _Bins, than: _Bins) -> bool:
    """No more least copies unplaced and no fewer copies placed."""
    return bins.unmet() <= than.unmet() and bins.copies() >= than.copies()


def _best(results: Sequence[_Bins], floor: _Bins) -> _Bins | None:
    """Of the results as good as ``floor``, the one with the fewest least copies unplaced, then the most
    copies, then the first (the rule alone wins a tie)."""
    good = [(bins.unmet(), -bins.copies(), i) for i, bins in enumerate(results) if _as_good(bins, floor)]
    return results[min(good)[2]] if good else None


def _choose(
    pods: Sequence[PoolPod],
    by_name: Mapping[str, PoolModel],
    order: Sequence[PoolModel],
    current: Mapping[str, Sequence[str]],
) -> _Bins:
    """The strategies' best result from the kept copies; from nothing instead only when that places more
    least copies. Never worse than the rule alone (the first strategy with its own fallback to a placement
    from nothing) on least copies unplaced or on copies placed."""
    start = _Bins(pods, by_name)
    _keep(start, current)
    kept = _portfolio(start, order)
    fresh: list[_Bins] = []
    if current and kept[0].unmet():
        fresh = _portfolio(_Bins(pods, by_name), order)
    floor = fresh[0] if fresh and fresh[0].unmet() < kept[0].unmet() else kept[0]
    best_kept, best_fresh = _best(kept, floor), _best(fresh, floor)
    if best_fresh is not None and (best_kept is None or best_fresh.unmet() < best_kept.unmet()):
        return best_fresh
    # floor is one of kept or fresh and as good as itself: one of the two is found.
    return best_kept if best_kept is not None else floor


def _spread_loads(bins: _Bins, order: Sequence[PoolModel], before: set[tuple[str, str]]) -> None:
    """Spread the copies this pass gives (not in ``before``) over the pods: an agent loads at most two
    models at once, so a pod given several loads answers its last ones after the others. A new copy moves
    from a pod with the most loads to one with at least two fewer that holds something already (an empty
    pod's room stays whole, as best fit left it), with the memory, not holding the model, on a node with
    no more copies of it than its own; the fewest loads first, then the node with fewest copies of it,
    then best fit. Kept copies never move, and a move that would let more be placed (placing again would
    change it) is not made: the copies placed stay as they are."""
    new = {pod: {m for m in held if (pod, m) not in before} for pod, held in bins.held.items()}
    lacking = any(len(bins.where[m.name]) < m.target for m in order)
    refused: set[tuple[str, str, str]] = set()
    while True:
        move = None
        for pod in sorted(new, key=lambda p: (-len(new[p]), p)):
            loads = len(new[pod])
            if loads < 2:
                break
            options = []
            for model in new[pod]:
                memory = bins.models[model].memory
                nodes = bins.copies_by_node(model)
                own = nodes[bins.node(pod)] - 1
                for other, free in bins.free.items():
                    if (
                        len(new[other]) > loads - 2
                        or not bins.held[other]
                        or free < memory
                        or model in bins.held[other]
                        or (pod, model, other) in refused
                    ):
                        continue
                    there = nodes.get(bins.node(other), 0) - (bins.node(other) == bins.node(pod))
                    if there > own:
                        continue
                    options.append((len(new[other]), there, free - memory, other, model))
            if options:
                best = min(options)
                move = (pod, best[4], best[3])
                break
        if move is None:
            return
        pod, model, other = move
        bins.remove(pod, model)
        bins.add(other, model)
        if lacking:
            trial = bins.clone()
            _fill(trial, order)
            if trial.held != bins.held:
                bins.remove(other, model)
                bins.add(pod, model)
                refused.add(move)
                continue
        new[pod].discard(model)
        new[other].add(model)


def _by_name(models: Sequence[PoolModel]) -> dict[str, PoolModel]:
    by_name = {m.name: m for m in models}
    if len(by_name) != len(models):
        raise ValueError("model names must be unique")
    return by_name


def _order(models: Sequence[PoolModel]) -> list[PoolModel]:
    """The models with the most copies first (their copies spread before the pods fill), then the largest."""
    return sorted(models, key=lambda m: (-m.target, -m.memory, m.name))


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

    Stable: what is still valid stays where it is, then the rest is placed: in rounds of one copy of each
    model (the models with most copies first, then the largest), each on the pod that fits it tightest,
    on the node with fewest copies of it; a least copy without room takes it from copies beyond other
    models' least, the least recently used first. From the same kept copies two other orders are tried
    (the models wanting several copies first, each copy on the pod with most room; all of a model's
    copies together, the largest totals first) and the one placing the fewest least copies short, then
    the most copies, is kept (the rounds win a tie): never worse than the rounds alone. Only when least
    copies would stay unplaced although a placement from nothing places more of them is everything
    placed again. Last, this pass's new copies are spread over the pods (fewest loads a pod), where that
    changes nothing else. Deterministic: the same input gives the same output, and placing again from
    the result moves nothing."""
    by_name, order = _by_name(models), _order(models)
    bins = _choose(pods, by_name, order, current or {})
    before = {(pod, model) for pod, held in (current or {}).items() for model in held}
    _spread_loads(bins, order, before)
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
    """The fewest pods of ``budget`` bytes on which placement's rounds (the rule without the other
    orders ``place`` tries) put every model's target copies (each copy on a pod of its own): the pool's
    size, with the room a placement that keeps its copies where they are needs; ``place`` may fit them on
    fewer. Searched from the lower bound (the memory of all copies, the most copies of one model) up.
    Raises ValueError when a model is larger than the budget (``placeable`` leaves those out)."""
    for model in models:
        if model.memory > budget:
            raise ValueError(f"model {model.name!r} needs {model.memory} bytes, more than a pod's {budget}")
    if not models:
        return 0
    by_name, order = _by_name(models), _order(models)

    def enough(count: int) -> bool:
        # The rounds alone: a pool's placement keeps its copies where they are and adds the rest, so it
        # does not reach what the other orders reach from nothing; sized for them, a pool grown copy by
        # copy left copies without room (bench/pool/demo.py: a hot model's fourth copy BudgetFull on the
        # 5 pods they need, where the rounds ask for 6).
        bins = _Bins([PoolPod(f"{i:06d}", None, budget) for i in range(count)], by_name)
        _rounds(bins, order)
        return all(len(bins.where[m.name]) >= m.target for m in models)

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
