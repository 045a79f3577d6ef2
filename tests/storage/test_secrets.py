"""No store secret in an error, its cause chain, the log, the sync container's output or the status.

Each store runs on its real local server (seaweedfs, fake-gcs-server, azurite); the credentials
carry distinctive planted values, the stores are made to fail (a wrong key, a bogus SAS
signature, a missing bucket, an endpoint on a closed loopback port), and every text a user could
see is searched for them.
"""

from __future__ import annotations

import asyncio
import html
import http.server
import json
import logging
import os
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from fakeapi import FakeClient, KubeWithSecrets
from storage_backends import Backend
from storage_servers import AZURITE_ACCOUNT, AZURITE_KEY, S3_ACCESS_KEY, S3_SECRET_KEY, Server
from testkit import free_port
from triton_operator.adapters.redaction import install_log_redaction
from triton_operator.adapters.storage import StoreError, open_store, pin_repository
from triton_operator.core.repository.manifest import manifest_to_dict
from triton_operator.core.spec.modelconfig import build_config_pbtxt
from triton_operator.core.vocabulary import conditions as cond
from triton_operator.models import ModelSpec, Repository
from triton_operator.reconcile.pinning import RepositoryPinner
from triton_operator.reconcile.reconcile_pass import reconcile
from triton_operator.settings import Settings

pytestmark = pytest.mark.storage

# Planted values: each distinctive enough that finding it anywhere can only be a leak.
S3_PLANTED_ID = "AKIAPLANTEDID7Q3XW9Z"
S3_PLANTED_SECRET = "planted-s3-secret-Xq7Vb2Lm9Rt4Wp8Zk3Nc6Hd1"
S3_PLANTED_TOKEN = "planted-s3-session-token-Fj5Gk8Lz2Qw9Er4Ty7Ui1Op3"
SAS_PLANTED_SIG = "PlantedSasSig0Xq7Vb2Lm9Rt4Wp8Zk3Nc6Hd1Ab5Cd8E="
SAS_PLANTED = (
    "sv=2021-08-06&ss=b&srt=sco&sp=rl&se=2099-01-01T00:00:00Z&st=2020-01-01T00:00:00Z"
    f"&spr=https,http&sig={SAS_PLANTED_SIG.replace('=', '%3D')}"
)
AZURE_PLANTED_KEY = "UGxhbnRlZEF6dXJlQWNjb3VudEtleTBYcTdWYjJMbTlSdDRXcDhaazNOYzZIZDE="
GCS_PLANTED_KEY_ID = "planted0key0id0f7a3c9e1b5d2a8f6c4e0b9d7"
MODEL = ModelSpec(name="m", config={"backend": "python"})


def closed_endpoint() -> str:
    """An http endpoint on a loopback port nothing listens on (bound and released just now)."""
    return f"http://127.0.0.1:{free_port()}"


def private_key_pem() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def service_account_json(private_key: str, token_uri: str) -> str:
    return json.dumps(
        {
            "type": "service_account",
            "project_id": "planted-project",
            "private_key_id": GCS_PLANTED_KEY_ID,
            "private_key": private_key,
            "client_email": "planted@planted-project.iam.gserviceaccount.com",
            "client_id": "1234567890",
            "token_uri": token_uri,
        }
    )


def forms(secret: str) -> list[str]:
    """The planted value and the parts of it that would still give it away."""
    out = [secret]
    if "BEGIN PRIVATE KEY" in secret:
        # any base64 line of the key body
        out += [line for line in secret.splitlines() if len(line) > 40]
    return out


def visible_texts(exc: BaseException) -> list[str]:
    """What a user can be shown of an exception: str, repr, its text attributes, and the traceback
    logging prints (each cause and unsuppressed context)."""
    texts = [str(exc), repr(exc), "".join(traceback.format_exception(exc))]
    texts += [str(v) for v in vars(exc).values() if isinstance(v, str)]
    seen: BaseException | None = exc
    while seen is not None:
        texts += [str(seen), repr(seen)]
        seen = seen.__cause__ or (None if seen.__suppress_context__ else seen.__context__)
    return texts


def assert_hidden(secrets: list[str], *texts: str) -> None:
    for secret in secrets:
        for form in forms(secret):
            for text in texts:
                assert form not in text, f"a secret ({form[:12]}...) shows in:\n{text}"


@pytest.fixture
def debug_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Every logger at DEBUG (the SDKs' request lines and signed headers included), redacted as
    the `run` and `sync` commands redact the operator's and the sync container's log."""
    install_log_redaction()
    with caplog.at_level(logging.DEBUG):
        yield caplog


def fail(action: Callable[[], object]) -> StoreError:
    """The StoreError ``action`` raises, logged as kopf logs a handler's exception (with traceback)."""
    with pytest.raises(StoreError) as info:
        action()
    logging.getLogger("kopf.objects").exception("Handler 'tritonservice' failed with an exception")
    return info.value


def listing(repository: Repository, credentials: dict[str, str]) -> Callable[[], object]:
    def pin() -> object:
        return pin_repository(repository, [MODEL], credentials)

    return pin


# ----------------------------------------------------------------- S3 (seaweedfs)


S3_PLANTED = {
    "AWS_ACCESS_KEY_ID": S3_PLANTED_ID,
    "AWS_SECRET_ACCESS_KEY": S3_PLANTED_SECRET,
    "AWS_SESSION_TOKEN": S3_PLANTED_TOKEN,
}


def s3_repository(endpoint: str, bucket: str) -> Repository:
    return Repository.model_validate(
        {"uri": f"s3://{bucket}/models", "endpoint": endpoint, "s3": {"addressingStyle": "path"}}
    )


def test_s3_wrong_keys_are_access_denied_and_show_no_key(
    s3_backend: Backend, debug_log: pytest.LogCaptureFixture
) -> None:
    bucket = s3_backend.new_bucket()
    error = fail(listing(s3_repository(s3_backend.endpoint, bucket), S3_PLANTED))
    assert "access denied" in str(error), error
    assert_hidden(list(S3_PLANTED.values()), *visible_texts(error), debug_log.text)


def test_s3_a_missing_bucket_shows_neither_of_the_working_keys(
    s3_backend: Backend, debug_log: pytest.LogCaptureFixture
) -> None:
    error = fail(listing(s3_repository(s3_backend.endpoint, "no-such-bucket-here"), s3_backend.credentials))
    assert "does not exist" in str(error), error
    assert_hidden([S3_ACCESS_KEY, S3_SECRET_KEY], *visible_texts(error), debug_log.text)


def test_s3_an_unreachable_endpoint_shows_no_key(debug_log: pytest.LogCaptureFixture) -> None:
    repository = s3_repository(closed_endpoint(), "models")
    error = fail(lambda: open_store(repository, S3_PLANTED, timeout=2.0, max_attempts=1).head("models/m/1/x"))
    assert "store unavailable" in str(error), error
    assert_hidden(list(S3_PLANTED.values()), *visible_texts(error), debug_log.text)


# ----------------------------------------------------------------- GCS (fake-gcs-server)


def test_gcs_a_service_account_whose_token_cannot_be_had_shows_no_key_material(
    fake_gcs: Server, debug_log: pytest.LogCaptureFixture
) -> None:
    key = private_key_pem()
    credentials = {
        "GOOGLE_APPLICATION_CREDENTIALS_JSON": service_account_json(key, closed_endpoint() + "/token")
    }
    repository = Repository(uri="gs://models/repo", endpoint=fake_gcs.endpoint)
    error = fail(lambda: open_store(repository, credentials, timeout=2.0).head("repo/m/1/x"))
    assert_hidden([key, GCS_PLANTED_KEY_ID], *visible_texts(error), debug_log.text)


def test_gcs_a_malformed_private_key_is_refused_without_showing_it(
    fake_gcs: Server, debug_log: pytest.LogCaptureFixture
) -> None:
    broken = (
        "-----BEGIN PRIVATE KEY-----\nPlantedBrokenKeyMaterial0Xq7Vb2Lm9Rt4Wp8Zk3Nc6Hd1Ab5Cd8\n"
        "-----END PRIVATE KEY-----\n"
    )
    credentials = {
        "GOOGLE_APPLICATION_CREDENTIALS_JSON": service_account_json(broken, "https://oauth2.invalid/token")
    }
    error = fail(
        lambda: open_store(Repository(uri="gs://models/repo", endpoint=fake_gcs.endpoint), credentials)
    )
    assert "GOOGLE_APPLICATION_CREDENTIALS_JSON" in str(error), error
    assert_hidden(
        [broken, "PlantedBrokenKeyMaterial", GCS_PLANTED_KEY_ID], *visible_texts(error), debug_log.text
    )


# ----------------------------------------------------------------- Azure (azurite)


def azure_repository(endpoint: str, container: str) -> Repository:
    return Repository(uri=f"as://{AZURITE_ACCOUNT}/{container}/models", endpoint=endpoint)


@pytest.mark.parametrize(
    "credentials",
    [
        {"AZURE_STORAGE_SAS_TOKEN": SAS_PLANTED},
        {"AZURE_STORAGE_KEY": AZURE_PLANTED_KEY},
        {
            "AZURE_STORAGE_CONNECTION_STRING": f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURE_PLANTED_KEY};"
        },
    ],
    ids=["sas", "account-key", "connection-string"],
)
@pytest.mark.parametrize("where", ["azurite", "closed-port"])
def test_azure_bogus_credentials_show_no_signature_or_key(
    azure_backend: Backend, debug_log: pytest.LogCaptureFixture, credentials: dict[str, str], where: str
) -> None:
    """A SAS with a bogus sig (403 from azurite), a wrong account key, and either one sent to an
    endpoint that refuses connections: the SDK's message there holds the request URL, with the
    SAS in its query."""
    endpoint = azure_backend.endpoint if where == "azurite" else closed_endpoint() + f"/{AZURITE_ACCOUNT}"
    container = azure_backend.new_bucket()
    store = open_store(azure_repository(endpoint, container), credentials, timeout=2.0, max_attempts=1)
    error = fail(lambda: list(store.list("models/")))
    assert ("access denied" if where == "azurite" else "store unavailable") in str(error), error
    planted = [SAS_PLANTED, SAS_PLANTED_SIG, SAS_PLANTED_SIG.replace("=", "%3D"), AZURE_PLANTED_KEY]
    assert_hidden(planted, *visible_texts(error), debug_log.text)


def test_azure_a_missing_container_shows_no_account_key(
    azure_backend: Backend, debug_log: pytest.LogCaptureFixture
) -> None:
    error = fail(
        listing(azure_repository(azure_backend.endpoint, "no-such-container"), azure_backend.credentials)
    )
    assert "does not exist" in str(error), error
    assert_hidden([AZURITE_KEY], *visible_texts(error), debug_log.text)


# ----------------------------------------------------------------- the sync container's output


class _EchoingGateway(http.server.BaseHTTPRequestHandler):
    """Answers every request 501 with an Azure error body that quotes the request URL, query and
    all, as gateways and some stores do; 501 is not retried, so the sync fails at once."""

    def do_GET(self) -> None:
        body = (
            "<?xml version='1.0' encoding='utf-8'?><Error><Code>NotImplemented</Code>"
            f"<Message>{html.escape(self.path)} is not implemented here</Message></Error>"
        ).encode()
        self.send_response(501)
        self.send_header("Content-Type", "application/xml")
        self.send_header("x-ms-error-code", "NotImplemented")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_HEAD(self) -> None:
        self.do_GET()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class names it
        return None


@pytest.fixture
def echoing_gateway() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EchoingGateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/{AZURITE_ACCOUNT}"
    server.shutdown()
    server.server_close()
    thread.join(10)


def test_the_sync_container_prints_no_sas_signature(
    azure_backend: Backend, echoing_gateway: str, tmp_path: Path
) -> None:
    """`triton-operator sync` as the init container runs it, its SAS in the environment, its reads
    answered with an error that quotes the signed URL: its exit message and every line it writes
    are free of the signature."""
    container = azure_backend.new_bucket()
    azure_backend.put(container, "models/m/1/model.py", b"x = 1\n")
    manifest = manifest_to_dict(
        pin_repository(
            azure_repository(azure_backend.endpoint, container), [MODEL], azure_backend.credentials
        )
    )
    manifest["repository"]["endpoint"] = echoing_gateway
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "configs/m").mkdir(parents=True)
    (tmp_path / "configs/m/config.pbtxt").write_text(build_config_pbtxt("m", MODEL.config))
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "GOOGLE_"))}
    result = subprocess.run(
        [
            *(sys.executable, "-m", "triton_operator.cli", "sync"),
            *("--manifest", str(tmp_path / "manifest.json"), "--configs", str(tmp_path / "configs")),
            *("--dest", str(tmp_path / "models")),
        ],
        env={**clean, "AZURE_STORAGE_SAS_TOKEN": SAS_PLANTED},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 5, result.stderr  # EXIT_STORE
    assert "is not implemented here" in result.stderr  # the gateway's message is shown, redacted
    assert_hidden(
        [SAS_PLANTED, SAS_PLANTED_SIG, SAS_PLANTED_SIG.replace("=", "%3D")], result.stdout, result.stderr
    )


# ----------------------------------------------------------------- the status and Events


def test_the_status_and_events_of_a_failed_listing_show_no_sas_signature(
    echoing_gateway: str, debug_log: pytest.LogCaptureFixture
) -> None:
    """The reconcile writes RepositoryReady (and Ready) with the store's message: with a SAS sent to
    a store whose error quotes the signed URL, nothing of it is in the status, an Event or the log."""
    api = FakeClient()
    api.put(
        {
            "apiVersion": "triton-operator.io/v1alpha1",
            "kind": "TritonService",
            "metadata": {"name": "leaky", "namespace": "ml", "uid": "u1", "generation": 1},
            "spec": {
                "repository": {
                    "uri": f"as://{AZURITE_ACCOUNT}/models/repo",
                    "endpoint": echoing_gateway,
                    "credentialsSecret": "azure",
                },
                "models": [{"name": "m", "config": {"backend": "python"}}],
            },
        }
    )
    kube = KubeWithSecrets(api, {("ml", "azure"): {"AZURE_STORAGE_SAS_TOKEN": SAS_PLANTED}})
    result = asyncio.run(reconcile(kube, "ml", "leaky", Settings(), pin_manifest=RepositoryPinner(kube)))
    stored: Any = api.find("TritonService", "ml", "leaky")
    ready = next(c for c in stored["status"]["conditions"] if c["type"] == cond.REPOSITORY_READY)
    assert (ready["status"], ready["reason"]) == ("False", cond.REPOSITORY_ERROR), ready
    assert "is not implemented here" in ready["message"]  # the store's message is shown, redacted
    planted = [SAS_PLANTED, SAS_PLANTED_SIG, SAS_PLANTED_SIG.replace("=", "%3D")]
    assert_hidden(
        planted, json.dumps(stored["status"]), json.dumps(api.events), str(result.invalid), debug_log.text
    )
