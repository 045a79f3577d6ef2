"""SigV4 of bodiless S3 requests (storage.sigv4): AWS's published example, and botocore's signer."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from triton_operator.adapters.storage.sigv4 import EMPTY_SHA256, Keys, encode_path, encode_query, sign

EXAMPLE_KEYS = Keys("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")


def test_the_get_object_example_of_s3s_documentation() -> None:
    """docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html, "Example: GET Object"."""
    headers = sign(
        "GET",
        "examplebucket.s3.amazonaws.com",
        "/test.txt",
        {},
        {"Range": "bytes=0-9"},
        keys=EXAMPLE_KEYS,
        region="us-east-1",
        now=datetime(2013, 5, 24, tzinfo=UTC),
    )
    assert headers["authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    )
    assert headers["x-amz-content-sha256"] == EMPTY_SHA256
    assert headers["x-amz-date"] == "20130524T000000Z"


@pytest.mark.parametrize(
    ("method", "key", "query", "headers", "token"),
    [
        ("GET", "models/1/model.bin", {}, {"Range": "bytes=0-1048575", "If-Match": '"abc"'}, ""),
        ("HEAD", "m/1/a b+c=d&e?f%g ü.bin", {"partNumber": "1"}, {"If-Match": '"e-3"'}, ""),
        (
            "HEAD",
            "m/x",
            {"versionId": "3/L4kqtJl+c=", "partNumber": "1"},
            {"x-amz-checksum-mode": "ENABLED"},
            "",
        ),
        ("GET", "m/x", {"versionId": "null"}, {}, "FwoGZXIvYXdzEP//////////wEaD+token/=="),
    ],
    ids=["ranged-get", "odd-key", "version-and-checksum", "session-token"],
)
def test_signatures_equal_botocores(
    method: str, key: str, query: dict[str, str], headers: dict[str, str], token: str
) -> None:
    keys = Keys("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    path = encode_path(f"/bucket/{key}")
    url = f"http://127.0.0.1:8333{path}" + (f"?{encode_query(query)}" if query else "")
    request = AWSRequest(method=method, url=url, headers=dict(headers))
    S3SigV4Auth(Credentials(keys.access_key, keys.secret_key, token or None), "s3", "eu-west-3").add_auth(
        request
    )
    now = datetime.strptime(str(request.headers["X-Amz-Date"]), "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    ours = sign(method, "127.0.0.1:8333", path, query, headers, keys=keys, region="eu-west-3", now=now)
    assert ours["authorization"] == request.headers["Authorization"]
    if token:
        assert ours["x-amz-security-token"] == token


def test_keys_do_not_show_their_secret() -> None:
    keys = Keys("AKIDEXAMPLE", "the-secret", "the-token")
    assert "the-secret" not in repr(keys)
    assert "the-token" not in repr(keys)


@pytest.mark.parametrize(
    ("raw", "encoded"),
    [("/b/a b", "/b/a%20b"), ("/b/a+b=c&d", "/b/a%2Bb%3Dc%26d"), ("/b/ü~._-", "/b/%C3%BC~._-")],
)
def test_paths_are_encoded_once_keeping_slashes(raw: str, encoded: str) -> None:
    assert encode_path(raw) == encoded
