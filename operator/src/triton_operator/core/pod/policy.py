"""The operator's own policy over what a TritonService may run: images, volumes, privileges, identity.

Whoever may create a TritonService may otherwise create pods with any image and any volume, a
hostPath among them, privileged or as root, under any ServiceAccount of the namespace: the hostPath
ban alone would be moot without Pod Security admission. The policy is the operator's (settings,
chart values), not the spec's: a spec it refuses is held like an invalid one (the serving revision
keeps serving), with Ready saying which field the policy refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from triton_operator.core.objects.builders import RESTRICTED_POD_SECURITY, triton_image
from triton_operator.core.spec.validation.errors import SpecError
from triton_operator.models import TritonService
from triton_operator.settings import Settings

_REFERENCE_SEPARATORS = ("/", ":", "@")
DEFAULT_SERVICE_ACCOUNT = "default"
ANY_SERVICE_ACCOUNT = "*"
ALL_CAPABILITIES = "ALL"

# What Pod Security "baseline" allows (https://kubernetes.io/docs/concepts/security/pod-security-standards/);
# anything else in a spec's securityContext is refused unless TRITON_OPERATOR_ALLOW_PRIVILEGED.
CONFINED_PROFILE_TYPES = ("RuntimeDefault", "Localhost")
"""seccompProfile.type and appArmorProfile.type baseline allows (unset too): never Unconfined."""
BASELINE_SELINUX_TYPES = ("", "container_t", "container_init_t", "container_kvm_t", "container_engine_t")
"""seLinuxOptions.type baseline allows (unset too); seLinuxOptions.user and .role must be unset."""
SAFE_SYSCTLS = (
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ping_group_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
)
"""The sysctls baseline allows in securityContext.sysctls (the kubelet's safe set)."""
APPARMOR_ANNOTATION_PREFIX = "container.apparmor.security.beta.kubernetes.io/"
"""The older AppArmor pod annotation (one a container): baseline allows runtime/default and localhost/*."""


def image_allowed(image: str, prefixes: Sequence[str]) -> bool:
    """Whether ``image`` starts with one of ``prefixes`` (no prefixes: every image is allowed).

    A prefix matches at a reference boundary only, so ``registry.example.com/ml`` allows
    ``registry.example.com/ml/tritonserver:25.01`` but not ``registry.example.com/ml-other/x``:

    >>> image_allowed("nvcr.io/nvidia/tritonserver:25.01-py3", ["nvcr.io/nvidia"])
    True
    >>> image_allowed("nvcr.io/nvidia-evil/tritonserver:1", ["nvcr.io/nvidia"])
    False
    >>> image_allowed("nvcr.io/nvidia/tritonserver:25.01-py3", ["nvcr.io/nvidia/tritonserver:"])
    True
    >>> image_allowed("docker.io/anything", [])
    True
    """
    if not prefixes:
        return True
    for prefix in prefixes:
        if image == prefix:
            return True
        if image.startswith(prefix) and (
            prefix.endswith(_REFERENCE_SEPARATORS) or image[len(prefix)] in _REFERENCE_SEPARATORS
        ):
            return True
    return False


def volume_types(volume: Mapping[str, Any]) -> list[str]:
    """The source types a pod volume names (every key but ``name``), e.g. ``["hostPath"]``."""
    return sorted(key for key in volume if key != "name")


def _refused(field: str, what: str, setting: str, chart_value: str) -> SpecError:
    return SpecError(
        field,
        f"{what} is refused by the operator's policy (setting TRITON_OPERATOR_{setting}, chart value "
        f"policy.{chart_value})",
    )


def _capability(name: object) -> str:
    """A capability as Kubernetes names it: upper case, without CAP_ (the runtimes accept both)."""
    text = str(name).strip().upper()
    return text.removeprefix("CAP_")


def _privilege_errors(context: Mapping[str, Any], settings: Settings) -> list[SpecError]:
    """spec.securityContext's privileged, allowPrivilegeEscalation, hostProcess and added capabilities."""
    errors: list[SpecError] = []
    field = "spec.securityContext"
    if not settings.allow_privileged:
        errors.extend(_escalation_errors(context, field))
    capabilities = context.get("capabilities")
    added = capabilities.get("add") if isinstance(capabilities, Mapping) else None
    allowed = {_capability(c) for c in settings.allowed_capabilities}
    for index, name in enumerate(added if isinstance(added, list) else []):
        if ALL_CAPABILITIES not in allowed and _capability(name) not in allowed:
            listed = ", ".join(sorted(allowed)) or "none"
            errors.append(
                _refused(
                    f"{field}.capabilities.add[{index}]",
                    f"capability {name!r} (allowed: {listed})",
                    "ALLOWED_CAPABILITIES",
                    "allowedCapabilities",
                )
            )
    return errors


def _privileged(field: str, what: str) -> SpecError:
    return _refused(field, what, "ALLOW_PRIVILEGED", "allowPrivileged")


def _confinement_errors(context: Mapping[str, Any], field: str) -> list[SpecError]:
    """What Pod Security baseline refuses in a pod's or a container's securityContext besides
    privileges: unconfined seccomp or AppArmor, an SELinux type/user/role that escapes the container
    domain (spc_t), an unmasked /proc, unsafe sysctls and a Windows host-process pod."""
    errors: list[SpecError] = []
    for key, what in (("seccompProfile", "seccomp"), ("appArmorProfile", "AppArmor")):
        profile = context.get(key)
        kind = profile.get("type") if isinstance(profile, Mapping) else None
        if profile is not None and kind not in CONFINED_PROFILE_TYPES:
            errors.append(
                _privileged(
                    f"{field}.{key}.type",
                    f"{what} profile type {kind!r} (allowed: {', '.join(CONFINED_PROFILE_TYPES)})",
                )
            )
    selinux = context.get("seLinuxOptions")
    if isinstance(selinux, Mapping):
        kind = selinux.get("type") or ""
        if kind not in BASELINE_SELINUX_TYPES:
            allowed = ", ".join(t for t in BASELINE_SELINUX_TYPES if t)
            errors.append(
                _privileged(f"{field}.seLinuxOptions.type", f"SELinux type {kind!r} (allowed: {allowed})")
            )
        for key in ("user", "role"):
            if selinux.get(key):
                errors.append(
                    _privileged(f"{field}.seLinuxOptions.{key}", f"a custom SELinux {key} {selinux[key]!r}")
                )
    proc_mount = context.get("procMount")
    if proc_mount is not None and proc_mount != "Default":
        errors.append(_privileged(f"{field}.procMount", f"procMount {proc_mount!r} (an unmasked /proc)"))
    sysctls = context.get("sysctls")
    for index, sysctl in enumerate(sysctls if isinstance(sysctls, list) else []):
        name = sysctl.get("name") if isinstance(sysctl, Mapping) else sysctl
        if name not in SAFE_SYSCTLS:
            errors.append(
                _privileged(f"{field}.sysctls[{index}].name", f"the unsafe sysctl {name!r} (not namespaced)")
            )
    return errors


def _apparmor_annotation_errors(annotations: Mapping[str, str]) -> list[SpecError]:
    """The AppArmor annotations of spec.podAnnotations that baseline refuses (anything but
    runtime/default and localhost/<profile>, e.g. unconfined)."""
    return [
        _privileged(f"spec.podAnnotations[{key!r}]", f"AppArmor profile {value!r}")
        for key, value in sorted(annotations.items())
        if key.startswith(APPARMOR_ANNOTATION_PREFIX)
        and value != "runtime/default"
        and not value.startswith("localhost/")
    ]


def _escalation_errors(context: Mapping[str, Any], field: str) -> list[SpecError]:
    errors: list[SpecError] = []
    if context.get("privileged") is True:
        errors.append(
            _refused(f"{field}.privileged", "a privileged container", "ALLOW_PRIVILEGED", "allowPrivileged")
        )
    if context.get("allowPrivilegeEscalation") is True:
        errors.append(
            _refused(
                f"{field}.allowPrivilegeEscalation",
                "privilege escalation (setuid binaries, file capabilities)",
                "ALLOW_PRIVILEGED",
                "allowPrivileged",
            )
        )
    windows = context.get("windowsOptions")
    if isinstance(windows, Mapping) and windows.get("hostProcess") is True:
        errors.append(
            _refused(
                f"{field}.windowsOptions.hostProcess",
                "a host-process container",
                "ALLOW_PRIVILEGED",
                "allowPrivileged",
            )
        )
    return errors


def _root_error(ts: TritonService) -> SpecError | None:
    """Whether the pods would run as root: a runAsUser of 0 (the container's wins over the pod's), or
    a user left to the image (no runAsUser, and no runAsNonRoot: true to make the kubelet check).

    Only what the spec sets is judged: without either context the pods get the operator's own
    (non-root uid 1000), and one without the other is merged with it as the pod would be.
    """
    spec_pod = ts.spec.pod_security_context
    if spec_pod is None and ts.spec.security_context is None:
        return None
    pod: Mapping[str, Any] = spec_pod if spec_pod is not None else RESTRICTED_POD_SECURITY
    container: Mapping[str, Any] = ts.spec.security_context or {}
    what = "running as root"
    if "runAsUser" in container:
        if container["runAsUser"] == 0:
            return _refused("spec.securityContext.runAsUser", what, "ALLOW_ROOT", "allowRoot")
        return None
    if "runAsUser" in pod:
        if pod["runAsUser"] == 0:
            return _refused("spec.podSecurityContext.runAsUser", what, "ALLOW_ROOT", "allowRoot")
        return None
    if container.get("runAsNonRoot", pod.get("runAsNonRoot")) is True:
        return None
    field = "spec.podSecurityContext" if spec_pod is not None else "spec.securityContext"
    return _refused(
        field,
        "a securityContext that sets neither runAsUser nor runAsNonRoot: true leaves the user to the "
        "image, which may be root; running as root",
        "ALLOW_ROOT",
        "allowRoot",
    )


def service_account_allowed(namespace: str, name: str | None, allowed: Sequence[str]) -> bool:
    """Whether a TritonService of ``namespace`` may run its pods as ServiceAccount ``name``.

    >>> service_account_allowed("ml", None, [])
    True
    >>> service_account_allowed("ml", "builder", [])
    False
    >>> service_account_allowed("ml", "triton", ["ml/triton"])
    True
    >>> service_account_allowed("other", "triton", ["ml/triton"])
    False
    """
    if not name or name == DEFAULT_SERVICE_ACCOUNT or ANY_SERVICE_ACCOUNT in allowed:
        return True
    return name in allowed or f"{namespace}/{name}" in allowed


def policy_errors(ts: TritonService, settings: Settings) -> list[SpecError]:
    """What the operator's policy refuses in ``ts``, each naming its field and the setting.

    The image checked is the one the pods would run: the spec's, else the operator's default (a
    default outside the allowed prefixes is refused too, so the misconfiguration shows).
    """
    errors: list[SpecError] = []
    image = triton_image(ts, settings)
    allowed_image_prefixes = settings.allowed_image_prefixes
    if not image_allowed(image, allowed_image_prefixes):
        field = "spec.image" if ts.spec.image else "spec.image (the operator's default image)"
        errors.append(
            SpecError(
                field,
                f"image {image!r} is not allowed by the operator's policy: it must start with one of "
                f"{', '.join(repr(p) for p in allowed_image_prefixes)} "
                "(setting TRITON_OPERATOR_ALLOWED_IMAGE_PREFIXES, chart value policy.allowedImagePrefixes)",
            )
        )
    forbidden = set(settings.forbidden_volume_types)
    for index, volume in enumerate(ts.spec.volumes):
        for kind in volume_types(volume):
            if kind in forbidden:
                errors.append(
                    SpecError(
                        f"spec.volumes[{index}].{kind}",
                        f"volume type {kind} is refused by the operator's policy "
                        "(setting TRITON_OPERATOR_FORBIDDEN_VOLUME_TYPES, chart value "
                        "policy.forbiddenVolumeTypes)",
                    )
                )
    errors.extend(_privilege_errors(ts.spec.security_context or {}, settings))
    if not settings.allow_privileged:
        pod = ts.spec.pod_security_context or {}
        errors.extend(_confinement_errors(pod, "spec.podSecurityContext"))
        windows = pod.get("windowsOptions")
        if isinstance(windows, Mapping) and windows.get("hostProcess") is True:
            errors.append(
                _privileged("spec.podSecurityContext.windowsOptions.hostProcess", "a host-process pod")
            )
        errors.extend(_confinement_errors(ts.spec.security_context or {}, "spec.securityContext"))
        errors.extend(_apparmor_annotation_errors(ts.spec.pod_annotations))
    root = None if settings.allow_root else _root_error(ts)
    if root is not None:
        errors.append(root)
    if not service_account_allowed(
        ts.namespace, ts.spec.service_account_name, settings.allowed_service_accounts
    ):
        errors.append(
            _refused(
                "spec.serviceAccountName",
                f"ServiceAccount {ts.spec.service_account_name!r} (only the namespace's "
                f"{DEFAULT_SERVICE_ACCOUNT!r} unless allowed)",
                "ALLOWED_SERVICE_ACCOUNTS",
                "allowedServiceAccounts",
            )
        )
    return errors
