"""The node cache's check of its callers' tokens: the API server's TokenReview, behind a small interface."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from lightkube import AsyncClient
from lightkube.models.authentication_v1 import TokenReviewSpec
from lightkube.resources.authentication_v1 import TokenReview

from triton_operator.adapters.kube import make_client


@dataclass(frozen=True)
class Review:
    """What the API server said of a token: whether it is valid for the audience, and whose it is."""

    authenticated: bool
    username: str = ""
    extra: Mapping[str, Sequence[str]] = field(default_factory=dict)
    error: str = ""


class TokenReviewer(Protocol):
    """Reviews a bearer token for an audience. ``KubeTokenReviewer`` asks the API server;
    tests/support/fake_token_reviewer.py is a fake that knows a fixed set of tokens."""

    async def review(self, token: str, audience: str) -> Review: ...


class KubeTokenReviewer:
    """A TokenReview (authentication.k8s.io/v1) per call; the node cache's ServiceAccount may
    ``create tokenreviews``. Failures of the API server propagate (the caller answers 503)."""

    def __init__(self, client: AsyncClient | None = None) -> None:
        self.client = client if client is not None else make_client(timeout=10.0)

    async def review(self, token: str, audience: str) -> Review:
        answer = await self.client.create(
            TokenReview(spec=TokenReviewSpec(token=token, audiences=[audience]))
        )
        status = answer.status
        if status is None or not status.authenticated or status.user is None:
            return Review(False, error=(status.error or "") if status is not None else "")
        if audience not in (status.audiences or []):
            return Review(False, error=f"not a token for audience {audience}")
        extra = {str(k): [str(v) for v in vs] for k, vs in (status.user.extra or {}).items()}
        return Review(True, status.user.username or "", extra)
