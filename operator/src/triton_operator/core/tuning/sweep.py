"""A sweep, pure: its settings, its candidates (each put through the operator's checks), the GPU budget."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from triton_operator import GROUP, KIND, VERSION
from triton_operator.core.observed.observation import check_body

LABEL_TUNING = f"{GROUP}/tuning"
"""Every tuning object: the TritonService's name (never LABEL_SERVICE, which Service `<name>` selects)."""
LABEL_RUN = f"{GROUP}/tuning-run"
LABEL_CANDIDATE = f"{GROUP}/tuning-candidate"
LABEL_RESULTS = f"{GROUP}/tuning-results"
MANAGED_BY = "kubectl-triton"
RESULTS_KEY = "results.json"
CSV_MARKER = "### perf_analyzer csv"
PERCENTILES = (50, 90, 95, 99)
DEFAULT_CONCURRENCIES = (1, 4, 8)
MAX_CANDIDATES = 64
"""The most candidates one sweep may have (each is one pod, one after the other, or --parallel at once)."""
MAX_CONCURRENCY = 1024

# Run states, as the results ConfigMap records them.
RUNNING = "Running"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
INTERRUPTED = "Interrupted"
ABANDONED = "Abandoned"
"""The client went away before the run's end (killed, its machine gone): the operator removed what it
left once its deadline passed (ANNOTATION_DEADLINE)."""

ANNOTATION_DEADLINE = f"{GROUP}/tuning-deadline"
"""On every object a sweep makes (its record included): the absolute time (RFC 3339, UTC) after which
the operator deletes it (the record: marks it Abandoned when it still says Running)."""
DEADLINE_GRACE_SECONDS = 60
LONGEST_RUN_SECONDS = 24 * 3600 + 2 * 3600 + DEADLINE_GRACE_SECONDS
"""The longest any sweep may run (--max-seconds and --candidate-seconds at their maxima): the deadline
of a tuning object that carries none (made by an older kubectl-triton) counts from its creation."""


class TuningError(ValueError):
    """A sweep that cannot run as asked: the message names the flag or the field."""


# ----------------------------------------------------------------- the sweep


@dataclasses.dataclass(frozen=True)
class Sweep:
    """What the user asks to measure: per knob the values to try (empty: keep the model's own)."""

    model: str
    instance_counts: tuple[int, ...] = ()
    max_batch_sizes: tuple[int, ...] = ()
    dynamic_batching: tuple[bool, ...] = ()
    preferred_batch_sizes: tuple[tuple[int, ...], ...] = ()
    queue_delays_us: tuple[int, ...] = ()
    concurrencies: tuple[int, ...] = DEFAULT_CONCURRENCIES
    percentile: int = 95
    latency_bound_us: int | None = None
    max_candidates: int = 8
    parallel: int = 1
    max_seconds: int = 1800
    candidate_seconds: int = 300
    measurement_ms: int = 2000
    max_trials: int = 5
    stability_percentage: int = 10


INPUT_KEY = "data.json"
INPUT_DIR = "/etc/tuning-input"
"""Where a perf Job finds the user's ``--input-data`` (the run's input ConfigMap, mounted)."""


def sweep_errors(sweep: Sweep) -> list[str]:
    """What is wrong with a sweep, each naming the flag of `kubectl triton tune`."""
    errors: list[str] = []

    def positive(flag: str, values: Iterable[int], low: int = 1, high: int | None = None) -> None:
        for value in values:
            if value < low or (high is not None and value > high):
                bound = f"{low} to {high}" if high is not None else f"at least {low}"
                errors.append(f"{flag}: {value} is out of range ({bound})")

    positive("--instances", sweep.instance_counts, 1, 64)
    positive("--max-batch-size", sweep.max_batch_sizes, 1, 1 << 20)
    for sizes in sweep.preferred_batch_sizes:  # () is a set too: no preferred sizes
        positive("--preferred-batch-sizes", sizes, 1)
    positive("--queue-delay-us", sweep.queue_delays_us, 0, 10_000_000)
    if not sweep.concurrencies:
        errors.append("--concurrency: at least one concurrency is needed")
    positive("--concurrency", sweep.concurrencies, 1, MAX_CONCURRENCY)
    if sweep.percentile not in PERCENTILES:
        errors.append(f"--percentile: {sweep.percentile} is not one of {', '.join(map(str, PERCENTILES))}")
    if sweep.latency_bound_us is not None and sweep.latency_bound_us < 1:
        errors.append(f"--latency-bound-us: {sweep.latency_bound_us} is not above 0")
    positive("--max-candidates", [sweep.max_candidates], 1, MAX_CANDIDATES)
    positive("--parallel", [sweep.parallel], 1, 16)
    positive("--max-seconds", [sweep.max_seconds], 30, 24 * 3600)
    positive("--candidate-seconds", [sweep.candidate_seconds], 20, 3600)
    positive("--measurement-ms", [sweep.measurement_ms], 100, 600_000)
    positive("--max-trials", [sweep.max_trials], 1, 100)
    positive("--stability-percentage", [sweep.stability_percentage], 1, 1000)
    return errors


# ----------------------------------------------------------------- candidates


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One config to measure; index 0 is the model's own config (the baseline)."""

    index: int
    config: Mapping[str, Any]
    default: bool = False

    @property
    def name(self) -> str:
        return f"c{self.index}"


@dataclasses.dataclass(frozen=True)
class Refused:
    """A combination that was not run: what it would have set, and why not."""

    settings: Mapping[str, Any]
    problems: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Plan:
    candidates: tuple[Candidate, ...]
    refused: tuple[Refused, ...]


def knobs(config: Mapping[str, Any]) -> dict[str, Any]:
    """The settings a sweep varies, as a config has them (for tables and records)."""
    groups = config.get("instanceGroup") or []
    dynamic = config.get("dynamicBatching")
    out: dict[str, Any] = {
        "instances": [int(g.get("count", 1)) for g in groups] if groups else None,
        "maxBatchSize": int(config.get("maxBatchSize") or 0),
        "dynamicBatching": dynamic is not None,
    }
    if dynamic is not None:
        out["preferredBatchSize"] = [int(v) for v in dynamic.get("preferredBatchSize") or []]
        out["maxQueueDelayMicroseconds"] = int(dynamic.get("maxQueueDelayMicroseconds") or 0)
    return out


def describe_knobs(config: Mapping[str, Any]) -> str:
    """A config's swept settings in one short line: `2 inst, batch 8, dyn [4, 8] 100us`."""
    k = knobs(config)
    instances = "auto" if k["instances"] is None else "+".join(str(c) for c in k["instances"])
    text = f"{instances} inst, batch {k['maxBatchSize']}"
    if not k["dynamicBatching"]:
        return f"{text}, no dyn"
    preferred = k["preferredBatchSize"]
    return f"{text}, dyn {preferred if preferred else '[]'} {k['maxQueueDelayMicroseconds']}us"


def with_settings(base: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` (a model's config, proto3 JSON) with a candidate's settings (``None``: keep the base's).

    instances sets every instance group's count (one group of that count when there is none);
    preferredBatchSize or a queue delay imply dynamic batching; dynamicBatching False drops it.
    """
    config = copy.deepcopy(dict(base))
    if settings.get("instances") is not None:
        groups = config.get("instanceGroup") or [{}]
        config["instanceGroup"] = [{**g, "count": settings["instances"]} for g in groups]
    if settings.get("maxBatchSize") is not None:
        config["maxBatchSize"] = settings["maxBatchSize"]
    dynamic_on = settings.get("dynamicBatching")
    if dynamic_on is False:
        config.pop("dynamicBatching", None)
        return config
    wants_dynamic = (
        dynamic_on is True
        or settings.get("preferredBatchSize") is not None
        or settings.get("maxQueueDelayMicroseconds") is not None
    )
    if wants_dynamic:
        dynamic = dict(config.get("dynamicBatching") or {})
        if settings.get("preferredBatchSize") is not None:
            preferred = list(settings["preferredBatchSize"])
            if preferred:
                dynamic["preferredBatchSize"] = preferred
            else:
                dynamic.pop("preferredBatchSize", None)
        if settings.get("maxQueueDelayMicroseconds") is not None:
            dynamic["maxQueueDelayMicroseconds"] = str(settings["maxQueueDelayMicroseconds"])
        config["dynamicBatching"] = dynamic
    return config


def combinations(sweep: Sweep) -> list[dict[str, Any]]:
    """Every combination of the sweep's values, in a stable order (the cartesian product)."""

    def values(items: Sequence[Any]) -> Sequence[Any]:
        return items if items else [None]

    preferred: list[Any] = [list(p) for p in sweep.preferred_batch_sizes]
    out = []
    for inst, mbs, dyn, pref, delay in itertools.product(
        values(sweep.instance_counts),
        values(sweep.max_batch_sizes),
        values(sweep.dynamic_batching),
        values(preferred),
        values(sweep.queue_delays_us),
    ):
        off = dyn is False  # no batcher: nothing of it to set (the duplicates fold in plan_sweep)
        setting = {
            "instances": inst,
            "maxBatchSize": mbs,
            "dynamicBatching": dyn,
            "preferredBatchSize": None if off else pref,
            "maxQueueDelayMicroseconds": None if off else delay,
        }
        out.append({k: v for k, v in setting.items() if v is not None})
    return out


def _model_index(spec: Mapping[str, Any], model: str) -> int:
    names = [m.get("name") for m in spec.get("models") or []]
    if model not in names:
        raise TuningError(f"model {model!r} is not in the spec (models: {', '.join(map(str, names))})")
    return names.index(model)


def candidate_body(
    ts_body: Mapping[str, Any], spec: Mapping[str, Any], model: str, config: Any
) -> dict[str, Any]:
    """The TritonService ``ts_body`` with ``spec`` whose ``model`` has ``config``."""
    new_spec = copy.deepcopy(dict(spec))
    index = _model_index(new_spec, model)
    new_spec["models"][index] = {**new_spec["models"][index], "config": config}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": dict(ts_body.get("metadata") or {}),
        "spec": new_spec,
    }


def _shape_problem(base: Mapping[str, Any], config: Mapping[str, Any], path: str) -> str | None:
    before = int(base.get("maxBatchSize") or 0)
    after = int(config.get("maxBatchSize") or 0)
    if (before == 0) != (after == 0):
        return (
            f"{path}.maxBatchSize: {before} -> {after} changes the model's input shapes (0 has no batch "
            "dimension): clients would break, so tuning never tries it"
        )
    return None


def plan_sweep(ts_body: Mapping[str, Any], spec: Mapping[str, Any], sweep: Sweep) -> Plan:
    """The candidates of ``sweep`` over ``spec`` (the stable revision's): the model's own config first,
    then each distinct combination that passes the operator's checks; the others as Refused.

    Raises TuningError for a sweep that cannot run (bad flags, unknown model, too many candidates).
    """
    errors = sweep_errors(sweep)
    if errors:
        raise TuningError("; ".join(errors))
    index = _model_index(spec, sweep.model)
    base = dict(spec["models"][index].get("config") or {})
    path = f"spec.models[{index}].config"
    seen = {json.dumps(base, sort_keys=True)}
    candidates = [Candidate(0, base, default=True)]
    refused: list[Refused] = []
    for setting in combinations(sweep):
        config = with_settings(base, setting)
        key = json.dumps(config, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        problems = [p for p in [_shape_problem(base, config, path)] if p]
        if not problems:
            problems = list(check_body(candidate_body(ts_body, spec, sweep.model, config)).problems)
        if problems:
            refused.append(Refused(setting, tuple(problems)))
            continue
        candidates.append(Candidate(len(candidates), config))
    if len(candidates) > sweep.max_candidates:
        raise TuningError(
            f"{len(candidates)} candidates (the model's own config and {len(candidates) - 1} others) are "
            f"more than --max-candidates {sweep.max_candidates}: give fewer values or raise it "
            f"(at most {MAX_CANDIDATES})"
        )
    return Plan(tuple(candidates), tuple(refused))


# ----------------------------------------------------------------- the tuning pods


def held_pods(deployments: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> int:
    """Pods that hold GPUs or are about to: each Deployment's spec.replicas or status.replicas, whichever
    is more, and the pods of ``pods`` that terminate (status.replicas leaves them out; their GPUs are not
    free until they are gone) or whose Deployment is gone, unless they have finished."""
    counted = 0
    names = set()
    for deployment in deployments:
        metadata = deployment.get("metadata") or {}
        names.add(str(metadata.get("name", "")))
        spec_replicas = int((deployment.get("spec") or {}).get("replicas", 1) or 0)
        counted += max(spec_replicas, int((deployment.get("status") or {}).get("replicas") or 0))
    for pod in pods:
        metadata = pod.get("metadata") or {}
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        owner = _deployment_of(pod)  # a perf Job's pod has none: it holds no GPU
        if owner is not None and (metadata.get("deletionTimestamp") is not None or owner not in names):
            counted += 1
    return counted


def _deployment_of(pod: Mapping[str, Any]) -> str | None:
    """The Deployment a pod's ReplicaSet belongs to, by the ReplicaSet's name (`<deployment>-<hash>`)."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "ReplicaSet":
            return str(ref.get("name", "")).rsplit("-", 1)[0]
    return None


def gpu_budget_problem(
    spec: Mapping[str, Any], status: Mapping[str, Any], held: int, parallel: int
) -> str | None:
    """Whether ``parallel`` tuning pods fit spec.rollout.gpuBudget beside the ``held`` pods of the
    service (every revision's and any other sweep's: held_pods), and no rollout is under way whose
    canary the budget must make room for (the operator counts tuning pods against the budget too,
    so a canary started after the sweep waits for its pods to go)."""
    gpus = int(((spec.get("resources") or {}).get("gpus")) or 0)
    budget = (spec.get("rollout") or {}).get("gpuBudget")
    if budget is None or gpus == 0:
        return None
    canary = status.get("canaryRevision")
    if canary:
        return (
            f"spec.rollout.gpuBudget: {budget} GPUs and a rollout is under way (canary revision {canary}):"
            " its canary may need the budget's GPUs; tune once the rollout has completed"
        )
    if (held + parallel) * gpus > int(budget):
        return (
            f"spec.rollout.gpuBudget: {budget} GPUs; the service's pods (every revision's and other"
            f" sweeps') hold {held * gpus} and {parallel} tuning pod(s) need {parallel * gpus} more"
            " (lower --parallel, or wait for fewer pods)"
        )
    return None
