"""MemKube: an in-memory fake of adapters.kube.KubeAPI, for unit tests of the reconcile layer.

A fake, not the API server: the e2e tests run the operator against a real one. This fake exists
to force what a real cluster cannot produce on demand: a conflict on the next write, an object
changed between a read and a write, a call that waits until the test lets it go.

Which fake to use:

- ``MemKube`` (this module) stands in for the whole KubeAPI: the reconcile layer (steps, routes,
  pinning, the scheduler) runs over it, and tests inject faults and look at its call log.
- ``fakeapi.FakeClient`` stands in for lightkube's AsyncClient *under* the real ``Kube`` adapter,
  so Kube's own translation of API errors runs (the API server's 413/422 size refusals in
  test_large_manifest.py). Use it only to test what Kube does with the API server's answers.

Semantics (pinned by tests/unit/test_memkube.py):

- objects are plain dicts keyed by (kind, namespace, name), kinds those of adapters.kube.RESOURCES;
  every read returns a copy;
- every write stores a new metadata.resourceVersion (a counter across all objects); a spec that
  changes bumps metadata.generation (1 at creation); a new object gets a metadata.uid;
- ``apply`` replaces the whole object (the operator applies whole objects) but keeps its status
  and uid; ``applied`` records the order of applies;
- ``merge_patch`` is an RFC 7386 merge; it never creates an object;
- a resourceVersion precondition is honoured as the API server does (a 409): a
  metadata.resourceVersion in what ``apply`` or ``merge_patch`` is given, or ``apply_status``'s
  ``resource_version`` (None, the default: none), raises ConflictError and writes nothing when the
  stored object has another version (``apply`` too when there is no object to hold it);
- ``scale`` sets spec.replicas of a Deployment; ``delete`` says whether something was there;
  ``post_event`` records the event in ``events``; ``apply_status`` replaces the status;
- ``calls`` logs every call (reads too) before it runs, ``writes`` every write that succeeded;
- ``fail_next(method, exc, times=)`` makes the next calls of a method raise; ``before(method, hook,
  times=)`` runs a hook (sync or async) before a call, to change an object between a read and a
  write or to hold a call until the test lets it go.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import inspect
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from triton_operator import KIND
from triton_operator.adapters.kube import RESOURCES, ConflictError, KubeAPI, Owned

Key = tuple[str, str, str]
"""(kind, namespace, name)"""

READS = frozenset({"get_tritonservice", "get_secret_data", "list_owned", "list_kind", "get"})
WRITES = frozenset({"apply", "merge_patch", "scale", "post_event", "delete", "apply_status"})
METHODS = READS | WRITES


@dataclasses.dataclass(frozen=True)
class Call:
    """One call of a KubeAPI method: list_owned has no kind or name, post_event the Event's name."""

    method: str
    kind: str
    namespace: str
    name: str


Hook = Callable[[Call], Awaitable[None] | None]


@dataclasses.dataclass
class _Armed:
    """A fault or hook for the next ``times`` calls of a method (of ``kind``, when set)."""

    times: int | None
    """None: every call, until disarmed."""
    kind: str | None
    error: BaseException | None = None
    hook: Hook | None = None

    def matches(self, call: Call) -> bool:
        return self.kind is None or self.kind == call.kind


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch of ``patch`` onto ``target`` (neither is modified)."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out: dict[str, Any] = dict(copy.deepcopy(target)) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge(out.get(key), value)
    return out


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"KubeAPI has no method {method!r}")


def _check_kind(kind: str) -> None:
    # As the real Kube: a kind it has no resource for is a programming error, not a 404.
    if kind not in RESOURCES:
        raise KeyError(kind)


class MemKube:
    """The fake KubeAPI (see the module docstring)."""

    def __init__(self) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.calls: list[Call] = []
        """Every call, in order, logged before it runs (a call made to fail is logged too)."""
        self.writes: list[Call] = []
        """Every write that succeeded, in order."""
        self.applied: list[Key] = []
        """What ``apply`` stored, in order."""
        self.events: list[dict[str, Any]] = []
        self._version = 0
        self._armed: dict[str, list[_Armed]] = {}

    # ------------------------------------------------------------- test helpers

    def put(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Store ``obj`` whole, as a write by someone else (a user, kubectl): status included."""
        kind, namespace, name = _key(obj)
        if kind != "Secret":  # read by get_secret_data only
            _check_kind(kind)
        return self._store((kind, namespace, name), copy.deepcopy(dict(obj)))

    def edit(self, kind: str, namespace: str, name: str, change: Callable[[dict[str, Any]], None]) -> None:
        """Change a stored object in place as someone else's write (a new resourceVersion)."""
        key = (kind, namespace, name)
        obj = copy.deepcopy(self.objects[key])
        change(obj)
        self._store(key, obj)

    def find(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The stored object itself (not a copy), for assertions."""
        return self.objects.get((kind, namespace, name))

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [obj for (k, _, _), obj in sorted(self.objects.items()) if k == kind]

    def count(self, method: str, name: str | None = None) -> int:
        """How many calls of ``method`` (for ``name``, when given) were made."""
        return sum(1 for c in self.calls if c.method == method and (name is None or c.name == name))

    def fail_next(
        self, method: str, error: BaseException, *, times: int | None = 1, kind: str | None = None
    ) -> None:
        """The next ``times`` calls of ``method`` (of ``kind``) raise ``error`` and change nothing."""
        _check_method(method)
        self._armed.setdefault(method, []).append(_Armed(times, kind, error=error))

    def before(self, method: str, hook: Hook, *, times: int | None = 1, kind: str | None = None) -> None:
        """Run ``hook`` (awaited when it is async) before the next ``times`` calls of ``method``."""
        _check_method(method)
        self._armed.setdefault(method, []).append(_Armed(times, kind, hook=hook))

    # ------------------------------------------------------------- KubeAPI

    async def get_tritonservice(self, namespace: str, name: str) -> dict[str, Any] | None:
        await self._enter("get_tritonservice", KIND, namespace, name)
        return self._copy((KIND, namespace, name))

    async def get_secret_data(self, namespace: str, name: str) -> dict[str, str] | None:
        await self._enter("get_secret_data", "Secret", namespace, name)
        secret = self.objects.get(("Secret", namespace, name))
        if secret is None:
            return None
        out: dict[str, str] = {}
        for key, value in (secret.get("data") or {}).items():
            try:
                out[key] = base64.b64decode(value).decode("utf-8")
            except (ValueError, UnicodeDecodeError):
                continue
        out.update(secret.get("stringData") or {})
        return out

    async def list_owned(self, namespace: str, labels: Mapping[str, str]) -> Owned:
        await self._enter("list_owned", "", namespace, "")

        def matching(kind: str) -> list[dict[str, Any]]:
            return [
                copy.deepcopy(obj)
                for (k, ns, _), obj in sorted(self.objects.items())
                if k == kind
                and ns == namespace
                and all(
                    ((obj.get("metadata") or {}).get("labels") or {}).get(lk) == lv
                    for lk, lv in labels.items()
                )
            ]

        return Owned(
            deployments=matching("Deployment"), configmaps=matching("ConfigMap"), pods=matching("Pod")
        )

    async def list_kind(
        self, kind: str, namespace: str, labels: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]:
        _check_kind(kind)
        await self._enter("list_kind", kind, namespace, "")
        return [
            copy.deepcopy(obj)
            for (k, ns, _), obj in sorted(self.objects.items())
            if k == kind
            and ns == namespace
            and all(
                ((obj.get("metadata") or {}).get("labels") or {}).get(a) == b
                for a, b in (labels or {}).items()
            )
        ]

    async def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        key = _key(obj)
        _check_kind(key[0])
        await self._enter("apply", *key)
        stored = copy.deepcopy(dict(obj))
        previous = self.objects.get(key)
        _precondition(previous, (obj.get("metadata") or {}).get("resourceVersion"), key)
        if previous is not None and "status" in previous:
            stored["status"] = copy.deepcopy(previous["status"])  # status is not the applier's
        result = self._store(key, stored)
        self.applied.append(key)
        self._wrote("apply", key)
        return result

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        _check_kind(kind)
        await self._enter("get", kind, namespace, name)
        return self._copy((kind, namespace, name))

    async def merge_patch(
        self, kind: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        _check_kind(kind)
        key = (kind, namespace, name)
        await self._enter("merge_patch", *key)
        stored = self.objects.get(key)
        if stored is None:
            return None
        _precondition(stored, (patch.get("metadata") or {}).get("resourceVersion"), key)
        result = self._store(key, merge(stored, patch))
        self._wrote("merge_patch", key)
        return result

    async def scale(self, namespace: str, name: str, replicas: int) -> bool:
        key = ("Deployment", namespace, name)
        await self._enter("scale", *key)
        stored = self.objects.get(key)
        if stored is None:
            return False
        self._store(key, merge(stored, {"spec": {"replicas": replicas}}))
        self._wrote("scale", key)
        return True

    async def post_event(self, event: Mapping[str, Any]) -> None:
        metadata = event.get("metadata") or {}
        key = ("Event", str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))
        await self._enter("post_event", *key)
        self.events.append(copy.deepcopy(dict(event)))
        self._wrote("post_event", key)

    async def delete(self, kind: str, namespace: str, name: str) -> bool:
        _check_kind(kind)
        key = (kind, namespace, name)
        await self._enter("delete", *key)
        if self.objects.pop(key, None) is None:
            return False
        self._wrote("delete", key)
        return True

    async def apply_status(
        self, namespace: str, name: str, status: Mapping[str, Any], *, resource_version: str | None = None
    ) -> dict[str, Any] | None:
        key = (KIND, namespace, name)
        await self._enter("apply_status", *key)
        stored = self.objects.get(key)
        if stored is None:
            return None
        _precondition(stored, resource_version, key)
        updated = copy.deepcopy(stored)
        updated["status"] = copy.deepcopy(dict(status))
        result = self._store(key, updated)
        self._wrote("apply_status", key)
        return result

    # ------------------------------------------------------------- inside

    async def _enter(self, method: str, kind: str, namespace: str, name: str) -> None:
        """Log the call, run its hooks, then raise its injected fault, if any."""
        call = Call(method, kind, namespace, name)
        self.calls.append(call)
        for armed in self._take(call, hooks=True):
            assert armed.hook is not None
            outcome = armed.hook(call)
            if inspect.isawaitable(outcome):
                await outcome
        for armed in self._take(call, hooks=False):
            assert armed.error is not None
            raise armed.error

    def _take(self, call: Call, *, hooks: bool) -> list[_Armed]:
        """The faults (or hooks) armed for ``call``, each counted down once."""
        taken: list[_Armed] = []
        pending = self._armed.get(call.method, [])
        for armed in list(pending):
            if (armed.hook is not None) != hooks or not armed.matches(call):
                continue
            taken.append(armed)
            if armed.times is not None:
                armed.times -= 1
                if armed.times <= 0:
                    pending.remove(armed)
            if not hooks:
                break  # one fault a call: the next armed one is for the next call
        return taken

    def _store(self, key: Key, obj: dict[str, Any]) -> dict[str, Any]:
        previous = self.objects.get(key)
        metadata = obj.setdefault("metadata", {})
        metadata["name"], metadata["namespace"] = key[2], key[1]
        self._version += 1
        metadata["resourceVersion"] = str(self._version)
        if previous is None:
            metadata.setdefault("uid", str(uuid.uuid4()))
            metadata["generation"] = 1
        else:
            before = previous.get("metadata") or {}
            metadata["uid"] = before.get("uid")
            generation = int(before.get("generation") or 1)
            metadata["generation"] = generation + (previous.get("spec") != obj.get("spec"))
        self.objects[key] = obj
        return copy.deepcopy(obj)

    def _copy(self, key: Key) -> dict[str, Any] | None:
        obj = self.objects.get(key)
        return copy.deepcopy(obj) if obj is not None else None

    def _wrote(self, method: str, key: Key) -> None:
        self.writes.append(Call(method, *key))


def _precondition(stored: Mapping[str, Any] | None, wanted: object, key: Key) -> None:
    """ConflictError unless ``wanted`` (a resourceVersion, None: no precondition) is ``stored``'s."""
    if wanted is None:
        return
    have = (stored.get("metadata") or {}).get("resourceVersion") if stored is not None else None
    if have is None or str(wanted) != str(have):
        raise ConflictError(key[0], key[2])


def _key(obj: Mapping[str, Any]) -> Key:
    metadata = obj.get("metadata") or {}
    return str(obj["kind"]), str(metadata.get("namespace") or ""), str(metadata["name"])


_MEMKUBE_IS_A_KUBE_API: type[KubeAPI] = MemKube
"""mypy checks here that the fake keeps the contract the reconcile layer is written against."""


def run_kubelet(
    kube: MemKube, namespace: str, crashing: Callable[[Mapping[str, Any]], bool] = lambda _deployment: False
) -> None:
    """The Deployment controller and the kubelet, faked: every Deployment of ``namespace`` has its
    status and exactly its replicas' pods, Ready, or crash-looping (CrashLoopBackOff, 5 restarts)
    for a Deployment ``crashing`` picks."""
    for deployment in kube.of_kind("Deployment"):
        name = deployment["metadata"]["name"]
        crash = crashing(deployment)
        replicas = int(deployment["spec"].get("replicas", 1))
        ready = 0 if crash else replicas
        status = {
            "replicas": replicas,
            "readyReplicas": ready,
            "availableReplicas": ready,
            "updatedReplicas": replicas,
            "observedGeneration": deployment["metadata"]["generation"],
        }

        def set_status(obj: dict[str, Any], status: dict[str, Any] = status) -> None:
            obj["status"] = status

        kube.edit("Deployment", namespace, name, set_status)
        for key in [k for k in kube.objects if k[0] == "Pod" and k[2].startswith(f"{name}-")]:
            del kube.objects[key]
        pod_status: dict[str, Any] = {
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "False" if crash else "True"},
            ]
        }
        if crash:
            waiting = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}}
            pod_status["containerStatuses"] = [{"name": "tritonserver", "restartCount": 5, "state": waiting}]
        for i in range(replicas):
            labels = deployment["spec"]["template"]["metadata"]["labels"]
            kube.put(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": f"{name}-{i}", "namespace": namespace, "labels": labels},
                    "status": copy.deepcopy(pod_status),
                }
            )
