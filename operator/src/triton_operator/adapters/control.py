"""kubectl-triton's cluster access: TritonServices, tuning records, control requests (lightkube)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import yaml
from lightkube import ALL_NS, Client, KubeConfig
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.core_v1 import ConfigMap
from lightkube.types import PatchType

from triton_operator import GROUP, KIND, PLURAL, VERSION
from triton_operator.core import tuning
from triton_operator.core.rollout.clock import utcnow
from triton_operator.core.rollout.requests import Action, control_annotations

FIELD_MANAGER = "kubectl-triton"


def new_request_id(now: datetime | None = None) -> str:
    """A fresh request id: the UTC time with microseconds, so ids sort in the order they were made."""
    moment = (now or utcnow()).astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def request_patch(
    action: Action, request_id: str, to_revision: str | None = None, *, revision: str | None = None
) -> dict[str, Any]:
    """The JSON merge patch that makes one request (a None annotation value removes the key);
    ``revision``: the revision a promote or abort is made for."""
    annotations = control_annotations(action, request_id, to_revision, revision=revision)
    return {"metadata": {"annotations": annotations}}


# The kubeconfig fields that name a file: kubectl reads a relative one from the file's own folder.
_CLUSTER_FILES = ("certificate-authority",)
_USER_FILES = ("client-certificate", "client-key", "tokenFile")


def _absolute(entry: Mapping[str, Any], keys: Sequence[str], folder: Path) -> dict[str, Any]:
    body = dict(entry)
    for key in keys:
        if body.get(key) and not Path(str(body[key])).expanduser().is_absolute():
            body[key] = str(folder / str(body[key]))
    return body


def merge_kubeconfigs(documents: Sequence[tuple[Path, Mapping[str, Any]]]) -> dict[str, Any]:
    """Several kubeconfig files as kubectl merges $KUBECONFIG's: the first file to name a cluster, user
    or context wins it, the first current-context set wins, and each relative file path is made
    absolute against the folder of the file it came from."""
    merged: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [],
        "users": [],
        "contexts": [],
    }
    seen: dict[str, set[str]] = {"clusters": set(), "users": set(), "contexts": set()}
    for path, doc in documents:
        folder = path.expanduser().resolve().parent
        for section, inner, keys in (
            ("clusters", "cluster", _CLUSTER_FILES),
            ("users", "user", _USER_FILES),
            ("contexts", "context", ()),
        ):
            for entry in doc.get(section) or []:
                name = str(entry.get("name"))
                if name in seen[section]:
                    continue
                seen[section].add(name)
                merged[section].append({"name": name, inner: _absolute(entry.get(inner) or {}, keys, folder)})
        if doc.get("current-context") and "current-context" not in merged:
            merged["current-context"] = doc["current-context"]
    return merged


def load_kubeconfig(kubeconfig: str | None = None, env: Mapping[str, str] | None = None) -> KubeConfig:
    """The kubeconfig as kubectl finds it: ``--kubeconfig`` alone when given; else every file of
    $KUBECONFIG (``:``-separated, missing ones skipped, merged); else in a pod its service account,
    else ~/.kube/config."""
    if kubeconfig:
        return KubeConfig.from_file(kubeconfig)
    listed = [p for p in (os.environ if env is None else env).get("KUBECONFIG", "").split(os.pathsep) if p]
    if not listed:
        return KubeConfig.from_env()
    documents = []
    for name in listed:
        path = Path(name).expanduser()
        if path.is_file():
            documents.append((path, yaml.safe_load(path.read_text()) or {}))
    if not documents:
        raise ValueError(f"KUBECONFIG={os.pathsep.join(listed)}: none of its files exists")
    return KubeConfig.from_dict(merge_kubeconfigs(documents), fname=documents[0][0])


def kube_client(
    kubeconfig: str | None = None, context: str | None = None, *, timeout: float | None = None
) -> Client:
    """A lightkube Client for kubectl's ``--kubeconfig`` and ``--context`` (None: as kubectl's default)."""
    config = load_kubeconfig(kubeconfig)
    try:
        single = config.get(context)
    except Exception as exc:  # lightkube's ConfigError: a context that is not there, no current-context
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise ValueError(f"kubeconfig {where}: {exc}") from exc
    if timeout is None:
        return Client(config=single, field_manager=FIELD_MANAGER)
    import httpx2  # noqa: PLC0415 - lightkube's HTTP client, for a short timeout

    return Client(config=single, field_manager=FIELD_MANAGER, timeout=httpx2.Timeout(timeout))


OPERATOR_LABELS: dict[str, str] = {
    "app.kubernetes.io/part-of": "triton-operator",
    "app.kubernetes.io/component": "operator",
}
"""The labels of the operator's Deployment (the chart's and manifests/'), how `--version` finds it."""


def operator_versions(client: Any) -> list[str]:
    """Each operator Deployment in the cluster as `VERSION (NAMESPACE/NAME, image IMAGE)`: the version
    its app.kubernetes.io/version label says, else its image's tag. Raises what the API raises."""
    from lightkube.resources.apps_v1 import Deployment  # noqa: PLC0415 - only for --version

    found = []
    for dep in client.list(Deployment, namespace=ALL_NS, labels=dict(OPERATOR_LABELS)):
        body = dep.to_dict()
        metadata = body.get("metadata") or {}
        containers = ((body.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []
        image = next((c.get("image") for c in containers if c.get("name") == "operator"), None) or (
            containers[0].get("image") if containers else ""
        )
        tag = image.rpartition(":")[2] if ":" in image.rpartition("/")[2] else ""
        version = (metadata.get("labels") or {}).get("app.kubernetes.io/version") or tag or "unknown"
        found.append(f"{version} ({metadata.get('namespace')}/{metadata.get('name')}, image {image})")
    return sorted(found)


class Control(Protocol):
    """What kubectl-triton needs from the cluster (a fake in unit tests, lightkube for real)."""

    @property
    def namespace(self) -> str: ...

    def get(self, name: str, namespace: str) -> dict[str, Any]: ...

    def tuning_results(self, name: str, namespace: str) -> list[dict[str, Any]]: ...

    def list(self, namespace: str | None) -> list[dict[str, Any]]: ...

    def request(
        self,
        name: str,
        namespace: str,
        action: Action,
        to_revision: str | None = None,
        *,
        revision: str | None = None,
    ) -> str: ...


class KubeControl:
    """Control over lightkube's sync Client (default: kube_client(), the kubeconfig as kubectl finds it)."""

    def __init__(self, client: Any = None) -> None:
        self._client = client if client is not None else kube_client()
        self._resource = create_namespaced_resource(GROUP, VERSION, KIND, PLURAL)

    @property
    def client(self) -> Any:
        """The lightkube Client (the tuning sweep uses the same cluster and credentials)."""
        return self._client

    @property
    def namespace(self) -> str:
        return str(self._client.namespace or "default")

    def get(self, name: str, namespace: str) -> dict[str, Any]:
        obj = self._client.get(self._resource, name, namespace=namespace)
        result: dict[str, Any] = obj.to_dict()
        return result

    def tuning_results(self, name: str, namespace: str) -> list[dict[str, Any]]:
        """The records of a TritonService's sweeps (`kubectl triton tune`), oldest first."""
        labels: dict[str, Any] = {tuning.LABEL_TUNING: name, tuning.LABEL_RESULTS: "true"}
        found = self._client.list(ConfigMap, namespace=namespace, labels=labels)
        records = [tuning.read_record(c.to_dict()) for c in found]
        return sorted((r for r in records if r is not None), key=lambda r: str(r.get("run")))

    def list(self, namespace: str | None) -> list[dict[str, Any]]:
        items = self._client.list(self._resource, namespace=ALL_NS if namespace is None else namespace)
        return [item.to_dict() for item in items]

    def request(
        self,
        name: str,
        namespace: str,
        action: Action,
        to_revision: str | None = None,
        *,
        revision: str | None = None,
    ) -> str:
        request_id = new_request_id()
        self._client.patch(
            self._resource,
            name,
            request_patch(action, request_id, to_revision, revision=revision),
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )
        return request_id
