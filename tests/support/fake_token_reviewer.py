"""A fake TokenReview for the node cache's tests: tokens it issued itself, for pods it says are alive."""

from __future__ import annotations

import base64
import json
import secrets
import time
from dataclasses import dataclass

from triton_operator.adapters.nodecache.review import Review
from triton_operator.core.repository.cache_rules import AUDIENCE, POD_NAME_EXTRA, POD_UID_EXTRA


def _b64(data: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


@dataclass(frozen=True)
class Issued:
    namespace: str
    pod: str
    audience: str


class FakeTokenReviewer:
    """Stands in for the API server's TokenReview (storage and unit tests; the e2e uses the real
    one): ``issue`` makes a JWT-shaped token (unsigned) for a pod; ``review`` accepts a token only
    if this fake issued it, for the audience asked, not expired, and its pod is not ``delete``d, as
    the API server accepts a pod-bound token only while its pod exists. Counts its reviews."""

    def __init__(self) -> None:
        self.issued: dict[str, Issued] = {}
        self.deleted: set[str] = set()
        self.reviews = 0

    def issue(self, namespace: str, pod: str, *, audience: str = AUDIENCE, seconds: float = 3600.0) -> str:
        claims = {
            "aud": [audience],
            "exp": int(time.time() + seconds),
            "sub": f"system:serviceaccount:{namespace}:default",
            "kubernetes.io": {"namespace": namespace, "pod": {"name": f"name-{pod}", "uid": pod}},
        }
        token = f"{_b64({'alg': 'RS256'})}.{_b64(claims)}.{secrets.token_urlsafe(16)}"
        self.issued[token] = Issued(namespace, pod, audience)
        return token

    def delete(self, pod: str) -> None:
        self.deleted.add(pod)

    async def review(self, token: str, audience: str) -> Review:
        self.reviews += 1
        issued = self.issued.get(token)
        if issued is None or issued.audience != audience or issued.pod in self.deleted:
            return Review(False, error="invalid bearer token")
        extra = {POD_NAME_EXTRA: [f"name-{issued.pod}"], POD_UID_EXTRA: [issued.pod]}
        return Review(True, f"system:serviceaccount:{issued.namespace}:default", extra)
