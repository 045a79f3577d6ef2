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
from typing import Any, TextIO
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


@dataclass(frozen=True)
class Look:
    """One look of a leaving pod: who answered each model's Service it asked (the pod's name; None:
    nobody, or not a report), and the models it still serves alone (served_here)."""

    asked: Mapping[str, str | None]
    waiting: list[str]


def look(options: LeaveOptions, pod: str, asker: Callable[[str], Any] = ask) -> Look:
    """The models this pod holds READY whose Service the pod itself answered (core.pool.assignment
    .served_here): its own agent's report, then each such model's Service asked at once."""
    assignment = _assignment(options.assignment)
    try:
        copies = parse_report(asker(options.agent.rstrip("/") + POOL_PATH) or {})
    except AssignmentError:
        copies = {}
    asked = sorted(m for m, c in copies.items() if c.state == "READY" and m in assignment.services)
    if not asked:
        return Look({}, [])
    with ThreadPoolExecutor(max_workers=min(ASKS_AT_ONCE, len(asked))) as pool:
        answers = list(
            pool.map(lambda m: report_pod(asker(service_url(assignment.services[m], options.port))), asked)
        )
    answered_by: Mapping[str, str | None] = dict(zip(asked, answers, strict=True))
    return Look(answered_by, served_here(assignment, copies, answered_by, pod))


def _answers(seen: Look, pod: str) -> str:
    """Who answered each model's Service, as a leave line says it."""
    if not seen.asked:
        return "no model READY here has a Service address: nothing to wait on"
    said = {None: "nobody", pod: "this pod"}
    return ", ".join(f"{m} by {said.get(p, p)}" for m, p in seen.asked.items())


def leave(
    options: LeaveOptions,
    *,
    pod: str | None = None,
    asker: Callable[[str], Any] = ask,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[str]:
    """Wait ``options.after`` s, then while a model is served by this pod alone (look), at most
    ``options.seconds`` more; then write ``options.done``. Returns the models still served here when
    the bound ran out (empty: each answered elsewhere, or by nobody). Says what it does: the wait it
    starts, who answered each model's Service each time that changes, and how it ended (answers, or
    the bound)."""
    me = pod or pod_name()
    start = clock()
    waiting: list[str] = []
    logger.info(
        "leave: pod %s leaves: the drain (%gs), then at most %gs while a model it holds READY is "
        "answered through its Service by this pod alone",
        me,
        options.after,
        options.seconds,
    )
    try:
        sleep(options.after)
        deadline = start + options.after + options.seconds
        said = ""
        while options.seconds > 0:
            seen = look(options, me, asker)
            waiting = seen.waiting
            answers = _answers(seen, me)
            if answers != said:
                logger.info("leave: after %.1fs: %s", clock() - start, answers)
                said = answers
            if not waiting:
                logger.info("leave: done after %.1fs: no model is served by this pod alone", clock() - start)
                break
            left = deadline - clock()
            if left <= 0:
                logger.warning(
                    "leave: the bound is over (%gs after the drain): %s still served by this pod alone; "
                    "leaving anyway",
                    options.seconds,
                    ", ".join(waiting),
                )
                break
            sleep(min(options.interval, left))
        else:
            logger.info("leave: no wait after the drain (--seconds 0)")
    finally:
        try:
            options.done.write_text("done\n")
        except OSError as exc:
            logger.error("leave: %s: %s", options.done, exc)
    return waiting


def agent_output(pid_file: Path) -> Path | None:
    """The agent's own stdout, /proc/<pid>/fd/1 (the container's log, what `kubectl logs` shows), with
    the pid the agent wrote in ``pid_file`` (note_pid); None when there is no pid there."""
    try:
        text = pid_file.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return Path(f"/proc/{text}/fd/1") if text.isdigit() else None


def open_output(path: Path | None) -> TextIO | None:
    """``path`` opened to append lines to (line-buffered); None when there is none or it cannot be
    opened (another user's pipe, a process gone): the caller writes to its own stderr then."""
    if path is None:
        return None
    try:
        return open(path, "a", buffering=1, encoding="utf-8")
    except OSError:
        return None


def note_pid(path: Path) -> None:
    """Write this process's id to ``path`` (agent_output reads it); a failure is said, not fatal: the
    leave lines then go to the hook's own output."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{os.getpid()}\n")
    except OSError as exc:
        logger.warning("%s: %s; `triton-operator leave` writes to its own output", path, exc)
