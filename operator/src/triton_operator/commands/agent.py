"""`triton-operator agent`: the pod's model agent, for in-place model updates (init container and sidecar)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from triton_operator import logs
from triton_operator.adapters.agent.files import read_text
from triton_operator.adapters.agent.gpu_metrics import DEFAULT_INTERVAL, GpuMetrics, check_url
from triton_operator.adapters.agent.leaving import note_pid
from triton_operator.adapters.agent.model_control import ModelControl
from triton_operator.adapters.agent.pool_member import PoolMember, wait_loop
from triton_operator.adapters.agent.runner import Agent, AgentOptions, FillFailed
from triton_operator.adapters.agent.status import HEAD_LIMIT, Limits, StatusServer, parse_listen
from triton_operator.adapters.nodecache.client import NodeCacheClient
from triton_operator.adapters.redaction import install_log_redaction
from triton_operator.adapters.sync.progress import Progress
from triton_operator.commands.argtypes import seconds
from triton_operator.commands.sync import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    add_fetch_arguments,
    credentials_from_env,
    node_cache_pod,
    node_cache_url,
    read_manifest_bytes,
    sync_failure,
    write_termination_log,
)
from triton_operator.core.objects.names import (
    AGENT_PID_FILE,
    AGENT_PORT,
    AGENT_READY_PATH,
    AGENT_STATE_DIR,
    AGENT_STATUS_PATH,
    HTTP_PORT,
    INPLACE_DIR,
    INPLACE_TARGET_FILE,
    METRICS_PORT,
    MODELS_DIR,
)
from triton_operator.core.pod.agent_plan import RevisionFiles
from triton_operator.core.pod.startup import format_summary
from triton_operator.core.repository.manifest import CONFIG_FILE, ManifestError, manifest_from_json

EPILOG = f"""\
With --once (the pod's init container): the target revision is synced into --dest exactly as
`triton-operator sync` does, recorded in --state-dir, and the exit status and termination message
are sync's (see `triton-operator sync --help`).
Without --once (the sidecar): every --interval seconds the target is resolved again; when it differs
from the revision applied, only the changed objects are fetched (verified, atomic) while the pod still
serves, the changed config.pbtxt files written, removed models deleted; then the pod leaves its
Service (readiness false, state Draining): with --probe-failures N, until the agent has answered
the kubelet's readiness probe 503 N times in a row (at most --drain-timeout), then --drain-seconds;
without, for --drain-seconds. Then the changed and removed models are unloaded and the changed and
added ones loaded through Triton's model control API (--triton, loopback), and readiness comes back
once every model of the target is READY. A failed load leaves the state Failed with Triton's
message, the pod out of its Service, and is not tried again until the target changes.
The status is served read-only at GET http://<--listen>{AGENT_STATUS_PATH}; the pod's readiness at
GET http://<--listen>{AGENT_READY_PATH} (200 only when every model of the revision it serves is READY
by Triton's repository index and its per-model ready endpoint, with no Python backend stub process of
it gone; 503 with the reason otherwise), checked every {{models}} s. The port serves
--max-connections connections at once, one request each, plus one kept for the kubelet's probe;
one more is answered 503 at once, and a request's head must arrive within --header-seconds.
With --triton-starts-empty (every pod of a revision made since one pod shape; tritonserver started
with no model): the sidecar fills --dest itself in one sync, model by model (the models whose load
outlasts their download first; each file verified, from the node cache first), and loads each model
as soon as its bytes are in (an ensemble once its steps are loaded; two loads at once) while the next
one downloads; readiness comes once every model is READY. When that
first fill fails (a sync error, or a model Triton refuses to load), the sidecar exits with sync's exit
status (1 for a load) and the reason as its termination message, naming the model; its restart tries
again. Should tritonserver restart later (it starts with no model), the sidecar loads its models again.
With --pool-assignment (a pod of a pool): the sidecar loads exactly the models the pod's assignment
annotation names (a downwardAPI file; each fetched verified from the node cache first, then loaded),
unloads the ones no longer named, tries a failed load again only when the operator raises its
attempt, and reports each model at GET http://<--listen>/v1/pool; ready once the operator's first
assignment is loaded (each model READY or failed), then while tritonserver holds what it had READY
(docs/pool.md).
The target: the pod's annotation (--target-file) when it names `next` or `stable` of the in-place
ConfigMap's state.json (--inplace-dir) and that revision's files are there; else `stable`; else the
base revision (--manifest and --configs, the pod's own). With --target-file in --inplace-dir (one
projected volume) both are read from one payload of the volume.
"""


MODELS_SECONDS = 1.0
"""How often the sidecar asks Triton for its models' states (the status and the readiness); the
target, a file, is looked at every --interval."""
EPILOG = EPILOG.replace("{models}", f"{MODELS_SECONDS:g}")

BASE = "base"
"""The base revision's name when --base-revision is empty (a pod template rendered with no revision)."""


def _listen(text: str) -> str:
    try:
        parse_listen(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _metrics_url(text: str) -> str:
    try:
        return check_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high``."""

    def parse(text: str) -> int:
        value = int(text) if text.strip().isdigit() else -1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} must be a whole number from {low} to {high}")
        return value

    return parse


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "agent",
        help="keep a pod's models at its target revision in place (init container with --once, sidecar)",
        description="The pod's model agent for in-place model updates: syncs the revision the pod should "
        "serve into the model repository and loads what changed through Triton's model control API.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--manifest",
        type=Path,
        required=True,
        help="the base revision's pinned manifest: a JSON file, or a folder of its gzipped parts",
    )
    parser.add_argument(
        "--configs",
        type=Path,
        required=True,
        help="the base revision's rendered configs: <model>/config.pbtxt",
    )
    parser.add_argument(
        "--base-revision",
        required=True,
        help=f"the name of the pod's own (base) revision (empty: {BASE!r})",
    )
    parser.add_argument(
        "--dest", type=Path, default=Path(MODELS_DIR), help=f"the model repository ({MODELS_DIR})"
    )
    parser.add_argument(
        "--inplace-dir",
        type=Path,
        default=Path(INPLACE_DIR),
        help=f"the in-place ConfigMap's mount ({INPLACE_DIR})",
    )
    parser.add_argument(
        "--target-file",
        type=Path,
        default=Path(INPLACE_TARGET_FILE),
        help=f"the pod's target annotation as a downwardAPI file ({INPLACE_TARGET_FILE}: in the "
        "in-place volume, read from the same payload as state.json)",
    )
    parser.add_argument(
        "--drain-seconds",
        type=seconds(0, 3600),
        default=0.0,
        help="seconds the pod stays out of its Service (readiness false) before a model is unloaded or "
        "loaded: with --probe-failures, after the probe's failures (the spec's drainSeconds: the "
        "endpoints catching up); without, from the moment readiness went false (the readiness probe's "
        "period x failureThreshold plus a margin); the operator passes it",
    )
    parser.add_argument(
        "--probe-failures",
        type=_count(0, 100),
        default=0,
        help="the readiness probe's failureThreshold: before a model is unloaded or loaded, wait until "
        "the kubelet's probe (User-Agent kube-probe/...) has been answered 503 that many times in a row, "
        "then --drain-seconds (the endpoints catching up); 0 (default): --drain-seconds from the moment "
        "readiness went false",
    )
    parser.add_argument(
        "--drain-timeout",
        type=seconds(1, 3600),
        default=60.0,
        help="with --probe-failures: the most seconds to wait for those probe failures; past it the "
        "agent logs a warning, says so in its status message and goes on after --drain-seconds "
        "(default 60)",
    )
    parser.add_argument(
        "--max-connections",
        type=_count(1, 1024),
        default=16,
        help="connections the status port serves at once (a thread each), plus one kept for the "
        "kubelet's readiness probe; one more is answered 503 at once (default 16)",
    )
    parser.add_argument(
        "--header-seconds",
        type=seconds(0.05, 60),
        default=5.0,
        help=f"seconds a request's line and headers (at most {HEAD_LIMIT} bytes) may take to arrive on "
        "the status port; a slower connection is closed (default 5)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path(AGENT_STATE_DIR),
        help=f"the agent's own bookkeeping, shared by the init container and the sidecar ({AGENT_STATE_DIR})",
    )
    parser.add_argument(
        "--triton",
        default=f"http://127.0.0.1:{HTTP_PORT}",
        help=f"tritonserver's HTTP endpoint (default http://127.0.0.1:{HTTP_PORT})",
    )
    parser.add_argument(
        "--listen",
        type=_listen,
        default=f"0.0.0.0:{AGENT_PORT}",
        help=f"where the status is served (default 0.0.0.0:{AGENT_PORT})",
    )
    parser.add_argument(
        "--once", action="store_true", help="sync the target, record it and exit (init container)"
    )
    parser.add_argument(
        "--triton-starts-empty",
        action="store_true",
        help="tritonserver starts with no model: fill --dest and load each model as its bytes land; "
        "exit with the reason when that fails (the sidecar of a pod of the one shape)",
    )
    parser.add_argument(
        "--interval",
        type=seconds(0.05, 60),
        default=0.2,
        help="seconds between two looks at the target (default 0.2; Triton's model states are read "
        f"every {MODELS_SECONDS:g} s)",
    )
    parser.add_argument(
        "--load-timeout",
        type=seconds(1, 86400),
        default=900.0,
        help="seconds one model load or unload may take before it counts as failed (default 900)",
    )
    parser.add_argument(
        "--triton-metrics",
        type=_metrics_url,
        default=f"http://127.0.0.1:{METRICS_PORT}/metrics",
        help="tritonserver's metrics page, whose GPU memory gauges measure a pooled GPU model's memory "
        f"at its load (default http://127.0.0.1:{METRICS_PORT}/metrics)",
    )
    parser.add_argument(
        "--triton-metrics-interval",
        type=seconds(0.1, 3600),
        default=DEFAULT_INTERVAL,
        help="how often tritonserver refreshes its GPU gauges, in seconds (its --metrics-interval-ms; "
        "default 2): a pooled GPU model's load is read two intervals after it answered",
    )
    parser.add_argument(
        "--pool-assignment",
        type=Path,
        default=None,
        help="a pod of a pool: its annotation pool.triton-operator.io/models as a downwardAPI file; the "
        "sidecar loads exactly the models it names and reports them at GET /v1/pool (docs/pool.md)",
    )
    add_fetch_arguments(parser)
    parser.set_defaults(func=run)


def base_revision(args: argparse.Namespace) -> RevisionFiles:
    """The pod's own revision from its config volume: the manifest (JSON or parts) and the configs."""
    manifest = manifest_from_json(read_manifest_bytes(args.manifest))
    configs = {}
    for model in manifest.models:
        text = read_text(args.configs / model.name / CONFIG_FILE)
        if text is None:
            raise ManifestError("--configs", f"{args.configs / model.name / CONFIG_FILE}: no rendered config")
        configs[model.name] = text
    return RevisionFiles(args.base_revision.strip() or BASE, manifest, configs)


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    install_log_redaction()
    try:
        fmt = logs.log_format()
    except logs.LogFormatError as exc:  # a bad setting stops the process, naming the variable
        print(f"triton-operator agent: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    logs.configure("agent", fmt, text_format="%(asctime)s agent %(levelname)s %(message)s")

    def fail(code: int, message: str) -> int:
        text = f"triton-operator agent: error: {message}"
        print(logs.line("agent", fmt, text, exitCode=code), file=sys.stderr)
        write_termination_log(args.termination_log, message)
        return code

    try:
        base = base_revision(args)
    except OSError as exc:
        return fail(EXIT_USAGE, f"--manifest {args.manifest}: {exc.strerror or exc}")
    except ManifestError as exc:
        return fail(EXIT_USAGE, f"--manifest {args.manifest}: {exc}")
    url = node_cache_url(args.node_cache)
    pod = node_cache_pod()
    if url is not None:
        try:
            NodeCacheClient(url, pod).close(0)
        except ValueError as exc:
            return fail(EXIT_USAGE, f"--node-cache: {exc}")
    options = AgentOptions(
        dest=args.dest,
        state_dir=args.state_dir,
        base=base,
        inplace_dir=args.inplace_dir,
        target_file=args.target_file,
        credentials=credentials_from_env(),
        cache=args.cache,
        concurrency=args.concurrency,
        part_size=args.part_size,
        pvc_root=args.pvc_root,
        volume_limit=args.volume_limit,
        triton=ModelControl(args.triton, load_timeout=args.load_timeout),
        node_cache=url,
        node_cache_pod=pod,
        node_cache_upload_seconds=args.node_cache_upload_seconds,
        drain_seconds=args.drain_seconds,
        probe_failures=args.probe_failures,
        drain_timeout=args.drain_timeout,
        fills=args.triton_starts_empty and not args.once,
    )
    agent = Agent(options)
    if args.once:
        return once(agent, args, fail, started)
    if args.pool_assignment is not None:
        gpu = GpuMetrics(args.triton_metrics, interval=args.triton_metrics_interval)
        return pool_sidecar(PoolMember(agent, args.pool_assignment, gpu=gpu), args)
    try:
        return sidecar(agent, args)
    except FillFailed as exc:
        failure = sync_failure(exc.cause, args.dest) or (EXIT_FAILED, str(exc))
        code: int = fail(*failure)
        return code


def once(agent: Agent, args: argparse.Namespace, fail: Any, started: float) -> int:
    """The init container: the target synced and recorded; sync's summary as the termination message
    (status.timeToServe reads the bytes fetched from it), or the reason it failed."""
    tty = {"auto": None, "bar": True, "json": False}[args.progress]
    stream = sys.stderr if (tty or (tty is None and sys.stderr.isatty())) else sys.stdout
    progress = Progress(stream, tty=tty if tty is not None else stream.isatty())
    try:
        stats = agent.once(progress)
    except Exception as exc:
        failure = sync_failure(exc, args.dest)
        if failure is None:
            if isinstance(exc, ManifestError):
                failure = (EXIT_USAGE, str(exc))
            else:
                raise
        progress.error(failure[1])
        code: int = fail(*failure)
        return code
    summary = format_summary(
        stats.files,
        stats.downloaded_bytes,
        stats.bytes - stats.downloaded_bytes,
        time.monotonic() - started,
        node_cache=agent.node_cache_counts,
    )
    write_termination_log(args.termination_log, summary)
    return EXIT_OK


def limits(args: argparse.Namespace) -> Limits:
    """The status port's bounds (--max-connections, --header-seconds)."""
    return Limits(connections=args.max_connections, head_seconds=args.header_seconds)


def sidecar(agent: Agent, args: argparse.Namespace) -> int:
    stop = threading.Event()

    def stopping(signum: int, _frame: Any) -> None:
        logging.getLogger("triton_operator.agent").info("%s: stopping", signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stopping)
    agent.options = dataclasses.replace(agent.options, wait=stop.wait)

    def ready() -> tuple[bool, dict[str, Any]]:
        result = agent.ready(stale_seconds=MODELS_SECONDS * 5)
        return result.ready, result.to_json()

    def checking() -> None:
        while not stop.is_set():
            try:
                agent.check()
            except Exception:  # a bug: said, and tried again (readiness goes stale meanwhile)
                logging.getLogger("triton_operator.agent").exception("the readiness check failed")
            stop.wait(MODELS_SECONDS)

    threading.Thread(target=checking, name="agent-readiness", daemon=True).start()
    server = StatusServer(
        args.listen, agent.status, ready, probed=agent.probe_answered, limits=limits(args)
    ).start()
    logging.getLogger("triton_operator.agent").info(
        "serving the status at http://%s%s; following revision targets every %.3g s",
        args.listen,
        AGENT_STATUS_PATH,
        args.interval,
    )
    log = logging.getLogger("triton_operator.agent")
    models_read = -MODELS_SECONDS
    try:
        while not stop.is_set():
            now = time.monotonic()
            models = now - models_read >= MODELS_SECONDS
            try:
                agent.tick(models=models)
            except FillFailed:
                raise
            except Exception:  # a bug or an unreadable file: said, and tried again next time
                log.exception("the agent's pass failed")
            if models:
                models_read = now
            stop.wait(args.interval)
    finally:
        server.stop()
    return EXIT_OK


def pool_sidecar(member: PoolMember, args: argparse.Namespace) -> int:
    """The sidecar of a pod of a pool: the assignment followed every --interval, the pool report and
    the readiness (PoolMember.ready) served."""
    stop = threading.Event()

    def stopping(signum: int, _frame: Any) -> None:
        logging.getLogger("triton_operator.agent").info("%s: stopping", signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stopping)

    def ready() -> tuple[bool, dict[str, Any]]:
        result = member.ready()
        return result.ready, result.to_json()

    # Its preStop (`triton-operator leave`) writes its lines to this process's stdout, the container's log.
    note_pid(args.state_dir / Path(AGENT_PID_FILE).name)
    server = StatusServer(args.listen, member.agent.status, ready, member.report, limits=limits(args)).start()
    logging.getLogger("triton_operator.agent").info(
        "a pod of a pool: following %s every %.3g s", args.pool_assignment, args.interval
    )
    try:
        wait_loop(member, args.interval, stop)
    finally:
        server.stop()
    return EXIT_OK
