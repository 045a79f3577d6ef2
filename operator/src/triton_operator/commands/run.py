"""`triton-operator run`: the kopf operator with the TritonService handlers."""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import logging
import os
import random
import socket
import string
import sys
from collections.abc import Mapping
from typing import Any, cast

from triton_operator import logs
from triton_operator.core.rollout.clock import utcnow
from triton_operator.settings import Settings

logger = logging.getLogger(__name__)
# Loggers whose INFO lines are one per request: HTTP clients, the liveness endpoint.
CHATTY_LOGGERS = ("httpx", "httpx2", "aiohttp.access")
# The event handler runs on every TritonService event; kopf logs each success at INFO.
QUIET_HANDLERS = ("tritonservice",)


class _EventHandlerSuccessFilter(logging.Filter):
    """Drops kopf's "Handler 'tritonservice' succeeded." lines (one per TritonService event)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(message == f"Handler {name!r} succeeded." for name in QUIET_HANDLERS)


def configure_logging(verbose: bool, quiet: bool, fmt: str = "text") -> None:
    import kopf  # noqa: PLC0415

    from triton_operator.adapters.redaction import install_log_redaction  # noqa: PLC0415

    # First: no line of this process (ours, kopf's, an SDK's at DEBUG) shows a store's secret.
    install_log_redaction()
    # kopf's JSON lines (timestamp, severity, message, object: the TritonService's reference) with
    # namespace, name and revision added to every record of a reconcile pass (logs.service_context).
    log_format = kopf.LogFormat.JSON if fmt == "json" else kopf.LogFormat.FULL
    kopf.configure(verbose=verbose, quiet=quiet, log_format=log_format)
    for handler in logging.getLogger().handlers:
        handler.addFilter(logs.ServiceFilter(component="operator"))
    if not verbose:
        for name in CHATTY_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
        logging.getLogger("kopf.objects").addFilter(_EventHandlerSuccessFilter())


def peering_identity(environ: Mapping[str, str] | None = None) -> str:
    """This replica's name in the peering object: $POD_ID (the chart sets the pod's name) as kopf
    reads it, else user@host/time/random as kopf makes one."""
    env = os.environ if environ is None else environ
    if env.get("POD_ID"):
        return env["POD_ID"]
    now = utcnow().strftime("%Y%m%d%H%M%S")
    suffix = "".join(random.SystemRandom().choices(string.ascii_lowercase + string.digits, k=3))
    return f"{getpass.getuser()}@{socket.gethostname()}/{now}/{suffix}"


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "run",
        help="run the operator",
        description="Run the operator: watch TritonServices and the Deployments and pods they own.",
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        dest="namespaces",
        metavar="NS",
        help="namespace (or kopf glob pattern) to watch; repeatable; default: $TRITON_OPERATOR_NAMESPACES, "
        "else all namespaces",
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch the whole cluster")
    parser.add_argument(
        "--standalone",
        action="store_true",
        help="no peering between operator replicas (the default unless $TRITON_OPERATOR_PEERING_NAME is set)",
    )
    parser.add_argument(
        "--liveness", metavar="URL", help="kopf liveness endpoint, e.g. http://0.0.0.0:8081/healthz"
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="port of the operator's /metrics (default: $TRITON_OPERATOR_METRICS_PORT or 8080; 0 picks one)",
    )
    parser.add_argument("--no-metrics", action="store_true", help="serve no /metrics")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Imported here: the CLI builds every subcommand's parser, and only `run` needs kopf and handlers.
    import kopf  # noqa: PLC0415

    from triton_operator import handlers  # noqa: PLC0415  (registers the kopf handlers)
    from triton_operator.metrics import port_from_env, start_metrics_server  # noqa: PLC0415

    try:
        fmt = logs.log_format()
    except logs.LogFormatError as exc:  # a bad setting stops the process, naming the variable
        print(f"triton-operator run: error: {exc}", file=sys.stderr)
        return 2
    settings = Settings.from_env()
    if args.namespaces:
        settings = dataclasses.replace(settings, namespaces=tuple(args.namespaces), all_namespaces=False)
    elif args.all_namespaces:
        settings = dataclasses.replace(settings, namespaces=(), all_namespaces=True)
    elif not settings.namespaces:
        settings = dataclasses.replace(settings, all_namespaces=True)
    if args.liveness:
        settings = dataclasses.replace(settings, liveness_endpoint=args.liveness)
    standalone = args.standalone or not settings.peering_name
    # kopf pauses every replica that shares the top priority: give each its own.
    priority = settings.peering_priority
    if not standalone and priority is None:
        priority = random.SystemRandom().randint(1, 2**31 - 1)
    identity = None
    if not standalone:
        # Chosen here and handed to kopf, so that the operator knows its own keep-alive entry in
        # the peering object (its timers and pollers pause by the same rule as kopf).
        identity = peering_identity()
        settings = dataclasses.replace(settings, peering_priority=priority, peering_identity=identity)

    configure_logging(args.verbose or settings.log_level == "DEBUG", args.quiet, fmt)
    if not args.no_metrics:
        port = args.metrics_port if args.metrics_port is not None else port_from_env()
        server, _ = start_metrics_server(port)
        logger.info("metrics on http://0.0.0.0:%d/metrics", server.server_port)
    logger.info(
        "watching %s (%s) with handlers from %s",
        "all namespaces" if settings.all_namespaces else ", ".join(settings.namespaces),
        "standalone" if standalone else f"peering {settings.peering_name} as {identity}, priority {priority}",
        handlers.__name__,
    )
    try:
        kopf.run(
            standalone=standalone,
            peering_name=None if standalone else settings.peering_name,
            priority=None if standalone else priority,
            identity=cast(Any, identity),  # kopf's Identity is a NewType of str
            clusterwide=settings.all_namespaces,
            namespaces=settings.namespaces,
            liveness_endpoint=settings.liveness_endpoint,
            memo=kopf.Memo(operator_settings=settings),
        )
    except KeyboardInterrupt:
        return 130
    return 0
