"""TritonClient: a tritonserver (or a TritonService's endpoints) over HTTP or gRPC, models as attributes.

``client.<model>.run(*inputs)`` or ``run(**inputs)`` checks the inputs against the model's config
(core/commandline/inputs.py) before anything is sent and answers tritonclient's own result object, for both
protocols. Every other Triton API is passed through under tritonclient's method names.
"""

from __future__ import annotations

import asyncio
import errno
import inspect
import math
import queue
import socket
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from tritonclient.utils import InferenceServerException

from triton_operator.core.commandline.inputs import CheckedInput, Signature, check_inputs

if TYPE_CHECKING:
    from triton_operator.adapters.control import Control

Protocol = Literal["http", "grpc"]
DEFAULT_PORTS: dict[str, int] = {"http": 8000, "grpc": 8001}
DEFAULT_RETRY_SECONDS = 5.0
"""How long, by default, an inference that ran nowhere is sent again (retry_seconds)."""
_FIRST_WAIT = 0.05
_LONGEST_WAIT = 0.5
"""The wait before sending again an inference that ran nowhere: doubling from the first, at most the
longest."""
_SCHEMES: dict[str, tuple[Protocol, bool]] = {
    "http": ("http", False),
    "https": ("http", True),
    "grpc": ("grpc", False),
    "grpcs": ("grpc", True),
}


class ClientError(RuntimeError):
    """A request this client cannot make: streaming over HTTP, run on a decoupled model, no endpoint."""


class UnknownModelError(AttributeError):
    """A model the TritonService (or the server's repository) does not have."""


class ModelNotServedError(ClientError):
    """A model of a pooled TritonService with no endpoint to send it to yet: not placed, no copy READY."""


def parse_url(url: str) -> tuple[Protocol, str, bool]:
    """``http://host:port``, ``grpc://host:port`` (``https``/``grpcs`` for TLS) or a bare ``host:port``
    (gRPC) as (protocol, host:port, ssl); a missing port is Triton's default for the protocol."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "grpc", url
    if scheme not in _SCHEMES:
        raise ValueError(f"url {url!r}: the scheme must be http, https, grpc or grpcs, not {scheme!r}")
    protocol, ssl = _SCHEMES[scheme]
    address = rest.rstrip("/")
    if not address or "/" in address:
        raise ValueError(f"url {url!r}: expected SCHEME://HOST[:PORT] with no path")
    host_part = address.rsplit("]", 1)[-1]  # [ipv6]:port
    if ":" not in host_part:
        address = f"{address}:{DEFAULT_PORTS[protocol]}"
    return protocol, address, ssl


def _own_channel_args() -> list[tuple[str, Any]]:
    """tritonclient's gRPC channel arguments, and a subchannel pool of the channel's own (not gRPC's
    process-wide one): a new channel made after a pod said the model is not there, or that it is
    stopping, opens a new connection, which the Service sends on to a pod holding the model."""
    import tritonclient.grpc as module  # noqa: PLC0415 - only with gRPC

    options = module.KeepAliveOptions()
    return [
        ("grpc.max_send_message_length", module.MAX_GRPC_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", module.MAX_GRPC_MESSAGE_SIZE),
        ("grpc.keepalive_time_ms", options.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", options.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", options.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", options.http2_max_pings_without_data),
        ("grpc.use_local_subchannel_pool", 1),
    ]


def _closed_before_answer(exc: BaseException) -> bool:
    """An HTTP request's connection closed or reset before its answer's head came, as tritonclient's
    HTTP clients raise it (geventhttpclient's, and aiohttp's for the asyncio one); not a refused or
    timed out connection."""
    if isinstance(exc, (ConnectionResetError, BrokenPipeError)):
        return True
    try:
        from geventhttpclient.response import HTTPConnectionClosed  # noqa: PLC0415 - tritonclient's HTTP client
    except ImportError:
        pass
    else:
        if isinstance(exc, HTTPConnectionClosed):
            return True
    try:
        import aiohttp  # noqa: PLC0415 - tritonclient's asyncio HTTP client
    except ImportError:
        return False
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return True
    return (
        isinstance(exc, aiohttp.ClientOSError)
        and not isinstance(exc, aiohttp.ClientConnectorError)
        and exc.errno in (errno.ECONNRESET, errno.EPIPE)
    )


def _unavailable_text(exc: BaseException) -> str | None:
    """A gRPC inference's UNAVAILABLE failure's text, in lower case (None: not such a failure)."""
    if not isinstance(exc, InferenceServerException) or not str(exc.status() or "").endswith("UNAVAILABLE"):
        return None
    return str(exc.message() if hasattr(exc, "message") else exc).lower()


def _refused_as_stopping(exc: BaseException) -> bool:
    """A gRPC inference failed UNAVAILABLE with "Server is stopping" (gRPC's GOAWAY text, "Server is
    stopping to serve requests.", as tritonserver's gRPC server shuts down when it exits): the stream
    was refused by a server that is leaving, before the request reached Triton."""
    text = _unavailable_text(exc)
    return text is not None and "server is stopping" in text


_CUT = ("stream removed", "socket closed", "connection reset", "broken pipe")
"""gRPC's texts for a stream whose connection closed or was reset under it (gRPC core's status details)."""


def _cut_under_stream(exc: BaseException) -> bool:
    """A gRPC inference failed UNAVAILABLE because its connection closed or was reset before its answer
    came ("Stream removed (recvmsg:Connection reset by peer)", "Socket closed": a tritonserver killed
    while the request was on its way or in it), as an HTTP one's connection closing under it
    (_closed_before_answer)."""
    text = _unavailable_text(exc)
    return text is not None and any(cut in text for cut in _CUT)


def _reached_no_server(exc: BaseException) -> bool:
    """An inference that provably reached no tritonserver: its connection was refused (a pod whose
    tritonserver died, still in its Service's rules), as tritonclient's HTTP clients raise it
    (ConnectionRefusedError from geventhttpclient, aiohttp's ClientConnectorError for the asyncio one),
    or a gRPC inference failed UNAVAILABLE "failed to connect to all addresses" (the channel had no
    connection to send it on: gRPC fails such a call before any stream starts). Not a connection closed
    or reset under a request: that one may have run."""
    if isinstance(exc, InferenceServerException):
        text = _unavailable_text(exc)
        return text is not None and "failed to connect to all addresses" in text
    if isinstance(exc, ConnectionRefusedError):
        return True
    try:
        import aiohttp  # noqa: PLC0415 - tritonclient's asyncio HTTP client
    except ImportError:
        return False
    return isinstance(exc, aiohttp.ClientConnectorError) and exc.errno == errno.ECONNREFUSED


def _checked_retry_seconds(value: object) -> float:
    """``value`` as the retry_seconds option (a finite number of seconds, 0 or more)."""
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    if math.isfinite(number) and number >= 0:
        return float(number)
    raise ValueError(
        f"retry_seconds must be a number of seconds, 0 or more (0: an inference that ran nowhere is "
        f"not sent again), not {value!r}"
    )


class _Attempts:
    """One inference's attempts so far: when it was first sent, whether it was asked again after a
    failure it may have run in, and the wait before sending it again once more after it ran nowhere."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.asked_again = False
        self._wait = _FIRST_WAIT

    def next_wait(self, budget: float) -> float | None:
        """The wait before sending again, or None where that would end past ``budget`` seconds after
        the first send."""
        if time.monotonic() - self.started + self._wait > budget:
            return None
        wait, self._wait = self._wait, min(2 * self._wait, _LONGEST_WAIT)
        return wait


def _is_unknown_model(exc: InferenceServerException) -> bool:
    text = str(exc.message() if hasattr(exc, "message") else exc).lower()
    return "unknown model" in text or "not found" in text


class Model:
    """One model (and version) of a TritonClient: ``run``/``async_run``, ``stream``, its own APIs."""

    def __init__(self, client: TritonClient, name: str, version: str | int = "") -> None:
        self.client = client
        self.name = name
        self.version = str(version)

    def __repr__(self) -> str:
        version = f", version={self.version!r}" if self.version else ""
        return f"<Model {self.name!r}{version} at {self.client.url}>"

    # ------------------------------------------------------------ inference

    def signature(self) -> Signature:
        """The model's inputs and outputs: from the TritonService's spec, else from the server."""
        return self.client._signature(self.name, self.version)

    async def async_signature(self) -> Signature:
        return await self.client._async_signature(self.name, self.version)

    def run(self, *inputs: Any, **named: Any) -> Any:
        """Infer with inputs by position (the config's input order) or by name; never both.

        Checked against the config before sending (count, names, dtype, shape); answers
        tritonclient's InferResult (``as_numpy``, ``get_output``, ``get_response``).
        """
        return self._infer(inputs, named, {})

    async def async_run(self, *inputs: Any, **named: Any) -> Any:
        """``run`` over tritonclient's asyncio client."""
        return await self._async_infer(inputs, named, {})

    def infer(self, inputs: Sequence[Any] | Mapping[str, Any], **options: Any) -> Any:
        """``run`` with the inputs as one list or dict, and tritonclient's request options by keyword:
        ``outputs`` (the names wanted), ``request_id``, ``parameters``, ``headers``, ``sequence_id``,
        ``priority``, ``timeout``, ..."""
        args, named = ((), inputs) if isinstance(inputs, Mapping) else (inputs, {})
        return self._infer(args, named, options)

    async def async_infer(self, inputs: Sequence[Any] | Mapping[str, Any], **options: Any) -> Any:
        args, named = ((), inputs) if isinstance(inputs, Mapping) else (inputs, {})
        return await self._async_infer(args, named, options)

    def _refuse_decoupled(self, signature: Signature) -> None:
        if signature.decoupled:
            raise ClientError(
                f"model {self.name} is decoupled: its responses come over a stream; "
                "use .stream() (gRPC) instead of run/infer"
            )

    def _refuse_unstreamable(self) -> None:
        protocol = self.client.protocol
        if protocol != "grpc":
            raise ClientError(f"streaming needs gRPC; this client speaks {protocol} ({self.client.url})")

    def _prepare(
        self, signature: Signature, args: Sequence[Any], named: Mapping[str, Any], options: dict[str, Any]
    ) -> dict[str, Any]:
        checked = check_inputs(signature, args, named)
        request = self.client._request(signature, checked, options.pop("outputs", None))
        return {"model_version": self.version, **request, **options}

    def _infer(self, args: Sequence[Any], named: Mapping[str, Any], options: dict[str, Any]) -> Any:
        signature = self.signature()
        self._refuse_decoupled(signature)
        request = self._prepare(signature, args, named, dict(options))
        inputs = request.pop("inputs")
        attempts = _Attempts()
        while True:
            try:
                return self.client._sync.infer(self.name, inputs, **request)
            except Exception as exc:
                wait = self._again(exc, request, attempts)
                if wait is None:
                    raise
            time.sleep(wait)
            self.client._reconnect()

    async def _async_infer(
        self, args: Sequence[Any], named: Mapping[str, Any], options: dict[str, Any]
    ) -> Any:
        signature = await self.async_signature()
        self._refuse_decoupled(signature)
        request = self._prepare(signature, args, named, dict(options))
        inputs = request.pop("inputs")
        attempts = _Attempts()
        while True:
            try:
                return await (await self.client._aio()).infer(self.name, inputs, **request)
            except Exception as exc:
                wait = self._again(exc, request, attempts)
                if wait is None:
                    raise
            await asyncio.sleep(wait)
            await self.client._async_reconnect()

    def _again(self, exc: Exception, request: Mapping[str, Any], attempts: _Attempts) -> float | None:
        """The seconds to wait before sending a failed inference again on a new connection (over gRPC
        a new channel), or None: its failure is raised.

        One that ran nowhere, as it reached no tritonserver (``_unreached``) or a pool's pod answered it
        "unknown model" (``_moved``), is sent again, waiting 0.05 s then twice as long each time (at
        most 0.5 s), until ``retry_seconds`` after its first send; one that got no answer on a
        connection closing under it (``_unanswered``) is asked again once."""
        if self._unreached(exc, request) or self._moved(exc):
            return attempts.next_wait(self.client.retry_seconds)
        if not attempts.asked_again and self._unanswered(exc, request):
            attempts.asked_again = True
            return 0.0
        return None

    def _unreached(self, exc: Exception, request: Mapping[str, Any]) -> bool:
        """Whether an inference reached no tritonserver (its connection refused; over gRPC, no
        connection to send it on) and is not a step of a sequence. A Service's address keeps sending
        new connections to a pod whose tritonserver died (crashed, OOM-killed) until the pod's address
        leaves kube-proxy's rules (1.4 to 2 s on the real node); a new connection may reach a pod
        that serves. Nothing ran, so nothing runs twice. A sequence's step is not sent again: its
        state is on the server it was started on."""
        return not request.get("sequence_id") and _reached_no_server(exc)

    def _moved(self, exc: Exception) -> bool:
        """Whether a pool's pod said it does not hold the model: a connection kept open through the
        model's Service stays on the pod it reached first, which may since have let the model go (moved,
        or the pod leaving: tritonserver unloads every model before it exits) while the Service no longer
        sends new connections there; or a pod whose tritonserver crashed and came back before its
        address left kube-proxy's rules, its models not loaded again yet. Nothing ran: sent again on a
        new connection, as long as an inference that reached no tritonserver."""
        return isinstance(exc, InferenceServerException) and self.client.routed and _is_unknown_model(exc)

    def _unanswered(self, exc: Exception, request: Mapping[str, Any]) -> bool:
        """Whether an HTTP inference's connection was closed before any byte of its answer came, or a
        gRPC inference was refused UNAVAILABLE by a server that is stopping or its stream was cut, and
        the inference is not a step of a sequence: asked again once, on a new connection (over gRPC a
        new channel).

        tritonclient keeps HTTP connections open between requests; a server that exits (a pod leaving,
        after its drain) closes them, and a request sent on one as it closes gets no answer. HTTP
        clients send a request again by themselves only when its method is idempotent, and an
        inference is a POST; but one without a sequence changes no state on the server and gives the
        same answer twice. A sequence's step (``sequence_id``) is not sent again: the model's state
        would take it twice had the server run it.

        A kept gRPC channel to a Service stays on the pod it first reached; when that pod's
        tritonserver exits, its gRPC server refuses the streams it has not taken with UNAVAILABLE
        "Server is stopping to serve requests." (not run). A new channel opens a new connection, which
        the Service sends to a pod that stays. A gRPC inference whose connection closed or was reset
        under it before its answer (a tritonserver killed: crashed, OOM-killed) is asked again once as
        an HTTP one is."""
        if request.get("sequence_id"):
            return False
        if self.client.protocol == "http":
            return _closed_before_answer(exc)
        return _refused_as_stopping(exc) or _cut_under_stream(exc)

    def stream(self, *inputs: Any, timeout: float | None = None, **named: Any) -> Iterator[Any]:
        """The responses of one request over a gRPC stream (a decoupled model's many, or one), as
        InferResults, until the server marks the last. Inputs as for ``run``; ``timeout`` in seconds
        bounds the wait for each response."""
        self._refuse_unstreamable()
        signature = self.signature()
        request = self._prepare(signature, inputs, named, {})
        responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
        # A stream of its own: tritonclient's gRPC client holds one stream at a time.
        own = self.client._new_sync()
        own.start_stream(callback=lambda result, error: responses.put((result, error)))
        try:
            own.async_stream_infer(
                self.name,
                request["inputs"],
                model_version=self.version,
                enable_empty_final_response=True,
            )
            while True:
                try:
                    result, error = responses.get(timeout=timeout)
                except queue.Empty:
                    raise TimeoutError(f"model {self.name}: no response within {timeout} s") from None
                final, has_outputs = _final_and_outputs(result, error)
                if has_outputs:
                    yield result
                if final:
                    return
        finally:
            own.stop_stream(cancel_requests=True)
            own.close()

    async def async_stream(self, *inputs: Any, **named: Any) -> AsyncIterator[Any]:
        """``stream`` over tritonclient's asyncio gRPC client."""
        self._refuse_unstreamable()
        signature = await self.async_signature()
        request = self._prepare(signature, inputs, named, {})
        aio = await self.client._aio()

        async def one_request() -> AsyncIterator[dict[str, Any]]:
            yield {
                "model_name": self.name,
                "inputs": request["inputs"],
                "model_version": self.version,
                "enable_empty_final_response": True,
            }

        responses = aio.stream_infer(one_request())
        try:
            async for result, error in responses:
                final, has_outputs = _final_and_outputs(result, error)
                if has_outputs:
                    yield result
                if final:
                    return
        finally:
            responses.cancel()

    # ------------------------------------------------------------ this model's APIs

    def config(self) -> dict[str, Any]:
        return self.client.get_model_config(self.name, self.version)

    def metadata(self) -> dict[str, Any]:
        return self.client.get_model_metadata(self.name, self.version)

    def ready(self) -> bool:
        return self.client.is_model_ready(self.name, self.version)

    def statistics(self) -> dict[str, Any]:
        return self.client.get_inference_statistics(self.name, self.version)

    def load(self, config: str | None = None, files: Mapping[str, bytes] | None = None) -> None:
        self.client.load_model(self.name, config=config, files=files)

    def unload(self, unload_dependents: bool = False) -> None:
        self.client.unload_model(self.name, unload_dependents=unload_dependents)


def _final_and_outputs(result: Any, error: BaseException | None) -> tuple[bool, bool]:
    """Whether a streamed gRPC response is the last of its request, and whether it carries outputs;
    the stream's ``error`` for it, when there is one, is raised."""
    if error is not None:
        raise error
    response = result.get_response()
    final = "triton_final_response" in response.parameters and bool(
        response.parameters["triton_final_response"].bool_param
    )
    return final, bool(response.outputs)


class TritonClient:
    """A tritonserver over HTTP (``http://host:port``) or gRPC (``grpc://host:port``, or a bare
    ``host:port``); ``for_service`` finds a TritonService's endpoints and model configs.

    Each model is an attribute (``client.add_sub.run(...)``); ``client.model(name, version=...)``
    reaches any name and a version. A model whose name is also a method here is reached through
    ``client.model``. The Triton APIs keep tritonclient's names and return dicts for both protocols.
    """

    def __init__(
        self,
        url: str,
        *,
        configs: Mapping[str, Mapping[str, Any]] | None = None,
        service: str | None = None,
        verbose: bool = False,
        model_urls: Mapping[str, str] | None = None,
        unserved: Mapping[str, str] | None = None,
        routed: bool = False,
        retry_seconds: float = DEFAULT_RETRY_SECONDS,
    ) -> None:
        """``configs`` (model name -> ModelConfig dict, as a TritonService's spec holds them) are
        the models this client knows and checks inputs against; without, the server's are read.
        ``model_urls`` sends a model's requests to its own URL (a pool's per-model Service) instead
        of ``url``; using a model of ``unserved`` raises ModelNotServedError with its message.
        ``routed``: this client reaches one model of a pool through the model's own Service (made by
        the pooled client for each model): an inference a pod answers with "unknown model" ran nowhere
        (Model._moved). ``retry_seconds``: how long after its first send an inference that ran nowhere
        (its connection refused, as a Service's address does for the moments a crashed pod stays in
        its rules; or "unknown model" on a routed client) is sent again on new connections, waiting
        0.05 s then twice as long each time, at most 0.5 s; 0: never (a step of a sequence that
        reached no tritonserver never is)."""
        self.retry_seconds = _checked_retry_seconds(retry_seconds)
        self.routed = routed
        self.protocol, self.address, self.ssl = parse_url(url)
        scheme = {("http", False): "http", ("http", True): "https", ("grpc", False): "grpc"}.get(
            (self.protocol, self.ssl), "grpcs"
        )
        self.url = f"{scheme}://{self.address}"
        self.service = service
        self._verbose = verbose
        self._configs = {name: dict(config) for name, config in (configs or {}).items()}
        self._signatures: dict[tuple[str, str], Signature] = {}
        self._index: list[str] | None = None
        self._model_urls = dict(model_urls or {})
        self._unserved = dict(unserved or {})
        self._model_clients: dict[str, TritonClient] = {}
        self._sync = self._new_sync()
        self._aio_client: Any = None
        self._aio_loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------ construction

    @classmethod
    def for_service(
        cls,
        name: str,
        namespace: str | None = None,
        *,
        protocol: Protocol = "grpc",
        host: str | Mapping[str, str] | None = None,
        control: Control | None = None,
        retry_seconds: float = DEFAULT_RETRY_SECONDS,
    ) -> TritonClient:
        """The client of TritonService ``namespace/name`` (the kubeconfig's namespace by default):
        its status.endpoints and its spec's model configs. ``host`` (``HOST`` or ``HOST:PORT``)
        replaces the endpoint's host from outside the cluster (a port-forward, an ingress, the
        Service's IP where it is reachable).

        In a pool (spec.pool) each model's requests go to the model's own Service, as
        status.pool.models[].endpoints names it; from outside the cluster ``host`` is then either
        one host (HTTP only: a Gateway whose routes by model send each model's paths on) or a mapping
        from model name to ``HOST[:PORT]`` (e.g. a port-forward to each model's Service), its ``""``
        entry for the server-wide endpoint.

        ``retry_seconds`` (default 5): an inference that ran nowhere (its connection refused: a pod
        whose tritonserver crashed stays in its Service's rules for a moment; "unknown model" from a
        pool's pod) is sent again on new connections for up to that long; 0 turns it off."""
        if control is None:
            from triton_operator.adapters.control import KubeControl  # noqa: PLC0415 - lightkube when needed

            control = KubeControl()
        obj = control.get(name, namespace or control.namespace)
        return cls.from_tritonservice(obj, protocol=protocol, host=host, retry_seconds=retry_seconds)

    @classmethod
    def from_tritonservice(
        cls,
        obj: Mapping[str, Any],
        *,
        protocol: Protocol = "grpc",
        host: str | Mapping[str, str] | None = None,
        retry_seconds: float = DEFAULT_RETRY_SECONDS,
    ) -> TritonClient:
        """The client of a TritonService object as the API server returns it."""
        retry = _checked_retry_seconds(retry_seconds)
        if protocol not in DEFAULT_PORTS:
            raise ValueError(f"protocol must be 'http' or 'grpc', not {protocol!r}")
        metadata = obj.get("metadata") or {}
        where = f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"
        status = obj.get("status") or {}
        endpoint = (status.get("endpoints") or {}).get(protocol)
        if not endpoint:
            raise ClientError(
                f"TritonService {where} has no status.endpoints.{protocol} yet "
                "(the operator writes it on its first reconcile)"
            )
        server_host = host.get("") if isinstance(host, Mapping) else host
        address = _address(str(endpoint), server_host, f"status.endpoints.{protocol}", where)
        spec = obj.get("spec") or {}
        models = spec.get("models") or []
        configs = {str(m["name"]): dict(m.get("config") or {}) for m in models}
        if not spec.get("pool"):
            return cls(f"{protocol}://{address}", configs=configs, service=where, retry_seconds=retry)
        model_urls, unserved = _pool_routes(configs, status.get("pool") or {}, protocol, host, where)
        return cls(
            f"{protocol}://{address}",
            configs=configs,
            service=where,
            model_urls=model_urls,
            unserved=unserved,
            retry_seconds=retry,
        )

    def _module(self) -> Any:
        if self.protocol == "http":
            import tritonclient.http as module  # noqa: PLC0415 - only the protocol in use
        else:
            import tritonclient.grpc as module  # noqa: PLC0415
        return module

    def _new_sync(self) -> Any:
        module = self._module()
        own = {"channel_args": _own_channel_args()} if self.protocol == "grpc" else {}
        return module.InferenceServerClient(self.address, ssl=self.ssl, verbose=self._verbose, **own)

    def _reconnect(self) -> None:
        """A new synchronous client (new connections) in place of the one in use."""
        old, self._sync = self._sync, self._new_sync()
        old.close()

    async def _async_reconnect(self) -> None:
        """The asyncio client closed: the next call makes a new one (new connections)."""
        if self._aio_client is not None:
            old, self._aio_client = self._aio_client, None
            await old.close()

    async def _aio(self) -> Any:
        """tritonclient's asyncio client, made in (and for) the running event loop."""
        loop = asyncio.get_running_loop()
        if self._aio_client is None or self._aio_loop is not loop:
            if self.protocol == "http":
                from tritonclient.http import aio  # noqa: PLC0415
            else:
                from tritonclient.grpc import aio  # noqa: PLC0415
            own = {"channel_args": _own_channel_args()} if self.protocol == "grpc" else {}
            self._aio_client = aio.InferenceServerClient(
                self.address, ssl=self.ssl, verbose=self._verbose, **own
            )
            self._aio_loop = loop
        return self._aio_client

    @property
    def raw(self) -> Any:
        """tritonclient's own (synchronous) InferenceServerClient, for anything not passed through."""
        return self._sync

    # ------------------------------------------------------------ lifetime

    def close(self) -> None:
        for child in self._model_clients.values():
            child.close()
        self._sync.close()

    async def aclose(self) -> None:
        """Close the asyncio client (made by the first async call) and the synchronous one."""
        for child in self._model_clients.values():
            await child.aclose()
        self._model_clients = {}
        if self._aio_client is not None:
            await self._aio_client.close()
            self._aio_client = None
        self.close()

    def __enter__(self) -> TritonClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> TritonClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        service = f" (TritonService {self.service})" if self.service else ""
        return f"<TritonClient {self.url}{service}>"

    # ------------------------------------------------------------ models

    def model_names(self, *, refresh: bool = False) -> list[str]:
        """The models this client knows: the TritonService's, else the server's repository index."""
        if self._configs:
            return list(self._configs)
        if self._index is None or refresh:
            self._index = [str(entry["name"]) for entry in self.get_model_repository_index()]
        return list(self._index)

    def model(self, name: str, version: str | int = "") -> Model:
        """Model ``name`` (any name, also one that is not a Python identifier); ``version`` picks one
        (default: the server's choice by the model's version policy, usually the latest)."""
        known = self.model_names()
        if name not in known and (self._configs or name not in self.model_names(refresh=True)):
            source = f"TritonService {self.service}" if self.service else f"the repository at {self.url}"
            raise UnknownModelError(
                f"no model {name!r} in {source} (its models: {', '.join(known) or 'none'})"
            )
        return Model(self._for_model(name), name, version)

    def _for_model(self, name: str) -> TritonClient:
        """The client that reaches ``name``: this one, or in a pool the one of the model's own endpoint."""
        if name in self._unserved:
            raise ModelNotServedError(self._unserved[name])
        url = self._model_urls.get(name)
        if url is None:
            return self
        if name not in self._model_clients:
            configs = {name: self._configs[name]} if name in self._configs else None
            self._model_clients[name] = TritonClient(
                url,
                configs=configs,
                service=self.service,
                verbose=self._verbose,
                routed=True,
                retry_seconds=self.retry_seconds,
            )
        return self._model_clients[name]

    def model_url(self, name: str) -> str:
        """The URL ``name``'s requests go to (in a pool its own Service's; else this client's)."""
        return self._for_model(name).url

    def __getattr__(self, name: str) -> Model:
        if name.startswith("_"):
            raise AttributeError(name)
        return self.model(name)

    def __dir__(self) -> list[str]:
        names = list(self._configs) or list(self._index or [])
        return sorted({*super().__dir__(), *(n for n in names if n.isidentifier())})

    def _signature(self, name: str, version: str) -> Signature:
        key = (name, version)
        if key not in self._signatures:
            self._signatures[key] = Signature.from_config(name, self._config_for_checks(name, version))
        return self._signatures[key]

    async def _async_signature(self, name: str, version: str) -> Signature:
        key = (name, version)
        if key not in self._signatures:
            config = self._configs.get(name) or {}
            if not config.get("input"):
                aio = await self._aio()
                try:
                    served = await aio.get_model_config(name, version, **self._as_json("get_model_config"))
                except InferenceServerException as exc:
                    raise self._unknown(name, version, exc) from exc
                config = _unwrap_config(served)
            self._signatures[key] = Signature.from_config(name, config)
        return self._signatures[key]

    def _config_for_checks(self, name: str, version: str) -> Mapping[str, Any]:
        """The spec's config where it declares the inputs; otherwise what the server serves (Triton may
        have filled the inputs in from the model file)."""
        config = self._configs.get(name) or {}
        if config.get("input"):
            return config
        try:
            return self.get_model_config(name, version)
        except InferenceServerException as exc:
            raise self._unknown(name, version, exc) from exc

    def _unknown(self, name: str, version: str, exc: InferenceServerException) -> Exception:
        if _is_unknown_model(exc):
            what = f"no version {version} of model {name!r}" if version else f"no model {name!r}"
            return UnknownModelError(f"{what} served at {self.url}: {exc}")
        error: Exception = exc
        return error

    def _request(
        self, signature: Signature, checked: list[CheckedInput], outputs: Sequence[str] | None
    ) -> dict[str, Any]:
        """tritonclient's InferInput objects (and, over HTTP, binary outputs so BYTES come back as bytes
        as over gRPC)."""
        module = self._module()
        inputs = []
        for item in checked:
            infer_input = module.InferInput(item.name, list(item.data.shape), item.datatype)
            infer_input.set_data_from_numpy(item.data)
            inputs.append(infer_input)
        names = list(outputs) if outputs is not None else [o.name for o in signature.outputs]
        requested = None
        if names and (outputs is not None or self.protocol == "http"):
            if self.protocol == "http":
                requested = [module.InferRequestedOutput(n, binary_data=True) for n in names]
            else:
                requested = [module.InferRequestedOutput(n) for n in names]
        return {"inputs": inputs, "outputs": requested}

    # ------------------------------------------------------------ pass-throughs

    def _as_json(self, method: str) -> dict[str, Any]:
        target = getattr(self._sync, method)
        return {"as_json": True} if "as_json" in inspect.signature(target).parameters else {}

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._sync, method)(*args, **kwargs, **self._as_json(method))

    def is_server_live(self) -> bool:
        return bool(self._call("is_server_live"))

    def is_server_ready(self) -> bool:
        return bool(self._call("is_server_ready"))

    def is_model_ready(self, model_name: str, model_version: str = "") -> bool:
        if model_name in self._unserved:
            return False
        target = self._for_model(model_name)
        return bool(target._call("is_model_ready", model_name, str(model_version)))

    def get_server_metadata(self) -> dict[str, Any]:
        return dict(self._call("get_server_metadata"))

    def get_model_metadata(self, model_name: str, model_version: str = "") -> dict[str, Any]:
        return dict(self._for_model(model_name)._call("get_model_metadata", model_name, str(model_version)))

    def get_model_config(self, model_name: str, model_version: str = "") -> dict[str, Any]:
        """The config Triton serves (snake_case; over gRPC 64-bit integers are strings)."""
        target = self._for_model(model_name)
        return _unwrap_config(target._call("get_model_config", model_name, str(model_version)))

    def get_model_repository_index(self) -> list[dict[str, Any]]:
        """Every model of the repository: name, version, state, reason (a list for both protocols)."""
        index = self._call("get_model_repository_index")
        return list(index.get("models", []) if isinstance(index, dict) else index)

    def load_model(
        self, model_name: str, config: str | None = None, files: Mapping[str, bytes] | None = None
    ) -> None:
        self._sync.load_model(model_name, config=config, files=dict(files) if files else None)
        self._signatures = {k: v for k, v in self._signatures.items() if k[0] != model_name}
        self._index = None

    def unload_model(self, model_name: str, unload_dependents: bool = False) -> None:
        self._sync.unload_model(model_name, unload_dependents=unload_dependents)
        self._signatures = {k: v for k, v in self._signatures.items() if k[0] != model_name}

    def get_inference_statistics(self, model_name: str = "", model_version: str = "") -> dict[str, Any]:
        """One model's statistics (in a pool, from one pod of its own endpoint), or every model's."""
        target = self._for_model(model_name) if model_name else self
        return dict(target._call("get_inference_statistics", model_name, str(model_version)))

    def register_system_shared_memory(self, name: str, key: str, byte_size: int, offset: int = 0) -> None:
        self._sync.register_system_shared_memory(name, key, byte_size, offset=offset)

    def unregister_system_shared_memory(self, name: str = "") -> None:
        self._sync.unregister_system_shared_memory(name)

    def get_system_shared_memory_status(self, region_name: str = "") -> list[dict[str, Any]]:
        """The registered regions (name, key, offset, byte_size), a list for both protocols."""
        return _regions(self._call("get_system_shared_memory_status", region_name))

    def register_cuda_shared_memory(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int
    ) -> None:
        self._sync.register_cuda_shared_memory(name, raw_handle, device_id, byte_size)

    def unregister_cuda_shared_memory(self, name: str = "") -> None:
        self._sync.unregister_cuda_shared_memory(name)

    def get_cuda_shared_memory_status(self, region_name: str = "") -> list[dict[str, Any]]:
        return _regions(self._call("get_cuda_shared_memory_status", region_name))

    def get_log_settings(self) -> dict[str, Any]:
        return _settings(self._call("get_log_settings"))

    def update_log_settings(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        return _settings(self._call("update_log_settings", dict(settings)))

    def get_trace_settings(self, model_name: str | None = None) -> dict[str, Any]:
        return _settings(self._call("get_trace_settings", model_name=model_name))

    def update_trace_settings(
        self, model_name: str | None = None, settings: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        return _settings(
            self._call("update_trace_settings", model_name=model_name, settings=dict(settings or {}))
        )


def _address(endpoint: str, host: str | None, field: str, where: str) -> str:
    """``endpoint``'s HOST:PORT with ``host`` (``HOST`` or ``HOST:PORT``) in place of its host, or the
    endpoint itself where its host resolves here."""
    if host:
        return host if ":" in host.rsplit("]", 1)[-1] else f"{host}:{endpoint.rsplit(':', 1)[1]}"
    hostname = endpoint.rsplit(":", 1)[0]
    try:
        socket.getaddrinfo(hostname, None)
    except OSError:
        raise ClientError(
            f"{endpoint} ({field} of TritonService {where}) does not resolve "
            "here; from outside the cluster pass host= (a port-forward, an ingress, or the "
            "Service's IP where it is reachable)"
        ) from None
    return endpoint


def _pool_routes(
    configs: Mapping[str, Any],
    pool: Mapping[str, Any],
    protocol: Protocol,
    host: str | Mapping[str, str] | None,
    where: str,
) -> tuple[dict[str, str], dict[str, str]]:
    """Each model of a pooled TritonService: the URL of its own endpoint (status.pool.models[].endpoints,
    its host replaced as ``host`` says), or why it has none yet (not placed, no copy READY, no endpoint
    written, no host to reach it by)."""
    placed = {str(m.get("name")): m for m in pool.get("models") or [] if isinstance(m, Mapping)}
    urls: dict[str, str] = {}
    unserved: dict[str, str] = {}
    for name in configs:
        what = f"model {name!r} of TritonService {where}"
        entry = placed.get(name)
        ready = entry.get("readyCopies") if entry else None
        copies = ready if ready is not None else (entry or {}).get("copies") or 0
        endpoint = ((entry or {}).get("endpoints") or {}).get(protocol)
        if entry is None:
            unserved[name] = f"{what} is not placed yet (status.pool.models has no entry for it)"
        elif not copies:
            reason = f"{entry.get('reason') or 'no reason yet'}: {entry.get('message') or ''}".rstrip(": ")
            state = "has no copy READY on its routes" if ready is not None else "is on no pod"
            unserved[name] = f"{what} {state} yet (status.pool reason {reason})"
        elif not endpoint:
            unserved[name] = f"{what} has no status.pool.models[].endpoints.{protocol} yet"
        elif isinstance(host, Mapping) and name in host:
            urls[name] = f"{protocol}://{_address(str(endpoint), host[name], '', where)}"
        elif isinstance(host, str) and host and protocol == "grpc":
            unserved[name] = (
                f"{what}: gRPC cannot be routed by model through one host ({host}); pass "
                f"host={{{name!r}: 'HOST[:PORT]'}} (e.g. a port-forward to {endpoint.split('.')[0]}), or "
                "use HTTP through a Gateway whose routes send each model's paths to its Service"
            )
        elif isinstance(host, str) and host:
            urls[name] = f"{protocol}://{_address(str(endpoint), host, '', where)}"
        else:
            try:
                field = f"status.pool.models[].endpoints.{protocol} of model {name!r}"
                urls[name] = f"{protocol}://{_address(str(endpoint), None, field, where)}"
            except ClientError as exc:
                unserved[name] = str(exc)
    return urls, unserved


def _unwrap_config(served: Mapping[str, Any]) -> dict[str, Any]:
    """gRPC's as_json answer wraps the config in {"config": ...}; HTTP's is the config."""
    inner = served.get("config")
    return dict(inner) if isinstance(inner, Mapping) and "name" in inner else dict(served)


def _regions(answer: Any) -> list[dict[str, Any]]:
    """Shared memory regions as a list (gRPC's as_json answer is {"regions": {name: region}})."""
    if isinstance(answer, Mapping):
        return [dict(region) for region in (answer.get("regions") or {}).values()]
    return [dict(region) for region in answer]


def _settings(answer: Any) -> dict[str, Any]:
    """Log and trace settings as {name: value} for both protocols, as HTTP gives them (gRPC wraps each
    value: {"settings": {name: {"bool_param"|"uint32_param"|"string_param": v} | {"value": [v, ...]}}};
    only trace_level stays a list)."""
    settings = answer.get("settings") if isinstance(answer, Mapping) else None
    if not isinstance(settings, Mapping):
        return dict(answer)
    out: dict[str, Any] = {}
    for key, wrapped in settings.items():
        if isinstance(wrapped, Mapping) and len(wrapped) == 1:
            (value,) = wrapped.values()
            if isinstance(value, list) and len(value) == 1 and key != "trace_level":
                value = value[0]
            out[key] = value
        else:
            out[key] = wrapped
    return out
