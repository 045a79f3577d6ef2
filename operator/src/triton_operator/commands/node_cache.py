"""`triton-operator node-cache`: the per-node cache of pinned objects (the chart's DaemonSet)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from triton_operator import logs
from triton_operator.adapters.nodecache.server import serve
from triton_operator.adapters.nodecache.store import ContentStore
from triton_operator.quantities import quantity_bytes

DEFAULT_PORT = 8790
DEFAULT_LEASE_SECONDS = 24 * 3600.0

EPILOG = """\
The cache keeps objects by content (sha256, sha1 or md5 of their bytes) under --root, at most
--size-limit bytes of them. Pods syncing on the node read from it first, and upload what they read
from their store; the cache checks each upload against its digest before it keeps it, and each
object again as it serves it. It holds no store credentials. A pod's lease keeps the objects it
named for --lease-seconds; the least recently used of the rest are evicted to make room.
Metrics (hits, misses, bytes, evictions, refused uploads) at /metrics on the same port.
"""


def _size(text: str) -> int:
    try:
        value = quantity_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: the size limit must be above 0")
    return value


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
    parser.add_argument("--address", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument(
        "--lease-seconds",
        type=float,
        default=DEFAULT_LEASE_SECONDS,
        help="how long a pod's lease keeps its objects from eviction (default 86400)",
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
    try:
        store = ContentStore(args.root, args.size_limit, args.lease_seconds)
        server = serve((args.address, args.port), store)
    except OSError as exc:
        print(f"triton-operator node-cache: error: {exc}", file=sys.stderr)
        return 1
    objects, used, _ = store.figures()
    logging.info(
        "node cache at %s:%s: %s objects, %s of %s bytes",
        args.address,
        server.server_address[1],
        objects,
        used,
        args.size_limit,
    )

    def on_signal(signum: int, frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0
