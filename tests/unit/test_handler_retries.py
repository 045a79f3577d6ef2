"""What the TritonService handler tells kopf about a spec that was not applied: retry later, or not."""

from __future__ import annotations

from typing import Any

import kopf
import pytest

from triton_operator import handlers
from triton_operator.core import conditions as cond
from triton_operator.reconcile.steps import Result


class Held:
    """Stands in for the Reconciler: every pass holds the spec for ``reason``."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    async def __call__(self, namespace: str, name: str, *, coalesce: bool) -> Result:
        return Result(status={}, invalid=f"held: {self.reason}", reason=self.reason)


async def call_handler(reason: str) -> None:
    handler: Any = handlers.tritonservice  # kopf's decorator hides the plain signature from mypy
    await handler(namespace="ml", name="svc", memo={"reconciler": Held(reason)})


@pytest.mark.parametrize(
    "reason",
    [
        cond.INVALID_SPEC,
        # a new spec or a new pin from the repository poll reconciles again
        cond.MANIFEST_TOO_LARGE,
        # the operator's policy: a new spec, or a restart with other settings, reconciles again
        cond.REFUSED_BY_POLICY,
        cond.CREDENTIALS_REQUIRED,
        cond.ENDPOINT_NOT_ALLOWED,
    ],
)
async def test_retrying_cannot_help(reason: str) -> None:
    with pytest.raises(kopf.PermanentError, match=f"held: {reason}"):
        await call_handler(reason)


@pytest.mark.parametrize("reason", [cond.REPOSITORY_ERROR, cond.CREDENTIALS_MISSING, cond.MODELS_NOT_FOUND])
async def test_an_unreadable_repository_is_tried_again(reason: str) -> None:
    with pytest.raises(kopf.TemporaryError) as raised:
        await call_handler(reason)
    assert raised.value.delay == handlers.REPOSITORY_RETRY_SECONDS
