"""TritonClient of a pooled TritonService: an inference that a pod answers "unknown model" (its kept
connection reached a pod that has let the model go, or a crashed pod's tritonserver back before its models)
ran nowhere and is sent again on a new connection, until retry_seconds; nothing else is asked again, and
a client of a TritonService without a pool never does."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from tritonclient.utils import InferenceServerException

from triton_operator.client import TritonClient
from triton_operator.client.triton import _own_channel_args

GONE = "[StatusCode.NOT_FOUND] Request for unknown model: 'a' has no available versions"
CONFIG = {"a": {"maxBatchSize": 0, "input": [{"name": "X", "dataType": "TYPE_FP32", "dims": ["1"]}]}}


@dataclass
class Connection:
    """A tritonclient InferenceServerClient on one connection: each inference answered from ``answers``
    (an exception is raised)."""

    answers: list[Any]
    asked: int = 0
    closed: bool = False
    made_with: dict[str, Any] = field(default_factory=dict)

    def infer(self, model: str, inputs: Any, **request: Any) -> Any:
        self.asked += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def close(self) -> None:
        self.closed = True


class AsyncConnection(Connection):
    async def infer(self, model: str, inputs: Any, **request: Any) -> Any:
        return Connection.infer(self, model, inputs, **request)

    async def close(self) -> None:  # type: ignore[override]
        self.closed = True


def client(
    routed: bool, connections: list[Connection], monkeypatch: pytest.MonkeyPatch, retry_seconds: float = 5
) -> TritonClient:
    """A client whose connections are ``connections``, one after another (each made anew)."""
    made = iter(connections)
    monkeypatch.setattr(TritonClient, "_new_sync", lambda _self: next(made))
    return TritonClient("grpc://127.0.0.1:1", configs=CONFIG, routed=routed, retry_seconds=retry_seconds)


def test_a_pod_that_let_the_model_go_is_left_for_a_new_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = Connection([InferenceServerException(GONE)]), Connection(["answer"])
    c = client(True, [first, second], monkeypatch)
    assert c.model("a").run([1.0]) == "answer"
    assert (first.asked, first.closed, second.asked) == (1, True, 1)
    assert c._sync is second  # the new connection stays in use


def test_only_unknown_model_is_sent_again_and_only_for_retry_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    failing = InferenceServerException("[StatusCode.INTERNAL] model raised")
    c = client(True, [Connection([failing]), Connection(["answer"])], monkeypatch)
    with pytest.raises(InferenceServerException, match="model raised"):
        c.model("a").run([1.0])
    gone = [Connection([InferenceServerException(GONE)]) for _ in range(10)]
    c = client(True, gone, monkeypatch, retry_seconds=0.3)
    sent = time.monotonic()
    with pytest.raises(InferenceServerException, match="unknown model"):
        c.model("a").run([1.0])
    # sent again after 0.05 and 0.1 s; not once more, as the next wait (0.2 s) would end past 0.3 s
    assert [g.asked for g in gone[:4]] == [1, 1, 1, 0] and time.monotonic() - sent < 1
    once = Connection([InferenceServerException(GONE)])
    c = client(True, [once, Connection(["answer"])], monkeypatch, retry_seconds=0)
    with pytest.raises(InferenceServerException, match="unknown model"):
        c.model("a").run([1.0])
    assert once.asked == 1  # 0: not sent again


def test_a_client_without_a_pool_does_not_ask_again(monkeypatch: pytest.MonkeyPatch) -> None:
    only = Connection([InferenceServerException(GONE)])
    c = client(False, [only], monkeypatch)
    with pytest.raises(InferenceServerException, match="unknown model"):
        c.model("a").run([1.0])
    assert only.asked == 1 and not only.closed


def test_the_asyncio_client_is_made_again_too(monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = AsyncConnection([InferenceServerException(GONE)]), AsyncConnection(["answer"])
    c = client(True, [Connection([])], monkeypatch)
    made = iter([first, second])

    async def aio() -> Any:
        if c._aio_client is None:
            c._aio_client = next(made)
        return c._aio_client

    c._aio = aio  # type: ignore[method-assign]
    assert asyncio.run(c.model("a").async_run([1.0])) == "answer"
    assert first.closed and c._aio_client is second


def test_a_routed_grpc_channel_has_a_subchannel_pool_of_its_own() -> None:
    args = dict(_own_channel_args())
    assert args["grpc.use_local_subchannel_pool"] == 1
    assert args["grpc.max_send_message_length"] == args["grpc.max_receive_message_length"] > 0
    routed = TritonClient("grpc://127.0.0.1:1", routed=True)
    assert routed.routed and not TritonClient("grpc://127.0.0.1:1").routed
    routed.close()
