"""The pool's moves, pure: per pod the next safe label, load and unload steps, so no request fails.

From the placement the pool wants (each pod's models), each model's version, and what each pod has
(its assignment annotation, what its agent reports and which models it is labelled ready for),
``plan_moves`` gives each pod its next assignment and its label changes. A model moves as:

1. load on the new pod (its entry in the pod's assignment; the agent loads it), once the pod has the
   room: what it still holds (the copies its agent reports loaded or loading, and its entries not yet
   unloaded, those draining included) and the new copy within its budget, so a copy placed in the room
   of one leaving waits for that one's unload;
2. wait until the agent reports it READY at the wanted version;
3. label the pod ready for it (the model's Service and routes take it in, once the pod is Ready);
4. only then take the label off the copy placement no longer wants, once every copy it wants answers
   (READY, labelled, on a Ready pod);
5. wait a drain (the readiness probe's period x failures + drainSeconds, as an in-place update does);
6. unload it (its entry leaves the assignment).

The last READY copy of a model the spec still has is never taken off its routes, and a model is never
unloaded while labelled. A new version moves the same way on the pods that hold the model, one pod at a
time (taken off, drained, reloaded, READY, labelled again) while another copy answers; a model with one
copy is reloaded in place, Triton serving the old version until the new one is READY. Other models are
not touched. A failed load is reported per model (reason, message) and asked again by a higher
``attempt`` after core/edges/backoff.py's delay.

A pod holds no more than its budget, not even for the moment a copy moves: placement gives the room of
a copy it no longer wants at once, but the pod gets the new copy only once the old one is unloaded
(placement's figures: the larger of declared and measured memory). The one exception ends a circle of
such waits, which nothing else ends (_deadlocked).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from triton_operator.core.edges.backoff import Backoff, Random
from triton_operator.core.pool.assignment import Copy, FailedLoad, PodAssignment, Wanted
from triton_operator.core.vocabulary.triton_state import VERSION_READY, short_reason

LOADING = "LOADING"


@dataclass(frozen=True)
class PodState:
    """What one pod has: its assignment annotation, its agent's report, the models labelled ready on it,
    and whether the pod is Ready (an endpoint of its Services: a label on a pod not Ready routes
    nothing yet)."""

    assignment: PodAssignment = field(default_factory=PodAssignment)
    copies: Mapping[str, Copy] = field(default_factory=dict)
    routed: frozenset[str] = frozenset()
    ready: bool = True
    reported: bool = True
    """Whether its agent has reported at all (``copies`` is then what it holds)."""

    @property
    def unknown(self) -> bool:
        """Holding or routing models with no report from its agent yet, as every pod is in an operator's
        first passes after a restart: left as it is (no copy taken off its routes, drained or loaded)
        until its agent says what it holds. A new pod, holding nothing, is given its models at once."""
        return not self.reported and bool(self.routed or self.assignment.models)


@dataclass(frozen=True)
class PodMoves:
    """One pod's next step: the assignment to write and the model labels to set and take off."""

    assignment: PodAssignment
    label: tuple[str, ...] = ()
    unlabel: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelFailure:
    """A model whose load failed: the version, the pods it failed on, the reason, when it is tried again."""

    model: str
    version: str
    pods: tuple[str, ...]
    reason: str
    message: str
    retry_at: float


@dataclass(frozen=True)
class Moves:
    """The next step of every pod; the failed loads per model; what waits, in sentences; the earliest
    time a wait ends (a drain, a retry); whether everything is where the placement wants it; and the
    copies being loaded (pod, model): asked of an agent and not reported READY at their version, nor
    failed, yet. Nothing but the agent's next report ends their wait: the copy is labelled the pass
    that reads it READY. ``unloading``: the copies (pod, model) whose entry is gone but which the
    agent still reports loaded, on a pod where a new copy waits for their room: the agent's next report
    ends that wait too. ``beside``: the copies (pod, model) given this pass beside the copy whose room
    they wait for, to end a circle of such waits (_deadlocked): their pod holds more than its budget
    until that copy is unloaded."""

    pods: dict[str, PodMoves]
    failures: dict[str, ModelFailure]
    waiting: tuple[str, ...]
    next_at: float | None
    settled: bool
    loading: tuple[tuple[str, str], ...] = ()
    unloading: tuple[tuple[str, str], ...] = ()
    beside: tuple[tuple[str, str], ...] = ()
    room: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    """The copies not given for want of room (pod, model, the copies that pod must unload first: none
    when it only lacks the room), as status.pool's messages say them (core.pool.explain.room_waits)."""


def drain_seconds(probe_period: float, probe_failures: int, drain: float) -> float:
    """How long a copy stays loaded once its label is off: the readiness probe's period x failures (the
    endpoints' lag) and the spec's drainSeconds (in-flight requests and routers catching up)."""
    return probe_period * probe_failures + drain


class _Model:
    """One model across the pods: which pods answer for it, which are wanted, and who stays routed."""

    def __init__(
        self,
        name: str,
        version: str | None,
        wanted: set[str],
        pods: Mapping[str, PodState],
        on: Mapping[str, Mapping[str, str]],
    ):
        self.name, self.version, self.wanted = name, version, wanted
        self._on = {p: v[name] for p, v in on.items() if name in v and version is not None}
        self.serving = {
            p
            for p, s in pods.items()
            if s.ready and name in s.routed and name in s.copies and s.copies[name].state == VERSION_READY
        }
        self.staying = set(self.serving)
        self.unlabel: set[str] = set()

    def version_on(self, pod: str) -> str | None:
        """The version wanted on ``pod``: a change moving in place asks some pods for another."""
        return self._on.get(pod, self.version)

    def take_off(self, pod: str) -> None:
        self.staying.discard(pod)
        self.unlabel.add(pod)


def _labels_off(model: _Model, pods: Mapping[str, PodState]) -> None:
    """Which copies of ``model`` leave its routes now: those not READY; those placement no longer wants
    once every wanted copy answers (any removed model's); one copy of an old version while another
    answers and no other pod of it is changing."""
    name = model.name
    for pod, state in pods.items():
        if state.unknown:
            continue  # not heard from yet: what it holds is unknown, its routes stay
        copy = state.copies.get(name)
        if name in state.routed and (copy is None or copy.state not in (VERSION_READY, LOADING)):
            model.take_off(pod)
    unwanted = sorted(model.serving - model.wanted)
    every_wanted_answers = bool(model.wanted) and model.wanted <= model.serving
    if model.version is None or every_wanted_answers:
        for pod in unwanted:
            model.take_off(pod)
    if model.version is None:
        return
    changing = [p for p in model.wanted if p not in model.serving and name in pods[p].assignment.models] + [
        p for p in model.unlabel if p in model.wanted
    ]
    for pod in sorted(model.wanted & model.staying):
        held, version = pods[pod].assignment.models.get(name), model.version_on(pod)
        if pods[pod].copies[name].version == version or (held and held.version == version):
            continue
        if changing or not (model.staying - {pod}):
            break
        model.take_off(pod)
        changing.append(pod)


def plan_moves(
    placement: Mapping[str, Sequence[str]],
    versions: Mapping[str, str],
    pods: Mapping[str, PodState],
    *,
    now: float,
    drain: float,
    backoff: Backoff,
    random: Random | None = None,
    on: Mapping[str, Mapping[str, str]] | None = None,
    revisions: Mapping[str, str] | None = None,
    measured: Collection[str] = (),
    memory: Mapping[str, int] | None = None,
    budgets: Mapping[str, int] | None = None,
) -> Moves:
    """The next safe step of each pod of ``pods`` towards ``placement`` (pod -> its models), each model at
    its version of ``versions`` (every model of the spec; a model not in it is being removed). Pods of
    the placement that are not in ``pods`` (gone, not started) are left out.

    A change moving in place: ``on`` (pod -> model -> version) asks some pods for other versions than
    ``versions`` (the pods not asked yet keep the old one, a rollback takes the new one back), and
    ``revisions`` (version -> revision) names the revision whose files hold a version that is not in
    the pods' own (written in the assignment, for the agent to fetch). ``measured``: the models whose
    memory status.pool already keeps (their new entries say so: the agent may load them together).

    ``budgets`` (pod -> bytes) and ``memory`` (model -> the bytes one copy holds, placement's figure):
    a pod of ``budgets`` is given a new copy only when what it still holds (its entries, those leaving
    this pass included, and the copies its agent reports READY or LOADING) and the new copy fit its
    budget; the copy waits otherwise, the models with no copy answering first. A copy of a model not in
    ``memory`` counts the memory its agent measured, else the whole budget (what it holds is unknown:
    nothing is added beside it). A pod not in ``budgets`` is given its copies at once."""
    on = on or {}
    revisions = revisions or {}
    names = sorted({*versions, *(m for s in pods.values() for m in (*s.assignment.models, *s.routed))})
    models = {
        name: _Model(
            name,
            versions.get(name),
            {p for p, held in placement.items() if name in held and p in pods},
            pods,
            on,
        )
        for name in names
    }
    for model in models.values():
        _labels_off(model, pods)

    def pod_step(pod: str, state: PodState, force: frozenset[str] = frozenset()) -> _PodStep:
        wanted = {m: on.get(pod, {}).get(m, versions[m]) for m in placement.get(pod, ()) if m in versions}
        step = _PodStep(
            pod,
            state,
            models,
            wanted=wanted,
            now=now,
            drain=drain,
            backoff=backoff,
            random=random,
            revisions=revisions,
            measured=frozenset(measured),
            memory=memory or {},
            budget=(budgets or {}).get(pod),
            force=force,
        )
        step.run()
        return step

    out: dict[str, PodMoves] = {}
    by_pod = {pod: pod_step(pod, state) for pod, state in sorted(pods.items()) if not state.unknown}
    forced = _deadlocked(by_pod, models)
    for pod in sorted({pod for pod, _ in forced}):
        by_pod[pod] = pod_step(pod, pods[pod], frozenset(m for p, m in forced if p == pod))
    for pod, state in sorted(pods.items()):
        if state.unknown:
            out[pod] = PodMoves(state.assignment, (), ())  # as it is until its agent reports
            continue
        step = by_pod[pod]
        unlabel = tuple(sorted(m for m in names if pod in models[m].unlabel))
        out[pod] = PodMoves(step.assignment(), tuple(step.label), unlabel)
    steps = list(by_pod.values())
    failed_on: dict[str, list[tuple[str, FailedLoad]]] = {}
    for step in steps:
        for name, record in step.failed_now:
            failed_on.setdefault(name, []).append((step.pod, record))
    waits = [t for step in steps for t in step.waits]
    waiting = tuple(w for step in steps for w in step.waiting)
    loading = tuple((step.pod, name) for step in steps for name in step.loading)
    unloading = tuple((step.pod, name) for step in steps for name in step.unloading)
    settled = all(step.settled for step in steps) and not any(s.unknown for s in pods.values())
    failures = {
        name: ModelFailure(
            name,
            found[0][1].version,
            tuple(p for p, _ in found),
            found[0][1].reason,
            found[0][1].message,
            min(r.retry_at for _, r in found),
        )
        for name, found in failed_on.items()
    }
    future = [t for t in waits if t > now]
    next_at = min(future) if future else None
    room = tuple(
        sorted((step.pod, name, tuple(leaving)) for step in steps for name, leaving in step.short.items())
    )
    return Moves(out, failures, waiting, next_at, settled, loading, unloading, tuple(sorted(forced)), room)


def _deadlocked(steps: Mapping[str, _PodStep], models: Mapping[str, _Model]) -> set[tuple[str, str]]:
    """The copies (pod, model) given beside what their pods still hold, to end a circle of waits for room:
    a copy waits for its pod to unload a leaving copy that stays on its routes until its model's copy
    on another pod answers, which waits for that pod's room, and so on back to the first (a repack
    of pods with no room to spare: each pod's leaving copy is its model's last READY one). Nothing else
    ends it, so one copy of each circle (the first by pod and model) loads beside the copy it waits for:
    its pod exceeds its budget by it until that copy is unloaded."""
    short = {(step.pod, name): leaving for step in steps.values() for name, leaving in step.short.items()}

    def after(copy: tuple[str, str]) -> list[tuple[str, str]]:
        """The waiting copies whose load ``copy``'s room waits on."""
        pod, found = copy[0], []
        for leaving in short[copy]:
            # Off its routes (or only its agent still reporting it), a leaving copy goes in its time.
            model = models.get(leaving)
            if model is not None and pod in model.staying:
                found += [(other, leaving) for other in sorted(model.wanted - model.serving)]
        return [c for c in found if c in short]

    forced: set[tuple[str, str]] = set()
    for start in sorted(short):
        seen, todo = set(), [c for c in after(start) if c not in forced]
        while todo:
            copy = todo.pop()
            if copy == start:
                forced.add(start)
                break
            if copy not in seen:
                seen.add(copy)
                todo += [c for c in after(copy) if c not in forced]
    return forced


class _PodStep:
    """One pod's next step, model by model: what it holds, drains and failed, what to label."""

    def __init__(
        self,
        pod: str,
        state: PodState,
        models: Mapping[str, _Model],
        *,
        wanted: Mapping[str, str],
        now: float,
        drain: float,
        backoff: Backoff,
        random: Random | None,
        revisions: Mapping[str, str],
        measured: Collection[str],
        memory: Mapping[str, int],
        budget: int | None,
        force: frozenset[str] = frozenset(),
    ) -> None:
        self.pod, self.state, self.models, self.wanted = pod, state, models, wanted
        self.revisions, self.measured = revisions, measured
        self.memory, self.budget, self.force = memory, budget, force
        self.new: list[str] = []
        self.short: dict[str, list[str]] = {}
        """The new copies that wait for room: each with the leaving copies it waits to see unloaded."""
        self.unloading: list[str] = []
        self.now, self.drain, self.backoff, self.random = now, drain, backoff, random
        self.held = dict(state.assignment.models)
        self.draining = dict(state.assignment.draining)
        self.failed = dict(state.assignment.failed)
        self.label: list[str] = []
        self.failed_now: list[tuple[str, FailedLoad]] = []
        self.waits: list[float] = []
        self.waiting: list[str] = []
        self.loading: list[str] = []
        self.settled = True

    def run(self) -> None:
        for name in sorted({*self.held, *self.state.routed, *self.wanted}):
            model = self.models[name]
            if self.pod in model.unlabel:
                self.draining[name] = self.now
                self.settled = False
            routed = name in self.state.routed and self.pod not in model.unlabel
            if name in self.wanted:
                self._wanted(model, self.wanted[name], routed)
            else:
                self.settled = False
                self._unwanted(model, routed)
        self._give_room()
        if self.assignment() != self.state.assignment:
            self.settled = False  # a record to drop or write: written before anything is settled

    def assignment(self) -> PodAssignment:
        draining = {m: t for m, t in self.draining.items() if m in self.held}
        failed = {m: f for m, f in self.failed.items() if m in self.held}
        return replace(self.state.assignment, models=self.held, draining=draining, failed=failed)

    def _entry(self, name: str, version: str, attempt: int = 1) -> Wanted:
        return Wanted(version, attempt, self.revisions.get(version), measured=name in self.measured)

    def _wait(self, until: float | None, why: str) -> None:
        if until is not None:
            self.waits.append(until)
        self.waiting.append(f"{self.pod}: {why}")

    def _wanted(self, model: _Model, version: str, routed: bool) -> None:
        name = model.name
        entry = self.held.get(name)
        copy = self.state.copies.get(name)
        if entry is None:
            self.settled = False
            self.new.append(name)  # given once the pass knows what leaves (_give_room)
        elif entry.version != version:
            self._new_version(model, version, routed)
        elif copy is not None and copy.attempt == entry.attempt and copy.error:
            self._failed(name, version, entry, copy)
        elif copy is not None and copy.state == VERSION_READY and copy.version == version:
            self.failed.pop(name, None)
            self.draining.pop(name, None)
            if not routed and self.pod not in model.unlabel:
                self.label.append(name)
                self.settled = False
        else:
            self.settled = False
            self.loading.append(name)
            self._wait(None, f"{name} {version} is loading")

    def _holding(self) -> set[str]:
        """What the pod holds or is asked to load: its entries as read and as written this pass (an entry
        going now is unloaded after the write), and the copies its agent reports loaded or loading."""
        reported = (m for m, c in self.state.copies.items() if c.state in (VERSION_READY, LOADING))
        return {*self.state.assignment.models, *self.held, *reported}

    def _bytes(self, name: str) -> int:
        if name in self.memory:
            return self.memory[name]
        copy = self.state.copies.get(name)
        if copy is not None and copy.memory is not None:
            return copy.memory
        return self.budget if self.budget is not None else 0

    def _give_room(self) -> None:
        """The new copies, each given while the pod has the room for it beside what it still holds; the
        models with no copy answering first. A copy that waits names the copies it waits to see unloaded."""
        new = sorted(self.new, key=lambda m: (bool(self.models[m].serving), m))
        waits = False
        for name in new:
            holding = self._holding()
            used = sum(map(self._bytes, holding)) + self._bytes(name)
            if self.budget is not None and used > self.budget and name not in self.force:
                leaving = sorted(m for m in holding if m not in self.wanted)
                self.short[name] = leaving
                why = f"{self.pod} to unload {', '.join(leaving)} to make room" if leaving else "room"
                self.waiting.append(f"{self.pod}: waiting for {why} for {name}")
                waits = True
                continue
            self.held[name] = self._entry(name, self.wanted[name])
            self.loading.append(name)  # asked from this pass's write on
        if waits:
            # Unloaded once the agent says so: its next report, as for a copy loading.
            self.unloading = sorted(m for m in self._holding() if m not in self.held)

    def _new_version(self, model: _Model, version: str, routed: bool) -> None:
        """Reload at ``version``: once off the routes and drained, or in place when it is the only copy."""
        name = model.name
        self.settled = False
        if not routed:
            copy = self.state.copies.get(name)
            if name not in self.draining and copy is not None and copy.state == VERSION_READY:
                self.draining[name] = self.now  # it may have answered: drain before it reloads
            drained_at = self.draining.get(name, self.now) + self.drain if name in self.draining else self.now
            if self.now >= drained_at and self.pod not in model.unlabel:
                self.held[name] = self._entry(name, version)
                self.draining.pop(name, None)
                self.loading.append(name)
            else:
                self._wait(drained_at, f"{name} drains before its version {version} loads")
        elif model.staying == {self.pod} and not (model.serving | model.wanted) - {self.pod}:
            # The only copy: Triton serves the old version until the new one is READY.
            self.held[name] = self._entry(name, version)
            self.loading.append(name)
        else:
            self._wait(None, f"{name} waits for its other copies to change version")

    def _failed(self, name: str, version: str, entry: Wanted, copy: Copy) -> None:
        """A failed load: recorded once per attempt with the backoff's delay, asked again once it is over."""
        self.settled = False
        record = self.failed.get(name)
        if record is None or (record.version, record.attempt) != (version, entry.attempt):
            delay = self.backoff.delay(entry.attempt - 1, random=self.random)
            record = FailedLoad(
                version, entry.attempt, self.now + delay, short_reason(copy.error), copy.error
            )
            self.failed[name] = record
        self.failed_now.append((name, record))
        if self.now >= record.retry_at:
            self.held[name] = self._entry(name, version, entry.attempt + 1)
            self.loading.append(name)
        else:
            self._wait(record.retry_at, f"{name} {version} failed to load; tried again later")

    def _unwanted(self, model: _Model, routed: bool) -> None:
        """A copy placement no longer wants here: off its routes (decided per model), drained, unloaded."""
        name = model.name
        copy = self.state.copies.get(name)
        if routed:
            self._wait(None, f"{name} stays on its routes until its wanted copies answer")
        elif name not in self.held or self.pod in model.unlabel:
            return
        elif name in self.draining:
            if self.now >= self.draining[name] + self.drain:
                del self.held[name]
            else:
                self._wait(self.draining[name] + self.drain, f"{name} drains before it unloads")
        elif copy is not None and copy.state == VERSION_READY:
            self.draining[name] = self.now  # it may have answered: drain before it unloads
            self.waits.append(self.now + self.drain)
        else:
            del self.held[name]  # never READY here: nothing to drain
