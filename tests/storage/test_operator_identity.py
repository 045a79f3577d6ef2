"""The operator's own cloud identity is lent to no namespace unless its settings say so; endpoints
are held to the operator's allow-list. Through the reconcile (status as written) on a real S3 server.

The operator's identity here is the one boto3's default chain finds in the operator's
environment: seaweedfs's key pair in AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, as IRSA or a node
role would give it in a cloud.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from fakeapi import FakeClient, KubeWithSecrets
from storage_backends import Backend
from triton_operator.adapters import storage
from triton_operator.core.repository.repository_access import RepositoryAccess
from triton_operator.core.vocabulary import conditions as cond
from triton_operator.reconcile.pinning import RepositoryPinner
from triton_operator.reconcile.reconcile_pass import reconcile
from triton_operator.settings import Settings

pytestmark = pytest.mark.storage


@pytest.fixture
def operator_identity(s3_backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator process holds working S3 credentials of its own (its default chain)."""
    for key in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_backend.credentials["AWS_ACCESS_KEY_ID"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_backend.credentials["AWS_SECRET_ACCESS_KEY"])


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The URIs of every store opened for pinning: a refusal must come before any request."""
    calls: list[str] = []
    real = storage.open_store

    def counting(repository: Any, credentials: Mapping[str, str], **kwargs: Any) -> Any:
        calls.append(repository.uri)
        return real(repository, credentials, **kwargs)

    monkeypatch.setattr(storage, "open_store", counting)
    return calls


def model_bucket(backend: Backend) -> str:
    bucket = backend.new_bucket()
    backend.put(bucket, "models/m/1/model.py", b"x = 1\n")
    return bucket


def run(
    namespace: str,
    repository: dict[str, Any],
    access: RepositoryAccess | None,
    secrets: Mapping[tuple[str, str], Mapping[str, str]] | None = None,
) -> tuple[dict[str, Any], FakeClient]:
    """Reconcile a TritonService of ``namespace`` once; its RepositoryReady condition, and the API."""
    api = FakeClient()
    api.put(
        {
            "apiVersion": "triton-operator.io/v1alpha1",
            "kind": "TritonService",
            "metadata": {"name": "svc", "namespace": namespace, "uid": "u1", "generation": 1},
            "spec": {"repository": repository, "models": [{"name": "m", "config": {"backend": "python"}}]},
        }
    )
    kube = KubeWithSecrets(api, secrets or {})
    pinner = RepositoryPinner(kube) if access is None else RepositoryPinner(kube, access=access)
    asyncio.run(reconcile(kube, namespace, "svc", Settings(), pin_manifest=pinner))
    stored: Any = api.find("TritonService", namespace, "svc")
    ready = next(c for c in stored["status"]["conditions"] if c["type"] == cond.REPOSITORY_READY)
    return ready, api


def s3_spec(backend: Backend, bucket: str, **extra: Any) -> dict[str, Any]:
    return {
        "uri": f"s3://{bucket}/models",
        "endpoint": backend.endpoint,
        "s3": {"addressingStyle": "path"},
        **extra,
    }


@pytest.mark.usefixtures("operator_identity")
def test_without_a_secret_the_operator_identity_is_refused_by_default(
    s3_backend: Backend, opened: list[str]
) -> None:
    ready, api = run("team-a", s3_spec(s3_backend, model_bucket(s3_backend)), access=None)
    assert (ready["status"], ready["reason"]) == ("False", cond.CREDENTIALS_REQUIRED), ready
    assert ready["message"].startswith("spec.repository.credentialsSecret: required")
    assert (
        "'team-a'" in ready["message"]
        and "TRITON_OPERATOR_AMBIENT_CREDENTIALS_NAMESPACES" in ready["message"]
    )
    assert opened == [] and api.of_kind("Deployment") == [] and api.of_kind("ConfigMap") == []


@pytest.mark.usefixtures("operator_identity")
def test_a_namespace_the_settings_allow_is_pinned_with_the_operator_identity_and_no_other(
    s3_backend: Backend, opened: list[str]
) -> None:
    bucket = model_bucket(s3_backend)
    settings = Settings.from_env({"TRITON_OPERATOR_AMBIENT_CREDENTIALS_NAMESPACES": "team-a, team-c"})
    access = RepositoryAccess.from_settings(settings)
    ready, api = run("team-a", s3_spec(s3_backend, bucket), access)
    assert (ready["status"], ready["reason"]) == ("True", cond.MANIFEST_PINNED), ready
    assert len(api.of_kind("Deployment")) == 1
    other, _ = run("team-b", s3_spec(s3_backend, bucket), access)
    assert other["reason"] == cond.CREDENTIALS_REQUIRED, other
    assert opened == [f"s3://{bucket}/models"]  # team-a's listing only
    everyone, _ = run("team-b", s3_spec(s3_backend, bucket), RepositoryAccess(ambient_namespaces=("*",)))
    assert everyone["reason"] == cond.MANIFEST_PINNED, everyone


@pytest.mark.usefixtures("operator_identity")
def test_a_secret_without_the_store_keys_lends_no_identity_either(
    s3_backend: Backend, opened: list[str]
) -> None:
    """An empty Secret (or one of other keys) would leave boto3 on its default chain: refused alike."""
    spec = s3_spec(s3_backend, model_bucket(s3_backend), credentialsSecret="empty")
    ready, _ = run("team-a", spec, access=None, secrets={("team-a", "empty"): {"note": "nothing here"}})
    assert ready["reason"] == cond.CREDENTIALS_REQUIRED, ready
    assert "Secret 'empty' holds no credentials for s3://" in ready["message"]
    assert opened == []


def test_the_endpoint_allow_list_refuses_others_and_lets_its_own_through(s3_backend: Backend) -> None:
    bucket = model_bucket(s3_backend)
    spec = s3_spec(s3_backend, bucket, credentialsSecret="s3")
    secrets = {("ml", "s3"): s3_backend.credentials}
    ready, _ = run("ml", spec, RepositoryAccess(allowed_endpoints=("minio.storage:9000",)), secrets)
    assert (ready["status"], ready["reason"]) == ("False", cond.ENDPOINT_NOT_ALLOWED), ready
    assert ready["message"].startswith(
        f"spec.repository.endpoint: {s3_backend.endpoint!r} is not an endpoint"
    )
    ready, _ = run(
        "ml", spec, RepositoryAccess(allowed_endpoints=("minio.storage:9000", "127.0.0.1")), secrets
    )
    assert ready["reason"] == cond.MANIFEST_PINNED, ready


def test_a_pvc_repository_needs_no_credentials() -> None:
    ready, api = run("team-a", {"uri": "pvc://models/repo"}, access=None)
    assert (ready["status"], ready["reason"]) == ("True", cond.VOLUME_MOUNTED), ready
    assert len(api.of_kind("Deployment")) == 1
