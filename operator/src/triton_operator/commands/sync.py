"""`triton-operator sync`: fetch a revision's pinned models, verified (old-shape pods' init container)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import gc
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from triton_operator import logs
from triton_operator.adapters.nodecache.client import NodeCacheClient
from triton_operator.adapters.redaction import install_log_redaction
from triton_operator.adapters.storage import open_store
from triton_operator.adapters.storage.base import ObjectChanged, StoreConfigError, StoreError
from triton_operator.adapters.sync.download import VERIFY_MODES, SyncOptions, sync
from triton_operator.adapters.sync.progress import Progress
from triton_operator.adapters.sync.results import ChecksumMismatch, NoSpace, SyncError, UnsafeDestination
from triton_operator.core.pod.startup import TERMINATION_MESSAGE_MAX, format_summary
from triton_operator.core.repository.cache_rules import HOST_ENV, POD_ENV, PORT_ENV
from triton_operator.core.repository.manifest import (
    Manifest,
    ManifestError,
    SelectionFailed,
    manifest_from_json,
)
from triton_operator.core.repository.manifestparts import ordered, part_index, unpack
from triton_operator.core.repository.shared_files import FILES_ENV
from triton_operator.core.spec.field_error import ModelConfigError
from triton_operator.quantities import quantity_bytes

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CHANGED = 3
EXIT_MISMATCH = 4
EXIT_STORE = 5
EXIT_UNSAFE = 6
EXIT_NO_SPACE = 7

TERMINATION_LOG = Path("/dev/termination-log")
"""Where Kubernetes reads a container's termination message (terminationMessagePath's default)."""

# Environment variables read as credentials (the pod mounts the credentials Secret as env).
CREDENTIAL_VARS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "GOOGLE_APPLICATION_CREDENTIALS_JSON",
    "STORAGE_EMULATOR_HOST",
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_STORAGE_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
)

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "ki": 1024,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mi": 1024**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gi": 1024**3,
    "gib": 1024**3,
}

EPILOG = """\
exit status: 0 synced; 1 other failure; 2 bad arguments or manifest; 3 an object changed since it
was pinned; 4 a size or checksum did not match; 5 the store refused or failed (access denied,
missing bucket, unavailable); 6 something unsafe in the destination (a symlink where a file goes);
7 the files do not fit the destination volume (checked before anything is written: the message
names the bytes needed and free).
On success a one-line summary (objects, bytes fetched from the store and already present, seconds;
with the node cache, its hits and misses: bytes it gave count as already present), on failure the
one-line reason, is also written to --termination-log when that file exists, so that
Kubernetes shows it as the container's termination message (the operator reads the summary into
status.timeToServe, the reason into Degraded).
Credentials come from the environment: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY[/AWS_SESSION_TOKEN],
GOOGLE_APPLICATION_CREDENTIALS_JSON, AZURE_STORAGE_CONNECTION_STRING (or AZURE_STORAGE_KEY,
AZURE_STORAGE_SAS_TOKEN); none of them means the platform identity (IRSA, workload identity).
With S3 keys and an endpoint, the reads are signed and sent by sync itself; boto3 reads instead when
the environment holds another AWS_* setting, a *_PROXY or an ~/.aws/config (which boto3 honours).
The node cache (`triton-operator node-cache` on the pod's node, found through TRITON_NODE_CACHE_HOST
and TRITON_NODE_CACHE_PORT, which the operator sets when it is on) is read first; every byte it
gives is checked against the pinned checksum, and what the store gives is offered to it.
"""


def parse_size(text: str) -> int:
    """``64MiB``, ``8M``, ``1GiB``, ``1048576`` -> bytes (``M`` is 10^6, ``Mi``/``MiB`` 2^20)."""
    match = re.fullmatch(r"\s*([0-9]+)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 64MiB, 8M or 1048576")
    value = int(match.group(1)) * _UNITS[match.group(2).lower()]
    if value < 1024 * 1024:
        raise argparse.ArgumentTypeError(f"{text!r}: the part size must be at least 1MiB")
    return value


def volume_limit(text: str) -> int:
    try:
        return quantity_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1 or value > 256:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer from 1 to 256")
    return value


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "sync",
        help="fetch a revision's pinned model files (the pod's init container)",
        description="Download the objects a pinned manifest names, in parallel, verify sizes and "
        "checksums, and lay out a Triton model repository with the rendered config.pbtxt files.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--manifest",
        required=True,
        type=Path,
        help="the pinned manifest: a JSON file, or a folder of its gzipped parts manifest.json.gz.NNN",
    )
    parser.add_argument(
        "--configs", type=Path, default=None, help="folder of rendered configs: <model>/config.pbtxt"
    )
    parser.add_argument("--dest", required=True, type=Path, help="the model repository to fill (/models)")
    add_fetch_arguments(parser)
    parser.set_defaults(func=run)


def add_fetch_arguments(parser: argparse.ArgumentParser) -> None:
    """How the objects are fetched and where failures go: shared by `sync` and `agent`."""
    parser.add_argument(
        "--cache", type=Path, default=None, help="content-addressed cache folder: <cache>/<kind>/<checksum>"
    )
    parser.add_argument(
        "--node-cache",
        default=None,
        metavar="URL",
        help="the node cache (http://host:port), read before the store and given what the store gave; "
        f"default: http://${HOST_ENV}:${PORT_ENV} when both are set. Every byte it gives is checked; "
        "a cache that is down only means reading the store",
    )
    parser.add_argument(
        "--node-cache-upload-seconds",
        type=float,
        default=300.0,
        help="how long to wait at the end for the uploads to the node cache (default 300)",
    )
    parser.add_argument("--concurrency", type=_positive, default=16, help="parallel reads (default 16)")
    parser.add_argument(
        "--part-size",
        type=parse_size,
        default=64 * 1024 * 1024,
        help="objects bigger than this are read in ranged parts of this size (default 64MiB)",
    )
    parser.add_argument(
        "--verify",
        choices=VERIFY_MODES,
        default="fast",
        help="how bytes read from the store are checked: fast (default) checks a file read in ranged parts "
        "by the store's own CRC32C/CRC32 of the pinned object where it keeps one (read on the condition "
        "of the pinned ETag/version), else by the pinned digest; digest always checks the pinned "
        "digest (MD5, SHA-1, SHA-256, S3 multipart ETag)",
    )
    parser.add_argument(
        "--pvc-root", type=Path, default=None, help="where the pvc:// claim is mounted (unpinned manifests)"
    )
    parser.add_argument(
        "--volume-limit",
        type=volume_limit,
        default=None,
        help="the destination volume's size limit (an emptyDir's sizeLimit, e.g. 20Gi): the files must fit "
        "under it as well as in the filesystem's free space",
    )
    parser.add_argument(
        "--termination-log",
        type=Path,
        default=TERMINATION_LOG,
        help="write the summary (or, on failure, the reason) here if the file exists "
        "(default /dev/termination-log)",
    )
    parser.add_argument(
        "--progress",
        choices=("auto", "bar", "json"),
        default="auto",
        help="a progress bar on a terminal, JSON lines otherwise (default auto)",
    )


def read_manifest_bytes(path: Path) -> bytes:
    """The manifest's JSON at ``path``: a file of plain JSON, or a folder of the gzipped parts
    (manifest.json.gz.000, .001, ...) that a revision's ConfigMaps hold, as the pod mounts them."""
    if not path.is_dir():
        return path.read_bytes()
    parts = {}
    for child in path.iterdir():
        index = part_index(child.name)
        if index is not None:
            parts[index] = child.read_bytes()
    if not parts:
        raise ManifestError("manifest", "the folder holds no manifest.json.gz.NNN parts")
    return unpack(ordered(parts))


def load_manifest(path: Path) -> Manifest:
    return manifest_from_json(read_manifest_bytes(path))


def credentials_from_env(env: Any = None) -> dict[str, str]:
    env = os.environ if env is None else env
    return {k: env[k] for k in CREDENTIAL_VARS if env.get(k)}


def node_cache_url(arg: str | None, env: Any = None) -> str | None:
    """--node-cache, else http://$TRITON_NODE_CACHE_HOST:$TRITON_NODE_CACHE_PORT, else None."""
    env = os.environ if env is None else env
    if arg:
        return arg
    host, port = env.get(HOST_ENV, "").strip(), env.get(PORT_ENV, "").strip()
    if not host or not port:
        return None
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def node_cache_pod(env: Any = None) -> str:
    """Who asks the node cache: the pod's uid ($TRITON_NODE_CACHE_POD), else the host name."""
    env = os.environ if env is None else env
    return str(env.get(POD_ENV) or os.uname().nodename)


def run(args: argparse.Namespace) -> int:
    # The container's log is read by whoever may read the pod's: an SDK's warning (a retried
    # request's URL with its SAS signature) must not show the credentials it was given.
    install_log_redaction()
    started = time.monotonic()
    try:
        fmt = logs.log_format()
    except logs.LogFormatError as exc:  # a bad setting stops the process, naming the variable
        print(f"triton-operator sync: error: {exc}", file=sys.stderr)
        write_termination_log(args.termination_log, str(exc))
        return EXIT_USAGE
    if fmt == "json":  # an SDK's warnings as JSON lines too (text: Python's default, as before)
        logs.configure("sync", fmt, level=logging.WARNING)
    tty = {"auto": None, "bar": True, "json": False}[args.progress]
    stream = sys.stderr if (tty or (tty is None and sys.stderr.isatty())) else sys.stdout
    progress = Progress(stream, tty=tty if tty is not None else stream.isatty())

    def fail(code: int, message: str) -> int:
        progress.error(message)
        text = f"triton-operator sync: error: {message}"
        print(logs.line("sync", fmt, text, exitCode=code), file=sys.stderr)
        write_termination_log(args.termination_log, message)
        return code

    try:
        manifest = load_manifest(args.manifest)
    except OSError as exc:
        return fail(EXIT_USAGE, f"--manifest {args.manifest}: {exc.strerror or exc}")
    except ManifestError as exc:
        return fail(EXIT_USAGE, f"--manifest {args.manifest}: {exc}")
    if args.configs is not None and not args.configs.is_dir():
        return fail(EXIT_USAGE, f"--configs {args.configs}: not a folder")
    url = node_cache_url(args.node_cache)
    node_cache = None
    if url is not None and manifest.pinned:
        try:
            node_cache = NodeCacheClient(url, node_cache_pod())
        except ValueError as exc:
            return fail(EXIT_USAGE, f"--node-cache: {exc}")
    options = SyncOptions(
        dest=args.dest,
        configs=args.configs,
        cache=args.cache,
        concurrency=args.concurrency,
        part_size=args.part_size,
        pvc_root=args.pvc_root,
        volume_limit=args.volume_limit,
        source=node_cache,
        shared_dir=os.environ.get(FILES_ENV, ""),
        verify=args.verify,
    )
    store = None
    try:
        if manifest.pinned:
            store = open_store(
                manifest.repository,
                credentials_from_env(),
                pvc_root=args.pvc_root,
                max_connections=args.concurrency,
                reads_only=True,
            )
        # What is loaded by now (the modules, a store's SDK where it has one, the manifest) lives
        # until the process ends: the collector stops walking it in every full collection the
        # download's objects set off.
        gc.freeze()
        stats = sync(manifest, store, options, progress)
    except Exception as exc:
        failure = sync_failure(exc, args.dest)
        if failure is None:
            raise
        return fail(*failure)
    finally:
        if store is not None:
            store.close()
        if node_cache is not None:
            node_cache.close(args.node_cache_upload_seconds)
    summary = format_summary(
        stats.files,
        stats.downloaded_bytes,
        stats.bytes - stats.downloaded_bytes,
        time.monotonic() - started,
        node_cache=(stats.source_hits, stats.source_misses) if node_cache is not None else None,
        vouched=stats.vouched_files,
        shared=stats.shared_files,
    )
    write_termination_log(args.termination_log, summary)
    return EXIT_OK


def sync_failure(exc: BaseException, dest: Path) -> tuple[int, str] | None:
    """The exit status and one-line reason of what a sync raised (EPILOG); None for anything else."""
    if isinstance(exc, ObjectChanged):
        return EXIT_CHANGED, str(exc)
    if isinstance(exc, ChecksumMismatch):
        return EXIT_MISMATCH, str(exc)
    if isinstance(exc, UnsafeDestination):
        return EXIT_UNSAFE, str(exc)
    if isinstance(exc, NoSpace):
        return EXIT_NO_SPACE, str(exc)
    if isinstance(exc, StoreConfigError | ModelConfigError):
        return EXIT_USAGE, str(exc)
    if isinstance(exc, StoreError):
        return EXIT_STORE, str(exc)
    if isinstance(exc, SyncError | SelectionFailed):
        return EXIT_FAILED, str(exc)
    if isinstance(exc, OSError):
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            # Something else filled the volume after the space check (or it reported too much free).
            return EXIT_NO_SPACE, f"{dest}: the volume ran out of space while writing: {exc.strerror}"
        return EXIT_FAILED, f"{exc.filename or ''}: {exc.strerror or exc}"
    return None


def write_termination_log(path: Path | None, message: str) -> None:
    """The summary or the failure's one line, where Kubernetes keeps it as the termination message
    (at most 4096 bytes of it); only into a file that exists (kubelet makes it in a pod: sync run by
    hand writes nothing under /dev)."""
    if path is None or not path.is_file():
        return
    # Cut to Kubernetes' limit in bytes, never in the middle of a character.
    data = f"{message}\n".encode()[:TERMINATION_MESSAGE_MAX].decode(errors="ignore").encode()
    with contextlib.suppress(OSError):
        path.write_bytes(data)
