"""kubectl triton tune's cluster access: tuning pods, perf Jobs and their logs, the record (lightkube)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import ConfigMap, Pod, Service
from lightkube.types import CascadeType, PatchType

from triton_operator import GROUP, KIND, PLURAL, VERSION
from triton_operator.core import tuning as core
from triton_operator.core.objects.names import LABEL_REVISION, LABEL_SERVICE

FIELD_MANAGER = "kubectl-triton"
POLL_SECONDS = 1.0
NOT_FOUND = 404
KINDS: tuple[Any, ...] = (Job, Deployment, Service, ConfigMap)
"""What a sweep makes, in the order it is deleted: owners only. Their pods go with them (the garbage
collector's cascade), so cleanup needs no right on pods."""
LEFT: tuple[Any, ...] = (*KINDS, Pod)
"""What may be left of a sweep: its objects, and their pods until the cascade has removed them."""


def _selector(labels: Mapping[str, str]) -> dict[str, Any]:
    return dict(labels)


def _describe(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


class TuningPodError(RuntimeError):
    """A candidate that could not be measured: its pod never served, or perf_analyzer failed."""


class TuningCluster(Protocol):
    """What a sweep needs of the cluster (adapters.tuning_cluster.KubeTuning; a fake in unit tests)."""

    def service(self, name: str, namespace: str) -> dict[str, Any]: ...

    def revision_configmaps(self, name: str, namespace: str, revision: str) -> list[dict[str, Any]]: ...

    def create(self, objects: Sequence[Mapping[str, Any]]) -> None: ...

    def pod_ip(self, namespace: str, labels: Mapping[str, str], timeout: float) -> str: ...

    def job_log(self, namespace: str, name: str, timeout: float) -> str: ...

    def delete(self, namespace: str, labels: Mapping[str, str]) -> list[str]: ...

    def gpu_holders(self, name: str, namespace: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]: ...

    def leftovers(self, namespace: str, labels: Mapping[str, str]) -> list[str]: ...

    def save(self, configmap: Mapping[str, Any]) -> None: ...

    def patch_spec(self, name: str, namespace: str, patch: Sequence[Mapping[str, Any]]) -> None: ...

    def runs(self, name: str, namespace: str) -> list[str]: ...

    def forget(self, name: str, namespace: str, run: str) -> None: ...


class KubeTuning:
    """TuningCluster over lightkube's sync Client; the kubeconfig comes from the environment."""

    def __init__(self, client: Any = None, *, sleep: Any = time.sleep, clock: Any = time.monotonic) -> None:
        self._client = client if client is not None else Client(field_manager=FIELD_MANAGER)
        self._resource = create_namespaced_resource(GROUP, VERSION, KIND, PLURAL)
        self._sleep = sleep
        self._clock = clock

    @property
    def namespace(self) -> str:
        return str(self._client.namespace or "default")

    def service(self, name: str, namespace: str) -> dict[str, Any]:
        obj: dict[str, Any] = self._client.get(self._resource, name, namespace=namespace).to_dict()
        return obj

    def revision_configmaps(self, name: str, namespace: str, revision: str) -> list[dict[str, Any]]:
        labels: dict[str, Any] = {LABEL_SERVICE: name, LABEL_REVISION: revision}
        return [c.to_dict() for c in self._client.list(ConfigMap, namespace=namespace, labels=labels)]

    def create(self, objects: Sequence[Mapping[str, Any]]) -> None:
        for obj in objects:
            self._client.apply(from_dict(dict(obj)), field_manager=FIELD_MANAGER, force=True)

    def pod_ip(self, namespace: str, labels: Mapping[str, str], timeout: float) -> str:
        """Wait until the pod of ``labels`` is Ready; its IP. TuningPodError when it fails or times out."""
        deadline = self._clock() + timeout
        verdict = core.PodVerdict()
        while self._clock() < deadline:
            pods = [
                p.to_dict() for p in self._client.list(Pod, namespace=namespace, labels=_selector(labels))
            ]
            verdict = core.pod_verdict(pods)
            if verdict.failure:
                raise TuningPodError(verdict.failure)
            if verdict.ip:
                return verdict.ip
            self._sleep(POLL_SECONDS)
        raise TuningPodError(f"not Ready within {timeout:.0f} s ({verdict.detail})")

    def job_log(self, namespace: str, name: str, timeout: float) -> str:
        """Wait for a Job to finish; its pod's log. TuningPodError when it failed or ran out of time."""
        deadline = self._clock() + timeout
        verdict = None
        while self._clock() < deadline:
            verdict = core.job_verdict(self._client.get(Job, name, namespace=namespace).to_dict())
            if verdict is not None:
                break
            self._sleep(POLL_SECONDS)
        pods = list(self._client.list(Pod, namespace=namespace, labels={"job-name": name}))
        log = ""
        if pods:
            try:
                log = "".join(self._client.log(pods[0].metadata.name, namespace=namespace))
            except ApiError as exc:
                log = f"(no log: {exc})"
        if verdict == "complete":
            return log
        tail = "\n".join(log.strip().splitlines()[-5:])
        what = "failed" if verdict == "failed" else f"did not finish within {timeout:.0f} s"
        raise TuningPodError(f"perf_analyzer {what}: {tail}".rstrip(": "))

    def delete(self, namespace: str, labels: Mapping[str, str]) -> list[str]:
        """Delete every Job, Deployment, Service and ConfigMap of ``labels`` but results ConfigMaps, each
        with its dependents (the Deployment's ReplicaSet and pods, the Job's pod) in the background;
        never a pod directly. What could not be listed or deleted, one line each (nothing raised: the
        caller records it and goes on)."""
        problems: list[str] = []
        for kind in KINDS:
            try:
                found = list(self._client.list(kind, namespace=namespace, labels=_selector(labels)))
            except ApiError as exc:
                problems.append(
                    f"could not list {kind.__name__}s of {_describe(labels)}: {exc.status.message}"
                )
                continue
            for obj in found:
                if ((obj.metadata and obj.metadata.labels) or {}).get(core.LABEL_RESULTS) == "true":
                    continue
                try:
                    self._client.delete(
                        kind, obj.metadata.name, namespace=namespace, cascade=CascadeType.BACKGROUND
                    )
                except ApiError as exc:
                    if exc.status.code != NOT_FOUND:
                        problems.append(
                            f"could not delete {kind.__name__}/{obj.metadata.name}: {exc.status.message}"
                        )
        return problems

    def leftovers(self, namespace: str, labels: Mapping[str, str]) -> list[str]:
        """What of ``labels`` still exists (results ConfigMaps aside), as kind/name; pods included."""
        found = []
        for kind in LEFT:
            for obj in self._client.list(kind, namespace=namespace, labels=_selector(labels)):
                if ((obj.metadata and obj.metadata.labels) or {}).get(core.LABEL_RESULTS) != "true":
                    found.append(f"{kind.__name__}/{obj.metadata.name}")
        return found

    def gpu_holders(self, name: str, namespace: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The Deployments and pods of TritonService ``name``: every revision's and every sweep's."""
        deployments: list[dict[str, Any]] = []
        pods: list[dict[str, Any]] = []
        for key in (LABEL_SERVICE, core.LABEL_TUNING):
            selector: dict[str, Any] = {key: name}
            deployments += [
                d.to_dict() for d in self._client.list(Deployment, namespace=namespace, labels=selector)
            ]
            pods += [p.to_dict() for p in self._client.list(Pod, namespace=namespace, labels=selector)]
        return deployments, pods

    def save(self, configmap: Mapping[str, Any]) -> None:
        self._client.apply(from_dict(dict(configmap)), field_manager=FIELD_MANAGER, force=True)

    def patch_spec(self, name: str, namespace: str, patch: Sequence[Mapping[str, Any]]) -> None:
        self._client.patch(
            self._resource, name, [dict(p) for p in patch], namespace=namespace, patch_type=PatchType.JSON
        )

    def runs(self, name: str, namespace: str) -> list[str]:
        """The runs of a TritonService that have a record."""
        labels: dict[str, Any] = {core.LABEL_TUNING: name, core.LABEL_RESULTS: "true"}
        found = self._client.list(ConfigMap, namespace=namespace, labels=labels)
        return [str(((c.metadata and c.metadata.labels) or {}).get(core.LABEL_RUN, "")) for c in found]

    def forget(self, name: str, namespace: str, run: str) -> None:
        """Delete a run's record."""
        try:
            self._client.delete(ConfigMap, core.results_name(name, run), namespace=namespace)
        except ApiError as exc:
            if exc.status.code != NOT_FOUND:
                raise
