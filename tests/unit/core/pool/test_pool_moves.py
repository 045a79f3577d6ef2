"""The pool's moves (core/pool/moves.py) against a simulated pool: no model that answered stops answering."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import pytest

from triton_operator.core.edges.backoff import Backoff
from triton_operator.core.pool.assignment import Copy, PodAssignment, Wanted
from triton_operator.core.pool.moves import Moves, PodState, drain_seconds, plan_moves

BACKOFF = Backoff(base=2.0, cap=30.0)
DRAIN = drain_seconds(2, 2, 3)  # the in-place probe: period 2 s x 2 failures, drainSeconds 3


@dataclass
class Pod:
    """A simulated pod: the annotation, the labels, and Triton as its agent reports it."""

    assignment: PodAssignment = field(default_factory=PodAssignment)
    routed: set[str] = field(default_factory=set)
    copies: dict[str, Copy] = field(default_factory=dict)
    acted: dict[str, Wanted] = field(default_factory=dict)
    pending: dict[str, Wanted] = field(default_factory=dict)

    def state(self) -> PodState:
        return PodState(self.assignment, dict(self.copies), frozenset(self.routed))


class Pool:
    """Pods, their agents and a clock; loads fail at random before their third attempt."""

    def __init__(self, pods: dict[str, Pod], rng: random.Random, fail: float) -> None:
        self.pods, self.rng, self.fail, self.now = pods, rng, fail, 1000.0
        self.unloaded_while_labelled: list[tuple[str, str]] = []
        self.unloaded_undrained: list[tuple[str, str, float]] = []
        self.label_off_at: dict[tuple[str, str], float] = {}

    def plan(
        self,
        placement: dict[str, list[str]],
        versions: dict[str, str],
        on: dict[str, dict[str, str]] | None = None,
        revisions: dict[str, str] | None = None,
    ) -> Moves:
        states = {name: pod.state() for name, pod in self.pods.items()}
        return plan_moves(
            placement,
            versions,
            states,
            now=self.now,
            drain=DRAIN,
            backoff=BACKOFF,
            random=self.rng.random,
            on=on,
            revisions=revisions,
        )

    def apply(self, moves: Moves) -> None:
        for name, step in moves.pods.items():
            pod = self.pods[name]
            pod.routed |= set(step.label)
            pod.routed -= set(step.unlabel)
            self.label_off_at.update({(name, m): self.now for m in step.unlabel})
            pod.assignment = step.assignment

    def agents(self) -> None:
        """Each agent: pending loads end (READY, or failed), then it follows its assignment."""
        for name, pod in self.pods.items():
            for model, want in list(pod.pending.items()):
                del pod.pending[model]
                old = pod.copies.get(model)
                if want.attempt >= 3 or self.rng.random() >= self.fail:
                    pod.copies[model] = Copy("READY", want.version, want.attempt)
                elif old is not None and old.state == "READY":  # a failed reload: Triton keeps the old
                    pod.copies[model] = replace(old, attempt=want.attempt, error="boom: bad file\ntraceback")
                else:
                    pod.copies[model] = Copy(
                        "UNAVAILABLE", want.version, want.attempt, "boom: bad file\ntraceback"
                    )
            for model, want in pod.assignment.models.items():
                if pod.acted.get(model) != want:
                    pod.acted[model] = want
                    pod.pending[model] = want
                    old = pod.copies.get(model)
                    if old is None or old.state != "READY":
                        pod.copies[model] = Copy("LOADING", want.version, want.attempt)
            for model in [m for m in pod.copies if m not in pod.assignment.models]:
                if model in pod.routed:
                    self.unloaded_while_labelled.append((name, model))
                off_at = self.label_off_at.pop((name, model), None)
                if off_at is not None and self.now - off_at < DRAIN:
                    self.unloaded_undrained.append((name, model, self.now - off_at))
                del pod.copies[model]
                pod.acted.pop(model, None)
                pod.pending.pop(model, None)

    def answering(self, model: str) -> list[str]:
        return [
            n
            for n, p in self.pods.items()
            if model in p.routed and p.copies.get(model, Copy("", "")).state == "READY"
        ]


def _random_pool(seed: int) -> tuple[Pool, dict[str, list[str]], dict[str, str]]:
    rng = random.Random(seed)
    names = [f"p{i}" for i in range(rng.randint(2, 5))]
    models = [f"m{i}" for i in range(rng.randint(1, 6))]
    pods = {n: Pod() for n in names}
    for model in models:
        for n in rng.sample(names, rng.randint(0 if rng.random() < 0.1 else 1, len(names))):
            ready = rng.random() < 0.85
            pod = pods[n]
            want = Wanted("v1")
            pod.assignment = replace(pod.assignment, models={**pod.assignment.models, model: want})
            pod.acted[model] = want
            if ready:
                pod.copies[model] = Copy("READY", "v1")
                if rng.random() < 0.9:
                    pod.routed.add(model)
            else:
                pod.copies[model] = Copy("LOADING", "v1")
                pod.pending[model] = want
    kept = [m for m in models if rng.random() < 0.9]
    versions = {m: rng.choice(["v1", "v1", "v2"]) for m in kept}
    # A pod may be left out (gone); each model of the spec is placed on at least one pod.
    placement: dict[str, list[str]] = {n: [] for n in names if rng.random() < 0.9} or {names[0]: []}
    for model in kept:
        for n in rng.sample(sorted(placement), rng.randint(1, len(placement))):
            placement[n].append(model)
    return Pool(pods, rng, fail=rng.choice([0.0, 0.3, 0.6])), placement, versions


@pytest.mark.parametrize("seed", range(300))
def test_every_model_that_answered_keeps_answering_and_the_moves_end_where_placement_wants(seed: int) -> None:
    pool, placement, versions = _random_pool(seed)
    answered = {m for m in versions if pool.answering(m)}
    for _ in range(400):
        moves = pool.plan(placement, versions)
        if moves.settled:
            break
        pool.apply(moves)
        assert [m for m in answered if not pool.answering(m)] == []
        pool.agents()
        assert [m for m in answered if not pool.answering(m)] == []
        assert pool.unloaded_while_labelled == [] and pool.unloaded_undrained == []
        pool.now += pool.rng.uniform(0.5, 4.0)
    else:
        pytest.fail(f"no end after 400 steps: {moves.waiting}")
    for name, pod in pool.pods.items():
        wanted = {m: versions[m] for m in placement.get(name, []) if m in versions}
        assert {m: c.version for m, c in pod.copies.items()} == wanted
        assert all(c.state == "READY" for c in pod.copies.values())
        assert pod.routed == set(wanted)
        assert pod.assignment.draining == {} and pod.assignment.failed == {}


def _serving(*models: str, version: str = "v1") -> Pod:
    pod = Pod(routed=set(models))
    pod.assignment = PodAssignment(models={m: Wanted(version) for m in models})
    pod.copies = {m: Copy("READY", version) for m in models}
    pod.acted = dict(pod.assignment.models)
    return pod


def _run(
    pool: Pool, placement: dict[str, list[str]], versions: dict[str, str], steps: int = 60
) -> Iterator[Moves]:
    """Each step's moves, seen before they are applied; ends once settled."""
    for _ in range(steps):
        moves = pool.plan(placement, versions)
        yield moves
        if moves.settled:
            return
        pool.apply(moves)
        pool.agents()
        pool.now += 1.0
    pytest.fail(f"no end: {pool.plan(placement, versions).waiting}")


def test_a_moved_model_loads_answers_and_is_labelled_before_the_old_copy_leaves_its_routes_then_drains() -> (
    None
):
    pool = Pool({"p0": _serving("a"), "p1": Pod()}, random.Random(1), fail=0.0)
    events: list[tuple[float, str]] = []
    for moves in _run(pool, {"p1": ["a"]}, {"a": "v1"}):
        for pod, step in moves.pods.items():
            events += [(pool.now, f"label {pod}")] * bool(step.label) + [(pool.now, f"unlabel {pod}")] * bool(
                step.unlabel
            )
            if "a" in pool.pods[pod].assignment.models and "a" not in step.assignment.models:
                events.append((pool.now, f"unload {pod}"))
            if "a" not in pool.pods[pod].assignment.models and "a" in step.assignment.models:
                events.append((pool.now, f"load {pod}"))
    assert [e for _, e in events] == ["load p1", "label p1", "unlabel p0", "unload p0"]
    times = dict((e, t) for t, e in events)
    assert times["label p1"] < times["unlabel p0"]
    assert times["unload p0"] - times["unlabel p0"] >= DRAIN == 7


def test_the_last_ready_copy_stays_while_its_new_copy_fails_and_its_failure_is_reported_with_backoff() -> (
    None
):
    pool = Pool({"p0": _serving("a"), "p1": Pod()}, random.Random(2), fail=1.0)  # fails until attempt 3
    pool.apply(pool.plan({"p1": ["a"]}, {"a": "v1"}))
    pool.agents()
    pool.agents()  # the load ends: UNAVAILABLE
    moves = pool.plan({"p1": ["a"]}, {"a": "v1"})
    failure = moves.failures["a"]
    assert (failure.pods, failure.reason, failure.message) == (
        ("p1",),
        "boom: bad file",
        "boom: bad file\ntraceback",
    )
    assert pool.now < failure.retry_at <= pool.now + BACKOFF.ceiling(0) and moves.next_at == failure.retry_at
    assert moves.pods["p0"].unlabel == () and moves.pods["p1"].assignment.models["a"] == Wanted("v1", 1)
    pool.apply(moves)
    pool.now = failure.retry_at
    retry = pool.plan({"p1": ["a"]}, {"a": "v1"})
    assert retry.pods["p1"].assignment.models["a"] == Wanted("v1", 2)  # asked again, one attempt more
    assert retry.failures["a"].retry_at == failure.retry_at  # the same failure until the next attempt ends


def test_a_model_the_placement_gives_no_pod_keeps_its_copy_and_a_removed_model_leaves() -> None:
    pool = Pool({"p0": _serving("a", "gone")}, random.Random(3), fail=0.0)
    moves = pool.plan({"p0": []}, {"a": "v1"})
    assert moves.pods["p0"].unlabel == ("gone",) and not moves.settled
    assert "p0: a stays on its routes until its wanted copies answer" in moves.waiting


def test_a_new_version_moves_pod_by_pod_on_the_pods_holding_the_model_and_leaves_the_others_alone() -> None:
    pods = {f"p{i}": _serving("a", "b") for i in range(3)}
    pods["p3"] = _serving("b")
    pool = Pool(pods, random.Random(4), fail=0.0)
    placement = {p: sorted(pods[p].routed) for p in pods}
    b_entries = {p: pods[p].assignment.models["b"] for p in pods}
    off_at_once = []
    for _ in _run(pool, placement, {"a": "v2", "b": "v1"}):
        off_at_once.append(sum("a" not in pool.pods[p].routed for p in ("p0", "p1", "p2")))
        assert {p: pool.pods[p].assignment.models["b"] for p in pods} == b_entries
        assert all("b" in pool.pods[p].routed for p in pods)
    assert max(off_at_once) == 1 and sum(off_at_once) >= 3  # each of the three, one at a time
    assert {p: pool.pods[p].copies["a"].version for p in ("p0", "p1", "p2")} == dict.fromkeys(
        ("p0", "p1", "p2"), "v2"
    )


def test_a_single_copy_is_reloaded_in_place_and_keeps_answering() -> None:
    pool = Pool({"p0": _serving("a")}, random.Random(5), fail=0.0)
    moves = pool.plan({"p0": ["a"]}, {"a": "v2"})
    assert moves.pods["p0"].assignment.models["a"] == Wanted("v2") and moves.pods["p0"].unlabel == ()


def test_the_old_copy_leaves_its_routes_only_once_the_new_copys_pod_is_ready() -> None:
    """A label on a pod not Ready routes nothing (the Service's endpoints are its Ready pods): the copy
    placement moves away stays on its routes until the pod of the new copy is Ready too."""
    old = _serving("a").state()
    labelled = PodState(
        PodAssignment(models={"a": Wanted("v1")}), {"a": Copy("READY", "v1")}, frozenset({"a"}), ready=False
    )
    placement = {"p1": ["a"]}

    def moves(new: PodState) -> Moves:
        return plan_moves(
            placement, {"a": "v1"}, {"p0": old, "p1": new}, now=0.0, drain=DRAIN, backoff=BACKOFF
        )

    waiting = moves(labelled)
    assert waiting.pods["p0"].unlabel == () and "a" in waiting.pods["p0"].assignment.models
    ready = moves(replace(labelled, ready=True))
    assert ready.pods["p0"].unlabel == ("a",)


def test_a_change_in_place_moves_the_model_only_on_the_pods_asked_one_at_a_time_and_back_on_rollback() -> (
    None
):
    """A model's new version moving in place (the rollout engine asks pods step by step; ``on`` names
    the version each asked pod is to hold): the copy on an asked pod leaves its route, drains, reloads
    from the new revision's files (named in its entry), READY, back on its route, one pod at a time,
    while the model's other copies answer; the pods not asked and the other models are not touched;
    a rollback (the pods no longer asked) takes the old version back the same way."""
    pods = {"p0": _serving("a", "b"), "p1": _serving("a", "c"), "p2": _serving("b", "c")}
    pool = Pool(pods, random.Random(6), fail=0.0)
    placement = {p: sorted(pods[p].routed) for p in pods}
    untouched = {p: {m: w for m, w in pods[p].assignment.models.items() if m != "a"} for p in pods}
    versions, revisions = {"a": "v1", "b": "v1", "c": "v1"}, {"v2": "r2"}

    def run(on: dict[str, dict[str, str]]) -> list[int]:
        off: list[int] = []
        for _ in range(60):
            moves = pool.plan(placement, versions, on, revisions)
            if moves.settled:
                return off
            pool.apply(moves)
            off.append(sum("a" not in pool.pods[p].routed for p in ("p0", "p1")))
            assert pool.answering("a") and pool.answering("b") and pool.answering("c")
            pool.agents()
            assert pool.answering("a") and pool.answering("b") and pool.answering("c")
            assert {
                p: {m: w for m, w in pool.pods[p].assignment.models.items() if m != "a"} for p in pods
            } == (untouched)
            assert pool.unloaded_while_labelled == [] and pool.unloaded_undrained == []
            pool.now += 1.0
        pytest.fail("no end")

    assert max(run({"p0": {"a": "v2"}})) == 1  # the first step asks p0 alone
    assert pool.pods["p0"].assignment.models["a"] == Wanted("v2", 1, "r2")
    assert pool.pods["p0"].copies["a"].version == "v2" and pool.pods["p1"].copies["a"].version == "v1"
    assert pool.pods["p1"].acted["a"] == Wanted("v1")  # p1's copy was never reloaded
    assert max(run({"p0": {"a": "v2"}, "p1": {"a": "v2"}})) == 1
    assert {p: pool.pods[p].copies["a"].version for p in ("p0", "p1")} == {"p0": "v2", "p1": "v2"}
    assert max(run({})) == 1  # rolled back: each pod goes back to v1 (the pods' own files), one at a time
    assert {p: pool.pods[p].assignment.models["a"] for p in ("p0", "p1")} == dict.fromkeys(
        ("p0", "p1"), Wanted("v1")
    )


def test_a_copy_waits_while_the_models_other_copy_reloads_it_is_not_the_only_copy() -> None:
    """Two copies of a, one off its route reloading the new version: the other is not reloaded in
    place meanwhile (it is not the model's only copy), so the two reload one after the other."""
    reloading = Pod(assignment=PodAssignment(models={"a": Wanted("v2")}), copies={"a": Copy("LOADING", "v2")})
    pool = Pool({"p0": reloading, "p1": _serving("a")}, random.Random(7), fail=0.0)
    moves = pool.plan({"p0": ["a"], "p1": ["a"]}, {"a": "v2"})
    assert moves.pods["p1"].assignment.models["a"] == Wanted("v1") and moves.pods["p1"].unlabel == ()
    assert any("p1: a waits for its other copies" in w for w in moves.waiting), moves.waiting


def test_a_pod_whose_agent_has_not_reported_keeps_its_routes_and_assignment() -> None:
    """An operator's first pass after a restart has no agent report yet: each pod's copies are unknown,
    not gone. Nothing of such a pod is taken off its routes, drained or loaded (the real node's restart
    once drained every model of every pod for a pass); a pod that has reported moves as before."""
    held = PodAssignment(models={"a": Wanted("v1"), "b": Wanted("v1")})
    silent = PodState(assignment=held, copies={}, routed=frozenset({"a", "b"}), reported=False)
    heard = PodState(
        assignment=PodAssignment(models={"a": Wanted("v1")}),
        copies={"a": Copy("READY", "v1")},
        routed=frozenset({"a"}),
    )
    moves = plan_moves(
        {"p0": ["a", "b"], "p1": ["a"]},
        {"a": "v1", "b": "v1"},
        {"p0": silent, "p1": heard},
        now=100.0,
        drain=DRAIN,
        backoff=BACKOFF,
    )
    assert moves.pods["p0"].assignment == held and not moves.pods["p0"].assignment.draining
    assert moves.pods["p0"].unlabel == () and moves.pods["p0"].label == ()
    assert moves.pods["p1"].unlabel == ()
    assert not moves.settled  # it comes back once the agent has said what it holds
    # once it reports nothing READY, its copies leave their routes as any copy not READY does
    reported = plan_moves(
        {"p0": ["a", "b"], "p1": ["a"]},
        {"a": "v1", "b": "v1"},
        {"p0": replace(silent, reported=True), "p1": heard},
        now=100.0,
        drain=DRAIN,
        backoff=BACKOFF,
    )
    assert set(reported.pods["p0"].unlabel) == {"a", "b"}


def test_a_copy_is_loading_from_the_pass_that_asks_for_it_until_its_agent_reports_it_ready() -> None:
    """Moves.loading: the copies whose READY only the agent's next report tells (a pass looks again soon,
    core.decision.pool_plan.pool_requeue); nothing once they are READY, nor while drains or a backoff
    have their own end."""
    pool = Pool({"p0": _serving("a"), "p1": Pod()}, random.Random(1), fail=0.0)
    placement, versions = {"p1": ["a"]}, {"a": "v1"}
    seen = [
        (moves.loading, bool(moves.pods["p1"].label), moves.next_at)
        for moves in _run(pool, placement, versions)
    ]
    assert seen[0][0] == (("p1", "a"),)  # asked by this pass's write
    assert seen[1][0] == (("p1", "a"),)  # the agent loads it
    labelled = next(i for i, (_, label, _) in enumerate(seen) if label)
    assert all(loading == (("p1", "a"),) for loading, _, _ in seen[:labelled])
    assert all(loading == () for loading, _, _ in seen[labelled:])  # READY: labelled, then p0 drains
    assert any(next_at is not None for _, _, next_at in seen[labelled:])  # the drain: a time of its own

    failing = Pool({"p0": _serving("a"), "p1": Pod()}, random.Random(2), fail=1.0)
    failing.apply(failing.plan(placement, versions))
    failing.agents()
    failing.agents()  # the load failed
    moves = failing.plan(placement, versions)
    assert moves.loading == () and moves.next_at is not None  # the backoff's end, not the agent
    failing.apply(moves)
    failing.now = moves.next_at
    assert failing.plan(placement, versions).loading == (("p1", "a"),)  # asked again
