"""An in-memory stand-in for lightkube's AsyncClient, enough for adapters.kube.Kube and one reconcile.

Objects are plain dicts keyed by (kind, namespace, name). An apply replaces what it names (the
operator always applies whole objects); what the API server would refuse for its size is
refused with the API server's own status code and message (bigmanifest.refusal), so the
operator's error handling runs as it does against a real cluster.

A fake of the API server. Use it under the real ``Kube`` adapter, to test what Kube makes of the
API server's answers; to test the reconcile layer itself (conflicts, timings, call order), use
memkube.MemKube, a fake of the whole KubeAPI (see its docstring).
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Mapping
from typing import Any

from lightkube import ApiError
from lightkube.models.meta_v1 import Status, StatusCause, StatusDetails

from bigmanifest import refusal
from triton_operator.adapters.kube import RESOURCES, Kube, TritonServiceResource

KINDS = {resource: kind for kind, resource in RESOURCES.items()}


def api_error(code: int, reason: str, message: str, causes: list[StatusCause] | None = None) -> ApiError:
    details = StatusDetails(causes=causes) if causes else None
    return ApiError(
        status=Status(code=code, reason=reason, message=message, status="Failure", details=details)
    )


class FakeClient:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.writes: list[tuple[str, str, str]] = []
        """(verb, kind, name) of every accepted write, in order."""
        self.refused: list[tuple[int, str, str]] = []
        """(status code, kind, name) of every write refused for its size."""
        self.events: list[dict[str, Any]] = []

    def put(self, obj: Mapping[str, Any]) -> None:
        """Store an object as if it had been written earlier (by an earlier operator, say)."""
        meta = obj["metadata"]
        self.objects[str(obj["kind"]), str(meta.get("namespace", "")), str(meta["name"])] = copy.deepcopy(
            dict(obj)
        )

    def find(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((kind, namespace, name))

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for (k, _, _), o in sorted(self.objects.items()) if k == kind]

    async def close(self) -> None:
        return None

    async def get(self, resource: Any, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        obj = self.find(KINDS[resource], namespace or "", name)
        if obj is None:
            raise api_error(404, "NotFound", f'{KINDS[resource]} "{name}" not found')
        return copy.deepcopy(obj)

    async def list(
        self, resource: Any, *, namespace: str | None = None, labels: Mapping[str, Any] | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        for (kind, ns, _), obj in sorted(self.objects.items()):
            have = (obj.get("metadata") or {}).get("labels") or {}
            if (
                kind == KINDS[resource]
                and ns == namespace
                and all(have.get(k) == v for k, v in (labels or {}).items())
            ):
                yield copy.deepcopy(obj)

    async def patch(
        self,
        resource: Any,
        name: str,
        obj: Mapping[str, Any],
        *,
        namespace: str | None = None,
        patch_type: Any = None,
        field_manager: str | None = None,
        force: bool = False,
    ) -> dict[str, Any]:
        del field_manager, force
        if resource is TritonServiceResource.Status:
            stored = self.find("TritonService", namespace or "", name)
            if stored is None:
                raise api_error(404, "NotFound", f'TritonService "{name}" not found')
            # A metadata.resourceVersion in the applied object is a precondition (kube-apiserver's 409).
            have = stored.setdefault("metadata", {}).get("resourceVersion")
            wanted = (obj.get("metadata") or {}).get("resourceVersion")
            if wanted is not None and str(wanted) != str(have):
                raise api_error(409, "Conflict", f'Operation cannot be fulfilled on tritonservices "{name}"')
            if have is not None and str(have).isdigit():
                stored["metadata"]["resourceVersion"] = str(int(have) + 1)
            stored["status"] = copy.deepcopy(dict(obj["status"]))
            self.writes.append(("status", "TritonService", name))
            return copy.deepcopy(stored)
        kind = KINDS[resource]
        if str(patch_type).endswith("MERGE") or getattr(patch_type, "name", "") == "MERGE":
            stored = self.find(kind, namespace or "", name)
            if stored is None:
                raise api_error(404, "NotFound", f'{kind} "{name}" not found')
            for key, value in obj.get("spec", {}).items():
                stored.setdefault("spec", {})[key] = value
            self.writes.append(("patch", kind, name))
            return copy.deepcopy(stored)
        too_large = refusal(obj)
        if too_large is not None:
            code, message = too_large
            self.refused.append((code, kind, name))
            if code == 413:
                raise api_error(413, "RequestEntityTooLarge", message)
            cause = StatusCause(field="[]", message=message.split("[]: ", 1)[-1], reason="FieldValueTooLong")
            raise api_error(422, "Invalid", message, [cause])
        previous = self.find(kind, namespace or "", name)
        stored = copy.deepcopy(dict(obj))
        if previous is not None and "status" in previous:
            stored["status"] = previous["status"]
        self.put(stored)
        self.writes.append(("apply", kind, name))
        return copy.deepcopy(stored)

    async def delete(
        self, resource: Any, name: str, *, namespace: str | None = None, cascade: Any = None
    ) -> None:
        del cascade
        key = (KINDS[resource], namespace or "", name)
        if key not in self.objects:
            raise api_error(404, "NotFound", f'{key[0]} "{name}" not found')
        del self.objects[key]
        self.writes.append(("delete", key[0], name))

    async def create(self, obj: Any) -> Any:
        self.events.append(obj.to_dict() if hasattr(obj, "to_dict") else dict(obj))
        return obj


class KubeWithSecrets(Kube):
    """Kube over a FakeClient, with credentials Secrets by (namespace, name) (FakeClient keeps none)."""

    def __init__(self, api: FakeClient, secrets: Mapping[tuple[str, str], Mapping[str, str]]) -> None:
        super().__init__(api)  # type: ignore[arg-type]
        self.secrets = {key: dict(data) for key, data in secrets.items()}

    async def get_secret_data(self, namespace: str, name: str) -> dict[str, str] | None:
        data = self.secrets.get((namespace, name))
        return None if data is None else dict(data)
