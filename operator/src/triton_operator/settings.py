"""Operator settings: plain data read from the environment (TRITON_OPERATOR_*), passed to the core."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import Mapping, Sequence

from triton_operator import __version__

DEFAULT_TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:25.01-py3"
DEFAULT_SYNC_IMAGE = f"ghcr.io/triton-operator/triton-operator:{__version__}"
ENV_PREFIX = "TRITON_OPERATOR_"
DEFAULT_MAX_LISTED_OBJECTS = 100_000
"""The most objects one repository listing takes (a manifest of that many pins in well under the
operator's memory limit); a prefix holding more is refused with RepositoryReady=False/ListingTooLarge."""
DEFAULT_FORBIDDEN_VOLUME_TYPES = ("hostPath", "gitRepo")
"""Pod volume types a TritonService may not use unless the operator allows them: hostPath reaches
the node's own files; gitRepo runs git as root on the node with the spec's arguments
(CVE-2024-10220; deprecated, an init container cloning into an emptyDir does the same)."""
DEFAULT_ALLOWED_CAPABILITIES = ("NET_BIND_SERVICE",)
"""Linux capabilities spec.securityContext.capabilities.add may name unless the operator allows more:
the one Pod Security `restricted` allows."""


def _split(value: str | None) -> tuple[str, ...]:
    return tuple(part.strip() for part in (value or "").split(",") if part.strip())


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.strip() else None


def _positive(value: str | None, name: str) -> int | None:
    """A whole number above 0, or None when unset; anything else stops the operator at start."""
    if value is None:
        return None
    number = int(value) if value.strip().isdigit() else 0
    if number < 1:
        raise ValueError(f"{ENV_PREFIX}{name}: {value!r} is not a whole number above 0")
    return number


def _port(value: str | None, name: str) -> int | None:
    number = _positive(value, name)
    if number is not None and number > 65535:
        raise ValueError(f"{ENV_PREFIX}{name}: {value!r} is not a port (1 to 65535)")
    return number


def _flag(value: str | None, default: bool) -> bool:
    if value is None or not value.strip():
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


def _list_or_none(value: str | None, default: tuple[str, ...]) -> tuple[str, ...]:
    """Unset keeps ``default``; "none" (or an empty value) is the empty list."""
    if value is None:
        return default
    if value.strip().lower() == "none":
        return ()
    return _split(value)


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything the operator decides that is not in a TritonService spec."""

    default_image: str = DEFAULT_TRITON_IMAGE
    """tritonserver image for a spec that names none."""
    sync_image: str = DEFAULT_SYNC_IMAGE
    """Image of the `triton-operator sync` init container."""
    sync_image_pull_policy: str | None = None
    """imagePullPolicy of the sync init container; unset leaves the cluster default."""
    namespaces: tuple[str, ...] = ()
    """Namespaces (or kopf glob patterns) to watch; empty means the run command decides."""
    all_namespaces: bool = False
    """Watch the whole cluster."""
    peering_name: str | None = None
    """kopf peering object for leader election; unset runs standalone (no peering)."""
    peering_priority: int | None = None
    """This replica's kopf peering priority (the highest acts); unset picks a random one."""
    peering_identity: str | None = None
    """This replica's identity in the peering object (set by `run`: $POD_ID, else a generated one)."""
    liveness_endpoint: str | None = None
    """kopf liveness endpoint, e.g. http://0.0.0.0:8080/healthz."""
    log_level: str = "INFO"
    """Level of the operator's Python logging."""
    event_level: str = "WARNING"
    """Least severe level that kopf also posts as a Kubernetes Event."""
    prometheus_scrape: bool = True
    """Annotate pods with prometheus.io/scrape for the metrics port."""
    pin_repositories: bool = True
    """List object stores and pin each revision's manifest (off: pods sync unpinned, pvc:// only)."""
    pod_security_defaults: bool = True
    """Give pods the restricted securityContext defaults (core.builders). Never read from the
    environment: False only for a revision made before the operator set them, so that an operator
    upgrade restarts none of its serving pods (core.observation.recorded_settings)."""
    triton_log_on_exit: bool = True
    """Let Kubernetes keep the log tail of an exited tritonserver (terminationMessagePolicy
    FallbackToLogsOnError), where Triton says why a model failed to load. Never read from the
    environment: False only for a revision made before the operator set it
    (core.observation.recorded_settings), so that an upgrade restarts none of its serving pods."""
    sync_log_on_exit: bool = True
    """The same for the sync init container (`triton-operator sync` or `agent --once`), whose log
    says why a sync failed past its termination message. Never read from the environment: False
    only for a revision made before the operator set it."""
    allowed_image_prefixes: tuple[str, ...] = ()
    """tritonserver images a TritonService may run (core.policy.image_allowed); empty allows any."""
    forbidden_volume_types: tuple[str, ...] = DEFAULT_FORBIDDEN_VOLUME_TYPES
    """Pod volume types (spec.volumes) a TritonService may not use."""
    allow_privileged: bool = False
    """Let spec.securityContext ask for privileged: true, allowPrivilegeEscalation: true or a Windows
    hostProcess container (core.policy)."""
    allowed_capabilities: tuple[str, ...] = DEFAULT_ALLOWED_CAPABILITIES
    """Capabilities spec.securityContext.capabilities.add may name ("ALL" among them: any)."""
    allow_root: bool = False
    """Let the pods run as root (runAsUser 0, or a securityContext that leaves the user to the image)."""
    allowed_service_accounts: tuple[str, ...] = ()
    """ServiceAccounts spec.serviceAccountName may name besides the namespace's ``default``: a name
    (in any namespace), ``namespace/name``, or "*" for any."""
    ambient_credentials_namespaces: tuple[str, ...] = ()
    """Namespaces whose repositories the operator may list with its own cloud identity (no
    spec.repository.credentialsSecret); "*" for all. Empty: none, such a TritonService is refused."""
    allowed_endpoints: tuple[str, ...] = ()
    """Endpoints a repository may be listed at (hosts, host:port, with or without a scheme,
    *.domain); empty: any. The cloud's own service (no endpoint) always may."""
    triton_read_seconds: float = 30.0
    """How often each serving and canary pod's repository index is read for status.models
    (adapters.triton_reader); 0: never (no per-model state from Triton, no canary analysis)."""
    triton_read_cidrs: tuple[str, ...] = ()
    """Pod IP ranges the operator may read Triton from; empty: any pod IP."""
    max_listed_objects: int = DEFAULT_MAX_LISTED_OBJECTS
    """The most objects a repository listing takes: past it the listing stops (never held whole) and
    the TritonService gets RepositoryReady=False/ListingTooLarge naming the cap."""
    node_cache_port: int | None = None
    """The port of the node cache (the chart's node-cache DaemonSet) on every node; unset: off. New
    revisions' sync containers then read the node's cache before their store (recorded per revision:
    turning it on or off restarts no serving pod, core.observation.recorded_settings)."""
    node_cache_token: bool = True
    """Not read from the environment: whether a revision's pods show the node cache their projected
    token; False only for a revision recorded before the cache asked for one (it keeps its pods)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read TRITON_OPERATOR_* variables; ``environ`` defaults to the process environment."""
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            value = env.get(ENV_PREFIX + name)
            return value.strip() if value and value.strip() else None

        forbidden = env.get("TRITON_OPERATOR_FORBIDDEN_VOLUME_TYPES")
        capabilities = env.get("TRITON_OPERATOR_ALLOWED_CAPABILITIES")
        return cls(
            default_image=get("DEFAULT_IMAGE") or DEFAULT_TRITON_IMAGE,
            sync_image=get("SYNC_IMAGE") or DEFAULT_SYNC_IMAGE,
            sync_image_pull_policy=get("SYNC_IMAGE_PULL_POLICY"),
            namespaces=_split(get("NAMESPACES")),
            all_namespaces=_flag(get("ALL_NAMESPACES"), False),
            peering_name=get("PEERING_NAME"),
            peering_priority=_int(get("PEERING_PRIORITY")),
            liveness_endpoint=get("LIVENESS_ENDPOINT"),
            log_level=(get("LOG_LEVEL") or "INFO").upper(),
            event_level=(get("EVENT_LEVEL") or "WARNING").upper(),
            prometheus_scrape=_flag(get("PROMETHEUS_SCRAPE"), True),
            pin_repositories=_flag(get("PIN_REPOSITORIES"), True),
            allowed_image_prefixes=_split(get("ALLOWED_IMAGE_PREFIXES")),
            # Set but empty forbids nothing; unset keeps the default.
            forbidden_volume_types=_list_or_none(forbidden, DEFAULT_FORBIDDEN_VOLUME_TYPES),
            allow_privileged=_flag(get("ALLOW_PRIVILEGED"), False),
            allowed_capabilities=tuple(
                c.upper() for c in _list_or_none(capabilities, DEFAULT_ALLOWED_CAPABILITIES)
            ),
            allow_root=_flag(get("ALLOW_ROOT"), False),
            allowed_service_accounts=_split(get("ALLOWED_SERVICE_ACCOUNTS")),
            ambient_credentials_namespaces=_split(get("AMBIENT_CREDENTIALS_NAMESPACES")),
            allowed_endpoints=_split(get("ALLOWED_ENDPOINTS")),
            triton_read_seconds=float(get("TRITON_READ_SECONDS") or 30.0),
            triton_read_cidrs=_split(get("TRITON_READ_CIDRS")),
            max_listed_objects=_positive(get("MAX_LISTED_OBJECTS"), "MAX_LISTED_OBJECTS")
            or DEFAULT_MAX_LISTED_OBJECTS,
            node_cache_port=_port(get("NODE_CACHE_PORT"), "NODE_CACHE_PORT"),
        )


ReadNetworks = list[ipaddress.IPv4Network | ipaddress.IPv6Network]


def read_networks(cidrs: Sequence[str]) -> ReadNetworks:
    """TRITON_OPERATOR_TRITON_READ_CIDRS parsed: the networks whose pod IPs the operator may read."""
    return [ipaddress.ip_network(c, strict=False) for c in cidrs]


def may_read(ip: str | None, networks: ReadNetworks) -> bool:
    """Whether the operator may send a read to a pod at ``ip`` (Triton's or the model agent's
    endpoints): any address when no network is set, else only addresses inside one."""
    if not ip:
        return False
    if not networks:
        return True
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return False
    return any(address in network for network in networks)
