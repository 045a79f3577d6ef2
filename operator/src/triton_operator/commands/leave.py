"""`triton-operator leave`: a pool pod's preStop, serving on while a model is answered by it alone."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from triton_operator import logs
from triton_operator.adapters.agent.leaving import LeaveOptions, agent_output, leave, open_output
from triton_operator.commands.argtypes import port, seconds
from triton_operator.core.objects.names import (
    AGENT_PID_FILE,
    AGENT_PORT,
    LEAVE_DONE_FILE,
    POOL_ASSIGNMENT_FILE,
)

EPILOG = f"""\
The preStop of a pool pod's agent container (docs/pool.md, "A pod that leaves"). It waits --after
seconds (the drain), then, at most --seconds more, while a model the pod's agent reports READY
(GET --agent/v1/pool) is answered through its own Service (the address the pod's assignment names,
GET <address>:{AGENT_PORT}/v1/pool) by this very pod: kube-proxy sends a terminating pod requests only
while its Service has no other ready endpoint. A model answered by another pod, or by nobody, is done.
Then it writes --done, on which tritonserver's preStop waits, and exits 0. It only reads: what any
caller of port {AGENT_PORT} may read.

The kubelet keeps an exec hook's output only when it fails, so its lines (the wait it starts, who
answered each model's Service, how the wait ended: answers, or the bound) go to the agent's own stdout,
the container's log (`kubectl logs POD -c model-agent`): /proc/<pid>/fd/1, with the pid the agent
wrote in --pid-file (the pod shares one process namespace: its PID 1 is the pause container), or
--log; when that cannot be opened, to this command's stderr.
"""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "leave",
        help="a pool pod's preStop: serve on while one of its models is answered by it alone",
        description="Wait while a model this pod holds READY is answered through its Service by this pod "
        "alone, bounded; then say so to tritonserver's preStop.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--agent", default=f"http://127.0.0.1:{AGENT_PORT}", help="the pod's own agent (default: %(default)s)"
    )
    parser.add_argument(
        "--assignment",
        type=Path,
        default=Path(POOL_ASSIGNMENT_FILE),
        help="the pod's assignment annotation as a downwardAPI file (default: %(default)s)",
    )
    parser.add_argument(
        "--done", type=Path, default=Path(LEAVE_DONE_FILE), help="written once done (default: %(default)s)"
    )
    parser.add_argument("--after", type=seconds(0, 3600), default=0.0, help="seconds always waited first")
    parser.add_argument(
        "--seconds", type=seconds(0, 3600), default=60.0, help="the most waited after --after (default 60)"
    )
    parser.add_argument(
        "--interval", type=seconds(0.1, 60), default=1.0, help="seconds between two looks (default 1)"
    )
    parser.add_argument(
        "--port",
        type=port,
        default=AGENT_PORT,
        help="the port each model's Service serves the agent's report on (default: %(default)s)",
    )
    parser.add_argument(
        "--pid-file",
        type=Path,
        default=Path(AGENT_PID_FILE),
        help="the agent's process id, whose stdout its lines go to (default: %(default)s)",
    )
    parser.add_argument(
        "--log", type=Path, default=None, help="a file its lines go to instead of the agent's stdout"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        fmt = logs.log_format()
    except logs.LogFormatError as exc:  # a bad setting stops the process, naming the variable
        print(f"triton-operator leave: error: {exc}", file=sys.stderr)
        return 2
    target = args.log or agent_output(args.pid_file)
    stream = open_output(target)
    logs.configure("agent", fmt, text_format="%(asctime)s leave %(levelname)s %(message)s", stream=stream)
    if stream is None:
        where = f"{target} cannot be opened" if target is not None else f"no agent pid in {args.pid_file}"
        logging.getLogger("triton_operator.agent").warning("leave: %s: its lines go to its own stderr", where)
    leave(
        LeaveOptions(
            agent=args.agent,
            assignment=args.assignment,
            done=args.done,
            after=args.after,
            seconds=args.seconds,
            interval=args.interval,
            port=args.port,
        )
    )
    if stream is not None:
        stream.close()
    return 0
