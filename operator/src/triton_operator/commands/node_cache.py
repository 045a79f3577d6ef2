"""`triton-operator node-cache`: the per-node cache of pinned objects (the chart's DaemonSet)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from triton_operator import __version__, logs
from triton_operator.adapters.nodecache.csi import MAX_SOCKET_PATH, CsiPlugin, plugin_sockets
from triton_operator.adapters.nodecache.review import KubeTokenReviewer
from triton_operator.adapters.nodecache.server import NodeCacheServer
from triton_operator.adapters.nodecache.statements import BadKeyError, Signer
from triton_operator.adapters.nodecache.store import ContentStore
from triton_operator.adapters.nodecache.views import LinuxMounter, Views
from triton_operator.core.repository.cache_rules import AUDIENCE
from triton_operator.core.repository.shared_files import DRIVER
from triton_operator.quantities import quantity_bytes

DEFAULT_PORT = 8790
DEFAULT_LEASE_SECONDS = 24 * 3600.0

EPILOG = """\
The cache keeps each object's bytes once under --root, named by the SHA-256 it computed over them,
at most --size-limit bytes of them, and each namespace reaches them only through its own index
(kind/checksum -> SHA-256) written when one of its pods uploaded them. Every caller but /healthz and
/metrics presents its pod's projected ServiceAccount token for --audience, checked by a TokenReview
(the cache's ServiceAccount may create tokenreviews); the API server is found in-cluster or by
$KUBECONFIG. A pod's lease keeps the objects it named for --lease-seconds (at most its token's
life); the least recently used of the rest are evicted to make room. It holds no store credentials.
Metrics (hits, misses, bytes, evictions, refusals) at /metrics on the same port.
"""


def _size(text: str) -> int:
    try:
        value = quantity_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: the size must be above 0")
    return value


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be above 0")
    return value


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number above 0")
    return int(text)


PAGE_REPORTING = Path("/sys/module/page_reporting/parameters")
"""Linux's free page reporting: on a VM whose balloon hands free memory back to its host."""
MAX_REPORTED_ORDER = 10
"""The largest order the buddy allocator frees on x86-64: a page_reporting_order above it reports none."""


def free_page_reporting(folder: Path = PAGE_REPORTING) -> str | None:
    """A sentence for the log when this node's VM hands free memory back to its host (its free page
    reporting on: page_reporting_order at most MAX_REPORTED_ORDER), else None. Pages freed a few
    seconds before (a deleted pod's files) and memory never used since the boot are backed again only
    when written, which a pod's copy and the cache's own writes then pay (docs/operations.md)."""
    try:
        order = int((folder / "page_reporting_order").read_text())
    except (OSError, ValueError):
        return None
    if order > MAX_REPORTED_ORDER:
        return None
    return (
        f"this node hands free memory back to its host (free page reporting, page_reporting_order {order}): "
        "a pod started where another's files were just freed pays for each page it writes "
        "(docs/operations.md, 'A node that hands its free memory back')"
    )


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "node-cache",
        help="serve the node's cache of pinned objects (the node-cache DaemonSet)",
        description="Serve a bounded, content-addressed cache of pinned model objects over HTTP for "
        "the pods syncing on this node.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--root", required=True, type=Path, help="the cache's folder (a hostPath)")
    parser.add_argument("--size-limit", required=True, type=_size, help="the most bytes kept, e.g. 100Gi")
    parser.add_argument(
        "--address",
        default=None,
        help="address to listen on, IPv4 or IPv6 (default: every address of both families)",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument(
        "--lease-seconds",
        type=_positive,
        default=DEFAULT_LEASE_SECONDS,
        help="how long a pod's lease keeps its objects from eviction, at most its token's life "
        "(default 86400)",
    )
    parser.add_argument(
        "--pod-lease-bytes",
        type=_size,
        default=None,
        help="the most bytes one pod's lease may name (default: half of --size-limit)",
    )
    parser.add_argument(
        "--max-connections", type=_count, default=256, help="connections at once (default 256)"
    )
    parser.add_argument(
        "--idle-seconds",
        type=_positive,
        default=15.0,
        help="a connection idle, or stalled in a body, this long is closed (default 15)",
    )
    parser.add_argument(
        "--audit-seconds",
        type=_positive,
        default=60.0,
        help="how often each lease's token is reviewed again (default 60)",
    )
    parser.add_argument("--audience", default=AUDIENCE, help=f"the tokens' audience (default {AUDIENCE})")
    parser.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME", ""),
        help="this node's name: a token of a pod on another node is refused (default $NODE_NAME)",
    )
    parser.add_argument(
        "--signing-key",
        type=Path,
        default=os.environ.get("TRITON_NODE_CACHE_SIGNING_KEY") or None,
        help="an Ed25519 private key (PEM, or base64 of its 32 bytes): each lease answer then carries, "
        "for every held object, its SHA-256 and its BLAKE3 signed for the pod, which a pod given the "
        "public key checks instead of its pin (default $TRITON_NODE_CACHE_SIGNING_KEY; none: no "
        "statements)",
    )
    parser.add_argument(
        "--shared-files",
        type=Path,
        default=None,
        metavar="KUBELET_ROOT",
        help=f"also serve pods read-only views of their leased blobs as the CSI driver {DRIVER} "
        "(ephemeral inline volumes), registered with the kubelet whose --root-dir this is (usually "
        "/var/lib/kubelet; needs root and --node-name; default: off)",
    )
    parser.add_argument(
        "--one-download",
        action="store_true",
        help="pods of a namespace starting together read an object the node lacks from their store once: "
        "the first pod's lease claims it and the others wait for its upload (fewer bytes from the store; "
        "the waiting pods get it after that upload and its check; default: off, each reads its store)",
    )
    parser.add_argument("--log-level", default="INFO", help="Python logging level (default INFO)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        fmt = logs.log_format()
    except logs.LogFormatError as exc:  # a bad setting stops the process, naming the variable
        print(f"triton-operator node-cache: error: {exc}", file=sys.stderr)
        return 2
    logs.configure("node-cache", fmt, level=args.log_level.upper())
    signer = None
    if args.signing_key is not None:
        try:
            signer = Signer.from_file(args.signing_key)
        except BadKeyError as exc:  # a bad setting stops the process, naming it
            print(f"triton-operator node-cache: error: --signing-key {exc}", file=sys.stderr)
            return 2
    if args.shared_files is not None and not args.node_name:
        print(
            "triton-operator node-cache: error: --shared-files needs --node-name ($NODE_NAME)",
            file=sys.stderr,
        )
        return 2
    longest = plugin_sockets(args.shared_files)[0] if args.shared_files is not None else None
    if longest is not None and len(str(longest)) > MAX_SOCKET_PATH:
        print(
            f"triton-operator node-cache: error: --shared-files {args.shared_files}: the plugin's socket "
            f"{longest} would be longer than a unix socket's {MAX_SOCKET_PATH} bytes",
            file=sys.stderr,
        )
        return 2
    if args.shared_files is not None and not args.shared_files.is_dir():
        print(
            f"triton-operator node-cache: error: --shared-files {args.shared_files}: not a folder "
            "(the kubelet's --root-dir)",
            file=sys.stderr,
        )
        return 2
    try:
        reviewer = KubeTokenReviewer()
    except Exception as exc:  # lightkube's ConfigError: no in-cluster config, no $KUBECONFIG
        print(
            f"triton-operator node-cache: error: no API server to review tokens with ({exc}); "
            "run it in the cluster or set KUBECONFIG",
            file=sys.stderr,
        )
        return 1
    try:
        store = ContentStore(
            args.root, args.size_limit, args.lease_seconds, pod_lease_bytes=args.pod_lease_bytes
        )
    except OSError as exc:
        print(f"triton-operator node-cache: error: {exc}", file=sys.stderr)
        return 1
    views = Views(args.root, store, LinuxMounter()) if args.shared_files is not None else None
    server = NodeCacheServer(
        store,
        reviewer,
        audience=args.audience,
        node=args.node_name,
        max_connections=args.max_connections,
        idle_seconds=args.idle_seconds,
        audit_seconds=args.audit_seconds,
        signer=signer,
        views=views,
        one_download=args.one_download,
    )
    if signer is not None:
        logging.info("node cache: signing statements; its public key is %s", signer.public_key())
    return asyncio.run(_serve(server, args))


async def _serve(server: NodeCacheServer, args: argparse.Namespace) -> int:
    plugin = None
    if server.views is not None:
        plugin = CsiPlugin(server.views, args.node_name, args.shared_files, __version__)
    try:
        port = await server.start(args.address, args.port)
        if plugin is not None:
            await plugin.start()
    except (OSError, RuntimeError) as exc:  # grpc's bind failure is a RuntimeError
        print(f"triton-operator node-cache: error: {exc}", file=sys.stderr)
        await server.stop()
        return 1
    objects, used, _ = server.store.figures()
    logging.info(
        "node cache at %s port %s: %s objects, %s of %s bytes",
        args.address or "every address",
        port,
        objects,
        used,
        args.size_limit,
    )
    reporting = free_page_reporting()
    if reporting is not None:
        logging.info("node cache: %s", reporting)
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopped.set)
    await stopped.wait()
    if plugin is not None:
        await plugin.stop()
    await server.stop()
    return 0
