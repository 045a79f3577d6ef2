"""Desired Kubernetes objects of a TritonService (ConfigMaps, Deployment, Services, PDB, Event) as dicts."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from triton_operator import GROUP, KIND, VERSION, logs
from triton_operator.core.objects.names import (
    AGENT_CONTAINER,
    AGENT_PORT,
    AGENT_READY_PATH,
    AGENT_STATE_DIR,
    AGENT_STATE_VOLUME,
    APP_NAME,
    COMPONENT,
    CONFIG_DIR,
    CONFIG_VOLUME,
    CONFIGS_DIR,
    GRPC_PORT,
    HTTP_PORT,
    INPLACE_DIR,
    INPLACE_STATE_KEY,
    INPLACE_TARGET_ANNOTATION,
    INPLACE_TARGET_FILE,
    INPLACE_TARGET_ITEM,
    INPLACE_VOLUME,
    LABEL_COMPONENT,
    LABEL_INPLACE_HOST,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_REVISION,
    LABEL_SERVICE,
    LEAVE_DIR,
    LEAVE_DONE_FILE,
    LEAVE_VOLUME,
    MANAGED_BY,
    MANIFEST_DIR,
    MANIFEST_PATH,
    MANIFEST_SUBDIR,
    METRICS_PORT,
    MODELS_DIR,
    MODELS_VOLUME,
    OPERATOR_KEY,
    PLACEHOLDER_UID,
    POD_NAME_ENV,
    POOL_ASSIGNMENT_FILE,
    POOL_ASSIGNMENT_ITEM,
    POOL_LABELS_ITEM,
    PVC_ROOT,
    REPOSITORY_VOLUME,
    SHM_VOLUME,
    SPEC_KEY,
    SYNC_CONTAINER,
    TRITON_CONTAINER,
    config_key,
    inplace_config_key,
    inplace_configmap_name,
    inplace_manifest_key,
    object_name,
    part_configmap_name,
)
from triton_operator.core.objects.traffic import service_body
from triton_operator.core.pool.assignment import ASSIGNMENT_ANNOTATION
from triton_operator.core.repository import manifestparts
from triton_operator.core.repository.cache_rules import (
    AUDIENCE,
    HOST_ENV,
    POD_ENV,
    PORT_ENV,
    PUBLIC_KEY_ENV,
    TOKEN_DIR,
    TOKEN_ENV,
    TOKEN_PATH,
    TOKEN_SECONDS,
    TOKEN_VOLUME,
)
from triton_operator.core.repository.manifest import (
    StoreRef,
    manifest_to_json,
    model_sources,
    unpinned_manifest,
)
from triton_operator.core.repository.manifestparts import MANIFEST_KEY
from triton_operator.core.repository.revision import revision_hash
from triton_operator.core.repository.shared_files import DRIVER as SHARED_DRIVER
from triton_operator.core.repository.shared_files import FILES_ENV
from triton_operator.core.repository.shared_files import MOUNT_PATH as SHARED_MOUNT_PATH
from triton_operator.core.repository.shared_files import VOLUME as SHARED_VOLUME
from triton_operator.models import ModelUpdates, Strategy, TritonService
from triton_operator.settings import Settings

READINESS_PATH = "/v2/health/ready"
LIVENESS_PATH = "/v2/health/live"
STARTUP_PERIOD_SECONDS = 1
"""Startup probes run every second: a pod is Ready within a second of Triton loading its models."""
READINESS_PERIOD_SECONDS = 2
READINESS_FAILURES = 2
READINESS_TIMEOUT_SECONDS = 3
"""tritonserver's readiness probe (pods without the model agent), and the agent's in a revision
recorded before the quick one (settings.quick_agent_probe False): every 2 s, out at the second failure."""
AGENT_READINESS_PERIOD_SECONDS = 1
AGENT_READINESS_FAILURES = 1
AGENT_READINESS_TIMEOUT_SECONDS = 5
"""The agent's readiness probe (a revision's pods with the model agent, settings.quick_agent_probe):
every second, out of the Service at the first failure, so that a pod is NotReady within a second of
an in-place change beginning (its drain). The agent answers from memory, on a handler slot kept for
the probe: a failure is a 503 it meant (a change, a model not READY, or no readiness check for 5 s:
Triton not answering its reads) or no answer within 5 s, as long as the agent's own readiness takes
to go stale; a probe slower than the period delays the next, it does not fail."""
TRITON_EXIT_TIMEOUT_SECONDS = 30
"""tritonserver's default --exit-timeout-secs: how long it waits for in-flight requests on SIGTERM."""
TERMINATION_MARGIN_SECONDS = 5

# ----------------------------------------------------------------- revision inputs


def triton_image(ts: TritonService, settings: Settings) -> str:
    return ts.spec.image or settings.default_image


def pod_template_inputs(ts: TritonService, settings: Settings) -> dict[str, Any]:
    """Everything in the spec and settings that shapes a pod, minus replicas, rollout and Service.

    Model configs are left out here: they enter the revision hash as rendered config.pbtxt text.
    Defaults are left out too, so adding a field with a default to the API keeps existing hashes.
    """
    spec: dict[str, Any] = ts.spec.model_dump(
        by_alias=True, exclude_none=True, exclude_defaults=True, mode="json"
    )
    # The pool is placed per pass and carried out by the pods' agents, not by the template; only
    # whether there is one is (a pooled pod's agent reads its assignment: a volume item and a flag).
    for served_elsewhere in ("replicas", "rollout", "service", "image", "pool"):
        spec.pop(served_elsewhere, None)
    if not spec.get("modelVolume"):
        spec.pop("modelVolume", None)  # `modelVolume: {}` renders the pod that no modelVolume does
    repository = dict(spec.get("repository", {}))
    repository.pop("pollIntervalSeconds", None)
    spec["repository"] = repository
    models = spec.get("models", [])
    spec["models"] = [{k: v for k, v in m.items() if k not in _NOT_IN_TEMPLATE} for m in models]
    # The sync image and its pull policy are the operator's plumbing, not what a pod serves: an
    # operator upgrade must not make a new revision of every TritonService (see kept_sync_image).
    inputs: dict[str, Any] = {"spec": spec, "image": triton_image(ts, settings)}
    # The startup probe follows the rollout's deadline when startupTimeoutSeconds is unset.
    inputs["startupTimeoutSeconds"] = ts.spec.startup_timeout()
    inputs["prometheusScrape"] = settings.prometheus_scrape
    if ts.spec.pool is not None:
        inputs["pool"] = True  # left out when off, so existing hashes stay
        if settings.pool_leave:
            # A leaving pod's wait shapes its preStop and grace period (a revision recorded before
            # has neither: left out, so its hash stays).
            inputs["poolLeaveSeconds"] = ts.spec.pool.leave_seconds
    if settings.agent_pods:
        # One pod shape (has_agent): modelUpdates only says how changes roll out, so switching it
        # keeps the revision. The key tells these revisions from one of the same spec made before.
        inputs["agentPods"] = True
    elif in_place(ts):
        # A revision made before one pod shape (recorded): the agent and its volumes were part of the
        # pod only with in-place updates, so switching them on or off made new pods (left out when
        # off, so existing hashes stay).
        inputs["modelUpdates"] = ModelUpdates.IN_PLACE.value
    return inputs


_NOT_IN_TEMPLATE = frozenset({"config", "memory", "minCopies", "maxCopies"})
"""A model's fields that are not pod template inputs: its config enters the hash as rendered text,
and its pool fields (memory, least and most copies) are the pool's placement."""


def has_agent(ts: TritonService, settings: Settings | None) -> bool:
    """Whether a revision's pods run the model agent: every revision made since one pod shape
    (settings.agent_pods, recorded per revision), and one made before only with in-place updates."""
    return (settings is not None and settings.agent_pods) or in_place(ts)


def fills_itself(settings: Settings | None) -> bool:
    """Whether a revision's pods are of the one pod shape: no sync init container; tritonserver
    starts with no model and the agent beside it fetches and loads each model as its bytes land."""
    return settings is not None and settings.agent_pods


def in_place(ts: TritonService) -> bool:
    """Whether the spec opts in to in-place model updates (spec.rollout.modelUpdates: InPlace)."""
    return ts.spec.rollout.model_updates == ModelUpdates.IN_PLACE


def compute_revision(
    ts: TritonService,
    settings: Settings,
    configs: Mapping[str, str],
    manifest_digest: str | None,
    recorded: Mapping[str, Settings] | None = None,
) -> str:
    """The revision a valid spec asks for (see core.repository.revision.revision_hash).

    ``recorded``: the service's existing revisions with the operator settings each was created
    with (core.observed.observation.recorded_revisions). A spec that one of them rendered under its own
    settings asks for that revision, whatever today's settings: a new default tritonserver image
    (or scrape setting) applies to new revisions only, never re-hashing a spec that did not change.
    """
    for revision, earlier in sorted((recorded or {}).items()):
        if revision_hash(pod_template_inputs(ts, earlier), configs, manifest_digest) == revision:
            return revision
    return revision_hash(pod_template_inputs(ts, settings), configs, manifest_digest)


RECORDED_SETTINGS: dict[str, str] = {
    "defaultImage": "default_image",
    "syncImage": "sync_image",
    "syncImagePullPolicy": "sync_image_pull_policy",
    "podSecurityDefaults": "pod_security_defaults",
    "tritonLogOnExit": "triton_log_on_exit",
    "syncLogOnExit": "sync_log_on_exit",
    "prometheusScrape": "prometheus_scrape",
    "nodeCachePort": "node_cache_port",
    "logFormat": "log_format",
    "nodeCacheToken": "node_cache_token",
    "nodeCachePublicKey": "node_cache_public_key",
    "nodeCacheSharedFiles": "node_cache_shared_files",
    "agentPods": "agent_pods",
    "quickAgentProbe": "quick_agent_probe",
    "poolLeave": "pool_leave",
}
"""The operator settings that shape a revision's pod template (OPERATOR_KEY's keys -> Settings'
fields): recorded when the revision is created, and what it is re-rendered with ever after."""


def settings_record(settings: Settings) -> str:
    """What a revision's ConfigMap keeps under OPERATOR_KEY: the RECORDED_SETTINGS of ``settings``."""
    record = {key: getattr(settings, field) for key, field in RECORDED_SETTINGS.items()}
    if record["logFormat"] == "text":
        record["logFormat"] = None  # the default, left out: revisions recorded before it read the same
    if not record["quickAgentProbe"]:
        record["quickAgentProbe"] = None  # as a revision recorded before it: its record unchanged
    if not record["poolLeave"]:
        record["poolLeave"] = None  # as a revision recorded before it: its record unchanged
    if not record["nodeCacheSharedFiles"]:
        record["nodeCacheSharedFiles"] = None  # as a revision recorded before it: its record unchanged
    return json.dumps({k: v for k, v in record.items() if v is not None}, sort_keys=True)


def read_settings_record(text: str | None, settings: Settings) -> Settings | None:
    """``settings`` with the recorded fields of an OPERATOR_KEY text; None when there is none (or
    it is unreadable: then the revision's live Deployment says,
    core.observed.observation.recorded_settings)."""
    try:
        record = json.loads(text) if text is not None else None
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("defaultImage"), str):
        return None
    fields: dict[str, Any] = {f: record[k] for k, f in RECORDED_SETTINGS.items() if k in record}
    # Left out of the record when unset (the cluster's default policy).
    fields["sync_image_pull_policy"] = record.get("syncImagePullPolicy")
    # A revision recorded before the sync container's terminationMessagePolicy keeps going without.
    fields["sync_log_on_exit"] = record.get("syncLogOnExit") is True
    # A revision recorded before the node cache (or with it off) keeps syncing without it.
    port = record.get("nodeCachePort")
    fields["node_cache_port"] = port if isinstance(port, int) and not isinstance(port, bool) else None
    # A revision recorded before the log format was (or with text) keeps its pods' text logs.
    fields["log_format"] = "json" if record.get("logFormat") == "json" else "text"
    # A revision recorded before the node cache checked tokens keeps its pods without one.
    fields["node_cache_token"] = record.get("nodeCacheToken") is True
    # A revision recorded before the cache's key (or with another) keeps its pods as they are.
    key = record.get("nodeCachePublicKey")
    fields["node_cache_public_key"] = key if isinstance(key, str) else None
    # A revision recorded before one pod shape keeps its sync init container (and its agent only
    # with in-place updates) until it is replaced.
    fields["agent_pods"] = record.get("agentPods") is True
    # A revision recorded before the quick agent probe keeps its probe (every 2 s, out at the second
    # failure) and its agent's drain on it.
    fields["quick_agent_probe"] = record.get("quickAgentProbe") is True
    # A pool revision recorded before a leaving pod waited on its models' Services keeps its preStop
    # (drainSeconds alone).
    fields["pool_leave"] = record.get("poolLeave") is True
    # A revision recorded before the node cache's shared files (or with them off) keeps copying.
    fields["node_cache_shared_files"] = record.get("nodeCacheSharedFiles") is True
    return dataclasses.replace(settings, **fields)


# ----------------------------------------------------------------- metadata


def build_labels(ts: TritonService, revision: str | None = None) -> dict[str, str]:
    """Labels of every object; ``revision`` adds the revision label (Deployments, ConfigMaps, pods)."""
    labels = {
        LABEL_NAME: APP_NAME,
        LABEL_INSTANCE: ts.name,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_COMPONENT: COMPONENT,
        LABEL_SERVICE: ts.name,
    }
    if revision is not None:
        labels[LABEL_REVISION] = revision
    return labels


def selector_labels(ts: TritonService, revision: str | None = None) -> dict[str, str]:
    """Labels selecting a service's pods: all revisions, or one."""
    selector = {LABEL_SERVICE: ts.name}
    if revision is not None:
        selector[LABEL_REVISION] = revision
    return selector


def build_owner_reference(ts_body: Mapping[str, Any]) -> dict[str, Any]:
    """The controller ownerReference to a TritonService body (garbage collection on delete)."""
    metadata = ts_body.get("metadata") or {}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": metadata.get("name", ""),
        "uid": metadata.get("uid") or PLACEHOLDER_UID,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(ts: TritonService, name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": ts.namespace,
        "labels": labels,
        "ownerReferences": [build_owner_reference({"metadata": ts.metadata})],
    }


# ----------------------------------------------------------------- ConfigMaps


@dataclasses.dataclass(frozen=True)
class ManifestLayout:
    """How a revision stores its manifest: plain JSON beside the configs (``parts`` 0), or gzipped
    in ``parts`` parts, part 0 beside the configs and the others in ConfigMaps of their own."""

    parts: int = 0

    @property
    def plain(self) -> bool:
        return self.parts == 0


PLAIN = ManifestLayout()


def configs_bytes(configs: Mapping[str, str]) -> int:
    return sum(len(text.encode("utf-8")) for text in configs.values())


def build_configmaps(
    ts: TritonService,
    revision: str,
    configs: Mapping[str, str],
    manifest_json: str | None,
    *,
    layout: ManifestLayout | None = None,
    existing: Sequence[Mapping[str, Any]] = (),
    settings: Settings | None = None,
) -> list[dict[str, Any]]:
    """The revision's ConfigMaps: `<name>-<rev>` with `<model>.config.pbtxt` per model and the
    manifest (unpinned if None), then one ConfigMap per further part of a manifest in parts.

    The manifest is plain JSON under MANIFEST_KEY when ``layout`` says so, or (``layout`` None, a
    new revision) when it fits beside the configs in CONFIGMAP_BUDGET; else gzipped parts, part 0
    beside the configs. ``existing``: the revision's ConfigMaps as stored, whose parts are kept
    when they give back the same manifest. ``settings``: the operator settings the revision's pod
    template is rendered with, recorded under OPERATOR_KEY (core.observed.observation.recorded_settings).
    Raises manifestparts.ManifestTooLarge when the manifest needs more than MAX_PARTS parts.
    """
    text = manifest_json if manifest_json is not None else unpinned_manifest_json(ts)
    data = {config_key(model): body for model, body in sorted(configs.items())}
    # The spec it was rendered from (never mounted; updated while it is the spec's revision).
    data[SPEC_KEY] = stored_spec(ts)
    if settings is not None:
        data[OPERATOR_KEY] = settings_record(settings)
    main: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(ts, object_name(ts, revision), build_labels(ts, revision)),
        "data": data,
    }
    # What is left for the manifest (core.observed.observation.configmap_problem keeps the rest within the
    # budget): a manifest with no room here goes entirely to parts of their own.
    room = max(0, manifestparts.CONFIGMAP_BUDGET - sum(len(v.encode("utf-8")) for v in data.values()))
    if (layout is None and len(text.encode("utf-8")) <= room) or (layout is not None and layout.plain):
        data[MANIFEST_KEY] = text
        return [main]
    kept = manifestparts.stored_parts(existing)
    contiguous = sorted(kept) == list(range(len(kept)))
    packed = manifestparts.pack(text, room, kept=[kept[i] for i in sorted(kept)] if contiguous else None)
    out = [main]
    for index, part in enumerate(packed.parts):
        binary = {manifestparts.part_key(index): manifestparts.encode_part(part)}
        if index == 0:
            main["binaryData"] = binary
            continue
        name = part_configmap_name(ts, revision, index)
        out.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": _metadata(ts, name, build_labels(ts, revision)),
                "binaryData": binary,
            }
        )
    return out


@dataclasses.dataclass(frozen=True)
class RevisionFiles:
    """What a pod needs of one revision to serve it: its pinned manifest JSON and rendered configs."""

    manifest_json: str
    configs: Mapping[str, str]


def inplace_state_json(stable: str, next_revision: str | None) -> str:
    """The in-place ConfigMap's state.json: the revision every pod serves, and the one being loaded."""
    return json.dumps({"stable": stable, "next": next_revision}, sort_keys=True)


def inplace_data(
    stable: str, next_revision: str | None, files: Mapping[str, RevisionFiles]
) -> dict[str, str]:
    """The in-place ConfigMap's data: state.json and, for stable and next, each manifest and config."""
    data = {INPLACE_STATE_KEY: inplace_state_json(stable, next_revision)}
    for revision in dict.fromkeys(r for r in (stable, next_revision) if r):
        held = files[revision]
        data[inplace_manifest_key(revision)] = held.manifest_json
        for model, text in sorted(held.configs.items()):
            data[inplace_config_key(revision, model)] = text
    return data


def inplace_data_bytes(data: Mapping[str, str]) -> int:
    return sum(len(k.encode("utf-8")) + len(v.encode("utf-8")) for k, v in data.items())


def build_inplace_configmap(ts: TritonService, host: str, data: Mapping[str, str]) -> dict[str, Any]:
    """ConfigMap `<deployment>-inplace` of the host revision's pods (their agents read it; optional
    in their pod template, so its absence means: serve the pod's own revision)."""
    labels = {**build_labels(ts), LABEL_INPLACE_HOST: host}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(ts, inplace_configmap_name(ts, host), labels),
        "data": dict(data),
    }


def stored_spec(ts: TritonService) -> str:
    """The copy of the spec a revision's ConfigMap keeps under SPEC_KEY."""
    return json.dumps(ts.spec.model_dump(mode="json", by_alias=True, exclude_unset=True), sort_keys=True)


def build_configmap(
    ts: TritonService, revision: str, configs: Mapping[str, str], manifest_json: str | None
) -> dict[str, Any]:
    """The revision's own ConfigMap `<name>-<rev>` (build_configmaps' first)."""
    return build_configmaps(ts, revision, configs, manifest_json)[0]


def manifest_layout(configmaps: Sequence[Mapping[str, Any]]) -> ManifestLayout:
    """The layout of ConfigMaps build_configmaps made (what the Deployment must mount)."""
    if any(MANIFEST_KEY in (c.get("data") or {}) for c in configmaps):
        return PLAIN
    keys = [k for c in configmaps for k in c.get("binaryData") or {}]
    return ManifestLayout(sum(1 for k in keys if manifestparts.part_index(str(k)) is not None))


def unpinned_manifest_json(ts: TritonService) -> str:
    """A manifest that pins nothing (pvc://, or a store not listed yet): models and policies only."""
    manifest = unpinned_manifest(StoreRef.from_repository(ts.spec.repository), model_sources(ts.spec.models))
    return manifest_to_json(manifest)


# ----------------------------------------------------------------- Deployment


def pvc_claim(uri: str) -> str:
    """pvc://CLAIM/sub/path -> CLAIM."""
    return uri.split("://", 1)[1].partition("/")[0]


def _resources(ts: TritonService) -> dict[str, Any]:
    res = ts.spec.resources
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if res.cpu is not None:
        requests["cpu"] = res.cpu
    if res.cpu_limit is not None:
        limits["cpu"] = res.cpu_limit
    if res.memory is not None:
        requests["memory"] = res.memory
        limits["memory"] = res.memory
    if res.gpus > 0:
        # Extended resources must be requested and limited alike.
        requests[res.gpu_resource_name] = str(res.gpus)
        limits[res.gpu_resource_name] = str(res.gpus)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def triton_args(ts: TritonService, settings: Settings | None = None) -> list[str]:
    """tritonserver's arguments: our repository, control mode, models and ports, then serverArgs."""
    args = [f"--model-repository={MODELS_DIR}", "--model-control-mode=explicit"]
    if fills_itself(settings):
        # One pod shape: tritonserver starts with no model; the agent loads each model through the
        # model control API as soon as its bytes are in (and loads them again should tritonserver
        # restart), so that loads overlap the download.
        pass
    elif in_place(ts):
        # What /models holds: a tritonserver that restarts after an in-place update loads the
        # models the agent placed there, not the ones the pod started with. The pod's readiness is
        # the agent's (every model of the revision it serves READY); Triton's own stays strict.
        args += ["--load-model=*"]
    else:
        args += [f"--load-model={m.name}" for m in ts.spec.models]
    args += [f"--http-port={HTTP_PORT}", f"--grpc-port={GRPC_PORT}", f"--metrics-port={METRICS_PORT}"]
    return args + list(ts.spec.server_args)


def _probe(path: str, period: int, failures: int, timeout: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": timeout,
    }


def readiness_timing(ts: TritonService, settings: Settings | None = None) -> tuple[int, int, int]:
    """The readiness probe's (periodSeconds, failureThreshold, timeoutSeconds): the agent's quick
    one in pods with the model agent (settings.quick_agent_probe), else every 2 s, out at the second
    failure (tritonserver's own readiness, and the agent's in a revision recorded before)."""
    if has_agent(ts, settings) and settings is not None and settings.quick_agent_probe:
        return AGENT_READINESS_PERIOD_SECONDS, AGENT_READINESS_FAILURES, AGENT_READINESS_TIMEOUT_SECONDS
    return READINESS_PERIOD_SECONDS, READINESS_FAILURES, READINESS_TIMEOUT_SECONDS


def readiness_probe(ts: TritonService, settings: Settings | None = None) -> dict[str, Any]:
    """tritonserver's readiness (strict: every model loaded READY); in pods with the model agent
    (has_agent) the agent's (GET :AGENT_PORT/v1/ready: every model of the revision the pod serves
    READY, and false while the agent drains the pod for a change), timed by readiness_timing."""
    period, failures, timeout = readiness_timing(ts, settings)
    probe = _probe(READINESS_PATH, period=period, failures=failures, timeout=timeout)
    if has_agent(ts, settings):
        probe["httpGet"] = {"path": AGENT_READY_PATH, "port": AGENT_PORT}
    return probe


def server_arg(server_args: Sequence[str], flag: str) -> str | None:
    """The last value serverArgs give ``flag`` (``--flag=V`` or ``--flag V``); None: not given."""
    value: str | None = None
    for index, arg in enumerate(server_args):
        name, has_value, rest = arg.partition("=")
        if name == flag:
            if has_value:
                value = rest
            elif index + 1 < len(server_args):
                value = server_args[index + 1]
    return value


def exit_timeout_seconds(server_args: Sequence[str]) -> int:
    """tritonserver's --exit-timeout-secs from serverArgs (``--flag=N`` or ``--flag N``), else its default."""
    value = server_arg(server_args, "--exit-timeout-secs")
    if value is not None and value.strip().isdigit():
        return int(value)
    return TRITON_EXIT_TIMEOUT_SECONDS


def metrics_interval_args(server_args: Sequence[str]) -> list[str]:
    """The pool agent's --triton-metrics-interval from serverArgs' --metrics-interval-ms (how often
    tritonserver refreshes the GPU gauges a GPU model's memory is measured from; docs/pool.md), none
    when serverArgs leave it at Triton's default."""
    value = server_arg(server_args, "--metrics-interval-ms")
    if value is None or not value.strip().isdigit() or int(value) <= 0:
        return []
    return ["--triton-metrics-interval", f"{int(value) / 1000:g}"]


def leave_seconds(ts: TritonService, settings: Settings | None = None) -> int:
    """How long a leaving pool pod may serve on after its drain (spec.pool.leaveSeconds; 0 without a
    pool, in a revision recorded before the wait, settings.pool_leave, or in pods without the agent,
    which waits)."""
    if ts.spec.pool is None:
        return 0
    if settings is not None and not (settings.pool_leave and has_agent(ts, settings)):
        return 0
    return ts.spec.pool.leave_seconds


def termination_grace_seconds(ts: TritonService, settings: Settings | None = None) -> int:
    """The drain (preStop sleep) and, in a pool, the most a leaving pod waits for its models to answer
    elsewhere (leave_seconds), then Triton's exit timeout for in-flight requests, then a margin."""
    return (
        ts.spec.drain_seconds
        + leave_seconds(ts, settings)
        + exit_timeout_seconds(ts.spec.server_args)
        + TERMINATION_MARGIN_SECONDS
    )


def startup_failure_threshold(startup_timeout_seconds: int) -> int:
    """failureThreshold so that failureThreshold * STARTUP_PERIOD_SECONDS >= the timeout."""
    return max(1, math.ceil(startup_timeout_seconds / STARTUP_PERIOD_SECONDS))


def config_volume(ts: TritonService, revision: str, layout: ManifestLayout) -> dict[str, Any]:
    """The configs and the manifest at CONFIG_DIR: one ConfigMap's items (plain), or a projected
    volume of the revision's ConfigMaps that puts every part under MANIFEST_SUBDIR (parts)."""
    items = [{"key": config_key(m.name), "path": f"configs/{m.name}/config.pbtxt"} for m in ts.spec.models]
    if layout.plain:
        items.append({"key": MANIFEST_KEY, "path": MANIFEST_KEY})
        return {"name": CONFIG_VOLUME, "configMap": {"name": object_name(ts, revision), "items": items}}
    sources: list[dict[str, Any]] = []
    for index in range(layout.parts):
        key = manifestparts.part_key(index)
        part = {"key": key, "path": f"{MANIFEST_SUBDIR}/{key}"}
        name = part_configmap_name(ts, revision, index)
        sources.append({"configMap": {"name": name, "items": [*items, part] if index == 0 else [part]}})
    return {"name": CONFIG_VOLUME, "projected": {"sources": sources}}


def _is_pvc(ts: TritonService) -> bool:
    return ts.spec.repository.scheme == "pvc"


def _repository_mounts(ts: TritonService) -> list[dict[str, Any]]:
    """The claim of a pvc:// repository, as both containers mount it (none for an object store).

    A claim is mounted read-only at the same path in both containers: sync links its version
    folders into /models (no copy), and tritonserver follows the links.
    """
    if not _is_pvc(ts):
        return []
    return [{"name": REPOSITORY_VOLUME, "mountPath": PVC_ROOT, "readOnly": True}]


def models_empty_dir(ts: TritonService) -> dict[str, Any]:
    """The /models emptyDir as spec.modelVolume sizes it (``{}``: the node's disk, unbounded)."""
    volume = ts.spec.model_volume
    if volume is None:
        return {}
    return {
        **({"medium": volume.medium} if volume.medium else {}),
        **({"sizeLimit": volume.size_limit} if volume.size_limit else {}),
    }


def build_volumes(
    ts: TritonService, revision: str, layout: ManifestLayout, settings: Settings | None = None
) -> list[dict[str, Any]]:
    """The pod's volumes: /models (filled by sync), shared memory, the revision's configs and
    manifest, the repository's claim (pvc://), then the spec's own volumes."""
    spec = ts.spec
    volumes: list[dict[str, Any]] = [
        {"name": MODELS_VOLUME, "emptyDir": models_empty_dir(ts)},
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}},
        config_volume(ts, revision, layout),
    ]
    if _is_pvc(ts):
        claim = pvc_claim(spec.repository.uri)
        volumes.append(
            {"name": REPOSITORY_VOLUME, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        )
    if has_agent(ts, settings):
        volumes += agent_volumes(ts, revision, settings)
    return volumes + [dict(v) for v in spec.volumes]


def agent_volumes(ts: TritonService, revision: str, settings: Settings | None = None) -> list[dict[str, Any]]:
    """The in-place agent's volumes: one projected volume of the `<deployment>-inplace` ConfigMap
    (optional: absent until an update) and the pod's own target annotation (downward API), which the
    kubelet writes as one atomic payload (two volumes it refreshes at different moments let a pod see
    the annotation gone before the state.json that makes it so: a flip back to the old revision),
    and the agent's bookkeeping. In a pod of a pool, the same payload holds its assignment annotation
    (core.pool.assignment), which its agent follows, and its labels (which models are on their routes)."""
    items = [
        {
            "path": INPLACE_TARGET_ITEM,
            "fieldRef": {"fieldPath": f"metadata.annotations['{INPLACE_TARGET_ANNOTATION}']"},
        }
    ]
    if ts.spec.pool is not None:
        items.append(
            {
                "path": POOL_ASSIGNMENT_ITEM,
                "fieldRef": {"fieldPath": f"metadata.annotations['{ASSIGNMENT_ANNOTATION}']"},
            }
        )
        items.append({"path": POOL_LABELS_ITEM, "fieldRef": {"fieldPath": "metadata.labels"}})
    leave = [{"name": LEAVE_VOLUME, "emptyDir": {}}] if leave_seconds(ts, settings) else []
    return [
        {
            "name": INPLACE_VOLUME,
            "projected": {
                "sources": [
                    {"configMap": {"name": inplace_configmap_name(ts, revision), "optional": True}},
                    {"downwardAPI": {"items": items}},
                ]
            },
        },
        {"name": AGENT_STATE_VOLUME, "emptyDir": {}},
        *leave,
    ]


AGENT_RESOURCES: dict[str, Any] = {"requests": {"cpu": "10m", "memory": "96Mi"}}
"""The model-agent sidecar's requests, no limits: it idles between updates (44 MiB resident), about
68 MiB once it has applied a change (its store client loaded); a download streams to disk."""


def _agent_mounts() -> list[dict[str, Any]]:
    return [
        {"name": INPLACE_VOLUME, "mountPath": INPLACE_DIR, "readOnly": True},
        {"name": AGENT_STATE_VOLUME, "mountPath": AGENT_STATE_DIR},
    ]


def agent_args(revision: str) -> list[str]:
    """What the agent takes besides sync's own arguments (the contract in the agent's docs)."""
    return [
        "--inplace-dir",
        INPLACE_DIR,
        "--target-file",
        INPLACE_TARGET_FILE,
        "--state-dir",
        AGENT_STATE_DIR,
        "--base-revision",
        revision,
    ]


def pre_stop(ts: TritonService, settings: Settings | None = None) -> dict[str, Any]:
    """tritonserver's preStop: endpoints drop a terminating pod at once, but kube-proxy, load balancers
    and routers catch up later: keep serving for drainSeconds before tritonserver gets SIGTERM. In a
    pool (leave_seconds), then on until the agent's preStop (agent_pre_stop) writes LEAVE_DONE_FILE, at
    most leaveSeconds: while a model the pod holds is answered by it alone."""
    drain, leave = ts.spec.drain_seconds, leave_seconds(ts, settings)
    if leave:
        script = (
            f"sleep {drain}; n=0; while [ ! -e {LEAVE_DONE_FILE} ] && [ $n -lt {leave} ]; "
            "do sleep 1; n=$((n+1)); done"
        )
        return {"lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", script]}}}}
    if not drain:
        return {}
    return {"lifecycle": {"preStop": {"exec": {"command": ["sleep", str(drain)]}}}}


def agent_pre_stop(ts: TritonService, settings: Settings | None = None) -> dict[str, Any]:
    """A pool pod's agent's preStop: it answers the pod's readiness, so the pod stays a serving endpoint
    of its models' Services while tritonserver serves: it waits the drain, then (`triton-operator
    leave`, leave_seconds) while a model it holds READY is answered through its Service by this pod
    alone, at most leaveSeconds, and tells tritonserver's preStop (pre_stop) it is done."""
    leave = leave_seconds(ts, settings)
    if not leave:
        return pre_stop(ts, settings)
    command = [
        "triton-operator",
        "leave",
        "--after",
        str(ts.spec.drain_seconds),
        "--seconds",
        str(leave),
        "--assignment",
        POOL_ASSIGNMENT_FILE,
        "--done",
        LEAVE_DONE_FILE,
    ]
    return {"lifecycle": {"preStop": {"exec": {"command": command}}}}


def agent_drain_seconds(ts: TritonService, settings: Settings | None = None) -> int:
    """How long the agent keeps the pod out of its Service before it unloads or loads a model: the
    readiness probe fails within period x failureThreshold, then the endpoints, kube-proxy and any
    router catch up within the spec's drainSeconds (what a terminating pod's preStop waits too).
    Without ``settings``, the longer probe's (the most a pod of any revision waits)."""
    period, failures, _ = readiness_timing(ts, settings)
    return period * failures + ts.spec.drain_seconds


def agent_drain_args(ts: TritonService, settings: Settings | None) -> list[str]:
    """How the agent drains: in a pod of the one shape (fills_itself), until it has answered the
    kubelet's readiness probe 503 failureThreshold times (readiness_timing), then the spec's
    drainSeconds for the endpoints; in a revision made before, a fixed agent_drain_seconds (its
    template is kept)."""
    if fills_itself(settings):
        _, failures, _ = readiness_timing(ts, settings)
        return ["--probe-failures", str(failures), "--drain-seconds", str(ts.spec.drain_seconds)]
    return ["--drain-seconds", str(agent_drain_seconds(ts, settings))]


FILL_FLAG = "--triton-starts-empty"
"""The agent's flag in pods of the one shape (fills_itself): it loads every model itself, each as
soon as its bytes are in, and exits with the reason when that first fill fails (commands.agent)."""


def build_agent_container(ts: TritonService, settings: Settings, sync: Mapping[str, Any]) -> dict[str, Any]:
    """The model-agent sidecar: the sync container's image, arguments, credentials and security, as
    `triton-operator agent`, which follows the pod's target revision and loads what changed (and
    serves the pod's readiness). In a pod of the one shape (fills_itself) it also fills /models and
    loads every model in the first place, and says why it failed as its termination message."""
    fill = [FILL_FLAG] if fills_itself(settings) else []
    pool = (
        ["--pool-assignment", POOL_ASSIGNMENT_FILE, *metrics_interval_args(ts.spec.server_args)]
        if ts.spec.pool is not None
        else []
    )
    agent: dict[str, Any] = {
        "name": AGENT_CONTAINER,
        "image": sync["image"],
        "command": ["triton-operator", "agent"],
        "args": [
            *sync["args"][:-1],  # without --once
            "--triton",
            f"http://127.0.0.1:{HTTP_PORT}",
            "--listen",
            f"0.0.0.0:{AGENT_PORT}",
            *agent_drain_args(ts, settings),
            *fill,
            *pool,
        ],
        "ports": [{"name": "agent", "containerPort": AGENT_PORT, "protocol": "TCP"}],
        # In a pool, a terminating pod's copies may be its models' only answering ones until their
        # copies elsewhere are READY (core.decision.pool_plan): the agent, which answers the pod's
        # readiness, stops with tritonserver, not at once (a pod whose container stopped is not Ready,
        # and its models' Services would have no endpoint left).
        **(agent_pre_stop(ts, settings) if ts.spec.pool is not None else {}),
        "resources": copy.deepcopy(AGENT_RESOURCES),
        "volumeMounts": copy.deepcopy(sync["volumeMounts"]) + _leave_mount(ts, settings, read_only=False),
    }
    kept = ("imagePullPolicy", "envFrom", "env", "securityContext")  # env: the node cache
    for key in (*kept, "terminationMessagePolicy") if fill else kept:
        if key in sync:
            agent[key] = copy.deepcopy(sync[key])
    if ts.spec.pool is not None and settings.pool_leave:
        pod_name = {"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
        agent["env"] = [*agent.get("env", []), pod_name]
    return agent


def _leave_mount(ts: TritonService, settings: Settings | None, *, read_only: bool) -> list[dict[str, Any]]:
    """The leave emptyDir (agent_volumes) in a pool pod's containers: the agent's preStop writes there,
    tritonserver's reads."""
    if not leave_seconds(ts, settings):
        return []
    return [{"name": LEAVE_VOLUME, "mountPath": LEAVE_DIR, **({"readOnly": True} if read_only else {})}]


AGENT_UID = 65532
"""The agent's user in in-place pods (the operator image's own), not tritonserver's (1000)."""

RESTRICTED_POD_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    # The NGC tritonserver image's own user (triton-server); an image without a numeric USER
    # could not pass runAsNonRoot otherwise. emptyDir volumes are world-writable: no fsGroup (it
    # would chown a whole model PVC on every mount).
    "runAsUser": 1000,
    "runAsGroup": 1000,
    "seccompProfile": {"type": "RuntimeDefault"},
}
"""The pods' securityContext unless the spec sets one: Pod Security Standard `restricted`."""

RESTRICTED_CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}
"""Each container's securityContext (tritonserver's unless the spec sets one): `restricted`."""


def build_pod_security(ts: TritonService, settings: Settings) -> dict[str, Any]:
    """The pod spec's securityContext and service-account token mount (none for an older revision)."""
    if ts.spec.pod_security_context is not None:
        context: dict[str, Any] | None = dict(ts.spec.pod_security_context)
    else:
        context = copy.deepcopy(RESTRICTED_POD_SECURITY) if settings.pod_security_defaults else None
    out: dict[str, Any] = {}
    if context is not None:
        out["securityContext"] = context
    if settings.pod_security_defaults or ts.spec.automount_service_account_token:
        out["automountServiceAccountToken"] = ts.spec.automount_service_account_token
    return out


def _container_security(ts: TritonService, settings: Settings) -> dict[str, Any] | None:
    if ts.spec.security_context is not None:
        return dict(ts.spec.security_context)
    return copy.deepcopy(RESTRICTED_CONTAINER_SECURITY) if settings.pod_security_defaults else None


def build_triton_container(ts: TritonService, settings: Settings) -> dict[str, Any]:
    """The tritonserver container: serves /models on the three ports, probed on Triton's health API."""
    spec = ts.spec
    triton: dict[str, Any] = {
        "name": TRITON_CONTAINER,
        "image": triton_image(ts, settings),
        "command": ["tritonserver"],
        "args": triton_args(ts, settings),
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        # Kubernetes keeps the log's tail when tritonserver exits with an error: Triton's own reason
        # why a model failed to load, which the status and the rollback Event quote.
        **({"terminationMessagePolicy": "FallbackToLogsOnError"} if settings.triton_log_on_exit else {}),
        "readinessProbe": readiness_probe(ts, settings),
        "livenessProbe": _probe(LIVENESS_PATH, period=10, failures=3, timeout=5),
        # tritonserver's own start (and, in a pod of the older shapes, the loads of every model at
        # its start); in a pod of the one shape it starts with no model: the agent's loads are
        # bounded by its --load-timeout and the rollout's deadline, and gate the readiness only.
        "startupProbe": _probe(
            LIVENESS_PATH if fills_itself(settings) else READINESS_PATH,
            period=STARTUP_PERIOD_SECONDS,
            failures=startup_failure_threshold(spec.startup_timeout()),
            timeout=5,
        ),
        **pre_stop(ts, settings),
        "volumeMounts": [
            # With in-place updates /models is the agent's alone: read-only here, so that the Python
            # backend's __pycache__ never makes it differ from what the agent placed (Triton would
            # count the model as changed and reload it along with an ensemble over it).
            {
                "name": MODELS_VOLUME,
                "mountPath": MODELS_DIR,
                **({"readOnly": True} if has_agent(ts, settings) else {}),
            },
            {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
            *_repository_mounts(ts),
            *(_leave_mount(ts, settings, read_only=True) if has_agent(ts, settings) else []),
            *([dict(SHARED_FILES_MOUNT)] if has_shared_files(ts, settings) else []),
            *[dict(m) for m in spec.volume_mounts],
        ],
    }
    if spec.image_pull_policy:
        triton["imagePullPolicy"] = spec.image_pull_policy
    resources = _resources(ts)
    if resources:
        triton["resources"] = resources
    if spec.env:
        triton["env"] = [dict(e) for e in spec.env]
    security = _container_security(ts, settings)
    if security is not None:
        triton["securityContext"] = security
    return triton


def build_sync_container(
    ts: TritonService, settings: Settings, layout: ManifestLayout, revision: str | None = None
) -> dict[str, Any]:
    """The sync init container: `triton-operator sync` fills /models from the revision's manifest
    (with in-place updates, `triton-operator agent --once`, which serves the pod's target revision)."""
    manifest = MANIFEST_PATH if layout.plain else MANIFEST_DIR
    sync_args = ["--manifest", manifest, "--configs", CONFIGS_DIR, "--dest", MODELS_DIR]
    volume = ts.spec.model_volume
    if volume is not None and volume.size_limit:
        # kubelet evicts a pod past its emptyDir's sizeLimit, which statvfs does not show sync.
        sync_args += ["--volume-limit", volume.size_limit]
    sync: dict[str, Any] = {
        "name": SYNC_CONTAINER,
        "image": settings.sync_image,
        "command": ["triton-operator", "sync"],
        "args": [*sync_args, "--pvc-root", PVC_ROOT] if _is_pvc(ts) else sync_args,
        "volumeMounts": [
            {"name": MODELS_VOLUME, "mountPath": MODELS_DIR},
            {"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True},
            *_repository_mounts(ts),
        ],
    }
    if has_agent(ts, settings):
        # `agent --once`: sync, then record what it placed, so the sidecar starts from there.
        revision = revision or ""
        sync["command"] = ["triton-operator", "agent"]
        sync["args"] = [*sync["args"], *agent_args(revision), "--once"]
        sync["volumeMounts"] += _agent_mounts()
    if settings.sync_log_on_exit:
        # A sync that dies before writing its termination message (killed, out of memory) still
        # says why: the log's tail.
        sync["terminationMessagePolicy"] = "FallbackToLogsOnError"
    if settings.sync_image_pull_policy:
        sync["imagePullPolicy"] = settings.sync_image_pull_policy
    credentials = ts.spec.repository.credentials_secret
    if credentials and not _is_pvc(ts):
        sync["envFrom"] = [{"secretRef": {"name": credentials}}]
    if settings.node_cache_port is not None and not _is_pvc(ts):
        port, key = settings.node_cache_port, settings.node_cache_public_key
        sync["env"] = node_cache_env(port, token=settings.node_cache_token, public_key=key)
        if settings.node_cache_token:
            sync["volumeMounts"].append({"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True})
        if has_shared_files(ts, settings):
            # The pod's read-only view of the node cache's files: the agent links to what it holds.
            sync["env"].append({"name": FILES_ENV, "value": SHARED_MOUNT_PATH})
            sync["volumeMounts"].append(SHARED_FILES_MOUNT)
    if settings.log_format == "json":  # JSON lines naming the TritonService and the pod's revision
        sync["env"] = [*sync.get("env", []), *log_env(ts, revision)]
    if settings.pod_security_defaults:
        # The operator's own image: it writes /models only, so its root filesystem is read-only.
        sync["securityContext"] = {**RESTRICTED_CONTAINER_SECURITY, "readOnlyRootFilesystem": True}
        if has_agent(ts, settings):
            # In-place pods share one process namespace (the agent watches the Python backend's
            # stubs): the agent runs as a user of its own, so that no process of tritonserver (a
            # Python model's code) can read its environment (the repository's credentials).
            sync["securityContext"]["runAsUser"] = AGENT_UID
    return sync


def log_env(ts: TritonService, revision: str | None) -> list[dict[str, Any]]:
    """The sync's and agent's log format (JSON) and the TritonService and revision their lines name."""
    env = [
        {"name": logs.ENV, "value": "json"},
        {"name": logs.SERVICE_ENV, "value": f"{ts.namespace}/{ts.name}"},
    ]
    if revision:
        env.append({"name": logs.REVISION_ENV, "value": revision})
    return env


def node_cache_env(port: int, *, token: bool = True, public_key: str | None = None) -> list[dict[str, Any]]:
    """Where the sync container finds the node cache: the node's address and the cache's hostPort,
    and its pod's uid to name its lease (the downward API: nothing of the node is mounted); with
    the cache's public key, the key its signed statements are checked with."""
    return [
        {"name": HOST_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
        {"name": PORT_ENV, "value": str(port)},
        {"name": POD_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        *([{"name": TOKEN_ENV, "value": TOKEN_PATH}] if token else []),
        *([{"name": PUBLIC_KEY_ENV, "value": public_key}] if public_key else []),
    ]


def has_shared_files(ts: TritonService, settings: Settings) -> bool:
    """Whether the revision's pods get their view of the node cache's files: the node cache on, its
    shared files on, a pinned store (not a PVC) and the one pod shape (the agent fills /models)."""
    return (
        settings.node_cache_port is not None
        and settings.node_cache_shared_files
        and fills_itself(settings)
        and not _is_pvc(ts)
    )


SHARED_FILES_MOUNT = {"name": SHARED_VOLUME, "mountPath": SHARED_MOUNT_PATH, "readOnly": True}
"""The agent's and tritonserver's mount of the pod's view of the node cache's files (the model
files the agent placed are symlinks into it, so tritonserver sees it at the same path)."""


def node_cache_shared_volume() -> dict[str, Any]:
    """The pod's view of the node cache's files: an ephemeral inline CSI volume of the node cache's
    driver (allowed under Pod Security `restricted`), read-only."""
    return {"name": SHARED_VOLUME, "csi": {"driver": SHARED_DRIVER, "readOnly": True}}


def node_cache_token_volume() -> dict[str, Any]:
    """The pod's token for the node cache: projected, for the cache's audience only, bound to the
    pod (allowed under Pod Security `restricted`; the pod's automountServiceAccountToken stays off)."""
    token = {"audience": AUDIENCE, "expirationSeconds": TOKEN_SECONDS, "path": "token"}
    return {"name": TOKEN_VOLUME, "projected": {"sources": [{"serviceAccountToken": token}]}}


def build_scheduling(ts: TritonService) -> dict[str, Any]:
    """The pod spec fields the spec passes through, only those it sets: who the pod runs as and
    pulls images with, and where it may be scheduled (priority, node selector, tolerations, affinity)."""
    spec = ts.spec
    out: dict[str, Any] = {}
    if spec.service_account_name:
        out["serviceAccountName"] = spec.service_account_name
    if spec.priority_class_name:
        out["priorityClassName"] = spec.priority_class_name
    if spec.image_pull_secrets:
        out["imagePullSecrets"] = [{"name": s} for s in spec.image_pull_secrets]
    if spec.node_selector:
        out["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        out["tolerations"] = [dict(t) for t in spec.tolerations]
    if spec.affinity:
        out["affinity"] = dict(spec.affinity)
    return out


SCRAPE_ANNOTATIONS = {
    "prometheus.io/scrape": "true",
    "prometheus.io/port": str(METRICS_PORT),
    "prometheus.io/path": "/metrics",
}
"""The pods' annotations when Settings.prometheus_scrape is on (before the spec's podAnnotations)."""


def build_pod_metadata(ts: TritonService, revision: str, settings: Settings) -> dict[str, Any]:
    """The pod's labels (the spec's, then the operator's) and annotations (scrape hints, then the spec's)."""
    annotations: dict[str, str] = {}
    if settings.prometheus_scrape:
        annotations.update(SCRAPE_ANNOTATIONS)
    annotations.update(ts.spec.pod_annotations)
    # The operator's labels win: selectors and revision bookkeeping depend on them.
    labels = {**ts.spec.pod_labels, **build_labels(ts, revision)}
    metadata: dict[str, Any] = {"labels": labels}
    if annotations:
        metadata["annotations"] = annotations
    return metadata


def build_pod_template(
    ts: TritonService, revision: str, settings: Settings, layout: ManifestLayout = PLAIN
) -> dict[str, Any]:
    """The pod template of a revision: the model agent fills /models and loads each model as soon as
    its bytes are in, beside tritonserver (fills_itself); in a revision made before that shape, the
    sync init container fills /models and tritonserver loads it (with the agent beside it for
    in-place updates).

    ``layout``: how the revision's ConfigMaps hold the manifest (build_configmaps, manifest_layout).
    """
    sync = build_sync_container(ts, settings, layout, revision)
    containers = [build_triton_container(ts, settings)]
    if has_agent(ts, settings):
        containers.append(build_agent_container(ts, settings, sync))
    pod_spec: dict[str, Any] = {
        "containers": containers,
        "volumes": build_volumes(ts, revision, layout, settings)
        + (
            [node_cache_token_volume()]
            if any(m["name"] == TOKEN_VOLUME for m in sync["volumeMounts"])
            else []
        )
        + ([node_cache_shared_volume()] if SHARED_FILES_MOUNT in sync["volumeMounts"] else []),
        # Service links put 7 variables per Service of the namespace into every container.
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": termination_grace_seconds(ts, settings),
        **({} if fills_itself(settings) else {"initContainers": [sync]}),
        # Pods with the agent: it sees the Python backend's stub processes (a dead one is a model
        # Triton 2.51 still reports READY) and takes the pod out of its Service.
        **({"shareProcessNamespace": True} if has_agent(ts, settings) else {}),
        **build_pod_security(ts, settings),
        **build_scheduling(ts),
    }
    return {"metadata": build_pod_metadata(ts, revision, settings), "spec": pod_spec}


def build_deployment(
    ts: TritonService, revision: str, settings: Settings, replicas: int, layout: ManifestLayout = PLAIN
) -> dict[str, Any]:
    """The revision's Deployment `<name>-<revision>` with ``replicas`` (the rollout decides them)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(ts, object_name(ts, revision), build_labels(ts, revision)),
        "spec": {
            "replicas": replicas,
            # A revision's template never changes (its hash names it): no ReplicaSet history to keep.
            "revisionHistoryLimit": 0,
            "progressDeadlineSeconds": ts.spec.progress_deadline(),
            "selector": {"matchLabels": selector_labels(ts, revision)},
            "template": build_pod_template(ts, revision, settings, layout),
        },
    }


# ----------------------------------------------------------------- Service


def serving_only_stable(ts: TritonService) -> bool:
    """Whether Service `<name>` reaches the stable revision alone.

    BlueGreen: the green revision gets nothing before promotion. Gateway API: the routes' weights
    send the canary its share; in-cluster clients of `<name>` get the stable revision, never a
    replica-ratio share that would bypass the weights. Canary without a router: the replica ratio
    is the router, so `<name>` reaches every revision (a canary's pods only once Ready).
    """
    rollout = ts.spec.rollout
    routed = rollout.traffic_routing is not None and rollout.traffic_routing.gateway_api is not None
    return rollout.strategy == Strategy.BLUE_GREEN or routed


def build_service(ts: TritonService, stable_revision: str | None = None) -> dict[str, Any]:
    """Service `<name>`: every revision's pods (the replica ratio splits traffic), or only
    ``stable_revision``'s where `serving_only_stable` says so and a stable revision exists."""
    selector = selector_labels(ts)
    if stable_revision is not None and serving_only_stable(ts):
        selector = selector_labels(ts, stable_revision)
    return service_body(
        ts.name,
        ts.namespace,
        labels=build_labels(ts),
        owner_ref=build_owner_reference({"metadata": ts.metadata}),
        selector=selector,
        service_type=ts.spec.service.type,
        annotations=ts.spec.service.annotations,
    )


def disruption_budget_enabled(ts: TritonService) -> bool:
    """Explicit ``disruptionBudget.enabled``, else on when more than one replica serves."""
    enabled = ts.spec.disruption_budget.enabled
    return ts.spec.replicas > 1 if enabled is None else enabled


def build_pdb(ts: TritonService) -> dict[str, Any]:
    """PodDisruptionBudget `<name>`: a node drain evicts at most maxUnavailable serving pods at once.

    It selects every revision's pods, like Service `<name>`. Pods that are not Ready (a canary
    still loading, a crash loop) may always be evicted: they serve nothing, and a drain must not
    wait on them.
    """
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(ts, ts.name, build_labels(ts)),
        "spec": {
            "maxUnavailable": ts.spec.disruption_budget.max_unavailable,
            "selector": {"matchLabels": selector_labels(ts)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def endpoints(ts: TritonService) -> dict[str, str]:
    host = f"{ts.name}.{ts.namespace}.svc"
    return {"http": f"{host}:{HTTP_PORT}", "grpc": f"{host}:{GRPC_PORT}", "metrics": f"{host}:{METRICS_PORT}"}


# ----------------------------------------------------------------- status


# ----------------------------------------------------------------- events


EVENT_MESSAGE_MAX = 1024


def build_event(
    ts_metadata: Mapping[str, Any],
    event_type: str,
    reason: str,
    message: str,
    *,
    now: str,
    component: str = MANAGED_BY,
) -> dict[str, Any]:
    """A core/v1 Event about a TritonService (``kubectl describe`` and ``kubectl get events`` show it)."""
    name = str(ts_metadata.get("name", ""))
    namespace = str(ts_metadata.get("namespace", "default"))
    involved: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": name,
        "namespace": namespace,
    }
    for key in ("uid", "resourceVersion"):
        if ts_metadata.get(key):
            involved[key] = str(ts_metadata[key])
    if len(message) > EVENT_MESSAGE_MAX:
        message = message[: EVENT_MESSAGE_MAX - 3] + "..."
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{name}.", "namespace": namespace},
        "involvedObject": involved,
        "type": event_type,
        "reason": reason,
        "message": message,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": component,
    }
