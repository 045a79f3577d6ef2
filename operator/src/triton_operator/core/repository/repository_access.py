"""Whose identity the operator lists a repository with, and which endpoints it may reach: the policy."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from triton_operator.core.vocabulary import conditions as cond
from triton_operator.settings import Settings

ALL_NAMESPACES = "*"
"""In ``ambient_namespaces``: every namespace (said explicitly, never the default)."""

CREDENTIALS_FIELD = "spec.repository.credentialsSecret"
ENDPOINT_FIELD = "spec.repository.endpoint"
URI_FIELD = "spec.repository.uri"
AMBIENT_SETTING = "TRITON_OPERATOR_AMBIENT_CREDENTIALS_NAMESPACES"
AMBIENT_CHART_VALUE = "operator.ambientCredentialsNamespaces"
ENDPOINTS_SETTING = "TRITON_OPERATOR_ALLOWED_ENDPOINTS"
ENDPOINTS_CHART_VALUE = "operator.allowedRepositoryEndpoints"

GOOGLE_CREDENTIALS_KEY = "GOOGLE_APPLICATION_CREDENTIALS_JSON"
GOOGLE_TOKEN_HOSTS = ("oauth2.googleapis.com", "accounts.google.com")
"""Google's own OAuth token endpoints (https only), which a service-account key names in token_uri:
the cloud's own service, like a store without an endpoint. Any other token_uri is held to the list."""

# An Azure storage account name: the default endpoint is https://ACCOUNT.blob.core.windows.net, so
# anything else in that place could name another host (as://x@evil.example:443#/c).
_AZURE_ACCOUNT = re.compile(r"^[a-z0-9]{3,24}$")


# The credentials a store is opened with instead of the operator's identity: any one of these sets of
# keys, each non-empty (as the stores read them). Without one the store falls back to the default
# chain (boto3's, google.auth.default, DefaultAzureCredential) of the process that opens it.
OWN_CREDENTIALS: dict[str, tuple[tuple[str, ...], ...]] = {
    "s3": (("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),),
    "gs": (("GOOGLE_APPLICATION_CREDENTIALS_JSON",),),
    "as": (("AZURE_STORAGE_CONNECTION_STRING",), ("AZURE_STORAGE_KEY",), ("AZURE_STORAGE_SAS_TOKEN",)),
}


def has_own_credentials(scheme: str, credentials: Mapping[str, str]) -> bool:
    """Whether ``credentials`` (a Secret's data) open a ``scheme`` store without the default chain.

    A named Secret is not enough: an empty one (or one with other keys) leaves the store on the
    operator's identity just like no Secret at all.
    """
    return any(all(credentials.get(key) for key in keys) for keys in OWN_CREDENTIALS.get(scheme, ()))


@dataclass(frozen=True)
class RepositoryAccess:
    """The operator-level rules for listing a TritonService's repository (the operator's settings)."""

    ambient_namespaces: tuple[str, ...] = ()
    """Namespaces whose TritonServices may be pinned with the operator's own identity (no
    credentialsSecret); ALL_NAMESPACES allows every one. Empty: none."""
    allowed_endpoints: tuple[str, ...] = ()
    """Endpoints a repository may name; empty: any. Each entry is a host (``minio.minio``), a
    host:port, either with a scheme (``https://storage.example.com``), or ``*.domain`` for its
    subdomains; a path is not compared (azurite's ``/devstoreaccount1`` is the same server)."""

    @classmethod
    def from_settings(cls, settings: Settings) -> RepositoryAccess:
        return cls(settings.ambient_credentials_namespaces, settings.allowed_endpoints)

    def ambient_allowed(self, namespace: str) -> bool:
        return ALL_NAMESPACES in self.ambient_namespaces or namespace in self.ambient_namespaces


@dataclass(frozen=True)
class AccessRefusal:
    """Why a repository is not listed: a condition reason, the field to change, the message."""

    reason: str
    field: str
    message: str


def _host_matches(pattern: str, host: str) -> bool:
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and len(host) > len(pattern) - 1
    return host == pattern


def endpoint_allowed(allowed: tuple[str, ...], endpoint: str) -> bool:
    """Whether ``endpoint`` (a URL, or host:port as STORAGE_EMULATOR_HOST is written) is one of
    ``allowed`` (see RepositoryAccess.allowed_endpoints); an empty list allows every endpoint.

    >>> endpoint_allowed(("minio.minio:9000",), "http://minio.minio:9000/")
    True
    >>> endpoint_allowed(("https://*.example.com",), "http://s3.example.com")
    False
    """
    if not allowed:
        return True
    try:
        url = urlsplit(endpoint if "://" in endpoint else "http://" + endpoint)
        host, port = (url.hostname or "").lower().rstrip("."), url.port
    except ValueError:  # a port that is not a number
        return False
    if not host:
        return False
    for entry in allowed:
        want = urlsplit(entry.strip() if "://" in entry else "//" + entry.strip())
        try:
            want_port = want.port
        except ValueError:
            continue
        if want.scheme and want.scheme.lower() != url.scheme.lower():
            continue
        if want_port is not None and want_port != (port or {"http": 80, "https": 443}.get(url.scheme)):
            continue
        if _host_matches((want.hostname or "").lower().rstrip("."), host):
            return True
    return False


def _connection_string(credentials: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for segment in credentials.get("AZURE_STORAGE_CONNECTION_STRING", "").split(";"):
        key, sep, value = segment.partition("=")
        if sep:
            out[key.strip().upper()] = value.strip()
    return out


def _store_endpoint(uri: str, endpoint: str, credentials: Mapping[str, str]) -> tuple[str, str] | None:
    """The endpoint the store would be reached at and the field it comes from, as the stores pick
    it: the spec's, else one a credentials Secret sets (an Azure connection string's BlobEndpoint
    or EndpointSuffix, GCS's STORAGE_EMULATOR_HOST). None: the cloud's own service."""
    if endpoint:
        return endpoint, ENDPOINT_FIELD
    scheme, _, rest = uri.partition("://")
    secret = f"{CREDENTIALS_FIELD} ({{}})"
    if scheme == "gs" and credentials.get("STORAGE_EMULATOR_HOST"):
        return credentials["STORAGE_EMULATOR_HOST"], secret.format("STORAGE_EMULATOR_HOST")
    if scheme == "as":
        parts = _connection_string(credentials)
        if parts.get("BLOBENDPOINT"):
            return parts["BLOBENDPOINT"], secret.format("AZURE_STORAGE_CONNECTION_STRING BlobEndpoint")
        suffix = parts.get("ENDPOINTSUFFIX", "")
        if suffix and suffix.lower() != "core.windows.net":
            protocol = parts.get("DEFAULTENDPOINTSPROTOCOL", "https")
            account = rest.split("/", 1)[0]
            return (
                f"{protocol}://{account}.blob.{suffix}",
                secret.format("AZURE_STORAGE_CONNECTION_STRING EndpointSuffix"),
            )
    return None


def _google_token_uri(credentials: Mapping[str, str]) -> str | None:
    """The token_uri of a service-account key in the Secret, unless it is Google's own (None)."""
    try:
        info = json.loads(credentials.get(GOOGLE_CREDENTIALS_KEY) or "null")
    except ValueError:  # not JSON: the store refuses the key before it contacts anything
        return None
    token_uri = info.get("token_uri") if isinstance(info, dict) else None
    if token_uri is None:
        return None
    text = str(token_uri)
    try:
        url = urlsplit(text)
        google = (
            url.scheme.lower() == "https"
            and url.port in (None, 443)
            and (url.hostname or "").lower().rstrip(".") in GOOGLE_TOKEN_HOSTS
            and not url.username
        )
    except ValueError:
        google = False
    return None if google else text


def contacted_endpoints(uri: str, endpoint: str, credentials: Mapping[str, str]) -> list[tuple[str, str]]:
    """Every URL the operator would contact to list this repository, other than the cloud's own
    services, each with the field (or Secret key) it comes from: the store's endpoint (the spec's or
    one the Secret sets) and, for gs://, a service-account key's token_uri (google-auth posts a signed
    assertion there for an access token, whatever the store's endpoint)."""
    found: list[tuple[str, str]] = []
    store = _store_endpoint(uri, endpoint, credentials)
    if store is not None:
        found.append(store)
    if uri.partition("://")[0] == "gs":
        token_uri = _google_token_uri(credentials)
        if token_uri is not None:
            found.append((token_uri, f"{CREDENTIALS_FIELD} ({GOOGLE_CREDENTIALS_KEY} token_uri)"))
    return found


def _host(url: str) -> str:
    try:
        parsed = urlsplit(url if "://" in url else "http://" + url)
        return (parsed.hostname or "").lower() or "?"
    except ValueError:
        return "?"


def access_refusal(
    access: RepositoryAccess,
    *,
    namespace: str,
    uri: str,
    endpoint: str | None,
    credentials_secret: str | None,
    credentials: Mapping[str, str],
) -> AccessRefusal | None:
    """Why the operator may not list this repository for a TritonService of ``namespace``; None: it may.

    A pvc:// repository is never listed by the operator: nothing to refuse. Without a
    credentialsSecret the store would be opened with the operator's own identity (IRSA, GKE
    workload identity, a node role, its environment): only for the namespaces the operator's
    settings name. With an allow-list of endpoints, the endpoint the store would be reached at
    must be on it (the operator's network position is not lent out either); the cloud's own
    service (no endpoint) always may. The allow-list holds for every URL the operator would contact
    because the spec or a credential names it (contacted_endpoints), not the store's alone.
    """
    scheme, _, rest = uri.partition("://")
    if scheme == "pvc":
        return None
    if not has_own_credentials(scheme, credentials) and not access.ambient_allowed(namespace):
        keys = " or ".join(" and ".join(keys) for keys in OWN_CREDENTIALS.get(scheme, ()))
        held = (
            f"Secret {credentials_secret!r} holds no credentials for {scheme}:// ({keys})"
            if credentials_secret
            else "required"
        )
        return AccessRefusal(
            cond.CREDENTIALS_REQUIRED,
            CREDENTIALS_FIELD,
            f"{CREDENTIALS_FIELD}: {held}: the operator does not list a repository with its own cloud "
            f"identity for namespace {namespace!r}; name a Secret with the store's credentials, or ask "
            f"the operator's administrator to allow the namespace in {AMBIENT_SETTING} "
            f"(chart value {AMBIENT_CHART_VALUE})",
        )
    for value, field in contacted_endpoints(uri, endpoint or "", credentials):
        if endpoint_allowed(access.allowed_endpoints, value):
            continue
        named = (
            f"{value!r}"
            if field == ENDPOINT_FIELD
            else f"Secret {credentials_secret!r}: {value!r} (host {_host(value)!r})"
        )
        return AccessRefusal(
            cond.ENDPOINT_NOT_ALLOWED,
            field,
            f"{field}: {named} is not an endpoint the operator may reach; allowed: "
            f"{', '.join(access.allowed_endpoints)} "
            f"({ENDPOINTS_SETTING}, chart value {ENDPOINTS_CHART_VALUE})",
        )
    account = rest.split("/", 1)[0]
    named_host = bool(endpoint) or bool(_connection_string(credentials).get("BLOBENDPOINT"))
    if scheme == "as" and not named_host and not _AZURE_ACCOUNT.match(account):
        return AccessRefusal(
            cond.ENDPOINT_NOT_ALLOWED,
            URI_FIELD,
            f"{URI_FIELD}: {account!r} is not an Azure storage account name (3-24 lower-case letters "
            "and digits); without an endpoint it makes the host the operator connects to",
        )
    return None
