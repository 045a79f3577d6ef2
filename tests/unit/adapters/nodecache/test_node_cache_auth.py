"""The node cache's authenticator (adapters.nodecache.server.Authenticator) against the fake TokenReview:
reviews remembered briefly and in a bounded table, refusals without a review where the token says so."""

from __future__ import annotations

import pytest

from fake_token_reviewer import FakeTokenReviewer
from triton_operator.adapters.nodecache import server
from triton_operator.adapters.nodecache.review import Review
from triton_operator.adapters.nodecache.server import Authenticator
from triton_operator.core.repository.cache_rules import Caller, NotAllowed


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class Broken:
    async def review(self, token: str, audience: str) -> Review:
        raise ConnectionError("the API server is away")


async def test_a_review_is_remembered_for_a_short_time() -> None:
    reviewer, clock = FakeTokenReviewer(), Clock()
    auth = Authenticator(reviewer, clock=clock)
    token = reviewer.issue("team-a", "uid-1")
    for _ in range(100):
        assert await auth.caller(token) == Caller("team-a", "uid-1", "name-uid-1")
    assert reviewer.reviews == 1
    reviewer.delete("uid-1")
    clock.now += server.REVIEW_SECONDS + 1
    with pytest.raises(NotAllowed) as refused:
        await auth.caller(token)
    assert refused.value.status == 401
    assert reviewer.reviews == 2
    with pytest.raises(NotAllowed):  # the refusal is remembered too
        await auth.caller(token)
    assert reviewer.reviews == 2


async def test_the_table_of_reviews_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "REVIEWS_KEPT", 8)
    reviewer = FakeTokenReviewer()
    auth = Authenticator(reviewer)
    for i in range(50):
        await auth.caller(reviewer.issue("team-a", f"uid-{i}"))
    assert len(auth._seen) == 8


async def test_tokens_that_cannot_pass_cost_no_review() -> None:
    reviewer = FakeTokenReviewer()
    auth = Authenticator(reviewer)
    for token in ("opaque", reviewer.issue("team-a", "u", audience="https://kubernetes.default.svc")):
        with pytest.raises(NotAllowed, match="token refused"):
            await auth.caller(token)
    with pytest.raises(NotAllowed) as refused:
        Authenticator.token("Basic dXNlcjpwYXNz")
    assert refused.value.status == 401
    assert reviewer.reviews == 0


async def test_an_api_server_that_does_not_answer_is_503_and_not_remembered() -> None:
    auth = Authenticator(Broken())
    token = FakeTokenReviewer().issue("team-a", "u")
    for _ in range(2):
        with pytest.raises(NotAllowed) as refused:
            await auth.caller(token)
        assert refused.value.status == 503
    assert not auth._seen
