"""core.repository.repository_access: whose identity a repository is listed with, and which endpoints may be
reached."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest

from triton_operator.core.repository.repository_access import (
    AccessRefusal,
    RepositoryAccess,
    access_refusal,
    contacted_endpoints,
    endpoint_allowed,
    has_own_credentials,
)
from triton_operator.core.vocabulary import conditions as cond
from triton_operator.settings import Settings

S3_KEYS = {"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "s"}
DENY = RepositoryAccess()


def refusal(
    access: RepositoryAccess,
    uri: str,
    *,
    namespace: str = "team-a",
    endpoint: str | None = None,
    secret: str | None = None,
    credentials: Mapping[str, str] | None = None,
) -> AccessRefusal | None:
    return access_refusal(
        access,
        namespace=namespace,
        uri=uri,
        endpoint=endpoint,
        credentials_secret=secret,
        credentials=credentials or {},
    )


def test_settings_read_the_policy_from_the_environment() -> None:
    settings = Settings.from_env(
        {
            "TRITON_OPERATOR_AMBIENT_CREDENTIALS_NAMESPACES": "ml, team-a,,",
            "TRITON_OPERATOR_ALLOWED_ENDPOINTS": "http://minio.minio:9000,*.s3.example.com",
        }
    )
    access = RepositoryAccess.from_settings(settings)
    assert access == RepositoryAccess(("ml", "team-a"), ("http://minio.minio:9000", "*.s3.example.com"))
    assert RepositoryAccess.from_settings(Settings.from_env({})) == DENY  # the default lends nothing


@pytest.mark.parametrize(
    ("scheme", "credentials", "own"),
    [
        ("s3", S3_KEYS, True),
        ("s3", {"AWS_ACCESS_KEY_ID": "AKIA"}, False),  # half a key pair: boto3 would not use it alone
        ("s3", {"AWS_REGION": "eu-west-1"}, False),
        ("gs", {"GOOGLE_APPLICATION_CREDENTIALS_JSON": "{}"}, True),
        ("gs", {"STORAGE_EMULATOR_HOST": "fake:4443"}, False),
        ("as", {"AZURE_STORAGE_SAS_TOKEN": "sv=1&sig=x"}, True),
        ("as", {"AZURE_STORAGE_KEY": "a2V5"}, True),
        ("as", {"AZURE_STORAGE_CONNECTION_STRING": "AccountName=a;AccountKey=k"}, True),
        ("as", {"AZURE_STORAGE_KEY": ""}, False),
        ("as", S3_KEYS, False),  # another store's keys are none of this one's
    ],
)
def test_own_credentials_are_the_keys_a_store_reads_instead_of_its_default_chain(
    scheme: str, credentials: dict[str, str], own: bool
) -> None:
    assert has_own_credentials(scheme, credentials) is own


def test_without_credentials_of_its_own_a_repository_is_refused_by_default() -> None:
    found = refusal(DENY, "s3://models/prod")
    assert found is not None
    assert (found.reason, found.field) == (cond.CREDENTIALS_REQUIRED, "spec.repository.credentialsSecret")
    assert found.message == (
        "spec.repository.credentialsSecret: required: the operator does not list a repository with its "
        "own cloud identity for namespace 'team-a'; name a Secret with the store's credentials, or ask the "
        "operator's administrator to allow the namespace in TRITON_OPERATOR_AMBIENT_CREDENTIALS_NAMESPACES "
        "(chart value operator.ambientCredentialsNamespaces)"
    )
    assert refusal(DENY, "s3://models/prod", secret="s3", credentials=S3_KEYS) is None


def test_a_named_secret_without_the_store_keys_is_refused_naming_what_it_lacks() -> None:
    found = refusal(DENY, "as://acct/c/p", secret="azure", credentials={"AWS_ACCESS_KEY_ID": "x"})
    assert found is not None and found.reason == cond.CREDENTIALS_REQUIRED
    assert found.message.startswith(
        "spec.repository.credentialsSecret: Secret 'azure' holds no credentials for as:// "
        "(AZURE_STORAGE_CONNECTION_STRING or AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN): "
    )


@pytest.mark.parametrize(
    ("namespaces", "namespace", "allowed"),
    [
        (("ml",), "ml", True),
        (("ml",), "team-a", False),
        (("ml", "team-a"), "team-a", True),
        (("*",), "anything", True),
        ((), "default", False),
    ],
)
def test_named_namespaces_or_star_may_use_the_operator_identity(
    namespaces: tuple[str, ...], namespace: str, allowed: bool
) -> None:
    found = refusal(RepositoryAccess(ambient_namespaces=namespaces), "gs://b/p", namespace=namespace)
    assert (found is None) is allowed


def test_a_pvc_repository_is_never_refused() -> None:
    assert refusal(DENY, "pvc://claim/models") is None
    assert (
        refusal(RepositoryAccess(allowed_endpoints=("nowhere",)), "pvc://claim/models", endpoint="x") is None
    )


@pytest.mark.parametrize(
    ("allowed", "endpoint", "ok"),
    [
        ((), "http://anything:1", True),  # no list: any endpoint
        (("minio.minio",), "http://minio.minio:9000", True),  # a host: any scheme and port
        (("minio.minio",), "http://MINIO.minio.:9000/", True),
        (("minio.minio",), "http://minio.minio.evil.example:9000", False),
        (("minio.minio:9000",), "http://minio.minio:9000/bucket", True),
        (("minio.minio:9000",), "http://minio.minio:9001", False),
        (("https://s3.example.com",), "https://s3.example.com", True),
        (("https://s3.example.com",), "http://s3.example.com", False),
        (("https://s3.example.com:443",), "https://s3.example.com", True),  # the scheme's port
        (("*.example.com",), "https://s3.eu.example.com", True),
        (("*.example.com",), "https://example.com", False),
        (("*.example.com",), "https://badexample.com", False),
        (("minio.minio",), "http://minio.minio@evil.example", False),  # user info is not the host
        (("fake-gcs:4443",), "fake-gcs:4443", True),  # STORAGE_EMULATOR_HOST is host:port
        (("minio.minio",), "http://minio.minio:notaport", False),
        (("minio.minio",), "", False),
    ],
)
def test_endpoint_allow_list(allowed: tuple[str, ...], endpoint: str, ok: bool) -> None:
    assert endpoint_allowed(allowed, endpoint) is ok


def test_an_endpoint_off_the_list_is_refused_naming_the_field_it_comes_from() -> None:
    access = RepositoryAccess(ambient_namespaces=("*",), allowed_endpoints=("minio.minio",))
    found = refusal(access, "s3://b/p", endpoint="http://169.254.169.254")
    assert found == AccessRefusal(
        cond.ENDPOINT_NOT_ALLOWED,
        "spec.repository.endpoint",
        "spec.repository.endpoint: 'http://169.254.169.254' is not an endpoint the operator may reach; "
        "allowed: minio.minio "
        "(TRITON_OPERATOR_ALLOWED_ENDPOINTS, chart value operator.allowedRepositoryEndpoints)",
    )
    assert refusal(access, "s3://b/p") is None  # the cloud's own service
    assert refusal(access, "s3://b/p", endpoint="http://minio.minio:9000") is None


@pytest.mark.parametrize(
    ("uri", "credentials", "field"),
    [
        (
            "as://acct/c/p",
            {
                "AZURE_STORAGE_CONNECTION_STRING": "AccountName=acct;AccountKey=k;BlobEndpoint=http://10.0.0.1:10000/acct"
            },
            "spec.repository.credentialsSecret (AZURE_STORAGE_CONNECTION_STRING BlobEndpoint)",
        ),
        (
            "as://acct/c/p",
            {"AZURE_STORAGE_CONNECTION_STRING": "AccountName=acct;AccountKey=k;EndpointSuffix=evil.example"},
            "spec.repository.credentialsSecret (AZURE_STORAGE_CONNECTION_STRING EndpointSuffix)",
        ),
        (
            "gs://b/p",
            {"GOOGLE_APPLICATION_CREDENTIALS_JSON": "{}", "STORAGE_EMULATOR_HOST": "10.0.0.1:4443"},
            "spec.repository.credentialsSecret (STORAGE_EMULATOR_HOST)",
        ),
    ],
)
def test_an_endpoint_a_secret_sets_is_held_to_the_list_too(
    uri: str, credentials: dict[str, str], field: str
) -> None:
    found = refusal(
        RepositoryAccess(allowed_endpoints=("minio.minio",)), uri, secret="s", credentials=credentials
    )
    assert found is not None and (found.reason, found.field) == (cond.ENDPOINT_NOT_ALLOWED, field), found


def test_an_azure_account_name_cannot_make_the_host() -> None:
    """Without an endpoint the host is ACCOUNT.blob.core.windows.net: an account "x@evil.example:443#"
    would send the request (and the operator's bearer token) elsewhere."""
    keys = {"AZURE_STORAGE_KEY": "a2V5"}
    found = refusal(DENY, "as://x@evil.example:443#/c/p", secret="s", credentials=keys)
    assert found is not None and (found.reason, found.field) == (
        cond.ENDPOINT_NOT_ALLOWED,
        "spec.repository.uri",
    )
    assert refusal(DENY, "as://mystorageacct01/c/p", secret="s", credentials=keys) is None
    # with an endpoint the account is only a path segment (azurite's devstoreaccount1)
    assert (
        refusal(DENY, "as://Dev_Account/c/p", endpoint="http://azurite:10000/x", secret="s", credentials=keys)
        is None
    )


def _key(token_uri: object) -> dict[str, str]:
    return {
        "GOOGLE_APPLICATION_CREDENTIALS_JSON": json.dumps({"type": "service_account", "token_uri": token_uri})
    }


@pytest.mark.parametrize(
    ("token_uri", "refused"),
    [
        ("https://oauth2.googleapis.com/token", False),  # Google's own, like a store without an endpoint
        ("https://accounts.google.com/o/oauth2/token", False),  # older keys
        ("http://oauth2.googleapis.com/token", True),
        ("https://oauth2.googleapis.com:8443/token", True),
        ("https://oauth2.googleapis.com.evil.example/token", True),
        ("http://169.254.169.254/computeMetadata/v1/token", True),
        ("http://minio.minio/token", False),  # on the list
    ],
)
def test_a_service_account_token_uri_is_held_to_the_list(token_uri: str, refused: bool) -> None:
    access = RepositoryAccess(allowed_endpoints=("minio.minio",))
    found = refusal(access, "gs://b/p", secret="gcs-key", credentials=_key(token_uri))
    if not refused:
        assert found is None
        return
    assert found is not None
    assert (found.reason, found.field) == (
        cond.ENDPOINT_NOT_ALLOWED,
        "spec.repository.credentialsSecret (GOOGLE_APPLICATION_CREDENTIALS_JSON token_uri)",
    )
    host = token_uri.split("/")[2].split(":", maxsplit=1)[0]
    assert f"Secret 'gcs-key': {token_uri!r} (host {host!r}) is not an endpoint" in found.message


def test_every_contacted_url_is_checked_not_only_the_store() -> None:
    """An allowed store endpoint does not vouch for the token endpoint a key names."""
    access = RepositoryAccess(allowed_endpoints=("fake-gcs:4443",))
    keys = _key("http://10.0.0.1/token")
    assert contacted_endpoints("gs://b/p", "http://fake-gcs:4443", keys) == [
        ("http://fake-gcs:4443", "spec.repository.endpoint"),
        (
            "http://10.0.0.1/token",
            "spec.repository.credentialsSecret (GOOGLE_APPLICATION_CREDENTIALS_JSON token_uri)",
        ),
    ]
    found = refusal(access, "gs://b/p", endpoint="http://fake-gcs:4443", secret="k", credentials=keys)
    assert found is not None and "host '10.0.0.1'" in found.message
    # an empty list allows every endpoint, as for spec.repository.endpoint
    assert refusal(RepositoryAccess(), "gs://b/p", secret="k", credentials=keys) is None
    # a key that is no JSON names no URL: the store refuses it before it contacts anything
    assert contacted_endpoints("gs://b/p", "", {"GOOGLE_APPLICATION_CREDENTIALS_JSON": "not json"}) == []
