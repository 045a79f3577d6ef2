"""Secrets out of text: credential values, URL signatures and auth headers removed from messages and logs."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from urllib.parse import quote, quote_plus, unquote

REDACTED = "<redacted>"
"""What stands where a secret was. It starts with a character that ends every value the patterns
below match, so redacting a redacted text changes nothing."""

MIN_SECRET_LENGTH = 6
"""Shorter credential values are not redacted as plain strings: they would erase ordinary words
("admin", a region) and guard nothing. The patterns still remove them from URLs and headers."""

# Credential keys whose values configure a store but are not secret (everything else in a
# credentials Secret counts as secret, also keys no store reads: they are only ever in a Secret).
NOT_SECRET = frozenset({"AWS_REGION", "AWS_DEFAULT_REGION", "STORAGE_EMULATOR_HOST"})

# Query and form parameters that carry a signature, a credential or a token: presigned S3 and
# GCS URLs, Azure SAS (sig, and se/sp/skoid/... which say what the signature grants), OAuth.
CREDENTIAL_PARAMETERS = (
    "sig",
    "se",
    "sp",
    "skoid",
    "sktid",
    "skt",
    "ske",
    "sks",
    "skv",
    "signature",
    "x-amz-signature",
    "x-amz-credential",
    "x-amz-security-token",
    "awsaccesskeyid",
    "x-goog-signature",
    "x-goog-credential",
    "googleaccessid",
    "access_token",
    "id_token",
    "refresh_token",
    "client_secret",
    "assertion",
    "token",
    "key",
    "api_key",
    "apikey",
    "password",
    "secret",
    # connection strings (Key=Value;...)
    "accountkey",
    "sharedaccesssignature",
    "sharedaccesskey",
)

# Headers whose value is a credential, as a header line ("Authorization: ...") or in the repr of a
# headers dict ("'Authorization': b'...'"), both of which SDKs put into messages and debug logs.
CREDENTIAL_HEADERS = (
    "authorization",
    "proxy-authorization",
    "x-amz-security-token",
    "x-ms-encryption-key",
    "x-ms-copy-source-authorization",
    "x-goog-iam-authorization-token",
    "x-api-key",
    "cookie",
    "set-cookie",
)

_NAME_BEFORE = r"(?<![A-Za-z0-9_.\-])"  # a whole name: not the tail of x-amz-security-token for "token"


def _named(names: Iterable[str], rest: str) -> re.Pattern[str]:
    """A whole one of ``names`` (longest first, any case) as group 1, then the pattern ``rest``."""
    alternatives = "|".join(re.escape(name) for name in sorted(names, key=len, reverse=True))
    return re.compile(_NAME_BEFORE + r"(" + alternatives + r")" + rest, re.IGNORECASE)


_PARAMETER = _named(CREDENTIAL_PARAMETERS, r"(=|%3D)((?:(?!%26)[^&;\s\"'<>,)\]}])+)")
_HEADER = _named(CREDENTIAL_HEADERS, r"(['\"]?\s*:\s*(?:b(?=['\"]))?['\"]?)([^'\"\s<][^'\"\r\n<]*)")
# A bearer token, or Azure's "SharedKey account:signature", outside of a header a pattern above knows.
_BEARER = re.compile(
    r"\b(Bearer|SharedKey)(\s+)([A-Za-z0-9]+:[A-Za-z0-9+/=]{8,}|[A-Za-z0-9._~+/=\-]{8,})", re.IGNORECASE
)
_PRIVATE_KEY = re.compile(
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)", re.DOTALL
)
_USERINFO = re.compile(r"(\b[a-z][a-z0-9+.\-]*://)([^/@\s\"'<>]+)@", re.IGNORECASE)


def secret_forms(value: str) -> set[str]:
    """The ways a secret value shows up in text: as it is, URL-quoted and unquoted (a SAS token is
    usually written quoted), JSON-escaped, and each long line of a multi-line value (a PEM key's
    base64 lines). Forms shorter than MIN_SECRET_LENGTH are left out."""
    forms = {value, quote(value, safe=""), quote_plus(value), unquote(value), json.dumps(value)[1:-1]}
    if "\n" in value:
        forms.update(line.strip() for line in value.splitlines() if len(line.strip()) >= 16)
    return {form for form in forms if len(form) >= MIN_SECRET_LENGTH}


def _connection_string_parts(text: str) -> list[str]:
    """AccountKey, SharedAccessSignature and the like of an Azure ``Key=Value;...`` string."""
    parts = []
    for segment in text.split(";"):
        key, sep, value = segment.partition("=")
        if sep and key.strip().lower() in ("accountkey", "sharedaccesssignature", "sharedaccesskey"):
            parts.append(value.strip())
    return parts


def _sas_signatures(text: str) -> list[str]:
    """The ``sig`` values of a SAS token (``sv=...&sig=...``, with or without its leading ``?``)."""
    return [
        value
        for pair in text.lstrip("?").split("&")
        for key, sep, value in [pair.partition("=")]
        if sep and key.lower() == "sig" and value
    ]


def _service_account_parts(text: str) -> list[str]:
    """The secret fields of a Google credentials JSON (service-account key or authorized user)."""
    try:
        info = json.loads(text)
    except ValueError:
        return []
    if not isinstance(info, dict):
        return []
    fields = ("private_key", "private_key_id", "client_secret", "refresh_token")
    return [str(info[f]) for f in fields if isinstance(info.get(f), str) and info[f]]


def secret_values(credentials: Mapping[str, str]) -> set[str]:
    """Every string that must never be shown from a store's ``credentials`` (a credentials Secret's
    data, or the sync pod's environment): each value but the NOT_SECRET ones, the key material
    inside a connection string, SAS token or Google credentials JSON, and their quoted forms."""
    values: list[str] = []
    for key, value in credentials.items():
        if key in NOT_SECRET or not isinstance(value, str) or not value:
            continue
        values.append(value)
        values.extend(_connection_string_parts(value))
        values.extend(_sas_signatures(value))
        for part in _connection_string_parts(value):
            values.extend(_sas_signatures(part))
        if value.lstrip().startswith("{"):
            values.extend(_service_account_parts(value))
    forms: set[str] = set()
    for value in values:
        forms |= secret_forms(value)
    return forms


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every one of ``secrets`` (longest first) and every credential the patterns know
    (URL signature parameters, auth headers, bearer tokens, private keys, URL user info) replaced by
    REDACTED.

    >>> redact("GET /c?sv=2022&sig=abc%2Bd&comp=list failed")
    'GET /c?sv=2022&sig=<redacted>&comp=list failed'
    >>> redact("login as hunter22 failed", {"hunter22"})
    'login as <redacted> failed'
    """
    for secret in sorted({s for s in secrets if len(s) >= MIN_SECRET_LENGTH}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    text = _PRIVATE_KEY.sub(REDACTED, text)
    text = _HEADER.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)
    text = _BEARER.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)
    text = _PARAMETER.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)
    return _USERINFO.sub(lambda m: m.group(1) + REDACTED + "@", text)
