"""Names the operator's objects share: labels, object names, ConfigMap keys, paths, containers, volumes."""

from __future__ import annotations

from collections.abc import Sequence

from triton_operator import FIELD_MANAGER, GROUP
from triton_operator.core.repository.manifestparts import MANIFEST_KEY
from triton_operator.models import TritonService

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
# The operator settings that shaped a revision's pod template (default tritonserver image, sync
# image, pod security, scrape annotations), kept in its ConfigMap (never mounted): re-rendering
# the revision uses them, never the operator's settings of the day
# (core.observed.observation.recorded_settings).
OPERATOR_KEY = "operator.json"
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
# In-place model updates (spec.rollout.modelUpdates: InPlace): the pod's model agent, the in-place
# ConfigMap `<deployment>-inplace` it follows and the pod annotation that names its target revision.
AGENT_CONTAINER = "model-agent"
AGENT_PORT = 8009
AGENT_PORT_NAME = "agent"
AGENT_STATUS_PATH = "/v1/inplace"
"""The agent's read-only status: GET http://<podIP>:AGENT_PORT<AGENT_STATUS_PATH> -> JSON."""
AGENT_READY_PATH = "/v1/ready"
"""The in-place pod's readiness, served by its agent: 200 only when every model it serves is READY."""
INPLACE_TARGET_ANNOTATION = f"{GROUP}/inplace-target"
APPLIED_ANNOTATION = f"{GROUP}/applied"
"""On a Deployment (or HPA) the operator applies: a digest of the body it applied
(core.decision.actions.stamped), so a pass that finds it stored as built sends it no more."""
INPLACE_VOLUME = "inplace"
INPLACE_DIR = "/etc/triton-operator-inplace"
"""Where the in-place ConfigMap is mounted (optional, read-only)."""
INPLACE_STATE_KEY = "state.json"
"""The in-place ConfigMap's key {"stable": rev, "next": rev | null}."""
INPLACE_MANIFEST_SUFFIX = ".manifest.json"
PODINFO_VOLUME = "podinfo"
PODINFO_DIR = "/etc/triton-operator-podinfo"
"""Where pods of an earlier operator had the target annotation (a downwardAPI volume of its own)."""
INPLACE_TARGET_ITEM = "target"
"""In the in-place volume (one projected volume: the ConfigMap's keys and this item <- the pod's
INPLACE_TARGET_ANNOTATION), so that the kubelet writes both in one atomic payload."""
INPLACE_TARGET_FILE = f"{INPLACE_DIR}/{INPLACE_TARGET_ITEM}"
POOL_ASSIGNMENT_ITEM = "pool-models"
"""In a pod of a pool, the item of the in-place volume that projects its assignment annotation
(core.pool.assignment.ASSIGNMENT_ANNOTATION), which the kubelet refreshes when the operator writes it."""
POOL_ASSIGNMENT_FILE = f"{INPLACE_DIR}/{POOL_ASSIGNMENT_ITEM}"
POOL_LABELS_ITEM = "pool-labels"
"""Beside it, the pod's labels (the downward API's `key="value"` lines): its agent sees which of its
models the operator has put on their routes (core.pool.labels), and is not Ready before its first
assignment is."""
AGENT_STATE_VOLUME = "agent-state"
AGENT_STATE_DIR = "/var/run/triton-operator"
"""The agent's own bookkeeping (an emptyDir shared by the init container and the sidecar)."""
AGENT_PID_FILE = f"{AGENT_STATE_DIR}/agent.pid"
"""A pool pod's agent writes its process id there: the pod shares one process namespace (its PID 1 is
the pause container), so `triton-operator leave`, the agent container's preStop, finds the agent's own
stdout (/proc/<pid>/fd/1, the container's log) through it."""
LEAVE_VOLUME = "leave"
LEAVE_DIR = "/var/run/triton-operator-leave"
"""In a pod of a pool: an emptyDir, the agent's to write, tritonserver's to read, where the agent's
preStop (`triton-operator leave`) says its wait is over (LEAVE_DONE_FILE): tritonserver's preStop waits
on it."""
LEAVE_DONE_FILE = f"{LEAVE_DIR}/done"
POD_NAME_ENV = "TRITON_OPERATOR_POD_NAME"
"""In a pod of a pool, the agent's: the pod's name (the downward API), which its /v1/pool report
names, so that a caller through a model's Service can tell which pod answered."""
LABEL_INPLACE_HOST = f"{GROUP}/inplace-host"
"""The in-place ConfigMap's label naming its host revision (it has no revision label of its own)."""
# ownerReferences of `triton-operator render` output: no object exists, so no uid does either.
PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"


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


def inplace_configmap_name(ts: TritonService, revision: str) -> str:
    """Name of the in-place ConfigMap of the Deployment of ``revision``: `<ts>-<rev>-inplace`."""
    return f"{object_name(ts, revision)}-inplace"


def inplace_manifest_key(revision: str) -> str:
    """The in-place ConfigMap's key of ``revision``'s plain manifest JSON."""
    return f"{revision}{INPLACE_MANIFEST_SUFFIX}"


def inplace_config_key(revision: str, model: str) -> str:
    """The in-place ConfigMap's key of ``revision``'s rendered config.pbtxt of ``model``."""
    return f"{revision}.{config_key(model)}"
