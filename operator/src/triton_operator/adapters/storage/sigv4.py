"""AWS Signature Version 4 of S3 requests without a body (GET, HEAD): pure functions of the request."""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from urllib.parse import quote

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
"""The payload hash of a request without a body (x-amz-content-sha256)."""

ALGORITHM = "AWS4-HMAC-SHA256"


@dataclass(frozen=True)
class Keys:
    """Static credentials: an access key pair and, for temporary ones, the session token."""

    access_key: str
    secret_key: str = field(repr=False)
    session_token: str = field(default="", repr=False)


def encode_path(key_path: str) -> str:
    """A path as S3 signs and sends it: every byte but the unreserved ones and ``/`` percent-encoded
    (UTF-8), once (S3 is the one service whose canonical URI is not encoded twice)."""
    return quote(key_path, safe="/~")


def encode_query(params: Mapping[str, str]) -> str:
    """The canonical query string: names sorted, names and values percent-encoded (``/`` too)."""
    pairs = sorted((quote(k, safe="~"), quote(v, safe="~")) for k, v in params.items())
    return "&".join(f"{k}={v}" for k, v in pairs)


@functools.lru_cache(maxsize=16)
def signing_key(secret_key: str, date: str, region: str, service: str = "s3") -> bytes:
    """The day's key: HMAC-SHA256 chained over the date, region, service and "aws4_request"."""
    key = ("AWS4" + secret_key).encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def sign(
    method: str,
    host: str,
    path: str,
    query: Mapping[str, str],
    headers: Mapping[str, str],
    *,
    keys: Keys,
    region: str,
    now: datetime,
) -> dict[str, str]:
    """The headers to send with a bodiless S3 request, ``Authorization`` included.

    ``path`` is already encoded (``encode_path``); ``host`` is the Host header's value (with the
    port when it is not the scheme's default); ``now`` is UTC. Every header sent is signed, the
    ``x-amz-*`` ones as S3 requires, the others (``Range``, ``If-Match``) because a signed header
    cannot be changed on the way.
    """
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    date = amz_date[:8]
    sent = {k.lower(): " ".join(str(v).split()) for k, v in headers.items()}
    sent["host"] = host
    sent["x-amz-date"] = amz_date
    sent["x-amz-content-sha256"] = EMPTY_SHA256
    if keys.session_token:
        sent["x-amz-security-token"] = keys.session_token
    names = sorted(sent)
    signed_headers = ";".join(names)
    canonical = "\n".join(
        (
            method,
            path,
            encode_query(query),
            "".join(f"{n}:{sent[n]}\n" for n in names),
            signed_headers,
            EMPTY_SHA256,
        )
    )
    scope = f"{date}/{region}/s3/aws4_request"
    to_sign = f"{ALGORITHM}\n{amz_date}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    signature = hmac.new(
        signing_key(keys.secret_key, date, region), to_sign.encode(), hashlib.sha256
    ).hexdigest()
    sent["authorization"] = (
        f"{ALGORITHM} Credential={keys.access_key}/{scope}, SignedHeaders={signed_headers}, "
        f"Signature={signature}"
    )
    return sent
