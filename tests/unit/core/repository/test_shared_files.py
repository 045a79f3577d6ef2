"""Which pod a CSI publish of the node cache's shared files is for (core.repository.shared_files)."""

from __future__ import annotations

import pytest

from triton_operator.core.repository.shared_files import (
    EPHEMERAL_KEY,
    POD_NAMESPACE_KEY,
    POD_UID_KEY,
    ViewOwner,
    target_pod_uid,
    view_owner,
)

UID = "0b6c2a4e-51f1-4c3e-9a57-3f1d2a7c9e10"
OTHER = "7d0e9f3a-2b1c-4d5e-8f60-123456789abc"
TARGET = f"/var/lib/kubelet/pods/{UID}/volumes/kubernetes.io~csi/node-cache-files/mount"


def context(uid: str = UID, namespace: str = "team-a", ephemeral: str = "true") -> dict[str, str]:
    return {POD_UID_KEY: uid, POD_NAMESPACE_KEY: namespace, EPHEMERAL_KEY: ephemeral, "size": "1Gi"}


def test_the_kubelets_pod_info_and_target_name_the_owner() -> None:
    assert view_owner(context(), TARGET) == ViewOwner(UID, "team-a")
    assert target_pod_uid(TARGET) == UID
    assert target_pod_uid(TARGET.replace("/var/lib/kubelet", "/srv/k/kubelet")) == UID


@pytest.mark.parametrize(
    ("ctx", "target", "field"),
    [
        (context(uid=OTHER), TARGET, "target_path: names pod"),
        (context(ephemeral="false"), TARGET, EPHEMERAL_KEY),
        ({POD_UID_KEY: UID, POD_NAMESPACE_KEY: "team-a"}, TARGET, EPHEMERAL_KEY),
        (context(uid=""), TARGET, POD_UID_KEY),
        (context(uid="../../etc"), TARGET, POD_UID_KEY),
        (context(namespace="Team_A"), TARGET, POD_NAMESPACE_KEY),
        (context(namespace=""), TARGET, POD_NAMESPACE_KEY),
        (context(), f"/var/lib/kubelet/pods/{UID}/volumes/kubernetes.io~csi/x/mount/..", "target_path"),
        (context(), f"/k/pods/{UID}/../{OTHER}/volumes/kubernetes.io~csi/x/mount", "target_path"),
        (context(), f"/tmp/{UID}/mount", "target_path"),
        (context(), f"relative/pods/{UID}/volumes/kubernetes.io~csi/x/mount", "target_path"),
    ],
)
def test_a_publish_naming_no_pod_or_two_is_refused_naming_the_field(
    ctx: dict[str, str], target: str, field: str
) -> None:
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        view_owner(ctx, target)
