"""Tuning, pure: a sweep's candidate configs, their tuning pods and perf_analyzer Jobs, results, the choice.

`kubectl triton tune` measures one model of a TritonService under candidate values of its
scheduling settings (instances, max batch size, dynamic batching, preferred batch sizes, queue
delay). Each candidate is the stable revision's spec with that model's config changed, put through
the operator's own checks and rendering (core.observation.check_body, core.builders), served by a
tuning Deployment of one pod that no Service of the TritonService selects, and loaded by a
perf_analyzer Job. Everything here is plain data in, plain data out; the shell (client/tuning.py,
adapters/tuning.py) creates, waits, reads logs and deletes.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import io
import itertools
import json
import shlex
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import yaml

from triton_operator import GROUP, KIND, VERSION
from triton_operator.core.builders import (
    RESTRICTED_CONTAINER_SECURITY,
    RESTRICTED_POD_SECURITY,
    build_configmaps,
    build_deployment,
    manifest_layout,
    read_settings_record,
    selector_labels,
)
from triton_operator.core.names import (
    GRPC_PORT,
    LABEL_REVISION,
    LABEL_SERVICE,
    OPERATOR_KEY,
    SPEC_KEY,
)
from triton_operator.core.observation import check_body, pod_state, revision_manifest
from triton_operator.core.rollout.clock import format_time, parse_time
from triton_operator.models import TritonService
from triton_operator.settings import Settings

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


def run_labels(service: str, run: str) -> dict[str, str]:
    return {"app.kubernetes.io/managed-by": MANAGED_BY, LABEL_TUNING: service, LABEL_RUN: run}


def candidate_labels(service: str, run: str, candidate: Candidate) -> dict[str, str]:
    return {**run_labels(service, run), LABEL_CANDIDATE: candidate.name}


def owner_reference(ts_body: Mapping[str, Any]) -> dict[str, Any]:
    """An ownerReference to the TritonService that is not a controller's: deleting the TritonService
    deletes what a sweep left, and the operator (which owns by controller reference) never adopts it."""
    metadata = ts_body.get("metadata") or {}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": metadata.get("name", ""),
        "uid": metadata.get("uid", ""),
        "controller": False,
        "blockOwnerDeletion": False,
    }


def object_prefix(service: str, run: str) -> str:
    return f"{service}-tune-{run}"


def run_deadline(started: datetime, sweep: Sweep) -> datetime:
    """When the operator removes what a run left (its record it marks Abandoned): --max-seconds after
    its start, then the longest a candidate started just before may take (its pod's start and its perf
    Job, each bounded by --candidate-seconds), and DEADLINE_GRACE_SECONDS."""
    seconds = sweep.max_seconds + 2 * sweep.candidate_seconds + DEADLINE_GRACE_SECONDS
    return started + timedelta(seconds=seconds)


def with_deadline(objects: Iterable[Mapping[str, Any]], deadline: datetime) -> list[dict[str, Any]]:
    """Copies of ``objects`` annotated with the run's deadline (ANNOTATION_DEADLINE)."""
    out = []
    for obj in objects:
        copied = copy.deepcopy(dict(obj))
        metadata = copied.setdefault("metadata", {})
        metadata["annotations"] = {
            **(metadata.get("annotations") or {}),
            ANNOTATION_DEADLINE: format_time(deadline),
        }
        out.append(copied)
    return out


def tuning_objects(  # noqa: PLR0917 - the seven parts of one candidate's objects
    ts_body: Mapping[str, Any],
    stable_configmaps: Sequence[Mapping[str, Any]],
    stable_revision: str,
    sweep: Sweep,
    candidate: Candidate,
    run: str,
    settings: Settings,
) -> list[dict[str, Any]]:
    """A candidate's ConfigMaps and Deployment (one pod): the stable revision's spec, manifest and
    recorded operator settings (core.observation.recorded_settings), the model's config replaced,
    rendered by core.builders, then relabelled so that nothing of the TritonService selects it."""
    spec = stable_spec(stable_configmaps)
    body = candidate_body(ts_body, spec, sweep.model, dict(candidate.config))
    # Tuning pods serve one revision and take no traffic: no in-place agent, no drain on delete.
    body["spec"]["rollout"] = {**(body["spec"].get("rollout") or {}), "modelUpdates": "NewPods"}
    body["spec"]["drainSeconds"] = 0
    checked = check_body(body)
    if checked.ts is None or checked.problems:
        raise TuningError(f"candidate {candidate.name}: " + "; ".join(checked.problems))
    ts: TritonService = checked.ts
    manifest_json = revision_manifest(stable_configmaps, stable_revision)
    revision = f"tune-{run}-{candidate.name}"
    configmaps = build_configmaps(ts, revision, checked.configs, manifest_json)
    deployment = build_deployment(ts, revision, settings, 1, manifest_layout(configmaps))
    labels = candidate_labels(ts.name, run, candidate)
    owner = owner_reference(ts_body)
    for obj in [*configmaps, deployment]:
        obj["metadata"]["labels"] = dict(labels)
        obj["metadata"]["ownerReferences"] = [owner]
    template = deployment["spec"]["template"]
    pod_labels = {
        k: v for k, v in template["metadata"]["labels"].items() if k not in (LABEL_SERVICE, LABEL_REVISION)
    }
    template["metadata"]["labels"] = {**pod_labels, **labels}
    deployment["spec"]["selector"] = {"matchLabels": {LABEL_RUN: run, LABEL_CANDIDATE: candidate.name}}
    deployment["spec"]["progressDeadlineSeconds"] = max(sweep.candidate_seconds, 10)
    return [*configmaps, deployment]


def selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """Whether a Service's equality selector selects an object with ``labels``."""
    return all(labels.get(k) == v for k, v in selector.items())


def service_selects_tuning_pods(ts: TritonService, objects: Sequence[Mapping[str, Any]]) -> bool:
    """Whether Service `<name>` (any revision's selector) would select a tuning pod of ``objects``."""
    pods = [o["spec"]["template"]["metadata"]["labels"] for o in objects if o.get("kind") == "Deployment"]
    return any(selects(selector_labels(ts), labels) for labels in pods)


def stable_spec(configmaps: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The spec the stable revision was rendered from (its ConfigMap's SPEC_KEY)."""
    for configmap in configmaps:
        text = (configmap.get("data") or {}).get(SPEC_KEY)
        if text:
            spec: dict[str, Any] = json.loads(text)
            return spec
    raise TuningError(
        "the stable revision's ConfigMap has no recorded spec (a revision of an older operator?)"
    )


def stable_settings(configmaps: Sequence[Mapping[str, Any]]) -> Settings:
    """The operator settings the stable revision was created with (default image, sync image, security)."""
    for configmap in configmaps:
        text = (configmap.get("data") or {}).get(OPERATOR_KEY)
        recorded = read_settings_record(str(text), Settings()) if text is not None else None
        if recorded is not None:
            return recorded
    raise TuningError("the stable revision's ConfigMap has no recorded operator settings")


def serving_image(configmaps: Sequence[Mapping[str, Any]]) -> str:
    """The tritonserver image the stable revision runs."""
    spec = stable_spec(configmaps)
    return str(spec.get("image") or stable_settings(configmaps).default_image)


PROJECT_TRITON_IMAGE = "localhost/triton-operator/tritonserver-cpu:"
PROJECT_PERF_IMAGE = "localhost/triton-operator/perf-analyzer:"
"""This project's CPU tritonserver image (e2e/images) and the image beside it that carries perf_analyzer."""


def default_perf_image(image: str) -> str:
    """Where perf_analyzer is: NGC ships it in the `-py3-sdk` image beside `-py3`, this project in its
    perf-analyzer image beside its CPU tritonserver; any other image is taken to carry it."""
    if image.startswith(PROJECT_TRITON_IMAGE):
        return PROJECT_PERF_IMAGE + image.removeprefix(PROJECT_TRITON_IMAGE)
    return f"{image}-sdk" if image.endswith("-py3") else image


def perf_script(model: str, address: str, sweep: Sweep, input_data: str | None = None) -> str:
    """The shell script of the perf Job: perf_analyzer once per concurrency (gRPC), each CSV printed
    after CSV_MARKER; perf_analyzer's own output goes to stderr and, on failure, stops the script."""
    lines = ["set -u"]
    for concurrency in sweep.concurrencies:
        args = [
            "perf_analyzer",
            "-m",
            model,
            "-u",
            address,
            "-i",
            "grpc",
            "--concurrency-range",
            f"{concurrency}:{concurrency}",
            "--measurement-interval",
            str(sweep.measurement_ms),
            "--max-trials",
            str(sweep.max_trials),
            "--stability-percentage",
            str(sweep.stability_percentage),
            "-f",
            f"/tmp/c{concurrency}.csv",
        ]
        if input_data is not None:
            args += ["--input-data", input_data]
        command = " ".join(shlex.quote(a) for a in args)
        lines.append(
            f"{command} >&2 || {{ echo 'perf_analyzer failed at concurrency {concurrency}' >&2; exit 1; }}"
        )
        lines.append(f"echo {shlex.quote(CSV_MARKER)}; cat /tmp/c{concurrency}.csv; echo")
    return "\n".join(lines)


def job_scheduling(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The pod fields of a spec that place its pods (and pull their images), for the perf Job."""
    out: dict[str, Any] = {}
    for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName"):
        if spec.get(key):
            out[key] = copy.deepcopy(spec[key])
    if spec.get("imagePullSecrets"):
        out["imagePullSecrets"] = [{"name": name} for name in spec["imagePullSecrets"]]
    return out


def perf_job(  # noqa: PLR0917 - the parts of one Job
    ts_body: Mapping[str, Any],
    run: str,
    candidate: Candidate,
    sweep: Sweep,
    pod_ip: str,
    image: str,
    *,
    spec: Mapping[str, Any] | None = None,
    input_configmap: str | None = None,
) -> dict[str, Any]:
    """The Job that loads a candidate's pod with perf_analyzer (no retries, bounded by a deadline), on
    the same kind of node as the service's pods (``spec``'s nodeSelector, tolerations, affinity)."""
    service = str((ts_body.get("metadata") or {}).get("name", ""))
    return _load_job(
        ts_body,
        f"{object_prefix(service, run)}-{candidate.name}-perf",
        candidate_labels(service, run, candidate),
        sweep,
        f"{pod_ip}:{GRPC_PORT}",
        image,
        spec=spec,
        input_configmap=input_configmap,
    )


def service_perf_job(
    ts_body: Mapping[str, Any],
    run: str,
    sweep: Sweep,
    host: str,
    image: str,
    *,
    spec: Mapping[str, Any] | None = None,
    input_configmap: str | None = None,
) -> dict[str, Any]:
    """The Job that loads the TritonService's own Service at ``host`` (its ClusterIP or DNS name) with
    perf_analyzer as ``perf_job`` loads a tuning pod: what clients reach, whichever revision serves.

    Named `<name>-tune-<run>-service-perf` with the run's labels (deleted with the run's objects).
    """
    service = str((ts_body.get("metadata") or {}).get("name", ""))
    return _load_job(
        ts_body,
        f"{object_prefix(service, run)}-service-perf",
        {**run_labels(service, run), LABEL_CANDIDATE: "service"},
        sweep,
        f"{host}:{GRPC_PORT}",
        image,
        spec=spec,
        input_configmap=input_configmap,
    )


def _load_job(  # noqa: PLR0917 - the parts of one Job
    ts_body: Mapping[str, Any],
    name: str,
    labels: Mapping[str, str],
    sweep: Sweep,
    address: str,
    image: str,
    *,
    spec: Mapping[str, Any] | None,
    input_configmap: str | None,
) -> dict[str, Any]:
    metadata = ts_body.get("metadata") or {}
    input_path = f"{INPUT_DIR}/{INPUT_KEY}" if input_configmap else None
    container: dict[str, Any] = {
        "name": "perf-analyzer",
        "image": image,
        "command": ["sh", "-c", perf_script(sweep.model, address, sweep, input_path)],
        "securityContext": {**copy.deepcopy(RESTRICTED_CONTAINER_SECURITY)},
    }
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": copy.deepcopy(RESTRICTED_POD_SECURITY),
        "containers": [container],
        **job_scheduling(spec or {}),
    }
    if input_configmap:
        pod["volumes"] = [{"name": "input", "configMap": {"name": input_configmap}}]
        container["volumeMounts"] = [{"name": "input", "mountPath": INPUT_DIR, "readOnly": True}]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": metadata.get("namespace", "default"),
            "labels": dict(labels),
            "ownerReferences": [owner_reference(ts_body)],
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": sweep.candidate_seconds,
            "ttlSecondsAfterFinished": 600,
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod},
        },
    }


# ----------------------------------------------------------------- perf_analyzer's output


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One concurrency of one candidate: client-side throughput and latency percentiles (µs)."""

    concurrency: int
    throughput: float
    p50_us: int
    p90_us: int
    p95_us: int
    p99_us: int

    def latency(self, percentile: int) -> int:
        value: int = getattr(self, f"p{percentile}_us")
        return value


_COLUMNS = {
    "concurrency": "Concurrency",
    "throughput": "Inferences/Second",
    "p50_us": "p50 latency",
    "p90_us": "p90 latency",
    "p95_us": "p95 latency",
    "p99_us": "p99 latency",
}


def parse_perf_csv(text: str) -> list[Measurement]:
    """perf_analyzer's ``-f`` CSV (one or more, each with its header) as Measurements.

    Raises ValueError naming what is missing: a column, or any row at all.
    """
    rows: list[Measurement] = []
    header: list[str] | None = None
    for record in csv.reader(io.StringIO(text)):
        cells = [c.strip() for c in record]
        if not cells or not any(cells):
            header = None
            continue
        if cells[0] == _COLUMNS["concurrency"]:
            missing = [c for c in _COLUMNS.values() if c not in cells]
            if missing:
                raise ValueError(f"perf_analyzer's CSV has no column {', '.join(missing)} (header: {cells})")
            header = cells
            continue
        if header is None:
            continue
        values = dict(zip(header, cells, strict=False))
        try:
            rows.append(
                Measurement(
                    concurrency=int(values[_COLUMNS["concurrency"]]),
                    throughput=float(values[_COLUMNS["throughput"]]),
                    **{k: int(float(values[c])) for k, c in _COLUMNS.items() if k.endswith("_us")},
                )
            )
        except (KeyError, ValueError) as exc:
            raise ValueError(f"perf_analyzer's CSV row {cells}: {exc}") from exc
    if not rows:
        raise ValueError("perf_analyzer printed no measurement")
    return rows


def job_output_csv(log: str) -> str:
    """The CSV parts of a perf Job's log (after each CSV_MARKER line)."""
    parts: list[str] = []
    taking = False
    for line in log.splitlines():
        if line.strip() == CSV_MARKER:
            taking = True
            parts.append("")
            continue
        if taking:
            parts.append(line)
    return "\n".join(parts)


# ----------------------------------------------------------------- results and the choice


@dataclasses.dataclass(frozen=True)
class CandidateResult:
    candidate: Candidate
    measurements: tuple[Measurement, ...] = ()
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class Choice:
    """The best (candidate, concurrency) under the bound, and the model's own config's best beside it."""

    candidate: Candidate
    measurement: Measurement
    baseline: Measurement | None

    @property
    def gain(self) -> float | None:
        if self.baseline is None or self.baseline.throughput <= 0:
            return None
        return self.measurement.throughput / self.baseline.throughput


def _best(
    rows: Sequence[tuple[Candidate, Measurement]], percentile: int
) -> tuple[Candidate, Measurement] | None:
    if not rows:
        return None
    # Most throughput; then lower latency; then the earlier candidate (the model's own first).
    return max(rows, key=lambda r: (r[1].throughput, -r[1].latency(percentile), -r[0].index))


def choose(results: Sequence[CandidateResult], percentile: int, bound_us: int | None) -> Choice | None:
    """The highest throughput measured within ``bound_us`` at ``percentile`` (None: any latency)."""
    rows = [
        (r.candidate, m)
        for r in results
        if r.error is None
        for m in r.measurements
        if bound_us is None or m.latency(percentile) <= bound_us
    ]
    best = _best(rows, percentile)
    if best is None:
        return None
    baseline = _best([row for row in rows if row[0].default], percentile)
    return Choice(best[0], best[1], baseline[1] if baseline else None)


def spec_patch(spec: Mapping[str, Any], model: str, config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSON patch (RFC 6902) that gives ``model`` ``config`` in a TritonService with ``spec``;
    its first operation tests the model's name, so it fails rather than change another model."""
    index = _model_index(spec, model)
    return [
        {"op": "test", "path": f"/spec/models/{index}/name", "value": model},
        {"op": "replace", "path": f"/spec/models/{index}/config", "value": dict(config)},
    ]


def patch_yaml(patch: Sequence[Mapping[str, Any]]) -> str:
    return yaml.safe_dump([dict(p) for p in patch], sort_keys=False, default_flow_style=None)


# ----------------------------------------------------------------- the record on the cluster


def measurement_dict(m: Measurement) -> dict[str, Any]:
    return dataclasses.asdict(m)


def record(
    *,
    service: str,
    run: str,
    sweep: Sweep,
    plan: Plan,
    results: Sequence[CandidateResult],
    state: str,
    message: str,
    started_at: str,
    finished_at: str | None,
    spec: Mapping[str, Any] | None,
    cleanup: Sequence[str] = (),
) -> dict[str, Any]:
    """What the results ConfigMap keeps (and `kubectl triton status` shows): JSON-able data.

    ``cleanup``: the deletes that failed (the message says how many; the objects' deadline still
    ends them, core.tuning.expire)."""
    measured = {r.candidate.index: r for r in results}
    choice = choose(results, sweep.percentile, sweep.latency_bound_us)
    if cleanup:
        note = (
            f"cleanup incomplete: {len(cleanup)} delete(s) failed (see cleanup); the operator deletes what "
            "is left after the run's deadline"
        )
        message = f"{message}; {note}" if message else note
    out: dict[str, Any] = {
        "service": service,
        "model": sweep.model,
        "run": run,
        "state": state,
        "message": message,
        "cleanup": list(cleanup),
        "startedAt": started_at,
        "finishedAt": finished_at,
        "percentile": sweep.percentile,
        "latencyBoundMicroseconds": sweep.latency_bound_us,
        "concurrencies": list(sweep.concurrencies),
        "candidates": [
            {
                "name": c.name,
                "default": c.default,
                "settings": describe_knobs(c.config),
                "config": dict(c.config),
                "error": measured[c.index].error if c.index in measured else None,
                "measured": c.index in measured,
                "measurements": [measurement_dict(m) for m in measured[c.index].measurements]
                if c.index in measured
                else [],
            }
            for c in plan.candidates
        ],
        "refused": [{"settings": dict(r.settings), "problems": list(r.problems)} for r in plan.refused],
        "choice": None,
    }
    if choice is not None:
        out["choice"] = {
            "candidate": choice.candidate.name,
            "default": choice.candidate.default,
            "settings": describe_knobs(choice.candidate.config),
            "measurement": measurement_dict(choice.measurement),
            "baseline": measurement_dict(choice.baseline) if choice.baseline else None,
            "gain": round(choice.gain, 3) if choice.gain is not None else None,
            "patch": None
            if choice.candidate.default or spec is None
            else spec_patch(spec, sweep.model, choice.candidate.config),
        }
    return out


def results_name(service: str, run: str) -> str:
    return f"{object_prefix(service, run)}-results"


def _run_configmap(
    ts_body: Mapping[str, Any], run: str, name: str, data: Mapping[str, str], labels: Mapping[str, str]
) -> dict[str, Any]:
    """A ConfigMap of a sweep's run, owned by the TritonService (not as its controller)."""
    metadata = ts_body.get("metadata") or {}
    service = str(metadata.get("name", ""))
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": metadata.get("namespace", "default"),
            "labels": {**run_labels(service, run), **labels},
            "ownerReferences": [owner_reference(ts_body)],
        },
        "data": dict(data),
    }


def results_configmap(ts_body: Mapping[str, Any], run: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """The ConfigMap that keeps a sweep's record after its pods are gone (owned by the TritonService)."""
    service = str((ts_body.get("metadata") or {}).get("name", ""))
    return _run_configmap(
        ts_body,
        run,
        results_name(service, run),
        {RESULTS_KEY: json.dumps(data, sort_keys=True)},
        {LABEL_RESULTS: "true"},
    )


def input_configmap(ts_body: Mapping[str, Any], run: str, data: str) -> dict[str, Any]:
    """The ConfigMap that hands a user's ``--input-data`` to the run's perf_analyzer Jobs."""
    service = str((ts_body.get("metadata") or {}).get("name", ""))
    return _run_configmap(ts_body, run, f"{object_prefix(service, run)}-input", {INPUT_KEY: data}, {})


KEEP_RUNS = 5
"""Records kept per TritonService: a sweep's end deletes the older ones."""


def expired_runs(runs: Iterable[str], keep: int = KEEP_RUNS) -> list[str]:
    """The runs whose records go: all but the ``keep`` latest (run ids sort in time order)."""
    ordered = sorted(set(runs))
    return ordered[: max(0, len(ordered) - keep)]


def read_record(configmap: Mapping[str, Any]) -> dict[str, Any] | None:
    try:
        data = json.loads((configmap.get("data") or {}).get(RESULTS_KEY) or "null")
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


# ----------------------------------------------------------------- what people read


def _us(value: Any) -> str:
    return f"{int(value) / 1000:.1f}" if value is not None else "-"


def result_rows(data: Mapping[str, Any]) -> list[list[str]]:
    """The table of a record: one row per candidate and concurrency (a row per candidate not measured)."""
    chosen = (data.get("choice") or {}).get("candidate")
    best_conc = ((data.get("choice") or {}).get("measurement") or {}).get("concurrency")
    bound = data.get("latencyBoundMicroseconds")
    percentile = int(data.get("percentile") or 95)
    rows: list[list[str]] = []
    for c in data.get("candidates") or []:
        name = str(c.get("name")) + (" (own)" if c.get("default") else "")
        if not c.get("measurements"):
            reason = c.get("error") or ("not run" if not c.get("measured") else "no measurement")
            rows.append([name, str(c.get("settings")), "-", "-", "-", "-", "-", str(reason)])
            continue
        for m in c["measurements"]:
            latency = m.get(f"p{percentile}_us")
            note = ""
            if bound is not None and latency is not None and latency > bound:
                note = "over bound"
            if c.get("name") == chosen and m.get("concurrency") == best_conc:
                note = "<- best"
            rows.append(
                [
                    name,
                    str(c.get("settings")),
                    str(m.get("concurrency")),
                    f"{float(m.get('throughput', 0)):.1f}",
                    _us(m.get("p50_us")),
                    _us(m.get("p95_us")),
                    _us(m.get("p99_us")),
                    note,
                ]
            )
    return rows


RESULT_HEADER = ["CANDIDATE", "SETTINGS", "CONC", "INFER/S", "P50 MS", "P95 MS", "P99 MS", ""]


def summary(data: Mapping[str, Any]) -> str:
    """One line: the run, its state, and the choice with its gain over the model's own config."""
    percentile = data.get("percentile")
    bound = data.get("latencyBoundMicroseconds")
    under = f"p{percentile} <= {_us(bound)} ms" if bound is not None else f"p{percentile}, no bound"
    head = f"run {data.get('run')} of model {data.get('model')}: {data.get('state')}"
    if data.get("message"):
        head += f" ({data['message']})"
    choice = data.get("choice")
    if not choice:
        return f"{head}; best under {under}: none"
    m = choice.get("measurement") or {}
    gain = (
        f", x{choice['gain']:.2f} the model's own" if choice.get("gain") and not choice.get("default") else ""
    )
    own = " (the model's own config)" if choice.get("default") else ""
    return (
        f"{head}; best under {under}: {choice.get('candidate')}{own} [{choice.get('settings')}] at "
        f"concurrency {m.get('concurrency')}, {float(m.get('throughput', 0)):.1f} infer/s{gain}"
    )


def refused_lines(data: Mapping[str, Any]) -> list[str]:
    return [
        f"  {json.dumps(r.get('settings'), sort_keys=True)}: {'; '.join(r.get('problems') or [])}"
        for r in data.get("refused") or []
    ]


# ----------------------------------------------------------------- reading the cluster back


@dataclasses.dataclass(frozen=True)
class PodVerdict:
    """A tuning pod as read: Ready at ``ip``, failed (``failure``: why), or still starting (``detail``)."""

    ip: str | None = None
    failure: str | None = None
    detail: str = "no pod yet"


def pod_verdict(pods: Sequence[Mapping[str, Any]]) -> PodVerdict:
    """Whether a candidate's pod serves, will never serve, or is still starting (observation.pod_state)."""
    states = [pod_state(p) for p in pods]
    live = [s for s in states if not s.terminating]
    if not live:
        return PodVerdict()
    state = live[0]
    if state.ready and state.ip:
        return PodVerdict(ip=state.ip, detail="Ready")
    if state.sync_failure:
        return PodVerdict(failure=f"pod {state.name}: sync failed: {state.sync_failure}")
    if state.crash_looping(threshold=2) or state.waiting_reason:
        reason = state.waiting_reason or "restarting"
        message = f": {state.waiting_message}" if state.waiting_message else ""
        failures = "; ".join(f"{f.model} {f.version}: {f.reason}" for f in state.triton_failures)
        extra = f" (Triton: {failures})" if failures else ""
        return PodVerdict(failure=f"pod {state.name}: {reason}{message}{extra}")
    if state.unschedulable:
        return PodVerdict(detail=f"pod {state.name} unschedulable: {state.unschedulable}")
    return PodVerdict(detail=f"pod {state.name} starting")


def job_verdict(job: Mapping[str, Any]) -> str | None:
    """``complete`` or ``failed`` once a Job has finished (its conditions), None while it runs."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Complete":
            return "complete"
        if condition.get("type") == "Failed":
            return "failed"
    return None


# ----------------------------------------------------------------- the operator's end of runs left behind


@dataclasses.dataclass(frozen=True)
class Expiry:
    """What the operator does with what sweeps left past their deadline (expire)."""

    delete: tuple[tuple[str, str, str], ...] = ()
    """(kind, namespace, name) of the tuning objects to delete (their pods go with them)."""
    abandon: tuple[tuple[str, str, str, dict[str, Any]], ...] = ()
    """(namespace, name, resourceVersion, record) of the records that still say Running: marked Abandoned."""


def deadline_of(obj: Mapping[str, Any]) -> datetime | None:
    """A tuning object's deadline: its ANNOTATION_DEADLINE; without a readable one, its creation plus
    LONGEST_RUN_SECONDS (no sweep runs longer); None when it has neither."""
    metadata = obj.get("metadata") or {}
    deadline = parse_time((metadata.get("annotations") or {}).get(ANNOTATION_DEADLINE))
    if deadline is not None:
        return deadline
    created = parse_time(metadata.get("creationTimestamp"))
    return created + timedelta(seconds=LONGEST_RUN_SECONDS) if created is not None else None


def abandoned_record(data: Mapping[str, Any], deadline: datetime, now: datetime) -> dict[str, Any]:
    """A record that still said Running at its deadline, as the operator leaves it."""
    return {
        **data,
        "state": ABANDONED,
        "message": (
            f"the sweep's client stopped before the run ended (deadline {format_time(deadline)} passed with "
            f"the record still Running{': ' + str(data['message']) if data.get('message') else ''}); "
            "the operator deleted the objects it left"
        ),
        "finishedAt": format_time(now),
    }


def expire(objects: Sequence[Mapping[str, Any]], now: datetime) -> Expiry:
    """What to do with the tuning objects (``objects``: every object with LABEL_TUNING, any kind, each
    with its ``kind``) at ``now``: each past its deadline is deleted (Deployments, Jobs, Services, input
    ConfigMaps; never pods, which their owners' deletion takes), and each record past its deadline that
    still says Running is marked Abandoned (records stay: the sweep's end keeps the latest)."""
    delete: list[tuple[str, str, str]] = []
    abandon: list[tuple[str, str, str, dict[str, Any]]] = []
    for obj in objects:
        metadata = obj.get("metadata") or {}
        labels = metadata.get("labels") or {}
        kind = str(obj.get("kind", ""))
        if LABEL_TUNING not in labels or kind == "Pod" or metadata.get("deletionTimestamp"):
            continue
        deadline = deadline_of(obj)
        if deadline is None or now < deadline:
            continue
        where = (str(metadata.get("namespace", "")), str(metadata.get("name", "")))
        if labels.get(LABEL_RESULTS) != "true":
            delete.append((kind, *where))
            continue
        data = read_record(obj)
        if data is not None and data.get("state") == RUNNING:
            abandon.append(
                (*where, str(metadata.get("resourceVersion", "")), abandoned_record(data, deadline, now))
            )
    return Expiry(tuple(sorted(delete)), tuple(sorted(abandon, key=lambda a: a[:2])))


def next_deadline(objects: Sequence[Mapping[str, Any]], now: datetime) -> datetime | None:
    """The earliest deadline after ``now`` among tuning objects (pods aside): when expire has work next."""
    upcoming = [
        d
        for o in objects
        if o.get("kind") != "Pod" and LABEL_TUNING in ((o.get("metadata") or {}).get("labels") or {})
        for d in [deadline_of(o)]
        if d is not None and d > now
    ]
    return min(upcoming, default=None)


def record_patch(data: Mapping[str, Any], resource_version: str) -> dict[str, Any]:
    """The merge patch that writes ``data`` into a record unless it changed since ``resource_version``."""
    return {
        "metadata": {"resourceVersion": resource_version},
        "data": {RESULTS_KEY: json.dumps(data, sort_keys=True)},
    }
