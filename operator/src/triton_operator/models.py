"""The TritonService API as pydantic v2 models: the CRD schema is generated from these."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from triton_operator.quantities import quantity_bytes

# Every pattern here is also a CRD pattern, so it must be valid for Go's RE2 as well as Python's re:
# no lookarounds, no backreferences.

# Kubernetes resource.Quantity, as the API server's own regex accepts it.
QUANTITY_PATTERN = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
# Triton model names become folder names in the model repository.
MODEL_NAME_MAX_LENGTH = 128
MODEL_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$"
# A relative folder: segments that do not start with a dot (so no "..", no hidden folders), no
# leading "/", no empty segments; a trailing "/" is allowed.
MODEL_PATH_PATTERN = r"^[A-Za-z0-9_\-][A-Za-z0-9_.\-]*(/[A-Za-z0-9_\-][A-Za-z0-9_.\-]*)*/?$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
MAX_MODELS = 256
MAX_STEPS = 32
MAX_PAUSE_SECONDS = 31_536_000
"""The longest timed pause step, 365 days (a longer wait is a pause until promoted)."""


def _quantity_to_str(value: Any) -> Any:
    """Kubernetes quantities are int-or-string: ``cpu: 4`` means ``cpu: "4"``."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value


def _positive_bytes(value: str) -> str:
    if quantity_bytes(value) < 1:
        raise ValueError(f"{value!r} must be more than 0 bytes")
    return value


Quantity = Annotated[
    str,
    StringConstraints(pattern=QUANTITY_PATTERN),
    BeforeValidator(_quantity_to_str),
    Field(json_schema_extra={"x-kubernetes-int-or-string": True}),
]

# Marks the field whose CRD schema is derived from Triton's ModelConfig protobuf descriptor.
MODEL_CONFIG_MARKER = "x-triton-operator-model-config"


class _Model(BaseModel):
    """Base for every API object: camelCase on the wire, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=False,
    )

    def to_api(self) -> dict[str, Any]:
        """The object as the API server stores it: camelCase, unset fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class Resources(_Model):
    """Per-pod compute resources of the tritonserver container."""

    gpus: int = Field(
        0, ge=0, le=16, description="GPUs per pod, requested and limited under gpuResourceName."
    )
    gpu_resource_name: str = Field(
        "nvidia.com/gpu",
        description="Extended resource name of the GPU (nvidia.com/gpu, nvidia.com/mig-1g.10gb, ...).",
    )
    cpu: Quantity | None = Field(None, description="CPU request of the tritonserver container.")
    memory: Quantity | None = Field(
        None, description="Memory request and limit of the tritonserver container."
    )
    cpu_limit: Quantity | None = Field(None, description="CPU limit; unset means no CPU limit.")


class S3Options(_Model):
    """S3-specific repository options."""

    addressing_style: Literal["auto", "path", "virtual"] = Field(
        "auto", description="Bucket addressing; S3-compatible stores usually need path."
    )
    region: str | None = Field(None, description="Bucket region.")


class Repository(_Model):
    """Where the model repository lives and how the operator reads it."""

    uri: str = Field(
        description="s3://bucket/prefix, gs://bucket/prefix, as://account/container/prefix or pvc://claim/path.",
        pattern=r"^(s3|gs|as|pvc)://[^/]+(/.*)?$",
    )
    endpoint: str | None = Field(None, description="Endpoint URL of an S3- or Azure-compatible store.")
    credentials_secret: str | None = Field(
        None,
        description="Secret with store credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
        "GOOGLE_APPLICATION_CREDENTIALS_JSON or AZURE_STORAGE_CONNECTION_STRING); unset: the operator "
        "lists the store with its own identity only in namespaces its settings allow (else "
        "CredentialsRequired), and the pods use their workload identity (IRSA, GKE workload identity).",
        pattern=DNS_LABEL_PATTERN,
    )
    poll_interval_seconds: int = Field(
        60, ge=0, description="How often the repository is listed again; 0 turns polling off."
    )
    s3: S3Options | None = None

    @property
    def scheme(self) -> str:
        return self.uri.split("://", 1)[0]


class ModelSpec(_Model):
    """One Triton model: where its files are and the ModelConfig that config.pbtxt is rendered from."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.config) || !has(self.config.name) || self.config.name == self.name",
                    "message": "config.name must be left out or equal to the model name",
                }
            ]
        }
    )

    name: str = Field(
        description="Triton model name, unique in the service; the model's folder in the pod.",
        pattern=MODEL_NAME_PATTERN,
        max_length=MODEL_NAME_MAX_LENGTH,
    )
    path: str | None = Field(
        None,
        description="Folder under repository.uri holding the model's versions (relative, no '..'); "
        "default: name.",
        pattern=MODEL_PATH_PATTERN,
        max_length=1024,
    )
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="Triton ModelConfig in proto3 JSON (camelCase names; 64-bit integers as numbers or "
        "strings); config.name may be left out. Rendered into the model's config.pbtxt.",
        json_schema_extra={MODEL_CONFIG_MARKER: True},
    )

    memory: Annotated[Quantity, AfterValidator(_positive_bytes)] | None = Field(
        None,
        description="Memory one copy of the model holds once loaded (GPU or host, whichever it runs on), "
        "e.g. 100Mi; under spec.pool it is required and placement packs by the larger of it and the memory "
        "measured at its load (status.pool.models[].measuredMemory): a model larger than declared never "
        "overfills a pod, and one measured smaller keeps the room declared (serving may take more than "
        "loading did).",
    )
    min_copies: int | None = Field(
        None,
        ge=1,
        le=1000,
        description="Under spec.pool: the least pods that hold the model, each on its own pod (default 1).",
    )
    max_copies: int | None = Field(
        None,
        ge=1,
        le=1000,
        description="Under spec.pool: the most pods that hold the model (default: every pod of the pool).",
    )

    @property
    def folder(self) -> str:
        return (self.path or self.name).strip("/")


class PauseStep(_Model):
    """Wait before the next step."""

    duration_seconds: int | None = Field(
        None,
        ge=0,
        le=MAX_PAUSE_SECONDS,
        description=f"How long to pause, at most {MAX_PAUSE_SECONDS} seconds (365 days); unset pauses "
        "until promoted.",
    )


class HeaderValue(_Model):
    """How a header value matches: exactly one of exact, prefix, regex."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(has(self.exact) ? 1 : 0) + (has(self.prefix) ? 1 : 0)"
                    " + (has(self.regex) ? 1 : 0) == 1",
                    "message": "a header value sets exactly one of exact, prefix, regex",
                }
            ]
        }
    )

    exact: str | None = Field(None, description="The header equals this value.")
    prefix: str | None = Field(None, description="The header starts with this value.")
    regex: str | None = Field(None, description="The header matches this regular expression.")

    @model_validator(mode="after")
    def _exactly_one(self) -> HeaderValue:
        chosen = [f for f in ("exact", "prefix", "regex") if getattr(self, f) is not None]
        if len(chosen) != 1:
            raise ValueError("a header value sets exactly one of exact, prefix, regex")
        return self


class HeaderMatch(_Model):
    """A request header the canary route matches on."""

    header_name: str
    header_value: HeaderValue


class SetHeaderRoute(_Model):
    """Route requests with matching headers to the canary (A/B), whatever the weight."""

    name: str = Field(pattern=DNS_LABEL_PATTERN)
    match: list[HeaderMatch] = Field(default_factory=list, max_length=16)


class CanaryStep(_Model):
    """One step of a canary: exactly one of setWeight, pause, setHeaderRoute."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(has(self.setWeight) ? 1 : 0) + (has(self.pause) ? 1 : 0)"
                    " + (has(self.setHeaderRoute) ? 1 : 0) == 1",
                    "message": "a step sets exactly one of setWeight, pause, setHeaderRoute",
                }
            ]
        }
    )

    set_weight: int | None = Field(None, ge=0, le=100, description="Percent of traffic to the canary.")
    pause: PauseStep | None = None
    set_header_route: SetHeaderRoute | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> CanaryStep:
        chosen = [f for f in ("set_weight", "pause", "set_header_route") if getattr(self, f) is not None]
        if len(chosen) != 1:
            raise ValueError("a step sets exactly one of setWeight, pause, setHeaderRoute")
        return self


class GatewayAPIRouting(_Model):
    """Gateway API routes whose backend weights the operator sets."""

    http_route: str | None = Field(None, description="HTTPRoute whose backendRefs the operator owns.")
    grpc_route: str | None = Field(None, description="GRPCRoute whose backendRefs the operator owns.")


class TrafficRouting(_Model):
    """How traffic is split between stable and canary; unset: by replica ratio."""

    gateway_api: GatewayAPIRouting | None = Field(None, alias="gatewayAPI")


class Inconclusive(StrEnum):
    """What a canary analysis does when its window saw too few requests (or missed a canary pod's
    metrics) for a verdict in time."""

    WAIT = "Wait"
    PAUSE = "Pause"
    ABORT = "Abort"


class LatencyMetric(StrEnum):
    """Which of Triton's cumulative durations the latency checks average per successful request."""

    REQUEST = "request"
    QUEUE = "queue"
    COMPUTE = "compute"


class Analysis(_Model):
    """Judge the canary on Triton's own per-model counters (success ratio, latency) while it takes
    traffic, read from the metrics port of the canary's and the stable's pods. A failing verdict rolls
    the canary back; a step that raises its traffic waits for a passing one."""

    interval_seconds: int = Field(
        10, ge=2, le=300, description="How often each canary and stable pod's metrics are read."
    )
    min_requests: int = Field(
        50,
        ge=1,
        description="Requests a model must have had at the canary in the window before any verdict on it.",
    )
    min_success_ratio: float = Field(
        0.99,
        ge=0,
        le=1,
        description="Lowest success / (success + failure) of each model at the canary "
        "(nv_inference_request_success and _failure).",
    )
    latency_metric: LatencyMetric = Field(
        LatencyMetric.REQUEST,
        description="request (nv_inference_request_duration_us), queue (_queue_duration_us) or compute "
        "(_compute_infer_duration_us), averaged per successful request.",
    )
    max_latency_ratio: float | None = Field(
        1.5,
        gt=0,
        description="Highest canary average latency as a multiple of the stable's in the same window "
        "(the window runs until the stable has minRequests too; at weight 100 not judged); null: no "
        "relative check.",
    )
    max_latency_microseconds: int | None = Field(
        None, ge=1, description="Highest canary average latency in microseconds; unset: no absolute check."
    )
    models: list[str] = Field(
        default_factory=list,
        max_length=MAX_MODELS,
        description="The models judged; empty: every model of spec.models.",
    )
    on_inconclusive: Inconclusive = Field(
        Inconclusive.PAUSE,
        description="Too few requests, or a canary pod's metrics missing (not read, or its read failed), "
        "for inconclusiveAfterSeconds: Wait (keep waiting), Pause (hold the rollout until kubectl triton "
        "resume or promote) or Abort (roll back).",
    )
    inconclusive_after_seconds: int = Field(
        300,
        ge=1,
        description="How long a window may lack requests or a canary pod's metrics before onInconclusive "
        "applies.",
    )


class Strategy(StrEnum):
    CANARY = "Canary"
    BLUE_GREEN = "BlueGreen"
    RECREATE = "Recreate"


class ModelUpdates(StrEnum):
    """How a change that touches only models reaches the pods (spec.rollout.modelUpdates)."""

    NEW_PODS = "NewPods"
    IN_PLACE = "InPlace"


DEFAULT_STARTUP_TIMEOUT_SECONDS = 1800
DEFAULT_UNSCHEDULABLE_GRACE_SECONDS = 600
DOWNLOAD_AND_SCHEDULING_SECONDS = 600
"""What the default progress deadline adds to the start-up timeout: scheduling and the download."""


class Rollout(_Model):
    """How a new revision replaces the serving one."""

    strategy: Strategy = Strategy.CANARY
    steps: list[CanaryStep] = Field(
        default_factory=list,
        max_length=MAX_STEPS,
        description="Canary steps; empty promotes once the canary is Ready.",
    )
    progress_deadline_seconds: int | None = Field(
        None,
        ge=1,
        description=(
            "A canary step not Ready by then is rolled back automatically. It covers scheduling, the"
            " model download and the start-up: unset, it is startupTimeoutSeconds + 600"
            " (2400 with both unset); it may not be shorter than startupTimeoutSeconds."
        ),
    )
    unschedulable_grace_seconds: int | None = Field(
        None,
        ge=0,
        description=(
            "How long a canary pod may stay unschedulable (a node autoscaler adding a GPU node) before"
            " the rollout is rolled back; unset: 600; at most the progress deadline."
        ),
    )
    revision_history_limit: int = Field(3, ge=0, le=50, description="Earlier revisions kept for undo.")
    traffic_routing: TrafficRouting | None = None
    gpu_budget: int | None = Field(
        None,
        ge=0,
        description="Most GPUs stable and canary may hold together during a rollout; "
        "unset lets the canary add GPUs on top of stable.",
    )
    paused: bool = Field(False, description="Hold the rollout at its current step.")
    analysis: Analysis | None = Field(
        None, description="Judge the canary on Triton's metrics while it takes traffic (Canary strategy)."
    )
    model_updates: ModelUpdates = Field(
        ModelUpdates.NEW_PODS,
        description=(
            "NewPods: every change makes new pods. InPlace: a change that only touches model objects or"
            " configs is loaded into the running tritonservers, pod by pod following the steps, by the"
            " pods' model-agent (a change Triton cannot reload safely still makes new pods; the status"
            " says why). Switching it makes new pods."
        ),
    )

    def progress_deadline(self, startup_timeout_seconds: int | None = None) -> int:
        """progressDeadlineSeconds, else the start-up timeout (default 1800) plus the time to
        schedule and download (600)."""
        if self.progress_deadline_seconds is not None:
            return self.progress_deadline_seconds
        startup = (
            DEFAULT_STARTUP_TIMEOUT_SECONDS if startup_timeout_seconds is None else startup_timeout_seconds
        )
        return startup + DOWNLOAD_AND_SCHEDULING_SECONDS

    def unschedulable_grace(self) -> int:
        """unschedulableGraceSeconds, else 600 s: room for a node autoscaler to add a GPU node."""
        if self.unschedulable_grace_seconds is not None:
            return self.unschedulable_grace_seconds
        return DEFAULT_UNSCHEDULABLE_GRACE_SECONDS


class ServiceSpec(_Model):
    """The Kubernetes Service in front of the tritonserver pods."""

    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = "ClusterIP"
    annotations: dict[str, str] = Field(default_factory=dict)


class DisruptionBudget(_Model):
    """The PodDisruptionBudget `<name>` over every revision's pods (node drains, evictions)."""

    enabled: bool | None = Field(
        None, description="Create the PodDisruptionBudget; unset creates it when replicas > 1."
    )
    max_unavailable: int = Field(
        1, ge=1, description="Pods a voluntary disruption (a node drain) may take down at once."
    )


# ---------------------------------------------------------------- autoscaling

QUEUE_TIME_METRIC = "triton_queue_time_per_request_microseconds"
"""The per-pod custom metric of Triton's queue time per request (examples/autoscaling names it so)."""
INFERENCE_RATE_METRIC = "triton_inferences_per_second"
"""The per-pod custom metric of Triton's inferences per second (examples/autoscaling names it so)."""
METRIC_NAME_PATTERN = r"^[A-Za-z_:][A-Za-z0-9_:.\-]*$"


class QueueTimeTarget(_Model):
    """Scale on the time requests wait in Triton's queue (the first sign a pod is saturated)."""

    average_microseconds: int = Field(
        ge=1, description="Queue time per request, in microseconds, the HPA keeps the pods' average at."
    )
    metric_name: str = Field(
        QUEUE_TIME_METRIC,
        pattern=METRIC_NAME_PATTERN,
        max_length=253,
        description="The per-pod custom metric (custom.metrics.k8s.io) that carries it.",
    )


class InferenceRateTarget(_Model):
    """Scale on inferences per second per pod (throughput each pod is sized for)."""

    average_per_pod: Quantity = Field(description='Inferences per second per pod, e.g. "40" or "2500m".')
    metric_name: str = Field(
        INFERENCE_RATE_METRIC,
        pattern=METRIC_NAME_PATTERN,
        max_length=253,
        description="The per-pod custom metric (custom.metrics.k8s.io) that carries it.",
    )


class PodsMetricTarget(_Model):
    """Any other per-pod custom metric an adapter serves."""

    metric_name: str = Field(pattern=METRIC_NAME_PATTERN, max_length=253)
    average_value: Quantity = Field(description="The pods' average the HPA aims at.")


class ResourceTarget(_Model):
    """CPU or memory of the tritonserver container (a ContainerResource metric: metrics-server)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.averageUtilization) != has(self.averageValue)",
                    "message": "set exactly one of averageUtilization, averageValue",
                }
            ]
        }
    )

    average_utilization: int | None = Field(
        None, ge=1, le=1000, description="Percent of the container's request, averaged over the pods."
    )
    average_value: Quantity | None = Field(None, description="Average usage per pod, e.g. 3 or 12Gi.")

    @model_validator(mode="after")
    def _exactly_one(self) -> ResourceTarget:
        if (self.average_utilization is None) == (self.average_value is None):
            raise ValueError("set exactly one of averageUtilization, averageValue")
        return self


AUTOSCALING_METRIC_KINDS = ("queueTime", "inferencesPerSecond", "cpu", "memory", "pods")


class AutoscalingMetric(_Model):
    """One metric of the HPA: exactly one of queueTime, inferencesPerSecond, cpu, memory, pods."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": " + ".join(f"(has(self.{k}) ? 1 : 0)" for k in AUTOSCALING_METRIC_KINDS)
                    + " == 1",
                    "message": "a metric sets exactly one of " + ", ".join(AUTOSCALING_METRIC_KINDS),
                }
            ]
        }
    )

    queue_time: QueueTimeTarget | None = None
    inferences_per_second: InferenceRateTarget | None = None
    cpu: ResourceTarget | None = None
    memory: ResourceTarget | None = None
    pods: PodsMetricTarget | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> AutoscalingMetric:
        chosen = [
            k for k in ("queue_time", "inferences_per_second", "cpu", "memory", "pods") if getattr(self, k)
        ]
        if len(chosen) != 1:
            raise ValueError("a metric sets exactly one of " + ", ".join(AUTOSCALING_METRIC_KINDS))
        return self


class ScalingPolicy(_Model):
    """How much the HPA may change the replicas within a period (autoscaling/v2 HPAScalingPolicy)."""

    type: Literal["Pods", "Percent"]
    value: int = Field(ge=1, description="Pods, or percent of the current replicas.")
    period_seconds: int = Field(ge=1, le=1800, description="The window the change is counted over.")


class ScalingRules(_Model):
    """One direction's behaviour (autoscaling/v2 HPAScalingRules)."""

    stabilization_window_seconds: int | None = Field(
        None,
        ge=0,
        le=3600,
        description="Past recommendations considered; unset: the HPA's default (0 up, 300 down).",
    )
    select_policy: Literal["Max", "Min", "Disabled"] | None = None
    policies: list[ScalingPolicy] = Field(
        default_factory=list, max_length=10, description="Empty: the HPA controller's default policies."
    )


class ScalingBehavior(_Model):
    """How fast the HPA scales up and down (autoscaling/v2 HorizontalPodAutoscalerBehavior)."""

    scale_up: ScalingRules | None = None
    scale_down: ScalingRules | None = None


class Autoscaling(_Model):
    """An autoscaling/v2 HorizontalPodAutoscaler `<name>` the operator owns, on the /scale subresource."""

    min_replicas: int = Field(1, ge=1, le=1000)
    max_replicas: int = Field(ge=1, le=1000)
    metrics: list[AutoscalingMetric] = Field(min_length=1, max_length=10)
    behavior: ScalingBehavior | None = None


class ModelVolume(_Model):
    """The /models emptyDir that the sync init container fills and tritonserver serves."""

    size_limit: Annotated[Quantity, AfterValidator(_positive_bytes)] | None = Field(
        None,
        description="The emptyDir's sizeLimit, e.g. 40Gi: kubelet evicts a pod whose /models grows past it, "
        "and sync refuses (exit 7, before writing anything) a repository that would not fit under it.",
    )
    medium: Literal["Memory"] | None = Field(
        None,
        description='"Memory": a tmpfs, counted against the pod\'s memory (set a sizeLimit); unset, the '
        "node's disk.",
    )


class PoolScaling(_Model):
    """How a pooled model's copies follow its load, from Triton's own per-model figures."""

    busy_queue_microseconds: int = Field(
        10_000,
        ge=1,
        description="A model whose requests wait longer than this in Triton's queue (average over the "
        "window) gets one more copy, up to its maxCopies.",
    )
    busy_inferences_per_second: Quantity | None = Field(
        None,
        description="Also busy while each copy serves more inferences per second than this (average over "
        'the window), e.g. "50"; unset: queue time alone says busy.',
    )
    idle_inferences_per_second: Quantity = Field(
        "1",
        description="A model loses a copy, down to its minCopies, while one copy fewer would each still "
        'see fewer inferences per second than this, e.g. "1" or "500m".',
    )
    scale_up_stabilization_seconds: int = Field(
        30,
        ge=0,
        le=3600,
        description="How long a model must have been busy before it gets one more copy; each copy added "
        "starts the wait again: the hysteresis upwards.",
    )
    scale_down_stabilization_seconds: int = Field(
        300,
        ge=0,
        le=3600,
        description="How long a model must have been idle before a copy of it is dropped; each copy "
        "dropped starts the wait again: the hysteresis downwards.",
    )
    window_seconds: int = Field(
        60,
        ge=10,
        le=3600,
        description="The window over which each model's queue time and inferences per second are "
        "averaged, from Triton's per-model metrics on the pool's pods (read every 10 seconds).",
    )


class PoolSpec(_Model):
    """Pack the models into a pool of pods, each model on as many pods as its load needs, instead of
    loading every model in every pod (the default when spec.pool is unset)."""

    memory_per_pod: Annotated[Quantity, AfterValidator(_positive_bytes)] = Field(
        description="Memory each pod gives to its models (GPU or host), e.g. 1200Mi: placement never "
        "puts models whose spec.models[].memory add up to more on one pod.",
    )
    scaling: PoolScaling = Field(
        default_factory=PoolScaling, description="How each model's copies follow its load."
    )
    leave_seconds: int = Field(
        60,
        ge=0,
        le=3600,
        description="How long, at most, a pod that leaves (deleted, evicted, scaled down) keeps serving "
        "after spec.drainSeconds while a model it holds READY is answered through that model's Service "
        "by this pod alone (its copy elsewhere not READY and routed yet); 0: it serves drainSeconds only.",
    )


class TritonServiceSpec(_Model):
    """Desired state of a TritonService."""

    image: str | None = Field(None, description="tritonserver image; default from the operator's settings.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    image_pull_secrets: list[str] = Field(default_factory=list)
    replicas: int = Field(
        1,
        ge=0,
        le=1000,
        description="Pods of the serving revision (a canary's come on top, in proportion to its weight); "
        "the /scale subresource sets it, so an HPA or KEDA may own it.",
    )
    resources: Resources = Field(default_factory=Resources)
    shm_size: Quantity = Field("1Gi", description="Size of the /dev/shm emptyDir (Python backend).")
    model_volume: ModelVolume | None = Field(
        None, description="Size and medium of the /models volume that holds the model repository."
    )
    server_args: list[str] = Field(
        default_factory=list, description="Extra tritonserver flags, checked against an allow-list."
    )
    repository: Repository
    models: list[ModelSpec] = Field(
        min_length=1,
        max_length=MAX_MODELS,
        description="The models the service loads; names are unique.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.all(m, self.filter(n, n.name == m.name).size() == 1)",
                    "message": "model names must be unique",
                }
            ]
        },
    )
    pool: PoolSpec | None = Field(
        None,
        description="Pack the models into a pool: each pod holds some of them, within memoryPerPod, and "
        "each model has between its minCopies and maxCopies; unset, every pod loads every model.",
    )
    rollout: Rollout = Field(default_factory=Rollout)
    autoscaling: Autoscaling | None = Field(
        None,
        description="Let an owned HorizontalPodAutoscaler set spec.replicas; leave it unset to bring your "
        "own HPA or KEDA ScaledObject (both target the /scale subresource).",
    )
    service: ServiceSpec = Field(default_factory=ServiceSpec)
    startup_timeout_seconds: int | None = Field(
        None,
        ge=10,
        description=(
            "How long the startup probe lets a pod load its models; unset, the rollout's"
            " progressDeadlineSeconds, or 1800 with both unset."
        ),
    )
    disruption_budget: DisruptionBudget = Field(default_factory=DisruptionBudget)
    drain_seconds: int = Field(
        5,
        ge=0,
        le=600,
        description=(
            "Seconds a terminating pod keeps serving (a preStop sleep) while Services and routers stop"
            " sending it requests; tritonserver then gets SIGTERM and its --exit-timeout-secs to finish"
            " in-flight requests."
        ),
    )
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    affinity: dict[str, Any] | None = None
    env: list[dict[str, Any]] = Field(
        default_factory=list, description="Extra env of the tritonserver container."
    )
    volumes: list[dict[str, Any]] = Field(default_factory=list, description="Extra pod volumes.")
    volume_mounts: list[dict[str, Any]] = Field(
        default_factory=list, description="Extra mounts of the tritonserver container."
    )
    pod_security_context: dict[str, Any] | None = Field(
        None,
        description="The pods' securityContext, in place of the operator's default (non-root uid 1000, "
        "seccomp RuntimeDefault), for images that need another user.",
    )
    security_context: dict[str, Any] | None = Field(
        None,
        description="The tritonserver container's securityContext, in place of the operator's default "
        "(no privilege escalation, every capability dropped).",
    )
    automount_service_account_token: bool = Field(
        False,
        description="Mount the service account's API token into the pods (off by default: Triton "
        "never calls the API server).",
    )
    pod_annotations: dict[str, str] = Field(default_factory=dict)
    pod_labels: dict[str, str] = Field(default_factory=dict)
    service_account_name: str | None = None
    priority_class_name: str | None = None

    def startup_timeout(self) -> int:
        """startupTimeoutSeconds, else the rollout's progress deadline, else 1800."""
        if self.startup_timeout_seconds is not None:
            return self.startup_timeout_seconds
        if self.rollout.progress_deadline_seconds is not None:
            return self.rollout.progress_deadline_seconds
        return DEFAULT_STARTUP_TIMEOUT_SECONDS

    def progress_deadline(self) -> int:
        """rollout.progressDeadlineSeconds, else the start-up timeout plus time to schedule and download."""
        return self.rollout.progress_deadline(self.startup_timeout_seconds)

    @field_validator("models")
    @classmethod
    def _unique_names(cls, models: list[ModelSpec]) -> list[ModelSpec]:
        seen: dict[str, int] = {}
        for i, m in enumerate(models):
            if m.name in seen:
                raise ValueError(
                    f"models[{i}].name: duplicate model name {m.name!r} (also models[{seen[m.name]}])"
                )
            seen[m.name] = i
        return models


# ---------------------------------------------------------------- status


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(_Model):
    """A condition as the Kubernetes API conventions define it."""

    type: str
    status: ConditionStatus
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    message: str = ""
    observed_generation: int | None = None
    last_transition_time: str


class VersionState(_Model):
    """One version of a model as Triton reports it (repository index, or its log when it exited)."""

    version: str
    state: str = Field(description="READY, UNAVAILABLE, LOADING or UNLOADING.")
    reason: str | None = Field(None, description="Triton's reason, e.g. why the version failed to load.")


class RevisionModelState(_Model):
    """Triton's view of a model in one revision's pods (merged: the worst state a pod reports)."""

    revision: str
    versions: list[VersionState] = Field(default_factory=list)


class ModelStatus(_Model):
    """A model as the serving pods report it."""

    name: str
    versions: list[str] = Field(default_factory=list)
    ready: bool = False
    serving: RevisionModelState | None = Field(None, description="Triton's view in the stable revision.")
    canary: RevisionModelState | None = Field(None, description="Triton's view in the canary while one runs.")


class ModelFigures(_Model):
    """One model's figures in the canary's analysis window."""

    name: str
    verdict: str
    requests: int = 0
    stable_requests: int = 0
    success_ratio: str | None = None
    latency_microseconds: int | None = None
    stable_latency_microseconds: int | None = None
    reason: str = ""


class AnalysisWindow(_Model):
    """The canary's current analysis window (spec.rollout.analysis)."""

    revision: str
    weight: int
    verdict: str = Field(description="Passed, Failed or Inconclusive.")
    window_started_at: str | None = None
    models: list[ModelFigures] = Field(default_factory=list)


ANALYSIS_RUNS_KEPT = 10
"""status.analysisRuns keeps the last this many."""


class AnalysisRunRecord(_Model):
    """A window's analysis that decided something: the step advanced, paused or rolled back."""

    revision: str
    step_index: int
    weight: int
    verdict: str
    message: str
    at: str


class Endpoints(_Model):
    """In-cluster addresses of the service."""

    http: str
    grpc: str
    metrics: str


class RevisionRecord(_Model):
    """An earlier revision kept for an exact undo."""

    revision: str
    created: str | None = None
    generation: int | None = None
    in_place_host: str | None = Field(
        None,
        description="Served in place in the pods of this revision (no Deployment of its own): an undo to "
        "it loads it back into those pods, in place.",
    )


class StartPhases(_Model):
    """Seconds of each phase of a pod's start, from its own status (whole seconds apart: Kubernetes' times
    are) and, in a pod of the one shape, its model agent's record of its fill; a phase whose two ends
    are unknown is left out."""

    scheduling: float | None = Field(None, description="Created -> scheduled (PodScheduled).")
    image_and_sandbox: float | None = Field(
        None,
        description="Scheduled -> the sync init container (one shape: the model agent) started: the pod's "
        "sandbox, the images.",
    )
    sync: float | None = Field(
        None,
        description="The sync init container, started -> finished: the download. One shape: the model "
        "agent started -> the revision's last byte in (the loads of the models fetched first overlap it).",
    )
    drain: float | None = Field(
        None,
        description="In place only: the last byte in -> the pod out of its Service: what is left of the wait "
        "for the kubelet's probe to fail and spec.drainSeconds (counted from the change's start) before "
        "any model is unloaded or loaded; 0 when the fetch took longer.",
    )
    tritonserver_start: float | None = Field(
        None,
        description="Sync finished -> tritonserver started: the tritonserver image, the container (none in "
        "a pod of the one shape: tritonserver starts during the sync).",
    )
    tritonserver_load: float | None = Field(
        None,
        description="tritonserver started (one shape: the last byte in) -> Ready: Triton loads the models "
        "(one shape: those left after the last byte), then its probes pass. In place: the drain's end -> "
        "every changed model loaded (Triton's model control).",
    )


class TimeToServe(_Model):
    """How long a revision's first Ready pod took from its creation to Ready, phase by phase, and what
    its sync read from the store. Recorded once, when the operator first sees a pod of the revision Ready.
    A revision loaded in place (``host`` set): its first pod's agent, from the moment it began the
    revision until every changed model was loaded, in the in-place update's phases (sync, drain,
    tritonserverLoad: those of triton_operator_in_place_update_seconds)."""

    revision: str
    pod: str = Field(
        description="The pod measured: the revision's first Ready pod (in place: the first to load it)."
    )
    host: str | None = Field(
        None,
        description="In place: the revision whose pods loaded this one (absent: the revision's own pods).",
    )
    ready_at: str | None = Field(
        None, description="When that pod became Ready (in place: when its agent had loaded the revision)."
    )
    seconds: float | None = Field(
        None,
        description="Created -> Ready (in place: the agent began the revision -> its models loaded).",
    )
    phases: StartPhases = Field(default_factory=StartPhases)
    objects: int | None = Field(None, description="Objects of the pinned manifest the sync placed.")
    bytes_fetched: int | None = Field(
        None, description="Bytes the sync read from the store (absent: a sync image that does not say)."
    )
    bytes_present: int | None = Field(
        None, description="Bytes the sync found already present (from an earlier run or a cache)."
    )
    restarts: int | None = Field(
        None, description="Container restarts before Ready (the phase they fall in includes them)."
    )


RolloutKindName = Literal["InPlace", "NewPods"]


class InPlaceRollout(_Model):
    """An in-place model update on the stable revision's pods (spec.rollout.modelUpdates: InPlace)."""

    host: str = Field(description="The revision whose pods (Deployment, Services) are updated in place.")
    stable: str = Field(description="The revision whose models every pod serves until the update completes.")
    next: str | None = Field(None, description="The revision being loaded into the pods.")
    step_index: int | None = None
    step_started_at: str | None = None
    waiting_since: str | None = None
    pods: list[str] = Field(default_factory=list, description="The pods asked to load the next revision.")
    rolling_back: str | None = Field(
        None, description="Why the update is being rolled back (the pods load the stable revision again)."
    )
    aborted_revision: str | None = None
    aborted_reason: str | None = None
    aborted_detail: str | None = None
    pinned: str | None = Field(
        None, description="The revision an undo went back to in place (served instead of the spec's)."
    )
    pinned_for: str | None = Field(
        None, description="The spec's revision when the undo was made: a new spec or a retry ends the pin."
    )
    asked_at_step: int | None = Field(
        None, description="Pods asked when the current step began (its analysis gates its first pods only)."
    )
    promoted: bool | None = Field(None, description="A promote request took the update to its end.")


class PoolModelStatus(_Model):
    """One model of the pool: where it is, how many copies, and why not more."""

    name: str
    pods: list[str] = Field(default_factory=list, description="The pods placement gives the model.")
    copies: int = Field(0, description="How many pods hold it (the length of pods).")
    wanted_copies: int = Field(0, description="How many its load asks for, within minCopies and maxCopies.")
    memory: str | None = Field(None, description="The memory placement counts for one copy.")
    measured_memory: str | None = Field(
        None,
        description="The host memory its load took, as the pods' agents measured it (models whose every "
        "instance runs on the CPU; the largest READY copy's, rounded up to a MiB, changed only when a new "
        "measurement differs by more than a tenth); placement counts the larger of it and the declared.",
    )
    reason: str = Field(
        "",
        description="Why it has no more copies: Wanted, MaxCopies, BudgetFull, TooFewPods, LargerThanPod.",
    )
    message: str = ""
    ready_copies: int | None = Field(
        None,
        description="How many of its pods have it READY and on its routes (labelled ready); unset: not "
        "observed yet.",
    )
    endpoints: Endpoints | None = Field(
        None,
        description="The model's own Service (<name>-m-<model>) in the cluster: clients send the model's "
        "requests there (gRPC cannot be routed by model otherwise).",
    )
    copies_reason: str | None = Field(
        None,
        description="Why its load asks for wantedCopies: Busy, BusyWaiting, Idle, IdleWaiting, Steady, "
        "CopyLoading, MinCopies, MaxCopies, MemoryShort or NoReadings (spec.pool.scaling).",
    )
    copies_message: str | None = Field(
        None,
        description="The same in a sentence, with the thresholds and waits that apply (its figures over "
        "the window are the operator's metrics triton_operator_pool_model_inferences_per_second and "
        "triton_operator_pool_model_queue_microseconds, not status).",
    )
    busy_since: str | None = Field(
        None, description="Since when it has been busy without a copy added (the wait upwards)."
    )
    idle_since: str | None = Field(
        None, description="Since when it has been idle without a copy dropped (the wait downwards)."
    )
    last_used: str | None = Field(
        None,
        description="When it last served a request, as the window saw it, to 5 minutes (the start of "
        "that period): when memory is short, the least recently used model loses its extra copies first.",
    )


class PoolStatus(_Model):
    """The pool's placement (spec.pool): each model's pods and why."""

    pods_needed: int | None = Field(None, description="Pods the models' wanted copies need.")
    models: list[PoolModelStatus] = Field(default_factory=list)


class TritonServiceStatus(_Model):
    """Observed state of a TritonService."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")

    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    stable_revision: str | None = None
    canary_revision: str | None = None
    canary_weight: int | None = None
    current_step_index: int | None = None
    replicas: int | None = Field(
        None, description="Pods of the revisions taking traffic (the /scale subresource's status.replicas)."
    )
    selector: str | None = Field(
        None, description="Label selector of those pods (the /scale subresource's, for an HPA's metrics)."
    )
    ready_replicas: int | None = None
    models: list[ModelStatus] = Field(default_factory=list)
    endpoints: Endpoints | None = None
    history: list[RevisionRecord] = Field(default_factory=list)
    # Rollout bookkeeping (core/rollout/state.py): everything a restarted operator needs to resume.
    stable_since: str | None = None
    step_started_at: str | None = None
    canary_started_at: str | None = None
    waiting_since: str | None = None
    promoting: bool | None = None
    paused_by_user: bool | None = None
    aborted_revision: str | None = None
    aborted_reason: str | None = None
    aborted_step_index: int | None = None
    aborted_detail: str | None = None
    analysis: AnalysisWindow | None = None
    analysis_runs: list[AnalysisRunRecord] = Field(default_factory=list, max_length=ANALYSIS_RUNS_KEPT)
    pinned_revision: str | None = None
    pinned_for: str | None = None
    replaced_revision: str | None = None
    handled_requests: dict[str, str] = Field(default_factory=dict)
    repository_digest: str | None = None
    time_to_serve: list[TimeToServe] = Field(
        default_factory=list,
        description="The serving revisions' time to serve: their first Ready pod's start, phase by phase.",
    )
    served_revision: str | None = Field(
        None,
        description="The revision whose models the stable revision's pods serve after in-place updates "
        "(unset: the stable revision's own).",
    )
    rollout_kind: RolloutKindName | None = Field(
        None, description="How the current (or last) change rolls out: InPlace or NewPods."
    )
    rollout_kind_reason: str | None = Field(
        None, description="Why: what an in-place update reloads, or what forces new pods."
    )
    in_place: InPlaceRollout | None = None
    pool: PoolStatus | None = Field(None, description="Where each model of the pool is (spec.pool).")
    image: str | None = Field(None, description="The tritonserver image the stable revision runs.")
    default_image: str | None = Field(
        None,
        description="The operator's default tritonserver image, set while the spec names no image and "
        "the stable revision runs another (made under an earlier default): a new default applies to "
        "new revisions only, and the next change of the spec rolls it out.",
    )


class TritonService(_Model):
    """A whole TritonService object (as the handlers parse a body)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    api_version: str = "triton-operator.io/v1alpha1"
    kind: Literal["TritonService"] = "TritonService"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: TritonServiceSpec
    status: TritonServiceStatus = Field(default_factory=TritonServiceStatus)

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace", "default"))


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def field_path(loc: tuple[int | str, ...], prefix: str = "") -> str:
    """Render a pydantic error location as a JSON path: ("models", 0, "name") -> models[0].name.

    With ``prefix="spec"`` the path starts at spec: spec.models[0].name.
    """
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _IDENTIFIER.match(str(part)):
            out += ("." if out else "") + str(part)
        else:
            out += f"[{part}]"
    return out
