"""serverArgs: tritonserver flags against an allow-list; ports, repository and model loading are ours."""

from __future__ import annotations

from triton_operator.core.spec.validation.errors import SpecError

# tritonserver flags a TritonService may pass in serverArgs. Everything not listed is refused, so a
# flag added to tritonserver later needs adding here first.
ALLOWED_SERVER_FLAGS: frozenset[str] = frozenset(
    {
        # logging
        "log-verbose",
        "log-info",
        "log-warning",
        "log-error",
        "log-format",
        # server behaviour
        "id",
        "exit-on-error",
        "exit-timeout-secs",
        "strict-readiness",
        "strict-model-config",
        "disable-auto-complete-config",
        "model-load-thread-count",
        "model-load-retry-count",
        "model-namespacing",
        "model-load-gpu-limit",
        "enable-peer-access",
        "min-supported-compute-capability",
        "host-policy",
        "backend-config",
        "repoagent-directory",
        # scheduling and memory
        "rate-limit",
        "rate-limit-resource",
        "pinned-memory-pool-byte-size",
        "cuda-memory-pool-byte-size",
        "cuda-virtual-address-size",
        "buffer-manager-thread-count",
        # caches
        "response-cache-byte-size",
        "cache-config",
        "cache-directory",
        # tracing
        "trace-config",
        "trace-file",
        "trace-level",
        "trace-rate",
        "trace-count",
        "trace-log-frequency",
        # metrics content (not their port)
        "allow-gpu-metrics",
        "allow-cpu-metrics",
        "metrics-interval-ms",
        "metrics-config",
        # HTTP and GRPC tuning (not their ports or addresses)
        "http-thread-count",
        "http-header-forward-pattern",
        "http-restricted-api",
        "grpc-restricted-api",
        "grpc-header-forward-pattern",
        "grpc-infer-allocation-pool-size",
        "grpc-max-response-pool-size",
        "grpc-infer-response-compression-level",
        "grpc-keepalive-time",
        "grpc-keepalive-timeout",
        "grpc-keepalive-permit-without-calls",
        "grpc-http2-max-pings-without-data",
        "grpc-http2-min-recv-ping-interval-without-data",
        "grpc-http2-max-ping-strikes",
        "grpc-max-connection-age",
        "grpc-max-connection-age-grace",
        "grpc-use-ssl",
        "grpc-use-ssl-mutual",
        "grpc-server-cert",
        "grpc-server-key",
        "grpc-root-cert",
    }
)

# Flags the operator sets itself, with the reason a TritonService may not.
OPERATOR_OWNED_FLAGS: dict[str, str] = {
    "model-repository": "the operator mounts the model repository at /models",
    "model-store": "the operator mounts the model repository at /models",
    "model-control-mode": "the operator loads models explicitly",
    "load-model": "the operator loads the models of spec.models",
    "repository-poll-secs": "the operator polls the repository (spec.repository.pollIntervalSeconds)",
    "model-config-name": "the operator writes each model's config.pbtxt",
    "backend-directory": "backends come from the image",
    "http-port": "the operator owns the ports (HTTP 8000)",
    "grpc-port": "the operator owns the ports (GRPC 8001)",
    "metrics-port": "the operator owns the ports (metrics 8002)",
    "http-address": "the operator owns the listening addresses",
    "grpc-address": "the operator owns the listening addresses",
    "metrics-address": "the operator owns the listening addresses",
    "allow-http": "the operator needs HTTP for the health probes",
    "allow-grpc": "the operator serves GRPC on port 8001",
    "allow-metrics": "the operator serves metrics on port 8002",
    "allow-sagemaker": "only the HTTP, GRPC and metrics endpoints are served",
    "sagemaker-port": "only the HTTP, GRPC and metrics endpoints are served",
    "allow-vertex-ai": "only the HTTP, GRPC and metrics endpoints are served",
    "vertex-ai-port": "only the HTTP, GRPC and metrics endpoints are served",
    "log-file": "logs go to the container's stdout",
}


# tritonserver reads booleans as true/on/1 and false/off/0, in any case (ParseBoolOption).
_TRUE, _FALSE = frozenset({"true", "on", "1"}), frozenset({"false", "off", "0"})
# The readiness contract: pods are Ready only when every model loaded (the readiness and startup
# probes call /v2/health/ready), and a model that fails to load stops tritonserver, so a failed
# revision shows as crash-looping pods and is rolled back.
CONTRACT_FLAGS: dict[str, str] = {
    "strict-readiness": "would report the server ready before every model is: the readiness probe"
    " (/v2/health/ready) must wait for them all",
    "exit-on-error": "would keep tritonserver running after a model fails to load, so the operator"
    " cannot see the revision fail and roll it back",
}
HEALTH_API = "health"  # --http-restricted-api=<apis>:<key>=<value>; "health" covers /v2/health/*


def _missing_value(name: str, path: str) -> SpecError:
    return SpecError(
        path,
        f"--{name} takes a value and has none: give it as --{name}=<value> or as the next argument "
        "(tritonserver would take the next flag as its value, or refuse to start)",
    )


def server_args_errors(args: list[str], field: str = "spec.serverArgs") -> list[SpecError]:
    """Each of ``--flag=value`` or ``--flag value`` checked against the allow-list, and the values that
    would break the readiness contract.

    Every flag tritonserver accepts here takes a value (its booleans too: ``--strict-readiness=true``),
    so a flag at the end of the list, or followed by another ``--flag``, is refused: tritonserver
    would exit on the first and silently take the next flag as the value of the second.
    """
    errors: list[SpecError] = []
    waiting: str | None = None  # a --flag whose value is the next argument
    waiting_path = ""
    for index, arg in enumerate(args):
        path = f"{field}[{index}]"
        if any(c.isspace() for c in arg):
            # One argument reaches tritonserver as one argument: "--a=1 --b=2" would be one odd value.
            message = f"{arg!r} holds a space: give each flag (and each value) as its own argument"
            errors.append(SpecError(path, message))
            waiting = None
            continue
        if not arg.startswith("--"):
            if waiting is not None:
                errors.extend(_value_errors(waiting, arg, path))
                waiting = None
                continue
            errors.append(SpecError(path, f"{arg!r} is not a --flag (use --flag=value)"))
            continue
        if waiting is not None and waiting in ALLOWED_SERVER_FLAGS:
            errors.append(_missing_value(waiting, waiting_path))
        name, has_value, value = arg[2:].partition("=")
        waiting, waiting_path = (None, "") if has_value else (name, path)
        if name in OPERATOR_OWNED_FLAGS:
            errors.append(SpecError(path, f"--{name} is set by the operator: {OPERATOR_OWNED_FLAGS[name]}"))
        elif name not in ALLOWED_SERVER_FLAGS:
            errors.append(SpecError(path, f"--{name} is not an allowed tritonserver flag"))
        elif has_value:
            errors.extend(_value_errors(name, value, path))
    if waiting is not None and waiting in ALLOWED_SERVER_FLAGS:
        errors.append(_missing_value(waiting, waiting_path))
    return errors


def _value_errors(name: str, value: str, path: str) -> list[SpecError]:
    """A value of an allowed flag that the readiness contract cannot live with."""
    if name in CONTRACT_FLAGS:
        setting = value.lower()
        if setting in _FALSE:
            return [SpecError(path, f"--{name}={value} {CONTRACT_FLAGS[name]}")]
        if setting not in _TRUE:
            return [SpecError(path, f"--{name} takes true or false, not {value!r}")]
    if name == "http-restricted-api":
        apis = {api.strip().lower() for api in value.partition(":")[0].split(",")}
        if HEALTH_API in apis:
            message = (
                f"--{name}={value} restricts the health endpoints the probes call"
                " (/v2/health/live, /v2/health/ready) without the key"
            )
            return [SpecError(path, message)]
    return []
