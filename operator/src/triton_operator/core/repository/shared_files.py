"""The node cache's shared files: which pod a CSI publish is for, and the names its volume uses.

With ``nodeCache.sharedFiles.enabled`` the node cache is also a CSI node plugin (``DRIVER``,
ephemeral inline volumes only). A pod with its volume sees, read-only, a folder of hard links to the
cache's blobs: those its own lease named and its namespace's index holds, each named by the blob's
SHA-256 (docs/security.md, "Shared files: the node cache's CSI volume"). Which pod a publish is for
comes from the kubelet twice, the pod info of the volume context and the target path it chose, and
the two must agree (``view_owner``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from triton_operator.core.repository.cache_rules import BLOB_FORM, NAMESPACE_FORM

DRIVER = "files.node-cache.triton-operator.io"
"""The CSI driver's name (its CSIDriver object, the kubelet's registration of it, a pod's ``csi.driver``)."""
VOLUME = "node-cache-files"
"""The pod's volume of shared files."""
MOUNT_PATH = "/var/run/triton-operator/node-cache-files"
"""Where the model agent and tritonserver see it, read-only."""
FILES_ENV = "TRITON_NODE_CACHE_FILES"
"""Set in a pod given the volume: where it is mounted (unset: the pod copies what it reads)."""
POD_UID_KEY = "csi.storage.k8s.io/pod.uid"
POD_NAMESPACE_KEY = "csi.storage.k8s.io/pod.namespace"
EPHEMERAL_KEY = "csi.storage.k8s.io/ephemeral"
UID_FORM = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
TARGET_FORM = re.compile(
    r"^/(?:[^/\0]+/)*pods/(?P<uid>[0-9a-f-]{36})/volumes/kubernetes\.io~csi/[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/mount$"
)


@dataclass(frozen=True)
class ViewOwner:
    """The pod a view is for."""

    pod_uid: str
    namespace: str


def shared_target(link: str, folder: str) -> str | None:
    """The blob a symlink placed by the sync names, when ``link`` (its target) is a file of the view
    at ``folder``: ``<folder>/<sha256>``; else None (a symlink the sync did not place)."""
    head, _, name = link.rpartition("/")
    return name if head == folder.rstrip("/") and BLOB_FORM.fullmatch(name) else None


def target_pod_uid(target: str) -> str | None:
    """The pod uid in a target path the kubelet chose (``.../pods/<uid>/volumes/kubernetes.io~csi/
    <volume>/mount``), None when ``target`` is not one."""
    found = TARGET_FORM.fullmatch(target)
    if found is None or UID_FORM.fullmatch(found["uid"]) is None or "/../" in target or "/./" in target:
        return None
    return found["uid"]


def view_owner(context: Mapping[str, str], target: str) -> ViewOwner:
    """Which pod a publish is for, or ValueError naming what is wrong: the volume context's pod info
    (the kubelet's, written over the pod's own attributes) and the target path must name one pod,
    and the volume must be an ephemeral inline one."""
    uid = context.get(POD_UID_KEY, "")
    namespace = context.get(POD_NAMESPACE_KEY, "")
    if context.get(EPHEMERAL_KEY) != "true":
        raise ValueError(f"volume_context[{EPHEMERAL_KEY}]: only ephemeral inline volumes are served")
    if UID_FORM.fullmatch(uid) is None:
        raise ValueError(f"volume_context[{POD_UID_KEY}]: {uid!r} is not a pod uid (is podInfoOnMount set?)")
    if NAMESPACE_FORM.fullmatch(namespace) is None:
        raise ValueError(f"volume_context[{POD_NAMESPACE_KEY}]: {namespace!r} is not a namespace")
    in_target = target_pod_uid(target)
    if in_target is None:
        raise ValueError(f"target_path: {target!r} is not a kubelet's path of a pod's CSI volume")
    if in_target != uid:
        raise ValueError(f"target_path: names pod {in_target}, the volume context {uid}")
    return ViewOwner(uid, namespace)
