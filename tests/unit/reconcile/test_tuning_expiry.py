"""reconcile.tuning_expiry: the operator deletes what a dead sweep left once its deadline passed.

The API is a fake that keeps objects by kind and refuses what it is told to; the same pass runs
against a real API server in tests/e2e/test_tuning_expiry_e2e.py (a client SIGKILLed mid-sweep).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from triton_operator.adapters.kube import ConflictError
from triton_operator.core import tuning as core
from triton_operator.reconcile.tuning_expiry import TuningExpiry

NOW = datetime(2026, 11, 27, 17, 0, 0, tzinfo=UTC)


@dataclasses.dataclass
class FakeTuningAPI:
    objects: dict[tuple[str, str, str], dict[str, Any]] = dataclasses.field(default_factory=dict)
    conflict: bool = False
    listed: list[tuple[str, str | None]] = dataclasses.field(default_factory=list)

    def put(self, kind: str, namespace: str, name: str, deadline: datetime, **labels: str) -> dict[str, Any]:
        obj = {
            "kind": kind,
            "metadata": {
                "name": name,
                "namespace": namespace,
                "resourceVersion": "1",
                "labels": {**core.run_labels("svc", "r"), **labels},
                "annotations": {core.ANNOTATION_DEADLINE: deadline.strftime("%Y-%m-%dT%H:%M:%SZ")},
            },
        }
        self.objects[(kind, namespace, name)] = obj
        return obj

    async def list_labelled(self, kind: str, namespace: str | None, label: str) -> list[dict[str, Any]]:
        self.listed.append((kind, namespace))
        return [
            o
            for (k, ns, _), o in self.objects.items()
            if k == kind and (namespace is None or ns == namespace) and label in o["metadata"]["labels"]
        ]

    async def delete(self, kind: str, namespace: str, name: str) -> bool:
        return self.objects.pop((kind, namespace, name), None) is not None

    async def merge_patch(
        self, kind: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        if self.conflict:
            raise ConflictError(kind, name)
        obj = self.objects[(kind, namespace, name)]
        assert patch["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]
        obj["data"] = dict(patch["data"])
        return obj


def test_a_pass_deletes_owners_past_their_deadline_marks_the_record_and_wakes_at_the_next() -> None:
    api = FakeTuningAPI()
    past, soon = NOW - timedelta(seconds=1), NOW + timedelta(seconds=20)
    for kind in ("Deployment", "Job", "ConfigMap"):
        api.put(kind, "ml", f"svc-tune-r-c0-{kind.lower()}", past)
    api.put("Deployment", "ml", "svc-tune-s-c0", soon, **{core.LABEL_RUN: "s"})
    record = api.put("ConfigMap", "ml", "svc-tune-r-results", past, **{core.LABEL_RESULTS: "true"})
    record["data"] = {core.RESULTS_KEY: json.dumps({"run": "r", "state": core.RUNNING, "message": ""})}
    expiry = TuningExpiry(api, now=lambda: NOW)
    wait = asyncio.run(expiry.pass_once())
    assert sorted(api.objects) == [
        ("ConfigMap", "ml", "svc-tune-r-results"),
        ("Deployment", "ml", "svc-tune-s-c0"),
    ]
    assert sorted(k for k, _, _ in expiry.deleted) == ["ConfigMap", "Deployment", "Job"]
    assert json.loads(record["data"][core.RESULTS_KEY])["state"] == core.ABANDONED
    assert wait == 20.0  # the next deadline, sooner than the period


def test_a_pass_leaves_a_record_its_client_wrote_meanwhile_and_watches_only_its_namespaces() -> None:
    api = FakeTuningAPI(conflict=True)
    record = api.put("ConfigMap", "ml", "svc-tune-r-results", NOW, **{core.LABEL_RESULTS: "true"})
    record["data"] = {core.RESULTS_KEY: json.dumps({"run": "r", "state": core.RUNNING})}
    api.put("Deployment", "other", "svc-tune-r-c0", NOW)
    expiry = TuningExpiry(api, now=lambda: NOW, counts=lambda ns: ns == "ml")
    assert asyncio.run(expiry.pass_once()) == expiry.period  # nothing upcoming: the period
    assert json.loads(record["data"][core.RESULTS_KEY])["state"] == core.RUNNING
    assert ("Deployment", "other", "svc-tune-r-c0") in api.objects
    assert {kind for kind, _ in api.listed} == {"Deployment", "Job", "Service", "ConfigMap"}


def test_a_paused_operator_removes_nothing() -> None:
    api = FakeTuningAPI()
    api.put("Deployment", "ml", "svc-tune-r-c0", NOW - timedelta(hours=1))
    expiry = TuningExpiry(api, now=lambda: NOW, paused=lambda: True, period=0.01)

    async def briefly() -> None:
        task = expiry.start()
        await asyncio.sleep(0.05)
        await TuningExpiry.stop(task)

    asyncio.run(briefly())
    assert api.listed == [] and ("Deployment", "ml", "svc-tune-r-c0") in api.objects
