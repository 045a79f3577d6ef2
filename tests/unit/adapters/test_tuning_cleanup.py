"""adapters.tuning_cluster.KubeTuning.delete: owners only, by cascade; a refused delete is reported, not
raised.

The lightkube client is a fake that answers lists and refuses deletes as an RBAC-limited user's API
server does; tests/e2e/test_tuning_expiry_e2e.py runs the same cleanup as a real ServiceAccount.
"""

from __future__ import annotations

from typing import Any

from lightkube.models.apps_v1 import DeploymentSpec
from lightkube.models.core_v1 import PodTemplateSpec
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import ConfigMap, Pod
from lightkube.types import CascadeType

from fakeapi import api_error
from triton_operator.adapters.tuning_cluster import KubeTuning
from triton_operator.core import tuning as core

LABELS = core.run_labels("svc", "r")


class FakeSyncClient:
    def __init__(self, refuse: set[str]) -> None:
        self.refuse = refuse
        self.deleted: list[tuple[str, str, Any]] = []
        spec = DeploymentSpec(selector=LabelSelector(), template=PodTemplateSpec())
        self.objects: dict[Any, list[Any]] = {
            Job: [Job(metadata=ObjectMeta(name="svc-tune-r-c0-perf", labels=LABELS))],
            Deployment: [Deployment(metadata=ObjectMeta(name="svc-tune-r-c0", labels=LABELS), spec=spec)],
            Pod: [Pod(metadata=ObjectMeta(name="svc-tune-r-c0-1-x", labels=LABELS))],
            ConfigMap: [
                ConfigMap(metadata=ObjectMeta(name="svc-tune-r-c0", labels=LABELS)),
                ConfigMap(
                    metadata=ObjectMeta(
                        name="svc-tune-r-results", labels={**LABELS, core.LABEL_RESULTS: "true"}
                    )
                ),
            ],
        }

    def list(self, kind: Any, namespace: str, labels: dict[str, str]) -> list[Any]:
        return [*self.objects.get(kind, [])]

    def delete(self, kind: Any, name: str, namespace: str, cascade: CascadeType) -> None:
        if kind.__name__ in self.refuse:
            raise api_error(403, "Forbidden", f'{kind.__name__.lower()}s "{name}" is forbidden')
        self.deleted.append((kind.__name__, name, cascade))


def test_cleanup_deletes_owners_by_cascade_never_a_pod_and_reports_what_was_refused() -> None:
    client = FakeSyncClient(refuse={"Job", "Pod"})
    problems = KubeTuning(client).delete("ml", LABELS)
    assert client.deleted == [
        ("Deployment", "svc-tune-r-c0", CascadeType.BACKGROUND),
        ("ConfigMap", "svc-tune-r-c0", CascadeType.BACKGROUND),
    ]
    assert problems == ['could not delete Job/svc-tune-r-c0-perf: jobs "svc-tune-r-c0-perf" is forbidden']
