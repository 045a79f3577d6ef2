"""The GPU memory a pooled model's load took, from tritonserver's own GPU metrics (Prometheus text), pure.

tritonserver serves, on its metrics port (8002, ``/metrics``), one gauge per GPU it sees (the GPUs of
its pod) for each of ``nv_gpu_memory_used_bytes`` and ``nv_gpu_memory_total_bytes``, labelled
``gpu_uuid`` (Triton's docs/user_guide/metrics.md, "GPU Metrics"; read through DCGM once per
``--metrics-interval-ms``, 2000 by default; where DCGM cannot read a GPU, tritonserver sets both of its
gauges to 0). A model's GPU memory is how much the used memory of the pod's GPUs, summed, grew across
a load that no other load overlapped: the same rule as the host memory of a model on the CPU.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

USED = "nv_gpu_memory_used_bytes"
"""Triton's gauge of a GPU's used memory, in bytes (per GPU, labelled ``gpu_uuid``)."""
TOTAL = "nv_gpu_memory_total_bytes"
"""Triton's gauge of a GPU's total memory, in bytes (0 where DCGM could not read the GPU)."""
GPU_LABEL = "gpu_uuid"

HOST = "host"
GPU = "gpu"
"""The kinds of memory a model's instances take (measured_kinds)."""

_SAMPLE = re.compile(
    r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?\s*$"
)
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


class MetricsError(ValueError):
    """A metrics page whose GPU memory lines are not what Prometheus's text format says; names the line."""


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory as tritonserver last read it: used and total, in bytes."""

    used: int
    total: int


def _labels(text: str, line: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    at = 0
    while at < len(text):
        match = _LABEL.match(text, at)
        if match is None or match.end() == at:
            if text[at:].strip():
                raise MetricsError(f'metrics line {line!r}: labels not key="value" pairs')
            break
        value = match.group(2).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
        labels[match.group(1)] = value
        at = match.end()
    return labels


def parse_gpu_memory(text: str) -> dict[str, GpuMemory]:
    """Each GPU's used and total memory from tritonserver's metrics page (by its ``gpu_uuid``); the
    other metrics, comments and GPUs with only one of the two gauges are left out. Empty: no GPU metrics
    (no GPU in the pod, or tritonserver started with ``--allow-gpu-metrics=false``). A GPU memory line
    that is not Prometheus text, or whose value is negative or not a number, raises MetricsError."""
    found: dict[str, dict[str, int]] = {}
    for line in text.splitlines():
        if not line.startswith((USED, TOTAL)):
            continue
        match = _SAMPLE.match(line)
        if match is None or match.group("name") not in (USED, TOTAL):
            if match is None:
                raise MetricsError(f"metrics line {line!r}: not a Prometheus sample")
            continue
        try:
            value = float(match.group("value"))
        except ValueError:
            raise MetricsError(f"metrics line {line!r}: the value is not a number") from None
        if not math.isfinite(value) or value < 0:
            raise MetricsError(f"metrics line {line!r}: the value must be a finite number of bytes")
        uuid = _labels(match.group("labels") or "", line).get(GPU_LABEL)
        if not uuid:
            raise MetricsError(f"metrics line {line!r}: no {GPU_LABEL} label")
        found.setdefault(uuid, {})[match.group("name")] = int(value)
    return {
        uuid: GpuMemory(used=gauges[USED], total=gauges[TOTAL])
        for uuid, gauges in found.items()
        if USED in gauges and TOTAL in gauges
    }


def gpu_growth(before: Mapping[str, GpuMemory], after: Mapping[str, GpuMemory]) -> int | None:
    """How much the used memory of the pod's GPUs, summed, grew from ``before`` to ``after`` (bytes; a
    shrink counts 0). None, nothing measured, when either reading has no GPU, the two do not name the
    same GPUs, or DCGM could not read one of them (its total 0)."""
    if not before or not after or set(before) != set(after):
        return None
    if any(g.total <= 0 for g in (*before.values(), *after.values())):
        return None
    return max(0, sum(after[uuid].used - before[uuid].used for uuid in after))


def measured_kinds(instance_kinds: Iterable[str]) -> frozenset[str]:
    """Which memory a load of a model is measured in, from its instance_groups' kinds (their names, as
    config.pbtxt writes them): HOST when every group is KIND_CPU, GPU when every one is KIND_GPU, both
    when it has groups of each (its CPU instances hold host memory and its GPU instances GPU memory: its
    figure is the sum). Empty, not measured, when it has no instance_group (Triton then picks the
    device) or one of another kind (KIND_AUTO, a group that names no kind; KIND_MODEL: where it runs is
    not known here)."""
    kinds = set(instance_kinds)
    if not kinds or not kinds <= {"KIND_CPU", "KIND_GPU"}:
        return frozenset()
    return frozenset(({HOST} if "KIND_CPU" in kinds else set()) | ({GPU} if "KIND_GPU" in kinds else set()))


def load_figure(kinds: frozenset[str], host: int | None, gpu: int | None) -> int | None:
    """A model's measured memory from a load: the host growth where ``kinds`` has HOST, plus the GPU
    growth where it has GPU; None when a kind it needs was not measured (or it needs none)."""
    figures = [host if HOST in kinds else 0, gpu if GPU in kinds else 0]
    if not kinds or None in figures:
        return None
    return sum(f for f in figures if f is not None)
