"""Operator settings: plain data read from the environment (TRITON_OPERATOR_*), passed to the core."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import ipaddress
import math
import os
import pathlib
import urllib.parse
from collections.abc import Mapping, Sequence

from triton_operator import __version__
from triton_operator.logs import FORMATS as LOG_FORMATS

DEFAULT_TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:25.01-py3"
DEFAULT_SYNC_IMAGE = f"ghcr.io/triton-operator/triton-operator:{__version__}"
ENV_PREFIX = "TRITON_OPERATOR_"
DEFAULT_TRITON_READ_SECONDS = 30.0
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


TRUE_WORDS = ("true", "1", "yes", "on")
FALSE_WORDS = ("false", "0", "no", "off")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
BOOLEAN = "true or false (also 1/0, yes/no, on/off; any case)"

ENV_SETTINGS: dict[str, str] = {
    "DEFAULT_IMAGE": "an image reference",
    "SYNC_IMAGE": "an image reference",
    "SYNC_IMAGE_PULL_POLICY": " or ".join(PULL_POLICIES),
    "NAMESPACES": "namespaces or kopf patterns, comma-separated",
    "ALL_NAMESPACES": BOOLEAN,
    "PEERING_NAME": "a peering object's name",
    "PEERING_PRIORITY": "a whole number",
    "LIVENESS_ENDPOINT": "an http:// URL with a port, e.g. http://0.0.0.0:8081/healthz",
    "LOG_LEVEL": ", ".join(LOG_LEVELS) + " (any case)",
    "EVENT_LEVEL": ", ".join(LOG_LEVELS) + " (any case)",
    "PROMETHEUS_SCRAPE": BOOLEAN,
    "PIN_REPOSITORIES": BOOLEAN,
    "ALLOWED_IMAGE_PREFIXES": "image prefixes, comma-separated",
    "FORBIDDEN_VOLUME_TYPES": 'volume types, comma-separated ("none" or empty: none)',
    "ALLOW_PRIVILEGED": BOOLEAN,
    "ALLOWED_CAPABILITIES": 'capability names, comma-separated ("none" or empty: none)',
    "ALLOW_ROOT": BOOLEAN,
    "ALLOWED_SERVICE_ACCOUNTS": "name, namespace/name or *, comma-separated",
    "AMBIENT_CREDENTIALS_NAMESPACES": "namespaces or *, comma-separated",
    "ALLOWED_ENDPOINTS": "hosts, host:port or *.domain, comma-separated",
    "TRITON_READ_SECONDS": "a number of seconds above 0",
    "TRITON_READ_CIDRS": "IP networks (CIDR), comma-separated",
    "MAX_LISTED_OBJECTS": "a whole number above 0",
    "NODE_CACHE_PORT": "a port, 1 to 65535",
    "NODE_CACHE_SIGNING_KEY_FILE": "the path of the node cache's Ed25519 key (PEM, or base64 of 32 bytes)",
    "NODE_CACHE_SHARED_FILES": "true or false",
    "LOG_FORMAT": " or ".join(LOG_FORMATS),
}
"""Every variable Settings.from_env reads (without the prefix), with what it accepts."""


class SettingsError(ValueError):
    """TRITON_OPERATOR_* variables the operator cannot read, each named with what it accepts: the
    operator stops rather than run on a default nobody chose."""


def _split(value: str | None) -> tuple[str, ...]:
    return tuple(part.strip() for part in (value or "").split(",") if part.strip())


def _list_or_none(value: str | None, default: tuple[str, ...]) -> tuple[str, ...]:
    """Unset keeps ``default``; "none" (or an empty value) is the empty list."""
    if value is None:
        return default
    if value.strip().lower() == "none":
        return ()
    return _split(value)


class _Reader:
    """Reads TRITON_OPERATOR_* variables strictly, noting every one it cannot read."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.errors: list[str] = []

    def get(self, name: str) -> str | None:
        """The variable's value stripped; None when unset or blank (the default applies)."""
        assert name in ENV_SETTINGS, name
        value = self.env.get(ENV_PREFIX + name)
        return value.strip() if value and value.strip() else None

    def refuse(self, name: str, value: str) -> None:
        self.errors.append(f"{ENV_PREFIX}{name}={value!r}: accepts {ENV_SETTINGS[name]}")

    def flag(self, name: str, default: bool) -> bool:
        value = self.get(name)
        if value is None:
            return default
        if value.lower() in TRUE_WORDS:
            return True
        if value.lower() not in FALSE_WORDS:
            self.refuse(name, value)
            return default
        return False

    def level(self, name: str, default: str) -> str:
        value = self.get(name)
        if value is None:
            return default
        if value.upper() not in LOG_LEVELS:
            self.refuse(name, value)
            return default
        return value.upper()

    def choice(self, name: str, choices: Sequence[str]) -> str | None:
        value = self.get(name)
        if value is not None and value not in choices:
            self.refuse(name, value)
            return None
        return value

    def whole(self, name: str, lowest: int | None = None, highest: int | None = None) -> int | None:
        value = self.get(name)
        if value is None:
            return None
        try:
            number = int(value)
        except ValueError:
            number = None
        if (
            number is None
            or (lowest is not None and number < lowest)
            or (highest is not None and number > highest)
        ):
            self.refuse(name, value)
            return None
        return number

    def seconds(self, name: str, default: float) -> float:
        value = self.get(name)
        if value is None:
            return default
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and number > 0):
            self.refuse(name, value)
            return default
        return number

    def networks(self, name: str) -> tuple[str, ...]:
        cidrs = _split(self.get(name))
        try:
            read_networks(cidrs)
        except ValueError:
            self.refuse(name, ",".join(cidrs))
            return ()
        return cidrs

    def public_key(self, name: str) -> str | None:
        """The base64 public key of the Ed25519 private key in the file the variable names (the
        node cache's ``--signing-key``): the operator gives it to new revisions' pods, never signs."""
        value = self.get(name)
        if value is None:
            return None
        from cryptography.hazmat.primitives import serialization  # noqa: PLC0415
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: PLC0415

        try:
            data = pathlib.Path(value).read_bytes()
        except OSError as exc:
            self.errors.append(f"{ENV_PREFIX}{name}={value!r}: cannot be read: {exc.strerror or exc}")
            return None
        try:
            if b"-----BEGIN" in data:
                key = serialization.load_pem_private_key(data, password=None)
            else:
                key = Ed25519PrivateKey.from_private_bytes(base64.b64decode(data.strip(), validate=True))
        except (ValueError, TypeError, binascii.Error):
            key = None
        if not isinstance(key, Ed25519PrivateKey):
            self.errors.append(
                f"{ENV_PREFIX}{name}={value!r}: holds no Ed25519 private key: accepts {ENV_SETTINGS[name]}"
            )
            return None
        raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return base64.b64encode(raw).decode()

    def url(self, name: str) -> str | None:
        value = self.get(name)
        if value is None:
            return None
        parsed = urllib.parse.urlsplit(value)
        try:
            port = parsed.port
        except ValueError:
            port = None
        if parsed.scheme not in ("http", "https") or not parsed.hostname or port is None:
            self.refuse(name, value)
            return None
        return value


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
    """Give pods the restricted securityContext defaults (core.objects.builders). Never read from the
    environment: False only for a revision made before the operator set them, so that an operator
    upgrade restarts none of its serving pods (core.observed.observation.recorded_settings)."""
    triton_log_on_exit: bool = True
    """Let Kubernetes keep the log tail of an exited tritonserver (terminationMessagePolicy
    FallbackToLogsOnError), where Triton says why a model failed to load. Never read from the
    environment: False only for a revision made before the operator set it
    (core.observed.observation.recorded_settings), so that an upgrade restarts none of its serving pods."""
    sync_log_on_exit: bool = True
    """The same for the sync init container (`triton-operator sync` or `agent --once`), whose log
    says why a sync failed past its termination message. Never read from the environment: False
    only for a revision made before the operator set it."""
    allowed_image_prefixes: tuple[str, ...] = ()
    """tritonserver images a TritonService may run (core.pod.policy.image_allowed); empty allows any."""
    forbidden_volume_types: tuple[str, ...] = DEFAULT_FORBIDDEN_VOLUME_TYPES
    """Pod volume types (spec.volumes) a TritonService may not use."""
    allow_privileged: bool = False
    """Let spec.securityContext ask for privileged: true, allowPrivilegeEscalation: true or a Windows
    hostProcess container (core.pod.policy)."""
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
    triton_read_seconds: float = DEFAULT_TRITON_READ_SECONDS
    """How often each serving and canary pod's repository index is read for status.models
    (adapters.triton_reader): above 0. Canary analysis and in-place updates wait on these reads;
    0 once turned them off and left a rollout with analysis waiting for ever, so it is refused."""
    triton_read_cidrs: tuple[str, ...] = ()
    """Pod IP ranges the operator may read Triton from; empty: any pod IP."""
    max_listed_objects: int = DEFAULT_MAX_LISTED_OBJECTS
    """The most objects a repository listing takes: past it the listing stops (never held whole) and
    the TritonService gets RepositoryReady=False/ListingTooLarge naming the cap."""
    log_format: str = "text"
    """TRITON_OPERATOR_LOG_FORMAT (logs.log_format): text or json, for the operator and, recorded per
    revision, the sync and agent containers of new revisions' pods."""
    node_cache_port: int | None = None
    """The port of the node cache (the chart's node-cache DaemonSet) on every node; unset: off. New
    revisions' sync containers then read the node's cache before their store (recorded per revision:
    turning it on or off restarts no serving pod, core.observed.observation.recorded_settings)."""
    node_cache_shared_files: bool = False
    """TRITON_OPERATOR_NODE_CACHE_SHARED_FILES (chart ``nodeCache.sharedFiles.enabled``): new
    revisions' pods (with the node cache) get its CSI volume, their read-only view of the cache's
    files, and link to what it holds instead of copying it (core.repository.shared_files). A pod with
    the volume starts only on a node whose node cache serves the CSI driver. Recorded per revision:
    turning it on or off restarts no serving pod."""
    node_cache_token: bool = True
    """Not read from the environment: whether a revision's pods show the node cache their projected
    token; False only for a revision recorded before the cache asked for one (it keeps its pods)."""
    agent_pods: bool = True
    """Not read from the environment: whether a revision's pods have one shape, the model agent's
    (tritonserver starts with no models; the agent fetches and loads each model as its bytes land);
    False only for a revision recorded before (it keeps its sync init container, core.objects.builders)."""
    quick_agent_probe: bool = True
    """Not read from the environment: whether the readiness probe of a revision's pods with the model
    agent runs every second and takes the pod out at its first failure (core.objects.builders:
    AGENT_READINESS_*), so that a pod leaves its Service within a second of an in-place change
    beginning; False only for a revision recorded before (every 2 s, out at the second failure: it
    keeps its pods)."""
    pool_leave: bool = True
    """Not read from the environment: whether a pool revision's leaving pods serve on, after their
    drain, while a model they hold READY is answered through its Service by them alone (at most
    spec.pool.leaveSeconds; `triton-operator leave` as the agent's preStop, core.objects.builders
    .agent_pre_stop); False only for a revision recorded before (its pods serve drainSeconds only: it
    keeps its pods)."""

    node_cache_public_key: str | None = None
    """The node cache's public key (base64 of 32 bytes), derived from the key file that
    TRITON_OPERATOR_NODE_CACHE_SIGNING_KEY_FILE names: new revisions' sync and agent containers get
    it ($TRITON_NODE_CACHE_PUBLIC_KEY) and check the cache's bytes against its signed SHA-256.
    Recorded per revision: a new key (rotation) restarts no pod; older revisions' pods, whose key
    no longer verifies, fall back to checking each object against its pin."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.triton_read_seconds) and self.triton_read_seconds > 0):
            raise SettingsError(
                f"{ENV_PREFIX}TRITON_READ_SECONDS={self.triton_read_seconds!r}: accepts "
                f"{ENV_SETTINGS['TRITON_READ_SECONDS']}"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read TRITON_OPERATOR_* variables; ``environ`` defaults to the process environment."""
        env = os.environ if environ is None else environ
        read = _Reader(env)
        # Set but empty forbids (allows) nothing; unset keeps the default.
        forbidden = env.get(ENV_PREFIX + "FORBIDDEN_VOLUME_TYPES")
        capabilities = env.get(ENV_PREFIX + "ALLOWED_CAPABILITIES")
        settings = cls(
            default_image=read.get("DEFAULT_IMAGE") or DEFAULT_TRITON_IMAGE,
            sync_image=read.get("SYNC_IMAGE") or DEFAULT_SYNC_IMAGE,
            sync_image_pull_policy=read.choice("SYNC_IMAGE_PULL_POLICY", PULL_POLICIES),
            namespaces=_split(read.get("NAMESPACES")),
            all_namespaces=read.flag("ALL_NAMESPACES", False),
            peering_name=read.get("PEERING_NAME"),
            peering_priority=read.whole("PEERING_PRIORITY"),
            liveness_endpoint=read.url("LIVENESS_ENDPOINT"),
            log_level=read.level("LOG_LEVEL", "INFO"),
            event_level=read.level("EVENT_LEVEL", "WARNING"),
            prometheus_scrape=read.flag("PROMETHEUS_SCRAPE", True),
            pin_repositories=read.flag("PIN_REPOSITORIES", True),
            allowed_image_prefixes=_split(read.get("ALLOWED_IMAGE_PREFIXES")),
            forbidden_volume_types=_list_or_none(forbidden, DEFAULT_FORBIDDEN_VOLUME_TYPES),
            allow_privileged=read.flag("ALLOW_PRIVILEGED", False),
            allowed_capabilities=tuple(
                c.upper() for c in _list_or_none(capabilities, DEFAULT_ALLOWED_CAPABILITIES)
            ),
            allow_root=read.flag("ALLOW_ROOT", False),
            allowed_service_accounts=_split(read.get("ALLOWED_SERVICE_ACCOUNTS")),
            ambient_credentials_namespaces=_split(read.get("AMBIENT_CREDENTIALS_NAMESPACES")),
            allowed_endpoints=_split(read.get("ALLOWED_ENDPOINTS")),
            triton_read_seconds=read.seconds("TRITON_READ_SECONDS", DEFAULT_TRITON_READ_SECONDS),
            triton_read_cidrs=read.networks("TRITON_READ_CIDRS"),
            max_listed_objects=read.whole("MAX_LISTED_OBJECTS", lowest=1) or DEFAULT_MAX_LISTED_OBJECTS,
            node_cache_port=read.whole("NODE_CACHE_PORT", lowest=1, highest=65535),
            node_cache_public_key=read.public_key("NODE_CACHE_SIGNING_KEY_FILE"),
            node_cache_shared_files=read.flag("NODE_CACHE_SHARED_FILES", False),
            log_format=read.choice("LOG_FORMAT", LOG_FORMATS) or "text",
        )
        if read.errors:
            raise SettingsError("the operator's settings cannot be read:\n  " + "\n  ".join(read.errors))
        return settings


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
