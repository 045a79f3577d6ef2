"""Every URL the operator would contact because a credential names it is held to
allowedRepositoryEndpoints, and nothing such a URL answers reaches the status.

A GCS service-account key names its token endpoint (token_uri): google-auth posts a signed assertion
there for an access token, from the operator's network position, whatever the store's endpoint is.
Here the store is the real fake-gcs-server and the token endpoint a small loopback listener that
records every connection and answers with a planted body.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from fakeapi import FakeClient, KubeWithSecrets
from storage_servers import Server
from triton_operator.adapters.storage import StoreError, open_store
from triton_operator.core.repository.repository_access import RepositoryAccess
from triton_operator.core.vocabulary import conditions as cond
from triton_operator.models import Repository
from triton_operator.reconcile.pinning import RepositoryPinner
from triton_operator.reconcile.reconcile_pass import reconcile
from triton_operator.settings import Settings

pytestmark = pytest.mark.storage

PLANTED = "PLANTED-INTERNAL-ANSWER-7Q3XW9Z"
"""What the token endpoint answers: found in a status, it can only have come from its response."""


class _Recorder(http.server.BaseHTTPRequestHandler):
    answer: tuple[int, bytes] = (400, b"")
    requests: list[str]

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.do_GET()

    def do_GET(self) -> None:
        self.requests.append(self.path)
        status, body = self.answer
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet
        return None


class Listener:
    """An HTTP server on a free loopback port; ``connections`` counts every TCP connection."""

    def __init__(self, status: int, body: bytes) -> None:
        recorded: list[str] = []
        handler = type("Handler", (_Recorder,), {"answer": (status, body), "requests": recorded})
        self.requests = recorded
        self.connections = 0
        outer = self

        class Counting(http.server.ThreadingHTTPServer):
            def get_request(self) -> Any:
                outer.connections += 1
                return super().get_request()

        self.server = Counting(("127.0.0.1", 0), handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def listener(request: pytest.FixtureRequest) -> Iterator[Listener]:
    status, body = getattr(request, "param", (400, b"{}"))
    listener = Listener(status, body)
    yield listener
    listener.close()


def service_account_json(token_uri: str) -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return json.dumps(
        {
            "type": "service_account",
            "project_id": "p",
            "private_key_id": "k1",
            "private_key": pem,
            "client_email": "reader@p.iam.gserviceaccount.com",
            "token_uri": token_uri,
        }
    )


def host_port(url: str) -> str:
    return urlsplit(url).netloc


def repository_ready(fake_gcs: Server, token_uri: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    """Reconcile a gs:// TritonService on fake-gcs-server whose Secret holds a key naming
    ``token_uri``, with these allowed endpoints; its RepositoryReady condition."""
    repository = {"uri": "gs://models/repo", "endpoint": fake_gcs.endpoint, "credentialsSecret": "gcs-key"}
    secret = {"GOOGLE_APPLICATION_CREDENTIALS_JSON": service_account_json(token_uri)}
    return reconciled(repository, secret, allowed)


def reconciled(
    repository: dict[str, Any], secret: dict[str, str], allowed: tuple[str, ...]
) -> dict[str, Any]:
    """Reconcile a TritonService of ``repository`` whose credentialsSecret holds ``secret``."""
    api = FakeClient()
    api.put(
        {
            "apiVersion": "triton-operator.io/v1alpha1",
            "kind": "TritonService",
            "metadata": {"name": "svc", "namespace": "ml", "uid": "u1", "generation": 1},
            "spec": {"repository": repository, "models": [{"name": "m", "config": {"backend": "python"}}]},
        }
    )
    kube = KubeWithSecrets(api, {("ml", repository["credentialsSecret"]): secret})
    pinner = RepositoryPinner(kube, access=RepositoryAccess(allowed_endpoints=allowed))
    asyncio.run(reconcile(kube, "ml", "svc", Settings(), pin_manifest=pinner))
    stored: Any = api.find("TritonService", "ml", "svc")
    return next(c for c in stored["status"]["conditions"] if c["type"] == cond.REPOSITORY_READY)


def test_a_token_uri_off_the_allow_list_is_never_contacted(fake_gcs: Server, listener: Listener) -> None:
    ready = repository_ready(fake_gcs, listener.url + "/token", allowed=(host_port(fake_gcs.endpoint),))
    assert listener.connections == 0, listener.requests
    assert (ready["status"], ready["reason"]) == ("False", cond.ENDPOINT_NOT_ALLOWED), ready
    message = ready["message"]
    assert message.startswith(
        "spec.repository.credentialsSecret (GOOGLE_APPLICATION_CREDENTIALS_JSON token_uri): Secret 'gcs-key'"
    ), message
    assert "(host '127.0.0.1')" in message and "TRITON_OPERATOR_ALLOWED_ENDPOINTS" in message


@pytest.mark.parametrize(
    "listener",
    [
        (400, json.dumps({"error": "invalid_grant", "error_description": PLANTED}).encode()),
        (200, json.dumps({"token_type": "Bearer", "internal": PLANTED}).encode()),  # no access_token
        (403, f"<html>{PLANTED}</html>".encode()),
    ],
    indirect=True,
    ids=["oauth-error", "no-token", "text"],
)
def test_what_an_allowed_token_endpoint_answers_never_reaches_the_status(
    fake_gcs: Server, listener: Listener
) -> None:
    ready = repository_ready(
        fake_gcs,
        listener.url + "/token",
        allowed=(host_port(fake_gcs.endpoint), host_port(listener.url)),
    )
    assert listener.requests, "the allowed token endpoint was asked"
    assert (ready["status"], ready["reason"]) == ("False", cond.REPOSITORY_ERROR), ready
    assert PLANTED not in ready["message"], ready["message"]
    assert f"the token endpoint {host_port(listener.url)} gave no access token" in ready["message"]


# ----------------------------------------------------------------- Azure: a connection string's BlobEndpoint


def connection_string(blob_endpoint: str) -> dict[str, str]:
    return {
        "AZURE_STORAGE_CONNECTION_STRING": "DefaultEndpointsProtocol=http;AccountName=acct;"
        f"AccountKey=a2V5a2V5a2V5a2V5;BlobEndpoint={blob_endpoint}/acct"
    }


def test_a_blob_endpoint_off_the_allow_list_is_never_contacted(listener: Listener) -> None:
    ready = reconciled(
        {"uri": "as://acct/c/models", "credentialsSecret": "az"},
        connection_string(listener.url),
        allowed=("blob.storage.internal",),
    )
    assert listener.connections == 0, listener.requests
    assert ready["reason"] == cond.ENDPOINT_NOT_ALLOWED, ready
    assert "AZURE_STORAGE_CONNECTION_STRING BlobEndpoint" in ready["message"]
    assert "(host '127.0.0.1')" in ready["message"]


@pytest.mark.parametrize("listener", [(400, f"<html>{PLANTED}</html>".encode())], indirect=True)
def test_what_an_allowed_blob_endpoint_answers_outside_the_storage_api_never_reaches_the_status(
    listener: Listener,
) -> None:
    ready = reconciled(
        {"uri": "as://acct/c/models", "credentialsSecret": "az"},
        connection_string(listener.url),
        allowed=(host_port(listener.url),),
    )
    assert listener.requests, "the allowed endpoint was asked"
    assert (ready["status"], ready["reason"]) == ("False", cond.REPOSITORY_ERROR), ready
    assert PLANTED not in ready["message"], ready["message"]
    assert "400: (its response is not shown)" in ready["message"]


@pytest.mark.parametrize("listener", [(500, f"<html>{PLANTED}</html>".encode())], indirect=True)
def test_a_server_error_of_a_blob_endpoint_shows_no_body_either(listener: Listener) -> None:
    """The SDK's text of a 5xx ends in "Content: <the body>" (one attempt: its retries take long)."""
    repository = Repository(uri="as://acct/c/models")
    store = open_store(repository, connection_string(listener.url), timeout=5.0, max_attempts=1)
    with pytest.raises(StoreError) as caught:
        list(store.list("models/"))
    assert listener.requests, "the endpoint was asked"
    assert PLANTED not in str(caught.value)
    assert "store unavailable" in str(caught.value) and "500: (its response is not shown)" in str(
        caught.value
    )


def test_a_key_of_another_universe_is_refused_before_any_request(listener: Listener) -> None:
    """A key's universe_domain would make google-cloud-storage's own host storage.<domain>: the
    client refuses the mismatch, and the store says so as a credentials problem (not a crash)."""
    info = json.loads(service_account_json(listener.url + "/token"))
    key = {"GOOGLE_APPLICATION_CREDENTIALS_JSON": json.dumps({**info, "universe_domain": "evil.localhost"})}
    with pytest.raises(StoreError) as caught:
        open_store(Repository(uri="gs://models/repo"), key)
    assert str(caught.value).startswith("GOOGLE_APPLICATION_CREDENTIALS_JSON: cannot be used here")
    assert listener.connections == 0


# ----------------------------------------------------------------- S3: a region is part of the host


@pytest.mark.parametrize("key", ["AWS_REGION", "AWS_DEFAULT_REGION"])
def test_a_secret_region_that_is_no_region_is_a_credentials_problem_not_a_crash(key: str) -> None:
    """botocore builds s3.REGION.amazonaws.com and refuses a region that is no host label (so a
    Secret cannot point the operator elsewhere through it): a StoreError naming the key, which the
    reconcile reports, instead of botocore's InvalidRegionError escaping it."""
    keys = {
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "example-secret",
        key: "127.0.0.1:9#",
    }
    with pytest.raises(StoreError) as caught:
        open_store(Repository(uri="s3://models/repo"), keys)
    assert str(caught.value).startswith(f"{key}: ")
