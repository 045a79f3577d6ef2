"""Desired Kubernetes objects of a TritonService (ConfigMap, Deployment, Service) as plain dicts."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from triton_operator import FIELD_MANAGER, GROUP, KIND, VERSION
from triton_operator.core import conditions as cond
from triton_operator.core import manifestparts
from triton_operator.core.manifest import StoreRef, manifest_to_json, model_sources, unpinned_manifest
from triton_operator.core.manifestparts import MANIFEST_KEY
from triton_operator.core.modelconfig import ModelConfigError, build_config_pbtxt
from triton_operator.core.revision import revision_hash
from triton_operator.core.rollout import RolloutPlan
from triton_operator.core.traffic import Role, build_revision_service, revision_service_name, service_body
from triton_operator.core.validation.errors import errors_from_validation
from triton_operator.core.validation.spec import validate_spec
from triton_operator.models import Strategy, TritonService
from triton_operator.settings import Settings

# ----------------------------------------------------------------- names and constants

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_SERVICE = f"{GROUP}/service"
LABEL_REVISION = f"{GROUP}/revision"
MANAGED_BY = FIELD_MANAGER
COMPONENT = "inference-server"
APP_NAME = "tritonserver"

HTTP_PORT = 8000
GRPC_PORT = 8001
METRICS_PORT = 8002
MODELS_DIR = "/models"
CONFIG_DIR = "/etc/triton-operator"
MANIFEST_PATH = f"{CONFIG_DIR}/{MANIFEST_KEY}"
# The spec that rendered a revision, kept in its ConfigMap (never mounted): while a later spec is
# invalid, the rollout goes on under this one (aborts, deadlines, timed steps, control requests).
SPEC_KEY = "spec.json"
MANIFEST_SUBDIR = "manifest"
MANIFEST_DIR = f"{CONFIG_DIR}/{MANIFEST_SUBDIR}"
"""Where the sync container finds the parts of a manifest too large for plain JSON (manifestparts)."""
CONFIGS_DIR = f"{CONFIG_DIR}/configs"
CONFIG_KEY_SUFFIX = ".config.pbtxt"
TRITON_CONTAINER = "tritonserver"
SYNC_CONTAINER = "sync"
MODELS_VOLUME = "models"
SHM_VOLUME = "dshm"
CONFIG_VOLUME = "triton-operator-config"
REPOSITORY_VOLUME = "repository"
PVC_ROOT = "/repository"
# ownerReferences of `triton-operator render` output: no object exists, so no uid does either.
PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"

READINESS_PATH = "/v2/health/ready"
LIVENESS_PATH = "/v2/health/live"
STARTUP_PERIOD_SECONDS = 1
"""Startup probes run every second: a pod is Ready within a second of Triton loading its models."""
READINESS_PERIOD_SECONDS = 2
TRITON_EXIT_TIMEOUT_SECONDS = 30
"""tritonserver's default --exit-timeout-secs: how long it waits for in-flight requests on SIGTERM."""
TERMINATION_MARGIN_SECONDS = 5


def object_name(ts: TritonService, revision: str) -> str:
    """Name of a revision's Deployment and ConfigMap."""
    return f"{ts.name}-{revision}"


def config_key(model: str) -> str:
    """ConfigMap key of a model's config.pbtxt (keys cannot hold '/')."""
    return f"{model}{CONFIG_KEY_SUFFIX}"


def part_configmap_name(ts: TritonService, revision: str, index: int) -> str:
    """Name of the ConfigMap holding manifest part ``index`` (part 0 is in the revision's own)."""
    return object_name(ts, revision) if index == 0 else f"{object_name(ts, revision)}-manifest-{index}"


def revision_object_names(ts: TritonService, revision: str, names: Sequence[str]) -> list[str]:
    """Those of ``names`` that a revision's objects would have: `<name>-<rev>` and its manifest parts."""
    main = object_name(ts, revision)
    return [n for n in names if n == main or n.startswith(f"{main}-manifest-")]


# ----------------------------------------------------------------- checks

NAME_PATTERN = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
NAME_MAX_LENGTH = 63


def name_problems(name: str) -> list[str]:
    """The name becomes a Service name and a label value: a DNS-1035 label of at most 63 characters."""
    if len(name) > NAME_MAX_LENGTH:
        return [f"metadata.name: {name!r} is longer than {NAME_MAX_LENGTH} characters (it names the Service)"]
    if not NAME_PATTERN.match(name):
        return [
            f"metadata.name: {name!r} must be a DNS-1035 label (lowercase letters, digits and '-', "
            "starting with a letter): it names the Service"
        ]
    return []


@dataclasses.dataclass(frozen=True)
class CheckedSpec:
    """A TritonService body checked: the parsed model and its configs, or the problems found."""

    ts: TritonService | None
    configs: Mapping[str, str]
    problems: tuple[str, ...]

    @property
    def message(self) -> str:
        return "; ".join(self.problems)


def check_body(body: Mapping[str, Any]) -> CheckedSpec:
    """Parse a TritonService body and check what the CRD schema cannot (core.validation), then render.

    Every problem names its field (spec.models[0].config.maxBatchSize: ...).
    """
    try:
        ts = TritonService.model_validate(dict(body))
    except ValidationError as exc:
        problems = tuple(str(e) for e in errors_from_validation(exc, prefix=""))
        return CheckedSpec(ts=None, configs={}, problems=problems)
    found = name_problems(ts.name) + [str(e) for e in validate_spec(ts.spec)]
    configs: dict[str, str] = {}
    for i, model in enumerate(ts.spec.models):
        try:
            configs[model.name] = build_config_pbtxt(
                model.name, model.config, field=f"spec.models[{i}].config"
            )
        except ModelConfigError as exc:
            if str(exc) not in found:
                found.append(str(exc))
    size = configs_bytes(configs)
    if size > manifestparts.CONFIGMAP_BUDGET:
        found.append(
            f"spec.models: the rendered config.pbtxt files take {size} bytes; the revision's ConfigMap "
            f"holds at most {manifestparts.CONFIGMAP_BUDGET} (the API server refuses a ConfigMap over "
            f"{manifestparts.CONFIGMAP_LIMIT})"
        )
    return CheckedSpec(ts=ts, configs=configs, problems=tuple(found))


def revision_configmaps(configmaps: Sequence[Mapping[str, Any]], revision: str) -> list[Mapping[str, Any]]:
    """The ConfigMaps of one revision (its own, and those holding parts of its manifest)."""
    return [c for c in configmaps if _revision_of(c) == revision]


def revision_manifest(configmaps: Sequence[Mapping[str, Any]], revision: str) -> str | None:
    """The manifest JSON one revision's ConfigMaps hold (plain, or its parts put back together)."""
    return manifestparts.stored_manifest(revision_configmaps(configmaps, revision))


@dataclasses.dataclass(frozen=True)
class LastValid:
    """The revision the last valid spec asked for, with that spec and its pinned manifest."""

    revision: str
    body: dict[str, Any]
    """A TritonService body: the current metadata (names, uid, control requests) with that spec."""
    manifest_json: str | None


def last_valid(
    metadata: Mapping[str, Any], status: Mapping[str, Any], configmaps: Sequence[Mapping[str, Any]]
) -> LastValid | None:
    """What the last valid spec rendered, read back from its revision's ConfigMap (SPEC_KEY).

    The spec's revision is, in this order: the one an undo pin waits for, an aborted one, the
    canary, the stable one; the first whose ConfigMap holds a spec wins (a revision rendered by an
    operator that did not store specs has none).
    """
    for key in ("pinnedFor", "abortedRevision", "canaryRevision", "stableRevision"):
        revision = status.get(key)
        if not revision:
            continue
        own = revision_configmaps(configmaps, revision)
        data = next(((c.get("data") or {}) for c in own if SPEC_KEY in (c.get("data") or {})), {})
        try:
            spec = json.loads(data[SPEC_KEY])
        except (KeyError, TypeError, ValueError):
            continue
        if isinstance(spec, dict):
            return LastValid(
                revision=str(revision),
                body={"metadata": dict(metadata), "spec": spec},
                manifest_json=manifestparts.stored_manifest(own),
            )
    return None


def configs_bytes(configs: Mapping[str, str]) -> int:
    return sum(len(text.encode("utf-8")) for text in configs.values())


def model_statuses(ts: TritonService) -> list[dict[str, Any]]:
    """status.models entries: the versions each model's versionPolicy pins (empty: Triton decides)."""
    out: list[dict[str, Any]] = []
    for model in ts.spec.models:
        policy = model.config.get("versionPolicy") or {}
        specific = policy.get("specific") if isinstance(policy, dict) else None
        versions = specific.get("versions") if isinstance(specific, dict) else None
        out.append({"name": model.name, "versions": [str(v) for v in versions or []]})
    return out


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
    for served_elsewhere in ("replicas", "rollout", "service", "image"):
        spec.pop(served_elsewhere, None)
    repository = dict(spec.get("repository", {}))
    repository.pop("pollIntervalSeconds", None)
    spec["repository"] = repository
    spec["models"] = [{k: v for k, v in m.items() if k != "config"} for m in spec.get("models", [])]
    # The sync image and its pull policy are the operator's plumbing, not what a pod serves: an
    # operator upgrade must not make a new revision of every TritonService (see kept_sync_image).
    inputs: dict[str, Any] = {"spec": spec, "image": triton_image(ts, settings)}
    # The startup probe follows the rollout's deadline when startupTimeoutSeconds is unset.
    inputs["startupTimeoutSeconds"] = ts.spec.startup_timeout()
    inputs["prometheusScrape"] = settings.prometheus_scrape
    return inputs


def kept_sync_image(settings: Settings, deployment: Mapping[str, Any] | None) -> Settings:
    """``settings`` with the sync image (and pull policy) an existing revision's Deployment runs.

    A revision keeps the `triton-operator sync` image it was created with, so an operator upgrade
    restarts no serving pod; the next revision (any change of the spec) gets the new image.
    """
    template = ((deployment or {}).get("spec") or {}).get("template") or {}
    for container in (template.get("spec") or {}).get("initContainers") or []:
        if container.get("name") == SYNC_CONTAINER and container.get("image"):
            image = str(container["image"])
            policy = container.get("imagePullPolicy")
            # The API server fills in the default policy: leave that one unset, as it was written,
            # so that applying the same template again changes nothing (not even managedFields).
            if policy == default_pull_policy(image):
                policy = None
            return dataclasses.replace(settings, sync_image=image, sync_image_pull_policy=policy)
    return settings


def default_pull_policy(image: str) -> str:
    """The imagePullPolicy Kubernetes gives a container that sets none: Always for :latest or no tag."""
    name = image.split("@", 1)[0]
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else ""
    return "Always" if "@" not in image and tag in ("", "latest") else "IfNotPresent"


def compute_revision(
    ts: TritonService, settings: Settings, configs: Mapping[str, str], manifest_digest: str | None
) -> str:
    """The revision a valid spec asks for (see core.revision.revision_hash)."""
    return revision_hash(pod_template_inputs(ts, settings), configs, manifest_digest)


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


def layout_of(deployment: Mapping[str, Any] | None) -> ManifestLayout | None:
    """The layout an existing revision's Deployment reads its manifest with; None when it is not known.

    A revision keeps its layout, as it keeps its sync image (kept_sync_image): its pods, and the
    sync image they run, read the manifest where the template says.
    """
    template = ((deployment or {}).get("spec") or {}).get("template") or {}
    pod = template.get("spec") or {}
    sync = next((c for c in pod.get("initContainers") or [] if c.get("name") == SYNC_CONTAINER), None)
    args = list((sync or {}).get("args") or [])
    if MANIFEST_PATH in args:
        return PLAIN
    if MANIFEST_DIR not in args:
        return None
    volume: Mapping[str, Any] = next(
        (v for v in pod.get("volumes") or [] if v.get("name") == CONFIG_VOLUME), {}
    )
    sources = (volume.get("projected") or {}).get("sources") or []
    items = [i for s in sources for i in (s.get("configMap") or {}).get("items") or []]
    return ManifestLayout(sum(1 for i in items if manifestparts.part_index(str(i.get("key"))) is not None))


def build_configmaps(
    ts: TritonService,
    revision: str,
    configs: Mapping[str, str],
    manifest_json: str | None,
    *,
    layout: ManifestLayout | None = None,
    existing: Sequence[Mapping[str, Any]] = (),
) -> list[dict[str, Any]]:
    """The revision's ConfigMaps: `<name>-<rev>` with `<model>.config.pbtxt` per model and the
    manifest (unpinned if None), then one ConfigMap per further part of a manifest in parts.

    The manifest is plain JSON under MANIFEST_KEY when ``layout`` says so, or (``layout`` None, a
    new revision) when it fits beside the configs in CONFIGMAP_BUDGET; else gzipped parts, part 0
    beside the configs. ``existing``: the revision's ConfigMaps as stored, whose parts are kept
    when they give back the same manifest. Raises manifestparts.ManifestTooLarge when the
    manifest needs more than MAX_PARTS parts.
    """
    text = manifest_json if manifest_json is not None else unpinned_manifest_json(ts)
    data = {config_key(model): body for model, body in sorted(configs.items())}
    # The spec it was rendered from (never mounted; updated while it is the spec's revision).
    data[SPEC_KEY] = json.dumps(
        ts.spec.model_dump(mode="json", by_alias=True, exclude_unset=True), sort_keys=True
    )
    main: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(ts, object_name(ts, revision), build_labels(ts, revision)),
        "data": data,
    }
    room = manifestparts.CONFIGMAP_BUDGET - configs_bytes(configs) - len(data[SPEC_KEY].encode("utf-8"))
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


def triton_args(ts: TritonService) -> list[str]:
    """tritonserver's arguments: our repository, control mode, models and ports, then serverArgs."""
    args = [f"--model-repository={MODELS_DIR}", "--model-control-mode=explicit"]
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


def exit_timeout_seconds(server_args: Sequence[str]) -> int:
    """tritonserver's --exit-timeout-secs from serverArgs (``--flag=N`` or ``--flag N``), else its default."""
    value: str | None = None
    for index, arg in enumerate(server_args):
        name, has_value, rest = arg.partition("=")
        if name == "--exit-timeout-secs":
            if has_value:
                value = rest
            elif index + 1 < len(server_args):
                value = server_args[index + 1]
    if value is not None and value.strip().isdigit():
        return int(value)
    return TRITON_EXIT_TIMEOUT_SECONDS


def termination_grace_seconds(ts: TritonService) -> int:
    """The drain (preStop sleep), then Triton's exit timeout for in-flight requests, then a margin."""
    return ts.spec.drain_seconds + exit_timeout_seconds(ts.spec.server_args) + TERMINATION_MARGIN_SECONDS


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


def build_pod_template(
    ts: TritonService, revision: str, settings: Settings, layout: ManifestLayout = PLAIN
) -> dict[str, Any]:
    """The pod template of a revision: the sync init container fills /models, tritonserver serves it.

    ``layout``: how the revision's ConfigMaps hold the manifest (build_configmaps, manifest_layout).
    """
    spec = ts.spec
    is_pvc = spec.repository.scheme == "pvc"

    volumes: list[dict[str, Any]] = [
        {"name": MODELS_VOLUME, "emptyDir": {}},
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}},
    ]
    volumes.append(config_volume(ts, revision, layout))
    # A claim is mounted read-only at the same path in both containers: sync links its version
    # folders into /models (no copy), and tritonserver follows the links.
    repository_mount = {"name": REPOSITORY_VOLUME, "mountPath": PVC_ROOT, "readOnly": True}
    if is_pvc:
        claim = pvc_claim(spec.repository.uri)
        volumes.append(
            {"name": REPOSITORY_VOLUME, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        )
    volumes += [dict(v) for v in spec.volumes]

    triton: dict[str, Any] = {
        "name": TRITON_CONTAINER,
        "image": triton_image(ts, settings),
        "command": ["tritonserver"],
        "args": triton_args(ts),
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": _probe(READINESS_PATH, period=READINESS_PERIOD_SECONDS, failures=2, timeout=3),
        "livenessProbe": _probe(LIVENESS_PATH, period=10, failures=3, timeout=5),
        "startupProbe": _probe(
            READINESS_PATH,
            period=STARTUP_PERIOD_SECONDS,
            failures=startup_failure_threshold(spec.startup_timeout()),
            timeout=5,
        ),
        # Endpoints drop a terminating pod at once, but kube-proxy, load balancers and routers catch
        # up later: keep serving for drainSeconds before tritonserver gets SIGTERM.
        **(
            {"lifecycle": {"preStop": {"exec": {"command": ["sleep", str(spec.drain_seconds)]}}}}
            if spec.drain_seconds
            else {}
        ),
        "volumeMounts": [
            {"name": MODELS_VOLUME, "mountPath": MODELS_DIR},
            {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
            *([repository_mount] if is_pvc else []),
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

    pod_spec: dict[str, Any] = {
        "containers": [triton],
        "volumes": volumes,
        # Service links put 7 variables per Service of the namespace into every container.
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": termination_grace_seconds(ts),
    }
    manifest = MANIFEST_PATH if layout.plain else MANIFEST_DIR
    sync_args = ["--manifest", manifest, "--configs", CONFIGS_DIR, "--dest", MODELS_DIR]
    sync: dict[str, Any] = {
        "name": SYNC_CONTAINER,
        "image": settings.sync_image,
        "command": ["triton-operator", "sync"],
        "args": [*sync_args, "--pvc-root", PVC_ROOT] if is_pvc else sync_args,
        "volumeMounts": [
            {"name": MODELS_VOLUME, "mountPath": MODELS_DIR},
            {"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True},
            *([repository_mount] if is_pvc else []),
        ],
    }
    if settings.sync_image_pull_policy:
        sync["imagePullPolicy"] = settings.sync_image_pull_policy
    if spec.repository.credentials_secret and not is_pvc:
        sync["envFrom"] = [{"secretRef": {"name": spec.repository.credentials_secret}}]
    pod_spec["initContainers"] = [sync]
    if spec.service_account_name:
        pod_spec["serviceAccountName"] = spec.service_account_name
    if spec.priority_class_name:
        pod_spec["priorityClassName"] = spec.priority_class_name
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in spec.image_pull_secrets]
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in spec.tolerations]
    if spec.affinity:
        pod_spec["affinity"] = dict(spec.affinity)

    annotations: dict[str, str] = {}
    if settings.prometheus_scrape:
        annotations.update(
            {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(METRICS_PORT),
                "prometheus.io/path": "/metrics",
            }
        )
    annotations.update(spec.pod_annotations)
    # The operator's labels win: selectors and revision bookkeeping depend on them.
    labels = {**spec.pod_labels, **build_labels(ts, revision)}
    metadata: dict[str, Any] = {"labels": labels}
    if annotations:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": pod_spec}


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


# ----------------------------------------------------------------- observed state


def controlled_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether ``obj``'s controller ownerReference is the object with ``uid``."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("controller") and ref.get("uid") == uid for ref in refs)


@dataclasses.dataclass(frozen=True)
class Adoption:
    """The labelled objects split by owner: this TritonService's, and an earlier one's (same name)."""

    deployments: list[Mapping[str, Any]]
    configmaps: list[Mapping[str, Any]]
    pods: list[Mapping[str, Any]]
    foreign: tuple[str, ...]
    """Names of Deployments and ConfigMaps with the labels but another controller (waiting for the
    garbage collector after a delete and re-create): never adopted, never counted."""


def split_by_owner(
    uid: str,
    deployments: Sequence[Mapping[str, Any]],
    configmaps: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
) -> Adoption:
    """Objects found by label, kept only when this TritonService (``uid``) controls them.

    Labels alone also match what a deleted TritonService of the same name left for the garbage
    collector (`kubectl replace --force`, Argo CD `Replace=true`); adopting those would make them
    look like revisions of this one. Pods belong to the kept Deployments' revisions.
    """
    mine = [d for d in deployments if controlled_by(d, uid)]
    maps = [c for c in configmaps if controlled_by(c, uid)]
    revisions = {_revision_of(d) for d in mine}
    owned_pods = [p for p in pods if _revision_of(p) in revisions]
    foreign = tuple(
        sorted(
            str((o.get("metadata") or {}).get("name", ""))
            for o in [*deployments, *configmaps]
            if not controlled_by(o, uid)
        )
    )
    return Adoption(mine, maps, owned_pods, foreign)


@dataclasses.dataclass(frozen=True)
class DeploymentState:
    """What the operator needs to know about one observed revision Deployment."""

    name: str
    revision: str
    replicas: int
    ready_replicas: int = 0
    updated_replicas: int = 0
    available_replicas: int = 0
    generation: int = 0
    observed_generation: int = 0
    deadline_exceeded: bool = False

    def complete(self, replicas: int) -> bool:
        """Scaled to ``replicas``, all updated and Ready, as the Deployment controller last saw it."""
        return (
            self.observed_generation >= self.generation
            and self.replicas == replicas
            and self.updated_replicas >= replicas
            and self.ready_replicas >= replicas
        )


@dataclasses.dataclass(frozen=True)
class PodState:
    """What the operator needs to know about one observed pod."""

    name: str
    revision: str
    ready: bool = False
    unschedulable: str | None = None
    waiting_reason: str | None = None
    waiting_message: str | None = None
    terminating: bool = False


def deployment_state(obj: Mapping[str, Any]) -> DeploymentState:
    """Read a Deployment's dict (as the API returns it)."""
    metadata = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    deadline = any(
        c.get("type") == cond.DEPLOYMENT_PROGRESSING and c.get("reason") == cond.DEPLOYMENT_DEADLINE_EXCEEDED
        for c in status.get("conditions") or []
    )
    return DeploymentState(
        name=str(metadata.get("name", "")),
        revision=str((metadata.get("labels") or {}).get(LABEL_REVISION, "")),
        replicas=int(spec.get("replicas", 1)),
        ready_replicas=int(status.get("readyReplicas", 0)),
        updated_replicas=int(status.get("updatedReplicas", 0)),
        available_replicas=int(status.get("availableReplicas", 0)),
        generation=int(metadata.get("generation", 0)),
        observed_generation=int(status.get("observedGeneration", 0)),
        deadline_exceeded=deadline,
    )


def pod_state(obj: Mapping[str, Any]) -> PodState:
    """Read a Pod's dict (as the API returns it)."""
    metadata = obj.get("metadata") or {}
    status = obj.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    ready = (conditions.get(cond.POD_READY) or {}).get("status") == cond.TRUE
    scheduled = conditions.get(cond.POD_SCHEDULED) or {}
    unschedulable = None
    if scheduled.get("status") == cond.FALSE and scheduled.get("reason") == cond.POD_UNSCHEDULABLE:
        unschedulable = str(scheduled.get("message") or cond.POD_UNSCHEDULABLE)
    waiting_reason = waiting_message = None
    for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in FAILING_WAIT_REASONS:
            waiting_reason = str(waiting["reason"])
            waiting_message = f"container {cs.get('name')}: {waiting.get('message') or waiting['reason']}"
            break
    return PodState(
        name=str(metadata.get("name", "")),
        revision=str((metadata.get("labels") or {}).get(LABEL_REVISION, "")),
        ready=ready,
        unschedulable=unschedulable,
        waiting_reason=waiting_reason,
        waiting_message=waiting_message,
        terminating=metadata.get("deletionTimestamp") is not None,
    )


FAILING_WAIT_REASONS = frozenset(
    {
        cond.CRASH_LOOP_BACK_OFF,
        "ImagePullBackOff",
        "ErrImagePull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)


# ----------------------------------------------------------------- revisions (the rollout seam)


@dataclasses.dataclass(frozen=True)
class RevisionPlan:
    """Which revisions serve, as the status reports them (built from core.rollout's plan)."""

    replicas: Mapping[str, int]
    """Revisions to apply, with their replicas; revisions absent here and from delete stay as they are."""
    delete: tuple[str, ...] = ()
    """Revisions whose Deployment goes away."""
    stable: str | None = None
    """The promoted revision that serves."""
    rolling: str | None = None
    """The new revision not yet promoted (None when the desired revision is stable)."""


# ----------------------------------------------------------------- everything at once


@dataclasses.dataclass(frozen=True)
class Actions:
    """What the reconcile writes for one rollout plan (routes and status aside), in this order."""

    apply: tuple[dict[str, Any], ...]
    """Whole objects to server-side apply: the spec's revision (its ConfigMaps not yet stored as
    built, then its Deployment), then Services."""
    scale: Mapping[str, int]
    """Deployment name -> spec.replicas for the revisions other than the spec's, where it differs."""
    delete: tuple[tuple[str, str], ...]
    """(kind, name) to delete: Deployments and ConfigMaps of revisions let go (and manifest parts the
    spec's revision no longer has), unused revision Services."""


def _names(objects: Sequence[Mapping[str, Any]]) -> list[str]:
    return [str((o.get("metadata") or {}).get("name", "")) for o in objects]


def _stored_as_built(built: Mapping[str, Any], stored: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a ConfigMap as the API server holds it already is ``built`` (content, labels, owner)."""
    name = built["metadata"]["name"]
    found = next((c for c in stored if (c.get("metadata") or {}).get("name") == name), None)
    if found is None:
        return False
    metadata = found.get("metadata") or {}
    labels = metadata.get("labels") or {}
    return (
        (found.get("data") or {}) == (built.get("data") or {})
        and (found.get("binaryData") or {}) == (built.get("binaryData") or {})
        and all(labels.get(k) == v for k, v in built["metadata"]["labels"].items())
        and metadata.get("ownerReferences") == built["metadata"]["ownerReferences"]
    )


def _revision_of(obj: Mapping[str, Any]) -> str | None:
    revision = ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_REVISION)
    return str(revision) if revision else None


def plan_actions(
    ts: TritonService,
    settings: Settings,
    revision: str,
    plan: RolloutPlan,
    *,
    configs: Mapping[str, str],
    manifest_json: str | None,
    deployments: Sequence[Mapping[str, Any]],
    configmaps: Sequence[Mapping[str, Any]],
    revision_services: bool = False,
    disruption_budget: bool = False,
) -> Actions:
    """The writes that carry out ``plan`` for the spec's ``revision``.

    Only the spec's own revision can be rendered (ConfigMap and Deployment in full). Any other
    revision the plan keeps (the stable one being replaced, history, an undo target) was rendered
    from an earlier spec: only its Deployment's spec.replicas changes, and its ConfigMap stays as
    it is, so an undo serves the same bytes. A revision whose Deployment is gone cannot be rebuilt.
    ``revision_services``: `<name>-stable`/`<name>-canary` may exist (they are deleted when the
    spec no longer routes through Gateway API). ``disruption_budget``: the PodDisruptionBudget
    exists (it is deleted when the spec no longer wants one).
    """
    apply: list[dict[str, Any]] = []
    delete: list[tuple[str, str]] = []
    if revision in plan.replicas:
        existing = next((d for d in deployments if _revision_of(d) == revision), None)
        stored = revision_configmaps(configmaps, revision)
        built = build_configmaps(
            ts, revision, configs, manifest_json, layout=layout_of(existing), existing=stored
        )
        # A revision's ConfigMaps never change (its hash names them): one stored as built is not
        # sent again, which spares the API server megabytes of manifest parts on every reconcile.
        apply += [c for c in built if not _stored_as_built(c, stored)]
        apply.append(
            build_deployment(
                ts,
                revision,
                kept_sync_image(settings, existing),
                plan.replicas[revision],
                manifest_layout(built),
            )
        )
        names = {c["metadata"]["name"] for c in built}
        delete += [("ConfigMap", n) for n in _names(stored) if n not in names]
    apply.append(build_service(ts, plan.stable_service_revision))
    if disruption_budget_enabled(ts):
        apply.append(build_pdb(ts))
    elif disruption_budget:
        delete.append(("PodDisruptionBudget", ts.name))
    routing = ts.spec.rollout.traffic_routing
    if routing is not None and routing.gateway_api is not None:
        owner = build_owner_reference({"metadata": ts.metadata})
        roles: tuple[tuple[Role, str | None], ...] = (
            ("stable", plan.stable_service_revision),
            ("canary", plan.canary_service_revision or plan.stable_service_revision),
        )
        for role, selected in roles:
            if selected:
                apply.append(
                    build_revision_service(
                        ts.name, ts.namespace, role, selected, owner_ref=owner, labels=build_labels(ts)
                    )
                )
    elif revision_services:
        delete += [("Service", revision_service_name(ts.name, role)) for role in ("stable", "canary")]

    scale: dict[str, int] = {}
    for deployment in deployments:
        rev = _revision_of(deployment)
        if rev is None or rev == revision or rev not in plan.replicas:
            continue
        if int((deployment.get("spec") or {}).get("replicas", 1)) != plan.replicas[rev]:
            scale[str(deployment["metadata"]["name"])] = plan.replicas[rev]
    for rev in plan.delete:
        delete += [("Deployment", object_name(ts, rev)), ("ConfigMap", object_name(ts, rev))]
    for configmap in configmaps:
        rev = _revision_of(configmap)
        name = str((configmap.get("metadata") or {}).get("name", ""))
        if rev not in plan.replicas and ("ConfigMap", name) not in delete:
            delete.append(("ConfigMap", name))
    return Actions(apply=tuple(apply), scale=scale, delete=tuple(delete))


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


def unpinned_manifest_json(ts: TritonService) -> str:
    """A manifest that pins nothing (pvc://, or a store not listed yet): models and policies only."""
    manifest = unpinned_manifest(StoreRef.from_repository(ts.spec.repository), model_sources(ts.spec.models))
    return manifest_to_json(manifest)
