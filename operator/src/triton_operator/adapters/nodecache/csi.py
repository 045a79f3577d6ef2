"""The node cache's CSI node plugin: CSI's Identity and Node services and the kubelet's registration.

Both are served over unix sockets in the kubelet's folders.

Only the messages and fields the plugin reads or writes are declared (the CSI spec's package
``csi.v1`` and the kubelet's ``pluginregistration``, with their field numbers): protobuf keeps the
rest of a request as unknown fields, and an answer's absent fields are their defaults.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from triton_operator.adapters.nodecache.views import Views
from triton_operator.core.repository.shared_files import DRIVER

log = logging.getLogger(__name__)

CSI_VERSION = "1.0.0"
_STRING = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
_BOOL = descriptor_pb2.FieldDescriptorProto.TYPE_BOOL
_REPEATED = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
_OPTIONAL = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
_MESSAGE = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE

# message name -> fields: (name, number, "string" | "bool" | "map" | "repeated string")
_CSI: dict[str, tuple[tuple[str, int, str], ...]] = {
    "GetPluginInfoRequest": (),
    "GetPluginInfoResponse": (("name", 1, "string"), ("vendor_version", 2, "string")),
    "GetPluginCapabilitiesRequest": (),
    "GetPluginCapabilitiesResponse": (),
    "ProbeRequest": (),
    "ProbeResponse": (),
    "NodeGetInfoRequest": (),
    "NodeGetInfoResponse": (("node_id", 1, "string"),),
    "NodeGetCapabilitiesRequest": (),
    "NodeGetCapabilitiesResponse": (),
    "NodePublishVolumeRequest": (
        ("volume_id", 1, "string"),
        ("target_path", 4, "string"),
        ("readonly", 6, "bool"),
        ("volume_context", 8, "map"),
    ),
    "NodePublishVolumeResponse": (),
    "NodeUnpublishVolumeRequest": (("volume_id", 1, "string"), ("target_path", 2, "string")),
    "NodeUnpublishVolumeResponse": (),
}
_REGISTRATION: dict[str, tuple[tuple[str, int, str], ...]] = {
    "InfoRequest": (),
    "PluginInfo": (
        ("type", 1, "string"),
        ("name", 2, "string"),
        ("endpoint", 3, "string"),
        ("supported_versions", 4, "repeated string"),
    ),
    "RegistrationStatus": (("plugin_registered", 1, "bool"), ("error", 2, "string")),
    "RegistrationStatusResponse": (),
}


def _file(name: str, package: str, messages: dict[str, tuple[tuple[str, int, str], ...]]) -> Any:
    proto = descriptor_pb2.FileDescriptorProto(name=name, package=package, syntax="proto3")
    for message, fields in messages.items():
        m = proto.message_type.add(name=message)
        for field, number, kind in fields:
            f = m.field.add(name=field, number=number, json_name=field)
            if kind == "map":
                entry = m.nested_type.add(name="".join(w.title() for w in field.split("_")) + "Entry")
                entry.options.map_entry = True
                entry.field.add(name="key", number=1, type=_STRING, label=_OPTIONAL)
                entry.field.add(name="value", number=2, type=_STRING, label=_OPTIONAL)
                f.type, f.label, f.type_name = _MESSAGE, _REPEATED, f".{package}.{message}.{entry.name}"
            elif kind == "repeated string":
                f.type, f.label = _STRING, _REPEATED
            else:
                f.type, f.label = (_BOOL if kind == "bool" else _STRING), _OPTIONAL
    return proto


_POOL = descriptor_pool.DescriptorPool()
_FILES = [
    _file("triton_operator/csi_node.proto", "csi.v1", _CSI),
    _file("triton_operator/pluginregistration.proto", "pluginregistration", _REGISTRATION),
]
for _proto in _FILES:
    _POOL.Add(_proto)
MESSAGES: dict[str, Any] = message_factory.GetMessages(_FILES, pool=_POOL)
"""Message classes by full name (``csi.v1.NodePublishVolumeRequest``)."""


def _unary(package: str, request: str, answer: Callable[[Any, grpc.aio.ServicerContext], Any]) -> Any:
    in_cls = MESSAGES[f"{package}.{request}"]
    return grpc.unary_unary_rpc_method_handler(
        answer,
        request_deserializer=in_cls.FromString,
        response_serializer=lambda m: m.SerializeToString(),
    )


SOCKETS_NAME = "triton-node-cache"
"""The CSI socket's folder under <kubelet>/plugins, and the registration socket's name under
<kubelet>/plugins_registry; short, since a unix socket's path is at most MAX_SOCKET_PATH bytes."""
MAX_SOCKET_PATH = 107


def plugin_sockets(kubelet_root: Path) -> tuple[Path, Path]:
    """The plugin's sockets for the kubelet whose --root-dir is ``kubelet_root``: the CSI one (the
    longer), then the kubelet's registration one."""
    return (
        kubelet_root / "plugins" / SOCKETS_NAME / "csi.sock",
        kubelet_root / "plugins_registry" / f"{SOCKETS_NAME}.sock",
    )


class CsiPlugin:
    """The plugin for ``views``, registered with the kubelet whose --root-dir is ``kubelet_root``:
    its sockets are ``plugin_sockets`` (the CSI one in a folder of mode 0700); ``node`` is what
    NodeGetInfo answers."""

    def __init__(self, views: Views, node: str, kubelet_root: Path, version: str) -> None:
        self.views = views
        self.node = node
        self.version = version
        self.endpoint, self.registration = plugin_sockets(kubelet_root)
        self.registered: bool | None = None
        self._servers: list[grpc.aio.Server] = []

    # ------------------------------------------------------------ CSI

    async def _plugin_info(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return MESSAGES["csi.v1.GetPluginInfoResponse"](name=DRIVER, vendor_version=self.version)

    async def _node_info(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return MESSAGES["csi.v1.NodeGetInfoResponse"](node_id=self.node)

    async def _publish(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        context_map = dict(request.volume_context)
        await self._on_views(context, "mounting", self.views.publish, context_map, request.target_path)
        return MESSAGES["csi.v1.NodePublishVolumeResponse"]()

    async def _unpublish(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._on_views(context, "unmounting", self.views.unpublish, request.target_path)
        return MESSAGES["csi.v1.NodeUnpublishVolumeResponse"]()

    async def _on_views(
        self, context: grpc.aio.ServicerContext, what: str, call: Callable[..., None], *args: Any
    ) -> None:
        """``call(*args)`` on a thread; a call naming no pod (ValueError) is refused as an invalid
        argument, a mount that failed (OSError) is an internal error (the kubelet retries both)."""
        try:
            await asyncio.to_thread(call, *args)
        except ValueError as refused:
            log.warning("node cache: %s a view refused: %s", what, refused)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(refused))
        except OSError as failed:
            log.error("node cache: %s a view failed: %s", what, failed)
            await context.abort(grpc.StatusCode.INTERNAL, f"{what} the view failed: {failed}")

    # ------------------------------------------------------------ registration

    async def _info(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return MESSAGES["pluginregistration.PluginInfo"](
            type="CSIPlugin", name=DRIVER, endpoint=str(self.endpoint), supported_versions=[CSI_VERSION]
        )

    async def _status(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.registered = bool(request.plugin_registered)
        if self.registered:
            log.info("node cache: the kubelet registered %s", DRIVER)
        else:
            log.error("node cache: the kubelet did not register %s: %s", DRIVER, request.error)
        return MESSAGES["pluginregistration.RegistrationStatusResponse"]()

    def _handlers(self) -> list[Any]:
        def empty(name: str) -> Callable[[Any, grpc.aio.ServicerContext], Any]:
            async def answer(request: Any, context: grpc.aio.ServicerContext) -> Any:
                return MESSAGES[name]()

            return answer  # a coroutine function: grpc.aio awaits it

        identity = {
            "GetPluginInfo": _unary("csi.v1", "GetPluginInfoRequest", self._plugin_info),
            "GetPluginCapabilities": _unary(
                "csi.v1", "GetPluginCapabilitiesRequest", empty("csi.v1.GetPluginCapabilitiesResponse")
            ),
            "Probe": _unary("csi.v1", "ProbeRequest", empty("csi.v1.ProbeResponse")),
        }
        node = {
            "NodeGetInfo": _unary("csi.v1", "NodeGetInfoRequest", self._node_info),
            "NodeGetCapabilities": _unary(
                "csi.v1", "NodeGetCapabilitiesRequest", empty("csi.v1.NodeGetCapabilitiesResponse")
            ),
            "NodePublishVolume": _unary("csi.v1", "NodePublishVolumeRequest", self._publish),
            "NodeUnpublishVolume": _unary("csi.v1", "NodeUnpublishVolumeRequest", self._unpublish),
        }
        return [
            grpc.method_handlers_generic_handler("csi.v1.Identity", identity),
            grpc.method_handlers_generic_handler("csi.v1.Node", node),
        ]

    def _registration_handlers(self) -> list[Any]:
        return [
            grpc.method_handlers_generic_handler(
                "pluginregistration.Registration",
                {
                    "GetInfo": _unary("pluginregistration", "InfoRequest", self._info),
                    "NotifyRegistrationStatus": _unary(
                        "pluginregistration", "RegistrationStatus", self._status
                    ),
                },
            )
        ]

    async def start(self) -> None:
        """Serve CSI, then offer the plugin to the kubelet (its registration socket last: the
        kubelet calls the CSI socket as soon as it sees it)."""
        kept, removed = await asyncio.to_thread(self.views.sweep)
        if kept or removed:
            log.info("node cache: views kept %s, removed %s (their pods gone)", kept, removed)
        for folder in (self.endpoint.parent, self.registration.parent):
            folder.mkdir(parents=True, exist_ok=True)
        self.endpoint.parent.chmod(0o700)
        for path, handlers in (
            (self.endpoint, self._handlers()),
            (self.registration, self._registration_handlers()),
        ):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            server = grpc.aio.server(
                maximum_concurrent_rpcs=16, options=[("grpc.max_receive_message_length", 1 << 20)]
            )
            server.add_generic_rpc_handlers(handlers)
            server.add_insecure_port(f"unix://{path}")
            await server.start()
            os.chmod(path, 0o600)
            self._servers.append(server)

    async def stop(self) -> None:
        for server in reversed(self._servers):
            await server.stop(grace=1.0)
        self._servers.clear()
        with contextlib.suppress(FileNotFoundError):
            self.registration.unlink()
