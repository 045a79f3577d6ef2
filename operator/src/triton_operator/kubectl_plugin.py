"""The `kubectl triton` plugin: get, status, promote, abort, pause, resume, retry, undo, infer, tune."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TextIO

from pydantic import ValidationError

from triton_operator.core import tuning
from triton_operator.core.commandline import output
from triton_operator.core.commandline.completion import KUBECTL, SHELLS
from triton_operator.core.pod.startup import describe_phases
from triton_operator.core.rollout.clock import parse_time, utcnow
from triton_operator.core.rollout.requests import FOR_REVISION, Action, request_revision
from triton_operator.core.rollout.texts import describe_step
from triton_operator.core.vocabulary import conditions as cond
from triton_operator.models import Rollout

if TYPE_CHECKING:
    from triton_operator.adapters.control import Control
    from triton_operator.adapters.tuning_cluster import TuningCluster

CONTROL_VERBS: tuple[str, ...] = ("promote", "abort", "pause", "resume", "retry", "undo")
# The display order of `kubectl triton status` (the others, TrafficRouted among them, after by name).
CONDITION_ORDER = (cond.READY, cond.REPOSITORY_READY, cond.PODS_SCHEDULED, cond.PROGRESSING, cond.DEGRADED)
WATCH_PERIOD = 2.0
"""Seconds between two reads of `--watch` (a read is one GET or LIST: cheap for the API server)."""
CLEAR = "\x1b[H\x1b[2J"
"""Cursor home, clear the screen: a terminal's redraw (no alternate screen, nothing to restore)."""


# ----------------------------------------------------------------- pure rendering


def human_age(seconds: float) -> str:
    """An age as kubectl prints it (apimachinery's HumanDuration): 42s, 3m12s, 45m, 3h5m, 20h, 3d4h, 2y."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        rest = s % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d{rest}h" if rest else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def age(timestamp: Any, now: datetime) -> str:
    moment = parse_time(timestamp)
    return human_age((now - moment).total_seconds()) if moment is not None else "<unknown>"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "") -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [str(c).ljust(w) for c, w in zip(row, widths, strict=True)]
        lines.append((indent + "   ".join(cells)).rstrip())
    return "\n".join(lines)


def _rollout(obj: Mapping[str, Any]) -> Rollout | None:
    try:
        return Rollout.model_validate((obj.get("spec") or {}).get("rollout") or {})
    except ValidationError:
        return None


def _step_column(obj: Mapping[str, Any]) -> str:
    status = obj.get("status") or {}
    rollout = _rollout(obj)
    steps = len(rollout.steps) if rollout is not None else 0
    if status.get("canaryRevision"):
        if status.get("promoting"):
            return "promoting"
        return f"{status.get('currentStepIndex') or 0}/{steps}"
    in_place = status.get("inPlace") or {}
    if in_place.get("next"):
        if in_place.get("rollingBack"):
            return "in place: rolling back"
        index = in_place.get("stepIndex") or 0
        return f"in place {index}/{steps}" if index < steps else "in place: all pods"
    if status.get("abortedRevision") or in_place.get("abortedRevision"):
        return "aborted"
    return "-"


def render_table(items: Sequence[Mapping[str, Any]], now: datetime, *, all_namespaces: bool = False) -> str:
    """`kubectl triton get`: one line per TritonService."""
    header = ["NAME", "READY", "STABLE", "CANARY", "WEIGHT", "STEP", "AGE"]
    if all_namespaces:
        header.insert(0, "NAMESPACE")
    rows: list[list[str]] = []
    ordered = sorted(
        items,
        key=lambda o: (
            (o.get("metadata") or {}).get("namespace", ""),
            (o.get("metadata") or {}).get("name", ""),
        ),
    )
    for obj in ordered:
        metadata = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        canary = status.get("canaryRevision")
        weight = status.get("canaryWeight")
        in_place = status.get("inPlace") or {}
        if not canary and in_place.get("next"):
            canary = f"{in_place['next']} (in place)"
        row = [
            str(metadata.get("name", "")),
            f"{status.get('readyReplicas') or 0}/{spec.get('replicas', 1)}",
            str(status.get("stableRevision") or "-"),
            str(canary)
            if canary
            else (f"{status['abortedRevision']} (aborted)" if status.get("abortedRevision") else "-"),
            f"{weight}%" if canary and weight is not None else "-",
            _step_column(obj),
            age(metadata.get("creationTimestamp"), now),
        ]
        if all_namespaces:
            row.insert(0, str(metadata.get("namespace", "")))
        rows.append(row)
    if not rows:
        return "No TritonServices found."
    return _table(header, rows)


def _steps_block(obj: Mapping[str, Any], rollout: Rollout | None) -> list[str]:
    status = obj.get("status") or {}
    if rollout is None:
        return ["Steps:     (spec.rollout is not valid)"]
    if not rollout.steps:
        return ["Steps:     none (promote once the new revision is fully Ready)"]
    in_place = status.get("inPlace") or {}
    in_progress = bool(status.get("canaryRevision")) or bool(in_place.get("next"))
    current = int(
        (in_place.get("stepIndex") if in_place.get("next") else status.get("currentStepIndex")) or 0
    )
    promoting = bool(status.get("promoting"))
    lines = ["Steps:"]
    for i, step in enumerate(rollout.steps):
        if in_progress and (promoting or i < current):
            mark, note = "  ", "done"
        elif in_progress and i == current:
            mark, note = "->", "current"
        else:
            mark, note = "  ", ""
        lines.append(f"  {mark} {i:>2}  {describe_step(step):<28} {note}".rstrip())
    if in_progress and promoting:
        lines.append("  ->     promotion: scaling the canary to full replicas")
    return lines


def _progress_line(obj: Mapping[str, Any], rollout: Rollout | None, now: datetime) -> list[str]:
    """A rollout in progress in one line: the step (k of N, what it is), the traffic split, and how
    long the current step has waited (what is left of a timed pause)."""
    status = obj.get("status") or {}
    in_place = status.get("inPlace") or {}
    canary = bool(status.get("canaryRevision"))
    if rollout is None or not (canary or in_place.get("next")) or status.get("promoting"):
        return []
    steps = rollout.steps
    index = int((status.get("currentStepIndex") if canary else in_place.get("stepIndex")) or 0)
    where = f"step {index + 1} of {len(steps)}" if index < len(steps) else f"all {len(steps)} steps done"
    if index < len(steps):
        where += f" ({describe_step(steps[index])})"
    if canary:
        weight = int(status.get("canaryWeight") or 0)
        split = f"canary {weight}% / stable {100 - weight}%"
    else:
        split = f"{len(in_place.get('pods') or [])} pod(s) asked to load {in_place['next']}"
    started = parse_time((status if canary else in_place).get("stepStartedAt"))
    waited = ""
    if started is not None:
        seconds = (now - started).total_seconds()
        waited = f", this step waiting {human_age(seconds)}"
        pause = steps[index].pause if index < len(steps) else None
        if pause is not None and pause.duration_seconds is not None:
            left = human_age(max(0.0, pause.duration_seconds - seconds))
            waited += f" of {human_age(pause.duration_seconds)} ({left} left)"
    return [f"Progress:  {where}, {split}{waited}"]


def _in_place_block(in_place: Mapping[str, Any]) -> list[str]:
    """An in-place update in progress (or held after its rollback), as status.inPlace records it."""
    lines: list[str] = []
    if in_place.get("next"):
        where = "rolling back" if in_place.get("rollingBack") else f"step {in_place.get('stepIndex') or 0}"
        pods = ", ".join(in_place.get("pods") or []) or "none yet"
        lines.append(
            f"In place:  {in_place['next']} loading in the pods of {in_place.get('host')} "
            f"(from {in_place.get('stable')}; {where}); pods asked: {pods}"
        )
    if in_place.get("abortedRevision"):
        lines.append(
            f"Aborted:   {in_place['abortedRevision']} in place "
            f"({in_place.get('abortedReason') or 'Aborted'}): {in_place.get('abortedDetail') or '-'}; "
            "kubectl triton retry to try again"
        )
    return lines


def _summary(obj: Mapping[str, Any], rollout: Rollout | None) -> str:
    status = obj.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    degraded = conditions.get(cond.DEGRADED) or {}
    progressing = conditions.get(cond.PROGRESSING) or {}
    if degraded.get("status") == cond.TRUE:
        return f"Degraded - {degraded.get('reason', '')}: {degraded.get('message', '')}"
    paused = status.get("pausedByUser") or (rollout is not None and rollout.paused)
    moving = status.get("canaryRevision") or (status.get("inPlace") or {}).get("next")
    if paused and moving:
        return "Paused"
    if progressing.get("status") == cond.TRUE or moving:
        return f"Progressing - {progressing.get('reason', '')}: {progressing.get('message', '')}".rstrip(
            ": -"
        )
    ready = conditions.get(cond.READY) or {}
    if ready.get("status") == cond.TRUE:
        return "Healthy"
    if ready:
        return f"Not ready - {ready.get('reason', '')}: {ready.get('message', '')}"
    return "Unknown (no status yet)"


def _triton_view(side: Mapping[str, Any] | None) -> str:
    """Triton's view of a model in one revision: `rev: 1 READY, 2 UNAVAILABLE (reason)`."""
    if not side:
        return "-"
    versions = ", ".join(
        f"{v.get('version')} {v.get('state')}" + (f" ({v['reason']})" if v.get("reason") else "")
        for v in side.get("versions") or []
    )
    return f"{side.get('revision', '')}: {versions or 'nothing loaded'}"


def _models_block(models: Sequence[Mapping[str, Any]]) -> list[str]:
    if not models:
        return []
    rows = [
        [
            str(m.get("name", "")),
            ",".join(str(v) for v in m.get("versions") or []) or "-",
            str(bool(m.get("ready"))).lower(),
            _triton_view(m.get("serving")),
            _triton_view(m.get("canary")),
        ]
        for m in models
    ]
    header = ["NAME", "VERSIONS", "READY", "TRITON (STABLE)", "TRITON (CANARY)"]
    return ["Models (TRITON: what Triton reports in the revision's pods):", _table(header, rows, indent="  ")]


def _analysis_block(status: Mapping[str, Any]) -> list[str]:
    """The canary's current analysis window, per model, and the windows that decided something."""
    lines: list[str] = []
    current = status.get("analysis") or {}
    if current:
        since = f", since {current['windowStartedAt']}" if current.get("windowStartedAt") else ""
        lines.append(
            f"Analysis:  {current.get('verdict')} for {current.get('revision')} at weight "
            f"{current.get('weight')}%{since}"
        )
        rows = [
            [
                str(m.get("name", "")),
                str(m.get("verdict", "")),
                f"{m.get('requests', 0)}/{m.get('stableRequests', 0)}",
                str(m.get("successRatio", "-")),
                f"{m.get('latencyMicroseconds', '-')}/{m.get('stableLatencyMicroseconds', '-')}",
            ]
            for m in current.get("models") or []
        ]
        if rows:
            header = ["MODEL", "VERDICT", "REQUESTS (CANARY/STABLE)", "SUCCESS", "LATENCY US (CANARY/STABLE)"]
            lines.append(_table(header, rows, indent="  "))
    runs = status.get("analysisRuns") or []
    if runs:
        lines.append("Analysis runs (oldest first):")
        lines += [
            f"  {r.get('at', '')} step {r.get('stepIndex')} weight {r.get('weight')}%: {r.get('verdict')}: "
            f"{r.get('message', '')}"
            for r in runs
        ]
    return lines


def _served_block(status: Mapping[str, Any]) -> list[str]:
    """status.timeToServe: each serving revision's first Ready pod's start, phase by phase."""
    entries = status.get("timeToServe") or []
    if not entries:
        return []
    roles = {status.get("stableRevision"): "stable", status.get("canaryRevision"): "canary"}
    lines = ["Time to serve (the revision's first Ready pod, created -> Ready):"]
    for e in entries:
        role = f"in place, in the pods of {e['host']}" if e.get("host") else roles.get(e.get("revision"))
        lines.append(f"  {e.get('revision', '')}{f' ({role})' if role else ''}: {describe_phases(e)}")
        when = "loaded it at" if e.get("host") else "Ready at"
        lines.append(f"    pod {e.get('pod', '')}, {when} {e.get('readyAt') or '?'}")
    return lines


def render_tuning(data: Mapping[str, Any], indent: str = "") -> list[str]:
    """A sweep's record (core.tuning.record): its summary, its table, what was refused."""
    lines = [f"{indent}{tuning.summary(data)}"]
    rows = tuning.result_rows(data)
    if rows:
        lines.append(_table(tuning.RESULT_HEADER, rows, indent=indent + "  "))
    refused = tuning.refused_lines(data)
    if refused:
        lines.append(f"{indent}  refused (not run):")
        lines += [f"{indent}  {line}" for line in refused]
    return lines


def _tuning_block(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The latest sweep in full, the earlier ones a line each (kubectl triton tune NAME --show RUN)."""
    if not records:
        return []
    lines = ["Tuning (kubectl triton tune; latest last):"]
    lines += [f"  {tuning.summary(r)}" for r in records[:-1]]
    lines += render_tuning(records[-1], indent="  ")
    return lines


def render_status(obj: Mapping[str, Any], now: datetime, tunings: Sequence[Mapping[str, Any]] = ()) -> str:
    """`kubectl triton status NAME`: the rollout, its steps, conditions, models, tuning and history."""
    metadata = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    rollout = _rollout(obj)
    strategy = rollout.strategy.value if rollout is not None else "?"
    lines = [
        f"Name:      {metadata.get('name', '')}",
        f"Namespace: {metadata.get('namespace', '')}",
        f"Status:    {_summary(obj, rollout)}",
        f"Strategy:  {strategy}",
        f"Replicas:  {spec.get('replicas', 1)} desired, {status.get('readyReplicas') or 0} ready",
        f"Stable:    {status.get('stableRevision') or '-'}",
    ]
    if status.get("image"):
        lines.append(f"Image:     {status['image']}")
    if status.get("defaultImage"):
        lines.append(
            f"           not the operator's default {status['defaultImage']}: a new default applies "
            "to new revisions only, the next change of the spec rolls it out"
        )
    if status.get("servedRevision"):
        lines.append(
            f"Serving:   revision {status['servedRevision']} in place, "
            f"in the pods of {status.get('stableRevision')}"
        )
    if status.get("rolloutKind"):
        lines.append(
            f"Rollout:   {status['rolloutKind']} - {status.get('rolloutKindReason') or ''}".rstrip(" -")
        )
    canary = status.get("canaryRevision")
    if canary:
        weight = status.get("canaryWeight")
        lines.append(f"Canary:    {canary} (weight {weight if weight is not None else 0}%)")
    lines += _progress_line(obj, rollout, now)
    lines += _in_place_block(status.get("inPlace") or {})
    if status.get("abortedRevision"):
        lines.append(
            f"Aborted:   {status['abortedRevision']} at step {status.get('abortedStepIndex', '?')} "
            f"({status.get('abortedReason') or 'Aborted'}); kubectl triton retry to try again"
        )
        if status.get("abortedDetail"):
            lines.append(f"           {status['abortedDetail']}")
    if status.get("pinnedRevision"):
        lines.append(
            f"Undo:      serving {status['pinnedRevision']} "
            f"while the spec still asks for {status.get('pinnedFor')}"
        )
    in_place = status.get("inPlace") or {}
    if in_place.get("pinned"):
        lines.append(
            f"Undo:      serving {in_place['pinned']} in place, in the pods of {in_place.get('host')}, "
            f"while the spec still asks for {in_place.get('pinnedFor')} "
            "(kubectl triton retry to roll forward)"
        )
    if status.get("pausedByUser") or (rollout is not None and rollout.paused):
        source = "spec.rollout.paused" if rollout is not None and rollout.paused else "kubectl triton pause"
        lines.append(f"Paused:    yes ({source})")
    lines += _steps_block(obj, rollout)

    conditions = sorted(
        status.get("conditions") or [],
        key=lambda c: (
            CONDITION_ORDER.index(c.get("type"))
            if c.get("type") in CONDITION_ORDER
            else len(CONDITION_ORDER),
            str(c.get("type")),
        ),
    )
    if conditions:
        lines.append("Conditions:")
        rows = [
            [
                str(c.get("type", "")),
                str(c.get("status", "")),
                str(c.get("reason", "")),
                age(c.get("lastTransitionTime"), now),
                str(c.get("message", "")),
            ]
            for c in conditions
        ]
        lines.append(_table(["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"], rows, indent="  "))
    lines += _models_block(status.get("models") or [])
    lines += _analysis_block(status)
    lines += _served_block(status)
    lines += _tuning_block(tunings)
    history = status.get("history") or []
    if history:
        lines.append("History (oldest first; kubectl triton undo --to-revision REV):")
        for h in history:
            when = f" (stable since {h['created']})" if h.get("created") else ""
            where = f" (in place, in the pods of {h['inPlaceHost']})" if h.get("inPlaceHost") else ""
            lines.append(f"  {h.get('revision', '')}{when}{where}")
    endpoints = status.get("endpoints") or {}
    if endpoints:
        lines.append("Endpoints:")
        lines += [f"  {k}: {v}" for k, v in endpoints.items()]
    return "\n".join(lines)


# ----------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubectl triton", description="Inspect and steer TritonService rollouts (triton-operator)."
    )
    _kube_flags(parser, suppress=False)
    parser.add_argument(
        "--version",
        action="store_true",
        help="print the plugin's version, the CRD's API version and the operator's in the cluster",
    )
    sub = parser.add_subparsers(dest="verb", metavar="COMMAND")  # required unless --version

    def add(name: str, help_text: str, *, name_required: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("name", nargs=None if name_required else "?", metavar="NAME")
        _kube_flags(p, suppress=True)
        return p

    get = add("get", "list TritonServices (or one)", name_required=False)
    get.add_argument("-A", "--all-namespaces", action="store_true", help="list across all namespaces")
    _output_flag(get, output.FORMATS, "NAME: the object, else a v1 List of them, as the API returns them")
    status = add("status", "show a TritonService's rollout: steps, conditions, models, history")
    _output_flag(status, output.FORMATS, "the TritonService as the API returns it")
    for p in (get, status):
        p.add_argument(
            "-w",
            "--watch",
            action="store_true",
            help=f"redraw as it changes (read every {WATCH_PERIOD:g}s) until Ctrl-C; with -o, print "
            "each change",
        )
    promote = add("promote", "complete the current step (a pause{} waits for this)")
    promote.add_argument("--full", action="store_true", help="skip the remaining steps; promote once Ready")
    add("abort", "roll back to the stable revision now")
    add("pause", "hold the rollout at its current step")
    add("resume", "lift a pause made with `kubectl triton pause`")
    add("retry", "retry an aborted revision from step 0 (or roll the spec forward after an undo)")
    undo = add("undo", "go back to an earlier revision (default: the previous one)")
    undo.add_argument("--to-revision", metavar="REV", help="a revision from `kubectl triton status` History")
    infer = add("infer", "run one inference on a model of a TritonService and print its outputs")
    infer.add_argument("model", metavar="MODEL")
    infer.add_argument(
        "-i",
        "--input",
        action="append",
        default=[],
        metavar="NAME=@FILE.npy|JSON",
        help="an input: a .npy file (@path) or a JSON array; repeat for each input",
    )
    infer.add_argument("--protocol", choices=("grpc", "http"), default="grpc", help="default: grpc")
    infer.add_argument(
        "--host", metavar="HOST[:PORT]", help="reach the endpoint here (outside the cluster: a port-forward)"
    )
    infer.add_argument("--model-version", metavar="VERSION", default="", help="default: the server's choice")
    _tune_parser(
        add("tune", "measure candidate configs of a model on tuning pods (perf_analyzer); show the best")
    )
    completion = sub.add_parser(
        "completion",
        help="print a shell completion script for kubectl-triton",
        description="Print a completion script for kubectl-triton: source <(kubectl-triton completion bash), "
        "source <(kubectl-triton completion zsh), kubectl-triton completion fish | source; `kubectl` prints "
        "the kubectl_complete-triton program that completes `kubectl triton ...` (kubectl 1.26+).",
    )
    completion.add_argument("shell", choices=(*SHELLS, KUBECTL), metavar="|".join((*SHELLS, KUBECTL)))
    return parser


def _kube_flags(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """kubectl's flags that reach a plugin only as its own (kubectl passes none of its global flags):
    before or after the verb, as kubectl allows. On a verb they keep what was given before it."""
    default = argparse.SUPPRESS if suppress else None
    parser.add_argument(
        "-n",
        "--namespace",
        default=default,
        help="namespace (default: the context's, else default)",
    )
    parser.add_argument("--context", default=default, help="kubeconfig context (default: current-context)")
    parser.add_argument(
        "--kubeconfig",
        default=default,
        metavar="FILE",
        help="the kubeconfig file (default: $KUBECONFIG, several files joined by ':', else ~/.kube/config)",
    )


def _output_flag(parser: argparse.ArgumentParser, formats: Sequence[str], shape: str) -> None:
    parser.add_argument(
        "-o",
        "--output",
        choices=formats,
        metavar="|".join(formats),
        help=f"machine-readable output instead of the table: {shape}",
    )


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: expected whole numbers separated by commas") from exc


def _switches(text: str) -> tuple[bool, ...]:
    values = {"on": True, "off": False}
    words = [w.strip() for w in text.split(",") if w.strip()]
    if not words or any(w not in values for w in words):
        raise argparse.ArgumentTypeError(f"{text!r}: expected on, off or on,off")
    return tuple(values[w] for w in words)


def _sets(text: str) -> tuple[tuple[int, ...], ...]:
    """`4,8;8;none`: sets of preferred batch sizes, `;` between sets (none: no preferred sizes)."""
    return tuple(() if part.strip() == "none" else _ints(part) or (0,) for part in text.split(";"))


def _tune_parser(tune: argparse.ArgumentParser) -> None:
    tune.add_argument("--model", required=True, help="the model of the TritonService to tune")
    knobs = tune.add_argument_group("candidate values (each unset keeps the model's own)")
    knobs.add_argument("--instances", type=_ints, default=(), metavar="N,N", help="instance count per group")
    knobs.add_argument("--max-batch-size", type=_ints, default=(), metavar="N,N")
    knobs.add_argument("--dynamic-batching", type=_switches, default=(), metavar="on,off")
    knobs.add_argument(
        "--preferred-batch-sizes", type=_sets, default=(), metavar="4,8;8;none", help="sets, ';' between"
    )
    knobs.add_argument("--queue-delay-us", type=_ints, default=(), metavar="US,US", help="max queue delay")
    load = tune.add_argument_group("load and choice")
    load.add_argument("--concurrency", type=_ints, default=tuning.DEFAULT_CONCURRENCIES, metavar="N,N")
    load.add_argument("--percentile", type=int, choices=(95, 99), default=95, help="latency bound on (95)")
    load.add_argument("--latency-bound-ms", type=float, metavar="MS", help="best throughput within this")
    load.add_argument("--measurement-ms", type=int, default=2000, help="perf_analyzer's window (2000)")
    load.add_argument("--max-trials", type=int, default=5, help="perf_analyzer's windows to stabilise (5)")
    load.add_argument("--stability-percentage", type=int, default=10, help="perf_analyzer's (10)")
    load.add_argument("--perf-image", help="image with perf_analyzer (default: the serving image's -sdk)")
    load.add_argument("--input-data", metavar="FILE.json", help="perf_analyzer --input-data (default random)")
    bounds = tune.add_argument_group("bounds")
    bounds.add_argument("--max-candidates", type=int, default=8, help="refuse a bigger sweep (8)")
    bounds.add_argument("--parallel", type=int, default=1, help="tuning pods at once (1)")
    bounds.add_argument("--max-seconds", type=int, default=1800, help="the whole sweep (1800)")
    bounds.add_argument("--candidate-seconds", type=int, default=300, help="one candidate: start+load (300)")
    tune.add_argument("--apply", action="store_true", help="patch the best into the spec (a normal rollout)")
    tune.add_argument("--keep", type=int, default=tuning.KEEP_RUNS, help="records of runs kept (5)")
    tune.add_argument("--show", metavar="RUN", help="print a recorded run (`all`: every one) and exit")
    _output_flag(tune, ("json", "yaml"), "the sweep's records: a list, oldest first")


def sweep_of(args: argparse.Namespace) -> tuning.Sweep:
    bound = args.latency_bound_ms
    return tuning.Sweep(
        model=args.model,
        instance_counts=args.instances,
        max_batch_sizes=args.max_batch_size,
        dynamic_batching=args.dynamic_batching,
        preferred_batch_sizes=args.preferred_batch_sizes,
        queue_delays_us=args.queue_delay_us,
        concurrencies=args.concurrency,
        percentile=args.percentile,
        latency_bound_us=round(bound * 1000) if bound is not None else None,
        max_candidates=args.max_candidates,
        parallel=args.parallel,
        max_seconds=args.max_seconds,
        candidate_seconds=args.candidate_seconds,
        measurement_ms=args.measurement_ms,
        max_trials=args.max_trials,
        stability_percentage=args.stability_percentage,
    )


# ----------------------------------------------------------------- infer


def parse_input(text: str) -> tuple[str, Any]:
    """``NAME=@file.npy`` (numpy's own format, dtype kept) or ``NAME=JSON`` as (name, value)."""
    import numpy as np  # noqa: PLC0415 - only for infer

    name, sep, value = text.partition("=")
    if not sep or not name:
        raise ValueError(f"--input {text!r}: expected NAME=@FILE.npy or NAME=JSON")
    if value.startswith("@"):
        try:
            return name, np.load(value[1:], allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ValueError(f"--input {name}: cannot read {value[1:]} as .npy: {exc}") from exc
    try:
        return name, json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--input {name}: not JSON ({exc.msg}): {value!r}") from exc


def _printable(value: Any) -> Any:
    if isinstance(value, list):
        return [_printable(v) for v in value]
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return value
    return value


def render_outputs(result: Any, names: Sequence[str]) -> str:
    """One line per output: name, data type, shape and values."""
    lines = []
    for name in names:
        output = result.get_output(name)
        if output is None:
            continue
        datatype = output["datatype"] if isinstance(output, dict) else output.datatype
        array = result.as_numpy(name)
        lines.append(f"{name}  {datatype} {list(array.shape)}  {_printable(array.tolist())}")
    return "\n".join(lines)


def infer(args: argparse.Namespace, obj: Mapping[str, Any]) -> str:
    from triton_operator.client import TritonClient  # noqa: PLC0415 - tritonclient only for infer

    inputs = dict(parse_input(text) for text in args.input)
    with TritonClient.from_tritonservice(obj, protocol=args.protocol, host=args.host) as client:
        model = client.model(args.model, version=args.model_version)
        result = model.run(**inputs)
        return render_outputs(result, [o.name for o in model.signature().outputs])


def tune(args: argparse.Namespace, client: Control, cluster: TuningCluster | None) -> str:
    """Run a sweep (or --show a recorded one); what to print: the record, the spec change."""
    from triton_operator.client.tuning_runner import tune as run_sweep  # noqa: PLC0415 - only for tune

    namespace = args.namespace or client.namespace
    if args.show:
        records = client.tuning_results(args.name, namespace)
        shown = [r for r in records if args.show in ("all", r.get("run"))]
        if not shown:
            runs = ", ".join(str(r.get("run")) for r in records) or "none"
            raise ValueError(f"no tuning run {args.show!r} of {namespace}/{args.name} (runs: {runs})")
        if args.output:
            return output.dump(shown, args.output)
        return "\n".join(line for r in shown for line in render_tuning(r))
    input_data = None
    if args.input_data:
        with open(args.input_data, encoding="utf-8") as f:
            input_data = f.read()
    data = run_sweep(
        args.name,
        namespace,
        sweep_of(args),
        perf_image=args.perf_image,
        input_data=input_data,
        apply=args.apply,
        keep=max(1, args.keep),
        cluster=cluster,
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    if args.output:
        return output.dump([data], args.output)
    lines = render_tuning(data)
    patch = (data.get("choice") or {}).get("patch")
    if patch and args.apply:
        lines.append(f"Applied to tritonservice {namespace}/{args.name}; its rollout carries it out.")
    elif patch:
        lines.append("The spec change (JSON patch; --apply makes it, or):")
        lines.append(f"  kubectl patch tsvc {args.name} -n {namespace} --type json -p '{json.dumps(patch)}'")
        lines.append(tuning.patch_yaml(patch).rstrip())
    return "\n".join(lines)


def watch(
    frame: Callable[[], tuple[Any, str]],
    out: TextIO,
    err: TextIO,
    *,
    tty: bool,
    sleep: Callable[[float], None] = time.sleep,
    period: float = WATCH_PERIOD,
) -> int:
    """Show ``frame()`` (data, text) until Ctrl-C (or SIGTERM): a terminal is redrawn whenever the
    text changes (ages included); a pipe gets the text again each time the data changes. A read that
    fails after the first is reported on ``err`` and retried. Returns 0: Ctrl-C is how a watch ends."""
    data, text = frame()  # the first read's error (not found, no cluster) ends the command
    shown: tuple[Any, str] | None = None
    try:
        while True:
            if shown is None or (text != shown[1] if tty else data != shown[0]):
                out.write((CLEAR if tty else "") + text + "\n")
                out.flush()
                shown = (data, text)
            sleep(period)
            try:
                data, text = frame()
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # a lost connection: say so, keep the last frame, read again
                err.write(f"error: {exc} (retrying every {period:g}s)\n")
                err.flush()
    except KeyboardInterrupt:
        return 0


def _frame(
    args: argparse.Namespace, client: Control, namespace: str, now: Callable[[], datetime] = utcnow
) -> Callable[[], tuple[Any, str]]:
    """`get` and `status`: one read and its text (table or -o); --watch calls it again and again."""

    def read() -> tuple[Any, str]:
        if args.verb == "status":
            obj = client.get(args.name, namespace)
            if args.output:
                return obj, output.render_objects([obj], args.output, single=True)
            tunings = client.tuning_results(args.name, namespace)
            return (obj, tunings), render_status(obj, now(), tunings)
        all_ns = bool(args.all_namespaces) and not args.name
        items = (
            [client.get(args.name, namespace)] if args.name else client.list(None if all_ns else namespace)
        )
        if args.output:
            return items, output.render_objects(items, args.output, single=bool(args.name))
        return items, render_table(items, now(), all_namespaces=all_ns)

    return read


VERSION_TIMEOUT = 5.0
"""Seconds `--version` waits for the cluster before it says the operator's version is unknown."""


def version_text(operator: Callable[[], list[str]]) -> str:
    """`kubectl triton --version`: this plugin's version, the API version it reads, and the version of
    each operator Deployment ``operator()`` finds (or `unknown` and why)."""
    from triton_operator import GROUP, VERSION, __version__  # noqa: PLC0415

    try:
        found = operator()
        running = (
            "; ".join(found)
            if found
            else (
                "unknown (no Deployment labelled app.kubernetes.io/part-of=triton-operator,"
                "app.kubernetes.io/component=operator in the cluster)"
            )
        )
    except Exception as exc:  # no kubeconfig, a dead or slow cluster, no right to list Deployments
        running = f"unknown (cannot read it from the cluster: {str(exc) or type(exc).__name__})"
    return f"kubectl-triton {__version__}\nAPI: {GROUP}/{VERSION}\nOperator: {running}"


def _operator_versions(args: argparse.Namespace) -> list[str]:
    from triton_operator.adapters.control import kube_client, operator_versions  # noqa: PLC0415

    return operator_versions(kube_client(args.kubeconfig, args.context, timeout=VERSION_TIMEOUT))


def _control(client: Control | None, args: argparse.Namespace) -> Control:
    if client is not None:
        return client
    from triton_operator.adapters.control import KubeControl, kube_client  # noqa: PLC0415 - lightkube when needed

    return KubeControl(kube_client(args.kubeconfig, args.context))


def _tuning_cluster(control: Control, given: TuningCluster | None) -> TuningCluster | None:
    """The sweep's cluster: the plugin's own client (its --kubeconfig and --context) unless given."""
    client = getattr(control, "client", None)
    if given is not None or client is None:
        return given
    from triton_operator.adapters.tuning_cluster import KubeTuning  # noqa: PLC0415 - lightkube when needed

    return KubeTuning(client)


def run(
    args: argparse.Namespace, client: Control, now: datetime, tuning_cluster: TuningCluster | None = None
) -> str:
    """Carry out one parsed command; returns what to print."""
    namespace = args.namespace or client.namespace
    if args.verb in ("get", "status"):
        return _frame(args, client, namespace, lambda: now)()[1]
    if args.verb == "tune":
        return tune(args, client, tuning_cluster)
    if args.verb == "infer":
        return infer(args, client.get(args.name, namespace))
    action: Action
    to_revision = None
    if args.verb == "promote":
        action = "promote-full" if args.full else "promote"
    elif args.verb == "undo":
        action = "undo"
        to_revision = args.to_revision
    elif args.verb in ("abort", "pause", "resume", "retry"):
        action = args.verb
    else:  # pragma: no cover - argparse allows only the verbs above
        raise ValueError(args.verb)
    # A promote or abort is for the rollout the user sees: the engine ignores it once another
    # revision has replaced that one (it never completes a step of a canary nobody looked at).
    revision = (
        request_revision(client.get(args.name, namespace).get("status")) if action in FOR_REVISION else None
    )
    request_id = client.request(args.name, namespace, action, to_revision, revision=revision)
    target = f" to {to_revision}" if to_revision else ""
    made_for = f" for revision {revision}" if revision else ""
    requested = f"{action}{target} requested{made_for}"
    return f"tritonservice {namespace}/{args.name}: {requested} (request id {request_id})"


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(
    argv: Sequence[str] | None = None,
    client: Control | None = None,
    tuning_cluster: TuningCluster | None = None,
    sleep: Callable[[float], None] = time.sleep,
    operator: Callable[[], list[str]] | None = None,
) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        print(version_text(operator or (lambda: _operator_versions(args))))
        return 0
    if args.verb is None:
        parser.error("the following arguments are required: COMMAND")
    if args.verb == "completion":
        from triton_operator.core.commandline.completion import script  # noqa: PLC0415

        sys.stdout.write(script(args.shell, "kubectl-triton", parser))
        return 0
    if getattr(args, "watch", False):
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            control = _control(client, args)
            namespace = args.namespace or control.namespace
            frame = _frame(args, control, namespace)
            tty = sys.stdout.isatty() and not args.output  # -o: a stream of documents, never redrawn
            return watch(frame, sys.stdout, sys.stderr, tty=tty, sleep=sleep)
        except KeyboardInterrupt:  # during the first read: ended like any other moment of a watch
            return 0
        except Exception as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    if args.verb == "tune":
        # SIGTERM (a closed terminal, `timeout`, a CI cancel) cleans up like Ctrl-C does.
        signal.signal(signal.SIGTERM, _interrupt)
        signal.signal(signal.SIGHUP, _interrupt)
    try:
        control = _control(client, args)
        if args.verb == "tune":
            tuning_cluster = _tuning_cluster(control, tuning_cluster)
        text = run(args, control, utcnow(), tuning_cluster)
        if text:  # `-o name` of nothing prints nothing, as kubectl
            print(text)
    except KeyboardInterrupt:
        if args.verb == "tune":
            print("interrupted: the sweep's objects were deleted (but any `cleanup:` above)", file=sys.stderr)
        else:
            print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # errors of the API or kubeconfig: one line, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
