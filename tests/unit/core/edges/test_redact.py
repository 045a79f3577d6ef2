"""core.edges.redact: which texts are secret and how they are taken out; adapters.redaction's uses of it."""

from __future__ import annotations

import json
import logging
import traceback

import pytest

from triton_operator.adapters.redaction import install_log_redaction, redacted_cause, remember_secrets
from triton_operator.adapters.storage.base import AccessDenied, StoreError, StoreUnavailable
from triton_operator.core.edges.redact import REDACTED, redact, secret_forms, secret_values

R = REDACTED


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Azure SAS in a request URL, as urllib3 and azure-core put it into messages
        (
            "Max retries exceeded with url: /acct/c?restype=container&comp=list&sv=2021-08-06&se=2099-01-01"
            "&sp=rl&sig=AbC%2Bd%2Fe%3D (Caused by NewConnectionError)",
            f"Max retries exceeded with url: /acct/c?restype=container&comp=list&sv=2021-08-06&se={R}"
            f"&sp={R}&sig={R} (Caused by NewConnectionError)",
        ),
        # a presigned S3 URL
        (
            "GET https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAX%2F2024"
            "&X-Amz-Security-Token=FwoG&X-Amz-Signature=9f8e",
            f"GET https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={R}"
            f"&X-Amz-Security-Token={R}&X-Amz-Signature={R}",
        ),
        # a signed GCS URL and the legacy S3 query signature
        (
            "https://storage.googleapis.com/b/o?GoogleAccessId=sa%40p.iam&Expires=1&Signature=abc",
            f"https://storage.googleapis.com/b/o?GoogleAccessId={R}&Expires=1&Signature={R}",
        ),
        ("/b/k?AWSAccessKeyId=AKIAX&Signature=abc", f"/b/k?AWSAccessKeyId={R}&Signature={R}"),
        # OAuth in a query or form body
        ("token_uri?access_token=ya29.a0&x=1", f"token_uri?access_token={R}&x=1"),
        # headers: a dict's repr (botocore's debug lines), a header line, Azure's SharedKey
        (
            "headers={'Authorization': b'AWS4-HMAC-SHA256 Credential=AKIAX/2024/s3, Signature=ff', "
            "'X-Amz-Security-Token': b'FwoGZX', 'Host': 'b'}",
            f"headers={{'Authorization': b'{R}', 'X-Amz-Security-Token': b'{R}', 'Host': 'b'}}",
        ),
        ("Authorization: Bearer ya29.a0AfH6SM\nHost: x", f"Authorization: {R}\nHost: x"),
        ("signed as SharedKey devstoreaccount1:Eby8vdM02xNO==", f"signed as SharedKey {R}"),
        ("retrying with Bearer ya29.a0AfH6SMBx", f"retrying with Bearer {R}"),
        # an Azure connection string
        (
            "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=Eby8/vd==;EndpointSuffix=core.windows.net",
            f"DefaultEndpointsProtocol=https;AccountName=a;AccountKey={R};EndpointSuffix=core.windows.net",
        ),
        # a PEM private key, also JSON-escaped, also cut off
        ("key: -----BEGIN PRIVATE KEY-----\nMIIEv\n-----END PRIVATE KEY-----\n!", f"key: {R}\n!"),
        ('{"private_key": "-----BEGIN RSA PRIVATE KEY-----\\nMIIE', f'{{"private_key": "{R}'),
        # user info in a URL
        ("http://admin:hunter2@minio:9000/b", f"http://{R}@minio:9000/b"),
        # what is not a credential stays: words, names ending in a parameter's name, other params
        ("basic auth failed for key 'models/m/1/x' (case=3, token count 2)", None),
        ("bucket 'models' does not exist; prefix=models/ versionId=3", None),
        ("x-amz-request-id=ABC use=1", None),
    ],
)
def test_patterns_remove_credentials_from_urls_headers_and_keys(text: str, expected: str | None) -> None:
    assert redact(text) == (text if expected is None else expected)


def test_redacting_twice_changes_nothing() -> None:
    once = redact("GET /c?sig=abc&se=1 Authorization: SharedKey a:bcdefghij", {"supersecret"})
    assert redact(once, {"supersecret"}) == once


def test_exact_secrets_go_longest_first_and_short_ones_are_left() -> None:
    text = "id AKIAEXAMPLE1 key AKIAEXAMPLE1-and-more region abc"
    assert redact(text, {"AKIAEXAMPLE1", "AKIAEXAMPLE1-and-more", "abc"}) == f"id {R} key {R} region abc"


def test_a_secret_is_found_quoted_and_unquoted_and_json_escaped() -> None:
    sig = "a+b/c=="
    assert {"a+b/c==", "a%2Bb%2Fc%3D%3D"} <= secret_forms(sig)
    assert "a+b/c==" in secret_forms("a%2Bb%2Fc%3D%3D")  # a SAS is usually given quoted
    pem = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n"
    forms = secret_forms(pem)
    assert json.dumps(pem)[1:-1] in forms and "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC" in forms


def test_secret_values_of_each_store_s_credentials() -> None:
    values = secret_values(
        {
            "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
            "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG",
            "AWS_REGION": "eu-central-1",  # configuration, not secret
            "STORAGE_EMULATOR_HOST": "fake-gcs:4443",
            "AZURE_STORAGE_CONNECTION_STRING": "AccountName=acct;AccountKey=S2V5S2V5S2V5==;"
            "SharedAccessSignature=sv=2021&sig=U2lnU2ln%3D",
            "AZURE_STORAGE_SAS_TOKEN": "?sv=2021&sp=r&sig=T3RoZXJTaWc%3D",
            "GOOGLE_APPLICATION_CREDENTIALS_JSON": json.dumps(
                {"type": "service_account", "private_key_id": "0123456789abcdef", "client_email": "sa@p"}
            ),
            "SOMETHING_ELSE": "unknown-keys-count-as-secret",
        }
    )
    for secret in [
        "AKIAIOSFODNN7EXAMPLE",
        "wJalrXUtnFEMI/K7MDENG",
        "S2V5S2V5S2V5==",  # the account key inside the connection string
        "U2lnU2ln%3D",  # the signature inside its SAS
        "U2lnU2ln=",
        "T3RoZXJTaWc%3D",
        "0123456789abcdef",  # the service account's key id
        "unknown-keys-count-as-secret",
    ]:
        assert secret in values, secret
    assert "eu-central-1" not in values and "fake-gcs:4443" not in values
    assert "sa@p" not in values  # an e-mail is no secret: the whole JSON is, not its every field


def test_a_store_error_is_redacted_with_the_secrets_of_every_store_opened() -> None:
    remember_secrets({"AWS_SECRET_ACCESS_KEY": "unit-planted-secret-0x5f3a"})
    error = StoreUnavailable("s3://b/p", "proxy said: bad key unit-planted-secret-0x5f3a in /b?sig=abc")
    assert str(error) == f"s3://b/p: store unavailable: proxy said: bad key {R} in /b?sig={R}"
    assert "unit-planted" not in error.detail
    assert "unit-planted" not in str(AccessDenied("s3://b/p", "unit-planted-secret-0x5f3a"))


def test_the_cause_of_a_store_error_is_a_redacted_stand_in_with_its_chain() -> None:
    # built here, so that the source lines a traceback prints do not hold them
    first, second = "/c?sig=first-" + "secret-sig", "/c?sig=second-" + "secret-sig"

    def sdk() -> None:
        try:
            raise OSError(f"connect to {first} failed")
        except OSError as low:
            raise ValueError(f"request {second} failed") from low

    try:
        try:
            sdk()
        except ValueError as exc:
            raise StoreError("s3://b/p: listing failed") from redacted_cause(exc)
    except StoreError as error:
        printed = "".join(traceback.format_exception(error))
    assert "first-secret-sig" not in printed and "second-secret-sig" not in printed
    # the chain is there to debug with: both types, their redacted text, the SDK's frames
    assert "builtins.ValueError: request /c?sig=<redacted> failed" in printed
    assert "builtins.OSError: connect to /c?sig=<redacted> failed" in printed
    assert "in sdk" in printed


def test_log_records_are_redacted_as_they_are_made(caplog: pytest.LogCaptureFixture) -> None:
    install_log_redaction()
    remember_secrets({"AZURE_STORAGE_KEY": "unit-planted-account-key-77"})
    log = logging.getLogger("urllib3.connectionpool")
    with caplog.at_level(logging.DEBUG):
        log.debug('%s "%s %s"', "http://a:10000", "GET", "/acct/c?comp=list&sig=abcdef%3D")
        log.warning("key %s refused", "unit-planted-account-key-77")
        secret = "in-a-traceback-" + "xyz"  # not in the source line the traceback shows
        try:
            raise OSError(f"GET /c?sig={secret} failed")
        except OSError:
            log.exception("listing failed")
    assert "abcdef" not in caplog.text and "unit-planted-account-key-77" not in caplog.text
    assert "in-a-traceback-xyz" not in caplog.text
    assert f"sig={R}" in caplog.text and f"key {R} refused" in caplog.text
    assert caplog.records[0].getMessage() == f'http://a:10000 "GET /acct/c?comp=list&sig={R}"'
