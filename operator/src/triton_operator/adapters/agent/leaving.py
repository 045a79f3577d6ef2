"""A leaving pool pod's preStop (`triton-operator leave`): serve on while a model is answered by it alone."""

from __future__ import annotations

import http.client
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from triton_operator.core.objects.names import AGENT_PORT, POD_NAME_ENV
from triton_operator.core.pool.assignment import (
    AssignmentError,
    PodAssignment,
    parse_assignment,
    parse_report,
    report_pod,
    served_here,
)

logger = logging.getLogger("triton_operator.agent")

POOL_PATH = "/v1/pool"
ASK_SECONDS = 1.0
"""How long one question (the pod's own agent, or a model's Service) may take; no answer: nobody."""
ASKS_AT_ONCE = 16


def pod_name() -> str:
    """The pod's name: $TRITON_OPERATOR_POD_NAME (the downward API), else its host name."""
    return os.environ.get(POD_NAME_ENV) or os.uname().nodename


def ask(url: str, timeout: float = ASK_SECONDS) -> Any:
    """GET ``url``'s JSON (a plain http://host:port/path); None when nothing, or no JSON, answers."""
    parts = urlsplit(url)
    if parts.hostname is None:
        return None
    connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        connection.request("GET", parts.path or "/", headers={"Connection": "close"})
        response = connection.getresponse()
        if response.status != 200:
            return None
        return json.loads(response.read(1 << 20))
    except (OSError, ValueError, http.client.HTTPException):
        return None
    finally:
        connection.close()


def service_url(address: str, port: int = AGENT_PORT) -> str:
    """The agent's report through a model's Service at ``address`` (an IPv6 one in brackets)."""
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}{POOL_PATH}"


@dataclass(frozen=True)
class LeaveOptions:
    """`triton-operator leave`'s arguments (commands.leave)."""

    agent: str
    """The pod's own agent (http://127.0.0.1:8009)."""
    assignment: Path
    """The pod's assignment annotation as its downwardAPI file: the models' Service addresses."""
    done: Path
    """Written when the wait is over: tritonserver's preStop waits on it."""
    after: float
    """The drain: always waited first."""
    seconds: float
    """The most it waits after the drain."""
    interval: float = 1.0
    port: int = AGENT_PORT


def _assignment(path: Path) -> PodAssignment:
    try:
        return parse_assignment(path.read_text())
    except (OSError, UnicodeDecodeError, AssignmentError) as exc:
        logger.warning("leave: %s: %s; no model is waited on", path, exc)
        return PodAssignment()


def still_served(options: LeaveOptions, pod: str, asker: Callable[[str], Any] = ask) -> list[str]:
    """The models this pod holds READY whose Service the pod itself answered (core.pool.assignment
    .served_here): its own agent's report, then each such model's Service asked at once."""
    assignment = _assignment(options.assignment)
    try:
        copies = parse_report(asker(options.agent.rstrip("/") + POOL_PATH) or {})
    except AssignmentError:
        copies = {}
    asked = sorted(m for m, c in copies.items() if c.state == "READY" and m in assignment.services)
    if not asked:
        return []
    with ThreadPoolExecutor(max_workers=min(ASKS_AT_ONCE, len(asked))) as pool:
        answers = list(
            pool.map(lambda m: report_pod(asker(service_url(assignment.services[m], options.port))), asked)
        )
    answered_by: Mapping[str, str | None] = dict(zip(asked, answers, strict=True))
    return served_here(assignment, copies, answered_by, pod)


def leave(
    options: LeaveOptions,
    *,
    pod: str | None = None,
    asker: Callable[[str], Any] = ask,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[str]:
    """Wait ``options.after`` s, then while a model is served by this pod alone (still_served), at most
    ``options.seconds`` more; then write ``options.done``. Returns the models still served here when
    the bound ran out (empty: each answered elsewhere, or by nobody)."""
    me = pod or pod_name()
    start = clock()
    waiting: list[str] = []
    try:
        sleep(options.after)
        deadline = start + options.after + options.seconds
        while options.seconds > 0:
            waiting = still_served(options, me, asker)
            if not waiting:
                logger.info("leave: no model is served by this pod alone")
                break
            left = deadline - clock()
            if left <= 0:
                logger.warning("leave: %s still served by this pod alone; leaving anyway", ", ".join(waiting))
                break
            sleep(min(options.interval, left))
    finally:
        try:
            options.done.write_text("done\n")
        except OSError as exc:
            logger.error("leave: %s: %s", options.done, exc)
    return waiting
