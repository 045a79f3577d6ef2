"""Kubernetes I/O: server-side apply under one field manager, owned-object lists, status writes."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import httpx2
from lightkube import ALL_NS, ApiError, AsyncClient, KubeConfig
from lightkube.generic_resource import create_namespaced_resource
from lightkube.operators import exists
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.autoscaling_v2 import HorizontalPodAutoscaler
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import ConfigMap, Event, Pod, Secret, Service
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.types import CascadeType, PatchType

from triton_operator import FIELD_MANAGER, GROUP, KIND, PLURAL, VERSION
from triton_operator.core.edges.backoff import parse_retry_after

TritonServiceResource: Any = create_namespaced_resource(GROUP, VERSION, KIND, PLURAL)
GATEWAY_GROUP = "gateway.networking.k8s.io"
HTTPRouteResource: Any = create_namespaced_resource(GATEWAY_GROUP, "v1", "HTTPRoute", "httproutes")
GRPCRouteResource: Any = create_namespaced_resource(GATEWAY_GROUP, "v1", "GRPCRoute", "grpcroutes")

RESOURCES: dict[str, Any] = {
    "Deployment": Deployment,
    "ConfigMap": ConfigMap,
    "Service": Service,
    "Pod": Pod,
    "PodDisruptionBudget": PodDisruptionBudget,
    "HorizontalPodAutoscaler": HorizontalPodAutoscaler,
    KIND: TritonServiceResource,
    "HTTPRoute": HTTPRouteResource,
    "GRPCRoute": GRPCRouteResource,
    "Job": Job,
}


def is_not_found(exc: BaseException) -> bool:
    return isinstance(exc, ApiError) and exc.status.code == 404


class ObjectRejectedError(Exception):
    """The API server refused a desired object as invalid (422): the spec asks for something impossible."""

    def __init__(self, kind: str, name: str, message: str) -> None:
        super().__init__(f"{kind} {name} rejected by the API server: {message}")
        self.kind = kind
        self.name = name
        self.message = message


class ObjectTooLargeError(ObjectRejectedError):
    """The API server refused a desired object for its size: 413 (the request body over its 3 MiB),
    or 422 "Too long" for the whole object (a ConfigMap's data over 1 MiB)."""


def _too_long(exc: ApiError) -> bool:
    """A 422 whose causes say the whole object, or a ConfigMap's data, is too long."""
    details = exc.status.details
    return any(
        cause.reason == "FieldValueTooLong" and (cause.field or "") in ("", "[]", "data", "binaryData")
        for cause in (details.causes if details is not None else None) or []
    )


class ConflictError(Exception):
    """A conditional write found the object changed since it was read (409)."""

    def __init__(self, kind: str, name: str) -> None:
        super().__init__(f"{kind} {name} changed while it was being written")
        self.kind = kind
        self.name = name


def retry_delay(exc: BaseException) -> float | None:
    """Seconds to wait before retrying after ``exc`` when it is an API or network failure, else None."""
    if isinstance(exc, ApiError):
        code = exc.status.code or 0
        if code == 429 or code >= 500:
            return 5.0
        if code in (401, 403):
            return 30.0  # RBAC or credentials: fixed by a human, so retry slowly
        return 10.0
    if isinstance(exc, httpx2.HTTPError | OSError | TimeoutError):
        return 5.0
    return None


def retry_after(exc: BaseException) -> float | None:
    """The seconds the API server asked to wait before a retry (Retry-After, sent with a 429 or a
    503), None when it sent none."""
    response = getattr(exc, "response", None) if isinstance(exc, httpx2.HTTPStatusError) else None
    return parse_retry_after(response.headers.get("Retry-After")) if response is not None else None


def _to_dict(obj: Any) -> dict[str, Any]:
    result: dict[str, Any] = obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)
    return result


@dataclasses.dataclass(frozen=True)
class Owned:
    """Objects of one TritonService found by its labels, as plain dicts."""

    deployments: list[dict[str, Any]]
    configmaps: list[dict[str, Any]]
    pods: list[dict[str, Any]]


def make_client(kubeconfig: str | Path | None = None, *, timeout: float = 30.0) -> AsyncClient:
    """An AsyncClient from a kubeconfig file, or auto-detected (in-cluster, $KUBECONFIG, ~/.kube)."""
    config = KubeConfig.from_file(str(kubeconfig)) if kubeconfig else None
    return AsyncClient(config=config, field_manager=FIELD_MANAGER, timeout=httpx2.Timeout(timeout))


class KubeAPI(Protocol):
    """What the reconcile layer needs from the API server, and each call's contract.

    ``Kube`` (below, over lightkube) is the real one; tests/support/memkube.py holds an in-memory
    fake that can force conflicts and timings a real cluster cannot produce on demand. Objects are
    plain camelCase dicts as the API server returns them. Any other failure of the API server or
    the network propagates as is (lightkube.ApiError, httpx errors): ``retry_delay`` says whether
    and when to try again.
    """

    async def get_tritonservice(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The TritonService as stored now (status included); None when it does not exist."""
        ...

    async def get_secret_data(self, namespace: str, name: str) -> dict[str, str] | None:
        """A Secret's data and stringData, decoded (values that are not UTF-8 left out); None when
        the Secret does not exist."""
        ...

    async def list_owned(self, namespace: str, labels: Mapping[str, str]) -> Owned:
        """The Deployments, ConfigMaps and Pods in ``namespace`` carrying every one of ``labels``
        (whoever owns them: the caller tells its own by ownerReferences)."""
        ...

    async def list_kind(
        self, kind: str, namespace: str, labels: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]:
        """Every object of ``kind`` (a key of RESOURCES) in ``namespace``, whoever made it; with
        ``labels``, only those carrying every one of them."""
        ...

    async def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply a whole desired object (kind among RESOURCES) under the operator's field
        manager, forcing conflicts, creating it when missing; the stored object.

        Raises ObjectTooLargeError when the API server refuses the object for its size, else
        ObjectRejectedError when it finds the object invalid.
        """
        ...

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """One object of ``kind`` (a key of RESOURCES) as stored now; None when it does not exist,
        nor its kind (a cluster without the Gateway API routes)."""
        ...

    async def merge_patch(
        self, kind: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        """JSON merge patch (RFC 7386) of an existing object; the stored result, None when the object
        does not exist (never creates one).

        A metadata.resourceVersion in ``patch`` makes it conditional: ConflictError when the object
        changed since that version. ObjectRejectedError when the result is invalid.
        """
        ...

    async def scale(self, namespace: str, name: str, replicas: int) -> bool:
        """Set a Deployment's spec.replicas and nothing else; False when the Deployment does not exist."""
        ...

    async def post_event(self, event: Mapping[str, Any]) -> None:
        """Create a core/v1 Event (built by core.objects.builders.build_event)."""
        ...

    async def delete(self, kind: str, namespace: str, name: str) -> bool:
        """Delete an object (its dependents go in the background); False when it was already gone."""
        ...

    async def apply_status(
        self, namespace: str, name: str, status: Mapping[str, Any], *, resource_version: str | None
    ) -> dict[str, Any] | None:
        """Server-side apply the operator's status fields on a TritonService's /status subresource
        (the spec is untouched); the stored object, None when the TritonService does not exist.

        ``resource_version`` (the version the status was decided from) makes the write conditional:
        ConflictError when the TritonService changed since, and nothing is written. None writes
        unconditionally.
        """
        ...


class Kube:
    """The operator's whole view of the API server (KubeAPI over lightkube's AsyncClient)."""

    def __init__(self, client: AsyncClient, field_manager: str = FIELD_MANAGER) -> None:
        self.client = client
        self.field_manager = field_manager

    async def close(self) -> None:
        await self.client.close()

    def http(self) -> httpx2.AsyncClient:
        """lightkube's own HTTP client (the server, its credentials, the connection pool), for the
        raw requests lightkube has no call for: metadata-only watches (adapters.owned_watch)."""
        http: httpx2.AsyncClient = self.client._client._client
        return http

    async def _read(self, resource: Any, namespace: str, name: str) -> Any:
        """The object as lightkube reads it; None when it (or its kind) does not exist."""
        try:
            return await self.client.get(resource, name, namespace=namespace)
        except ApiError as exc:
            if is_not_found(exc):
                return None
            raise

    async def get_tritonservice(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The TritonService as stored now, or None when it is gone."""
        obj = await self._read(TritonServiceResource, namespace, name)
        return None if obj is None else _to_dict(obj)

    async def get_secret_data(self, namespace: str, name: str) -> dict[str, str] | None:
        """A Secret's data, decoded (values that are not UTF-8 are left out); None when it is missing."""
        obj = await self._read(Secret, namespace, name)
        if obj is None:
            return None
        out: dict[str, str] = {}
        for key, value in (obj.data or {}).items():
            with contextlib.suppress(ValueError, UnicodeDecodeError):
                out[key] = base64.b64decode(value).decode("utf-8")
        for key, value in (obj.stringData or {}).items():
            out[key] = value
        return out

    async def list_owned(self, namespace: str, labels: Mapping[str, str]) -> Owned:
        """Deployments, ConfigMaps and Pods carrying ``labels`` in ``namespace``."""
        selector: dict[str, Any] = dict(labels)
        deployments = [
            _to_dict(o) async for o in self.client.list(Deployment, namespace=namespace, labels=selector)
        ]
        configmaps = [
            _to_dict(o) async for o in self.client.list(ConfigMap, namespace=namespace, labels=selector)
        ]
        pods = [_to_dict(o) async for o in self.client.list(Pod, namespace=namespace, labels=selector)]
        return Owned(deployments=deployments, configmaps=configmaps, pods=pods)

    async def list_kind(
        self, kind: str, namespace: str, labels: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]:
        """Every object of ``kind`` in ``namespace`` (carrying every one of ``labels``, when given)."""
        selector: dict[str, Any] | None = dict(labels) if labels else None
        found = self.client.list(RESOURCES[kind], namespace=namespace, labels=selector)
        return [_to_dict(o) async for o in found]

    async def list_labelled(self, kind: str, namespace: str | None, label: str) -> list[dict[str, Any]]:
        """Every object of ``kind`` that has label ``label`` (any value), in ``namespace`` (None: every
        namespace), each with its ``kind``."""
        found = self.client.list(RESOURCES[kind], namespace=namespace or ALL_NS, labels={label: exists()})
        return [{**_to_dict(o), "kind": kind} async for o in found]

    async def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply ``obj`` (a full desired object) under our field manager, forcing conflicts.

        Raises ObjectRejectedError when the API server finds the object invalid, ObjectTooLargeError
        when it refuses the object for its size.
        """
        kind = str(obj["kind"])
        metadata = obj["metadata"]
        try:
            result = await self.client.patch(
                RESOURCES[kind],
                metadata["name"],
                dict(obj),
                namespace=metadata.get("namespace"),
                patch_type=PatchType.APPLY,
                field_manager=self.field_manager,
                force=True,
            )
        except ApiError as exc:
            name = str(metadata["name"])
            if exc.status.code == 413 or (exc.status.code == 422 and _too_long(exc)):
                raise ObjectTooLargeError(kind, name, str(exc.status.message)) from exc
            if exc.status.code == 422:
                raise ObjectRejectedError(kind, name, str(exc.status.message)) from exc
            raise
        return _to_dict(result)

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """One object as stored now; None when it (or its kind, e.g. Gateway API routes) does not exist."""
        obj = await self._read(RESOURCES[kind], namespace, name)
        return None if obj is None else _to_dict(obj)

    async def merge_patch(
        self, kind: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        """JSON merge patch under our field manager; None when the object is gone (never creates one).

        A metadata.resourceVersion in ``patch`` makes it conditional: ConflictError when the object
        changed since that version. Raises ObjectRejectedError when the result is invalid.
        """
        try:
            result = await self._merge(RESOURCES[kind], namespace, name, dict(patch))
        except ApiError as exc:
            if exc.status.code == 409:
                raise ConflictError(kind, name) from exc
            if exc.status.code == 422:
                raise ObjectRejectedError(kind, name, str(exc.status.message)) from exc
            raise
        return None if result is None else _to_dict(result)

    async def scale(self, namespace: str, name: str, replicas: int) -> bool:
        """Set a Deployment's spec.replicas and nothing else (merge patch); False when it is gone."""
        return await self._merge(Deployment, namespace, name, {"spec": {"replicas": replicas}}) is not None

    async def _merge(self, resource: Any, namespace: str, name: str, patch: dict[str, Any]) -> Any:
        """A JSON merge patch under our field manager; the patched object, None when it is gone."""
        try:
            return await self.client.patch(
                resource,
                name,
                patch,
                namespace=namespace,
                patch_type=PatchType.MERGE,
                field_manager=self.field_manager,
            )
        except ApiError as exc:
            if is_not_found(exc):
                return None
            raise

    async def post_event(self, event: Mapping[str, Any]) -> None:
        """Create a core/v1 Event (built by core.objects.builders.build_event)."""
        obj: Any = Event.from_dict(dict(event))
        await self.client.create(obj)

    async def delete(self, kind: str, namespace: str, name: str) -> bool:
        """Delete an object, its dependents in the background; False when it was already gone."""
        try:
            await self.client.delete(
                RESOURCES[kind], name, namespace=namespace, cascade=CascadeType.BACKGROUND
            )
        except ApiError as exc:
            if is_not_found(exc):
                return False
            raise
        return True

    async def apply_status(
        self, namespace: str, name: str, status: Mapping[str, Any], *, resource_version: str | None
    ) -> dict[str, Any] | None:
        """Server-side apply the owned status fields on the /status subresource; None when gone.

        A metadata.resourceVersion in an applied object is a precondition to the API server (409
        when the object has another): forcing takes over fields of other managers, never a newer
        object's status.
        """
        metadata = {"name": name, "namespace": namespace}
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "metadata": metadata,
            "status": dict(status),
        }
        try:
            result = await self.client.patch(
                TritonServiceResource.Status,
                name,
                body,
                namespace=namespace,
                patch_type=PatchType.APPLY,
                field_manager=self.field_manager,
                force=True,
            )
        except ApiError as exc:
            if is_not_found(exc):
                return None
            if exc.status.code == 409:
                raise ConflictError(KIND, name) from exc
            raise
        return _to_dict(result)


_KUBE_IS_A_KUBE_API: type[KubeAPI] = Kube
"""mypy checks here that Kube keeps KubeAPI's contract (the fake in the tests is checked likewise)."""
