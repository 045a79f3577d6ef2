"""What the operator reads back: checked specs, owned objects, stored revisions, Deployment and pod states."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from triton_operator import logs
from triton_operator.core.objects.builders import (
    AGENT_READINESS_PERIOD_SECONDS,
    PLAIN,
    SCRAPE_ANNOTATIONS,
    ManifestLayout,
    configs_bytes,
    read_settings_record,
    stored_spec,
)
from triton_operator.core.objects.names import (
    AGENT_CONTAINER,
    CONFIG_VOLUME,
    INPLACE_TARGET_ANNOTATION,
    LABEL_REVISION,
    MANIFEST_DIR,
    MANIFEST_PATH,
    OPERATOR_KEY,
    POD_NAME_ENV,
    SPEC_KEY,
    SYNC_CONTAINER,
    TRITON_CONTAINER,
)
from triton_operator.core.pod.startup import FillTimeline, PodStart, pod_start
from triton_operator.core.repository import manifestparts
from triton_operator.core.repository.cache_rules import PORT_ENV, PUBLIC_KEY_ENV, TOKEN_ENV
from triton_operator.core.repository.shared_files import FILES_ENV
from triton_operator.core.rollout.clock import parse_time
from triton_operator.core.rollout.state import RevisionState, revision_ready
from triton_operator.core.spec.field_error import ModelConfigError
from triton_operator.core.spec.modelconfig import build_config_pbtxt
from triton_operator.core.spec.validation.errors import errors_from_validation
from triton_operator.core.spec.validation.spec import validate_spec
from triton_operator.core.vocabulary import conditions as cond
from triton_operator.core.vocabulary.triton_state import (
    ModelVersionState,
    describe_failures,
    failed_versions,
    load_failures,
    merge,
    short_reason,
)
from triton_operator.models import TritonService
from triton_operator.settings import Settings

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
    """Parse a TritonService body and check what the CRD schema cannot (core.spec.validation), then render.

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
    too_large = configmap_problem(configs, len(stored_spec(ts).encode("utf-8")))
    if too_large is not None:
        found.append(too_large)
    return CheckedSpec(ts=ts, configs=configs, problems=tuple(found))


def configmap_problem(configs: Mapping[str, str], spec_bytes: int) -> str | None:
    """Why what the revision's ConfigMap must hold besides the manifest does not fit in it, if it
    does not: the rendered config.pbtxt files and the copy of the spec (SPEC_KEY) it keeps.

    The operator's own record (OPERATOR_KEY, a few hundred bytes) fits in what CONFIGMAP_BUDGET
    leaves below the API server's CONFIGMAP_LIMIT; the manifest goes to parts of its own.
    """
    rendered = configs_bytes(configs)
    size = rendered + spec_bytes
    if size <= manifestparts.CONFIGMAP_BUDGET:
        return None
    return (
        f"spec.models: the rendered config.pbtxt files ({rendered} bytes) and the copy of the spec the "
        f"revision keeps to go on under it ({spec_bytes} bytes, the models' configs again) take {size} "
        f"bytes; the revision's ConfigMap holds at most {manifestparts.CONFIGMAP_BUDGET} (the API "
        f"server refuses a ConfigMap over {manifestparts.CONFIGMAP_LIMIT}). Make the models' configs "
        "smaller (e.g. fewer or shorter parameters)"
    )


# ----------------------------------------------------------------- revisions' stored ConfigMaps


def revision_configmaps(configmaps: Sequence[Mapping[str, Any]], revision: str) -> list[Mapping[str, Any]]:
    """The ConfigMaps of one revision (its own, and those holding parts of its manifest)."""
    return [c for c in configmaps if revision_of(c) == revision]


def revision_manifest(configmaps: Sequence[Mapping[str, Any]], revision: str) -> str | None:
    """The manifest JSON one revision's ConfigMaps hold (plain, or its parts put back together)."""
    return manifestparts.stored_manifest(revision_configmaps(configmaps, revision))


def revision_of(obj: Mapping[str, Any]) -> str | None:
    """An object's revision label (None when it has none)."""
    revision = ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_REVISION)
    return str(revision) if revision else None


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
    canary, the one loading in place (or held after its in-place rollback), the one the stable pods
    serve in place, the stable one; the first whose ConfigMap holds a spec wins (a revision
    rendered by an operator that did not store specs has none).
    """
    in_place = status.get("inPlace") or {}
    revisions = [status.get(k) for k in ("pinnedFor", "abortedRevision", "canaryRevision")]
    revisions += [in_place.get("next"), in_place.get("abortedRevision"), status.get("servedRevision")]
    for revision in [*revisions, status.get("stableRevision")]:
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


# ----------------------------------------------------------------- existing revisions' Deployments


def layout_of(deployment: Mapping[str, Any] | None) -> ManifestLayout | None:
    """The layout an existing revision's Deployment reads its manifest with; None when it is not known.

    A revision keeps its layout, as it keeps its sync image (kept_sync_image): its pods, and the
    sync image they run, read the manifest where the template says.
    """
    template = ((deployment or {}).get("spec") or {}).get("template") or {}
    pod = template.get("spec") or {}
    sync = next((c for c in pod.get("initContainers") or [] if c.get("name") == SYNC_CONTAINER), None)
    if sync is None:  # a pod of the one shape: the agent reads it
        sync = next((c for c in pod.get("containers") or [] if c.get("name") == AGENT_CONTAINER), None)
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


def kept_sync_image(settings: Settings, deployment: Mapping[str, Any] | None) -> Settings:
    """``settings`` with the sync image (and pull policy) an existing revision's Deployment runs.

    A revision keeps the `triton-operator sync` image it was created with, so an operator upgrade
    restarts no serving pod; the next revision (any change of the spec) gets the new image.
    """
    template = ((deployment or {}).get("spec") or {}).get("template") or {}
    for container, one_shape in _fetching_containers(template.get("spec") or {}):
        if container.get("image"):
            image = str(container["image"])
            policy = container.get("imagePullPolicy")
            # The API server fills in the default policy: leave that one unset, as it was written,
            # so that applying the same template again changes nothing (not even managedFields).
            if policy == default_pull_policy(image):
                policy = None
            return dataclasses.replace(
                settings,
                sync_image=image,
                sync_image_pull_policy=policy,
                node_cache_port=_node_cache_port(container),
                log_format=_log_format(container),
                node_cache_token=any(e.get("name") == TOKEN_ENV for e in container.get("env") or []),
                node_cache_public_key=_node_cache_public_key(container),
                node_cache_shared_files=any(e.get("name") == FILES_ENV for e in container.get("env") or []),
                agent_pods=one_shape,
            )
    return settings


def _node_cache_public_key(container: Mapping[str, Any]) -> str | None:
    """The node cache's public key a sync container was given (core.objects.builders.node_cache_env)."""
    env = {e.get("name"): e.get("value") for e in container.get("env") or []}
    key = env.get(PUBLIC_KEY_ENV)
    return key if isinstance(key, str) and key else None


def _fetching_containers(pod: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], bool]]:
    """The container of a pod template that fetches the models, and whether the template is of the
    one pod shape: the sync init container (a revision made before it), else the model agent."""
    inits = [c for c in pod.get("initContainers") or [] if c.get("name") == SYNC_CONTAINER]
    if inits:
        return [(inits[0], False)]
    return [(c, True) for c in pod.get("containers") or [] if c.get("name") == AGENT_CONTAINER][:1]


def _log_format(container: Mapping[str, Any]) -> str:
    """The log format a sync container was given (core.objects.builders.log_env): json, else text."""
    env = {e.get("name"): e.get("value") for e in container.get("env") or []}
    return "json" if env.get(logs.ENV) == "json" else "text"


def _node_cache_port(container: Mapping[str, Any]) -> int | None:
    """The node cache's port a sync container was given (core.objects.builders.node_cache_env), or None."""
    for env in container.get("env") or []:
        if env.get("name") == PORT_ENV and str(env.get("value") or "").isdigit():
            return int(env["value"])
    return None


def kept_pod_security(settings: Settings, deployment: Mapping[str, Any]) -> Settings:
    """``settings`` with the securityContext defaults, the terminationMessagePolicy and the readiness
    probe's timing an existing revision's Deployment has: a revision made before the operator set
    them keeps going without.

    Like its sync image, a revision keeps the pod template it was created with: applying the
    defaults to its Deployment would restart every serving pod, under a user the image may not
    support, outside any canary. The next revision gets them, and a canary tries it first.
    """
    pod = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    sync = next((c for c, _ in _fetching_containers(pod)), None)
    triton = next((c for c in pod.get("containers") or [] if c.get("name") == TRITON_CONTAINER), None)
    if sync is not None:
        # The sync container has a securityContext exactly when the defaults are on (not the spec's).
        settings = dataclasses.replace(settings, pod_security_defaults="securityContext" in sync)
        log_on_exit = sync.get("terminationMessagePolicy", "File") == "FallbackToLogsOnError"
        settings = dataclasses.replace(settings, sync_log_on_exit=log_on_exit)
    if triton is not None:
        # The API server stores the default policy, File.
        policy = triton.get("terminationMessagePolicy", "File")
        settings = dataclasses.replace(settings, triton_log_on_exit=policy == "FallbackToLogsOnError")
        # The agent's quick readiness probe is the only one every second (builders.readiness_timing).
        period = (triton.get("readinessProbe") or {}).get("periodSeconds")
        settings = dataclasses.replace(settings, quick_agent_probe=period == AGENT_READINESS_PERIOD_SECONDS)
    # A pool revision whose leaving pods wait on their models' Services: its agent names its pod.
    agent = next((c for c in pod.get("containers") or [] if c.get("name") == AGENT_CONTAINER), None)
    leaves = agent is not None and any(e.get("name") == POD_NAME_ENV for e in agent.get("env") or [])
    return dataclasses.replace(settings, pool_leave=leaves)


def live_settings(settings: Settings, deployment: Mapping[str, Any]) -> Settings:
    """``settings`` with what an existing revision's Deployment runs: its tritonserver image (the
    default it was created with, when its spec names none), sync image, pod security defaults,
    termination message policy and scrape annotations."""
    kept = kept_pod_security(kept_sync_image(settings, deployment), deployment)
    template = (deployment.get("spec") or {}).get("template") or {}
    containers = (template.get("spec") or {}).get("containers") or []
    triton: Mapping[str, Any] = next((c for c in containers if c.get("name") == TRITON_CONTAINER), {})
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    scrape = all(annotations.get(k) == v for k, v in SCRAPE_ANNOTATIONS.items())
    image = str(triton.get("image") or kept.default_image)
    return dataclasses.replace(kept, default_image=image, prometheus_scrape=scrape)


def recorded_settings(
    settings: Settings, configmaps: Sequence[Mapping[str, Any]], deployment: Mapping[str, Any] | None
) -> Settings:
    """The operator settings an existing revision was created with: what its ConfigMaps recorded
    (OPERATOR_KEY), else (a revision made before the record) what its Deployment runs; ``settings``
    for a new revision. A revision's pod template never changes: it is re-rendered with these,
    blocked spec or not, whatever the operator's settings are today."""
    for configmap in configmaps:
        text = (configmap.get("data") or {}).get(OPERATOR_KEY)
        recorded = read_settings_record(str(text), settings) if text is not None else None
        if recorded is not None:
            return recorded
    return live_settings(settings, deployment) if deployment is not None else settings


def recorded_revisions(
    settings: Settings, deployments: Sequence[Mapping[str, Any]], configmaps: Sequence[Mapping[str, Any]]
) -> dict[str, Settings]:
    """Every existing revision with the operator settings it was created with (recorded_settings)."""
    live = {revision_of(d): d for d in deployments}
    revisions = {r for r in [*live, *(revision_of(c) for c in configmaps)] if r is not None}
    out: dict[str, Settings] = {}
    for revision in sorted(revisions):
        own = revision_configmaps(configmaps, revision)
        if any(OPERATOR_KEY in (c.get("data") or {}) for c in own) or revision in live:
            out[revision] = recorded_settings(settings, own, live.get(revision))
    return out


def revision_image(deployments: Sequence[Mapping[str, Any]], revision: str | None) -> str | None:
    """The tritonserver image a revision's Deployment runs (None without one)."""
    for deployment in deployments:
        if revision is None or revision_of(deployment) != revision:
            continue
        pod = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
        for container in pod.get("containers") or []:
            if container.get("name") == TRITON_CONTAINER and container.get("image"):
                return str(container["image"])
    return None


def behind_default(ts: TritonService, settings: Settings, image: str | None) -> str | None:
    """The operator's default image when the spec names none and ``image`` (what the stable revision
    runs) is another: made under an earlier default, it keeps it until the spec changes."""
    if ts.spec.image is not None or image is None or image == settings.default_image:
        return None
    return settings.default_image


def default_pull_policy(image: str) -> str:
    """The imagePullPolicy Kubernetes gives a container that sets none: Always for :latest or no tag."""
    name = image.split("@", 1)[0]
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else ""
    return "Always" if "@" not in image and tag in ("", "latest") else "IfNotPresent"


# ----------------------------------------------------------------- objects by owner


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
    revisions = {revision_of(d) for d in mine}
    owned_pods = [p for p in pods if revision_of(p) in revisions]
    foreign = tuple(
        sorted(
            str((o.get("metadata") or {}).get("name", ""))
            for o in [*deployments, *configmaps]
            if not controlled_by(o, uid)
        )
    )
    return Adoption(mine, maps, owned_pods, foreign)


def nothing_applied_yet(
    previous: Mapping[str, Any],
    deployments: Sequence[Mapping[str, Any]],
    configmaps: Sequence[Mapping[str, Any]],
) -> bool:
    """Whether no pass has applied anything for this TritonService yet: no status, and none of its
    own Deployments or ConfigMaps (split_by_owner). A pass applies its revision's ConfigMaps and
    Deployment before any other object and writes the status after them, so nothing else of it
    (a PodDisruptionBudget) can exist either: a new TritonService's first pass looks none up."""
    return not previous and not deployments and not configmaps


# ----------------------------------------------------------------- Deployment and pod states

CRASH_RESTART_THRESHOLD = 3
"""Restarts after which a pod counts as crash looping, whether or not it waits in CrashLoopBackOff."""

POD_PENDING = "Pending"
POD_UNKNOWN = "Unknown"
SETTLED_PHASES = frozenset({"Failed", "Succeeded"})
"""Phases a pod never leaves: every container stopped for good (an evicted pod is Failed, reason
Evicted, with no deletionTimestamp, and stays until deleted). Such a pod is not live."""


@dataclasses.dataclass(frozen=True)
class DeploymentState:
    """What the operator needs to know about one observed revision Deployment."""

    name: str
    revision: str
    replicas: int
    """spec.replicas."""
    ready_replicas: int = 0
    updated_replicas: int = 0
    available_replicas: int = 0
    generation: int = 0
    observed_generation: int = 0
    deadline_exceeded: bool = False
    status_replicas: int = 0
    """status.replicas: the pods the Deployment controller counts (terminating ones left out)."""

    @property
    def observed(self) -> bool:
        """status.observedGeneration >= metadata.generation: the controller has seen the spec."""
        return self.observed_generation >= self.generation

    def ready_at(self, replicas: int) -> bool:
        """Ready at ``replicas``, by the rollout's own rule (core.rollout.state.revision_ready)."""
        return revision_ready(
            replicas, observed=self.observed, spec_replicas=self.replicas, ready_replicas=self.ready_replicas
        )


@dataclasses.dataclass(frozen=True)
class PodState:
    """What the operator needs to know about one observed pod (the status and the rollout read it)."""

    name: str
    revision: str
    ready: bool = False
    unschedulable: str | None = None
    """The scheduler's message while it marks the pod Unschedulable."""
    unschedulable_since: datetime | None = None
    """When the scheduler marked the pod Unschedulable, if it still is."""
    waiting_reason: str | None = None
    """The first container (init ones first) waiting for a reason in FAILING_WAIT_REASONS."""
    waiting_message: str | None = None
    crash_loop_back_off: bool = False
    """A container (init ones too) waits in CrashLoopBackOff."""
    restarts: int = 0
    """The most restarts of any of its containers (init ones too)."""
    terminating: bool = False
    uid: str = ""
    ip: str | None = None
    """status.podIP: where the operator reads Triton's own view of the pod."""
    triton_restarts: int = 0
    """restartCount of the tritonserver container: Triton's counters start again at each restart."""
    triton_failures: tuple[ModelVersionState, ...] = ()
    """The model versions Triton says failed to load, read once from the log tail the tritonserver
    container left at its last exit (terminationMessagePolicy FallbackToLogsOnError)."""
    inplace_target: str | None = None
    """Its `triton-operator.io/inplace-target` annotation: the revision the operator asked it to
    load in place (core.rollout.inplace)."""
    sync_failure: str | None = None
    """Why the sync init container last failed, in its own words (its termination message: e.g. the
    model repository needs more bytes than the volume has free), while it has not since succeeded."""
    start: PodStart = dataclasses.field(default_factory=PodStart)
    """The times of the pod's start (created, scheduled, sync, tritonserver, Ready) and what its
    sync fetched (core.pod.startup: status.timeToServe and the time-to-serve metrics read them); in a
    pod of the one shape, its agent's record of its fill once read (with_fill)."""

    def with_fill(self, fill: FillTimeline | None) -> PodState:
        """The pod with its agent's record of its first fill (one shape; read by reconcile.observe):
        its start's phases then have the sync and the bytes (core.pod.startup.PodStart.phases)."""
        if fill is None or not self.start.fills:
            return self
        return dataclasses.replace(self, start=dataclasses.replace(self.start, fill=fill))

    phase: str | None = None
    """status.phase (Pending, Running, Succeeded, Failed, Unknown; None: not reported)."""
    phase_reason: str | None = None
    """status.reason (e.g. Evicted) and, below, status.message: why the kubelet set the phase."""
    phase_message: str | None = None
    triton_started: bool = False
    """The tritonserver container runs (started, or state.running), Ready or not."""

    @property
    def settled(self) -> bool:
        """Failed or Succeeded: the pod never runs again (an evicted pod); it is not live."""
        return self.phase in SETTLED_PHASES

    @property
    def live(self) -> bool:
        """Neither terminating nor settled: the pod may serve now or later."""
        return not self.terminating and not self.settled

    def cannot_serve(self) -> str | None:
        """Why the pod cannot serve now, in words for the status; None when it can, that is when it
        is live, Running (a pod that reports no phase is judged by the rest), scheduled, not
        crash looping or failing to start a container, and Ready or with tritonserver running (a
        pod whose models reload in place is un-Ready for a while, and still one that serves)."""
        if self.terminating:
            return "terminating"
        if self.settled:
            why = ": ".join(w for w in (self.phase_reason, self.phase_message) if w)
            return f"{self.phase} ({why})" if why else str(self.phase)
        if self.phase == POD_PENDING or self.unschedulable:
            if self.unschedulable:
                return f"Pending ({cond.POD_UNSCHEDULABLE}: {short_reason(self.unschedulable)})"
            if self.waiting_reason:
                return f"Pending ({self.waiting_reason}: {short_reason(self.waiting_message or '')})"
            return "Pending (starting)"
        if self.phase == POD_UNKNOWN:
            return "Unknown (its node does not report it)"
        if self.crash_loop_back_off or self.waiting_reason:
            reason = self.waiting_reason or cond.CRASH_LOOP_BACK_OFF
            return f"{reason} ({short_reason(self.waiting_message or 'restarting')})"
        if not self.ready and not self.triton_started:
            return "not started (tritonserver is not running)"
        return None

    def crash_looping(self, threshold: int = CRASH_RESTART_THRESHOLD) -> bool:
        """A container waits in CrashLoopBackOff or restarted ``threshold`` times or more."""
        return self.crash_loop_back_off or self.restarts >= threshold


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
        ready_replicas=int(status.get("readyReplicas") or 0),
        updated_replicas=int(status.get("updatedReplicas") or 0),
        available_replicas=int(status.get("availableReplicas") or 0),
        generation=int(metadata.get("generation") or 0),
        observed_generation=int(status.get("observedGeneration") or 0),
        deadline_exceeded=deadline,
        status_replicas=int(status.get("replicas") or 0),
    )


def pod_state(obj: Mapping[str, Any]) -> PodState:
    """Read a Pod's dict (as the API returns it)."""
    metadata = obj.get("metadata") or {}
    status = obj.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    ready = (conditions.get(cond.POD_READY) or {}).get("status") == cond.TRUE
    scheduled = conditions.get(cond.POD_SCHEDULED) or {}
    unschedulable = since = None
    if scheduled.get("status") == cond.FALSE and scheduled.get("reason") == cond.POD_UNSCHEDULABLE:
        unschedulable = str(scheduled.get("message") or cond.POD_UNSCHEDULABLE)
        since = parse_time(scheduled.get("lastTransitionTime")) or datetime.min.replace(tzinfo=UTC)
    containers = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    waiting_reason, waiting_message = _failing_wait(containers)
    triton: Mapping[str, Any] = next((cs for cs in containers if cs.get("name") == TRITON_CONTAINER), {})
    sync = sync_container_status(status)
    return PodState(
        name=str(metadata.get("name", "")),
        revision=str((metadata.get("labels") or {}).get(LABEL_REVISION, "")),
        ready=ready,
        unschedulable=unschedulable,
        unschedulable_since=since,
        waiting_reason=waiting_reason,
        waiting_message=waiting_message,
        crash_loop_back_off=any(_waiting(cs).get("reason") == cond.CRASH_LOOP_BACK_OFF for cs in containers),
        restarts=max((int(cs.get("restartCount") or 0) for cs in containers), default=0),
        terminating=metadata.get("deletionTimestamp") is not None,
        uid=str(metadata.get("uid", "")),
        ip=str(status["podIP"]) if status.get("podIP") else None,
        triton_restarts=int(triton.get("restartCount") or 0),
        triton_failures=load_failures(_termination_message(triton))
        # one pod shape: the agent loads the models, and exits with Triton's reason when one fails
        or (load_failures(_termination_message(sync)) if sync.get("name") == AGENT_CONTAINER else ()),
        sync_failure=_failure_message(sync),
        start=pod_start(metadata, status, sync, triton, fills=sync.get("name") == AGENT_CONTAINER),
        inplace_target=str((metadata.get("annotations") or {}).get(INPLACE_TARGET_ANNOTATION) or "") or None,
        phase=str(status["phase"]) if status.get("phase") else None,
        phase_reason=str(status["reason"]) if status.get("reason") else None,
        phase_message=short_reason(str(status["message"])) if status.get("message") else None,
        triton_started=bool(triton.get("started")) or "running" in (triton.get("state") or {}),
    )


def sync_container_status(status: Mapping[str, Any]) -> Mapping[str, Any]:
    """The status of the init container that fills /models (named SYNC_CONTAINER, as
    core.objects.builders names it), from a pod's status; {} when the pod has none by that name.

    The one place a pod's status is searched for it: its failure (PodState.sync_failure) and its
    start (PodState.start, with its summary) are both read from what this returns."""
    inits = status.get("initContainerStatuses") or []
    found: Mapping[str, Any] | None = next((cs for cs in inits if cs.get("name") == SYNC_CONTAINER), None)
    if found is not None:
        return found
    # A pod of the one shape: the model agent fills /models beside tritonserver (core.pod.startup).
    containers = status.get("containerStatuses") or []
    agent: Mapping[str, Any] = next((cs for cs in containers if cs.get("name") == AGENT_CONTAINER), {})
    # Its last failure is no failure once it is ready again (an init container exits 0 instead).
    return {k: v for k, v in agent.items() if k != "lastState"} if agent.get("ready") else agent


def _failure_message(container_status: Mapping[str, Any]) -> str | None:
    """The last line of the message a container left when it last exited with an error, bounded;
    None once it has since exited 0 (or left no message)."""
    for key in ("state", "lastState"):
        terminated = (container_status.get(key) or {}).get("terminated")
        if terminated:
            lines = [line for line in str(terminated.get("message") or "").splitlines() if line.strip()]
            failed = int(terminated.get("exitCode") or 0) != 0
            return short_reason(lines[-1]) if failed and lines else None
    return None


def _termination_message(container_status: Mapping[str, Any]) -> str | None:
    """The message of the container's current or last termination, if it left one."""
    for key in ("state", "lastState"):
        terminated = (container_status.get(key) or {}).get("terminated") or {}
        if terminated.get("message"):
            return str(terminated["message"])
    return None


def _waiting(container_status: Mapping[str, Any]) -> Mapping[str, Any]:
    """A container status's state.waiting ({} when it is not waiting)."""
    return (container_status.get("state") or {}).get("waiting") or {}


def _failing_wait(containers: Sequence[Mapping[str, Any]]) -> tuple[str | None, str | None]:
    """The first container waiting for a reason in FAILING_WAIT_REASONS: that reason, and a message."""
    for cs in containers:
        waiting = _waiting(cs)
        if waiting.get("reason") in FAILING_WAIT_REASONS:
            reason = str(waiting["reason"])
            return reason, f"container {cs.get('name')}: {waiting.get('message') or reason}"
    return None, None


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


# ----------------------------------------------------------------- revisions, as the rollout engine sees them


def revision_state(
    deployment: DeploymentState | None,
    pods: Iterable[PodState] = (),
    *,
    crash_restart_threshold: int = CRASH_RESTART_THRESHOLD,
) -> RevisionState:
    """One revision as the rollout engine sees it: its Deployment's and its pods' states (parsed once,
    by deployment_state and pod_state)."""
    states = list(pods)
    live = [p for p in states if p.live]
    since = [p.unschedulable_since for p in live if p.unschedulable_since is not None]
    return RevisionState(
        spec_replicas=deployment.replicas if deployment is not None else 0,
        replicas=deployment.status_replicas if deployment is not None else 0,
        ready_replicas=deployment.ready_replicas if deployment is not None else 0,
        available_replicas=deployment.available_replicas if deployment is not None else 0,
        observed=deployment.observed if deployment is not None else True,
        pods=len(states),
        crash_looping=any(p.crash_looping(crash_restart_threshold) for p in live),
        unschedulable_since=min(since) if since else None,
        triton_failure=describe_failures(
            failed_versions(merge(p.triton_failures for p in live if p.triton_failures))
        )
        or None,
        sync_failure=next((p.sync_failure for p in live if p.sync_failure), None),
    )


def observe_revisions(
    deployments: Iterable[DeploymentState], pods: Iterable[PodState]
) -> dict[str, RevisionState]:
    """Every revision Deployment of a TritonService (by its revision label) with its own pods."""
    by_revision: dict[str, list[PodState]] = {}
    for pod in pods:
        if pod.revision:
            by_revision.setdefault(pod.revision, []).append(pod)
    return {d.revision: revision_state(d, by_revision.get(d.revision, ())) for d in deployments if d.revision}
