"""A sweep's objects, pure: each candidate's tuning pod and perf_analyzer Job, the run's ConfigMaps."""

from __future__ import annotations

import copy
import json
import shlex
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from triton_operator import GROUP, KIND, VERSION
from triton_operator.core.objects.builders import (
    RESTRICTED_CONTAINER_SECURITY,
    RESTRICTED_POD_SECURITY,
    build_configmaps,
    build_deployment,
    manifest_layout,
    read_settings_record,
    selector_labels,
)
from triton_operator.core.objects.names import (
    GRPC_PORT,
    LABEL_REVISION,
    LABEL_SERVICE,
    OPERATOR_KEY,
    SPEC_KEY,
)
from triton_operator.core.observed.observation import check_body, revision_manifest
from triton_operator.core.rollout.clock import format_time
from triton_operator.core.tuning.sweep import (
    ANNOTATION_DEADLINE,
    CSV_MARKER,
    DEADLINE_GRACE_SECONDS,
    INPUT_DIR,
    INPUT_KEY,
    LABEL_CANDIDATE,
    LABEL_RESULTS,
    LABEL_RUN,
    LABEL_TUNING,
    MANAGED_BY,
    RESULTS_KEY,
    Candidate,
    Sweep,
    TuningError,
    candidate_body,
)
from triton_operator.models import TritonService
from triton_operator.settings import Settings


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
    recorded operator settings (core.observed.observation.recorded_settings), the model's config replaced,
    rendered by core.objects.builders, then relabelled so that nothing of the TritonService selects it."""
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
