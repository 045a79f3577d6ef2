"""The operator with TRITON_OPERATOR_LOG_FORMAT=json against a real API server: every log line a JSON
object, the reconcile's naming the TritonService and its revision, and its pods' sync told the same."""

from __future__ import annotations

import json
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.apps_v1 import Deployment

from e2e_helpers import apply, owned, tritonservice, wait_condition
from triton_operator import logs
from tritonservice_bodies import fetcher

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


@pytest.mark.operator_env(TRITON_OPERATOR_LOG_FORMAT="json")
def test_json_log_lines_name_the_tritonservice_and_its_revision(
    kube: Client, namespace: str, operator: Any
) -> None:
    apply(kube, tritonservice("tiny", namespace))
    obj = wait_condition(kube, namespace, "tiny", "Ready", "True", reason="Available")
    revision = obj["status"]["stableRevision"]
    lines = [line for line in operator.log_path.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line: one JSON object
    assert all({"timestamp", "severity", "message"} <= r.keys() for r in records)
    ours = [r for r in records if r.get("tritonservice") == "tiny"]
    assert ours and all(r["namespace"] == namespace for r in ours)
    assert any(r.get("revision") == revision and r["component"] == "operator" for r in ours), ours[-5:]
    (deployment,) = owned(kube, Deployment, namespace, "tiny")
    sync = fetcher(deployment["spec"]["template"]["spec"])  # the model agent: one pod shape
    env = {e["name"]: e.get("value") for e in sync.get("env") or []}
    assert env[logs.ENV] == "json"
    assert (env[logs.SERVICE_ENV], env[logs.REVISION_ENV]) == (f"{namespace}/tiny", revision)
