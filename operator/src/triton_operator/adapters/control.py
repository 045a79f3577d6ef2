"""kubectl-triton's cluster access: TritonServices, tuning records, control requests (lightkube)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Protocol

from lightkube import ALL_NS, Client
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
    """Control over lightkube's sync Client; the kubeconfig comes from the environment."""

    def __init__(self, client: Any = None) -> None:
        self._client = client if client is not None else Client(field_manager=FIELD_MANAGER)
        self._resource = create_namespaced_resource(GROUP, VERSION, KIND, PLURAL)

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
