"""A sweep's measurements, pure: perf_analyzer's CSV parsed, the choice, the spec patch it proposes."""

from __future__ import annotations

import csv
import dataclasses
import io
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from triton_operator.core.tuning.sweep import CSV_MARKER, Candidate, _model_index

# ----------------------------------------------------------------- perf_analyzer's output


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One concurrency of one candidate: client-side throughput and latency percentiles (µs)."""

    concurrency: int
    throughput: float
    p50_us: int
    p90_us: int
    p95_us: int
    p99_us: int

    def latency(self, percentile: int) -> int:
        value: int = getattr(self, f"p{percentile}_us")
        return value


_COLUMNS = {
    "concurrency": "Concurrency",
    "throughput": "Inferences/Second",
    "p50_us": "p50 latency",
    "p90_us": "p90 latency",
    "p95_us": "p95 latency",
    "p99_us": "p99 latency",
}


def parse_perf_csv(text: str) -> list[Measurement]:
    """perf_analyzer's ``-f`` CSV (one or more, each with its header) as Measurements.

    Raises ValueError naming what is missing: a column, or any row at all.
    """
    rows: list[Measurement] = []
    header: list[str] | None = None
    for record in csv.reader(io.StringIO(text)):
        cells = [c.strip() for c in record]
        if not cells or not any(cells):
            header = None
            continue
        if cells[0] == _COLUMNS["concurrency"]:
            missing = [c for c in _COLUMNS.values() if c not in cells]
            if missing:
                raise ValueError(f"perf_analyzer's CSV has no column {', '.join(missing)} (header: {cells})")
            header = cells
            continue
        if header is None:
            continue
        values = dict(zip(header, cells, strict=False))
        try:
            rows.append(
                Measurement(
                    concurrency=int(values[_COLUMNS["concurrency"]]),
                    throughput=float(values[_COLUMNS["throughput"]]),
                    **{k: int(float(values[c])) for k, c in _COLUMNS.items() if k.endswith("_us")},
                )
            )
        except (KeyError, ValueError) as exc:
            raise ValueError(f"perf_analyzer's CSV row {cells}: {exc}") from exc
    if not rows:
        raise ValueError("perf_analyzer printed no measurement")
    return rows


def job_output_csv(log: str) -> str:
    """The CSV parts of a perf Job's log (after each CSV_MARKER line)."""
    parts: list[str] = []
    taking = False
    for line in log.splitlines():
        if line.strip() == CSV_MARKER:
            taking = True
            parts.append("")
            continue
        if taking:
            parts.append(line)
    return "\n".join(parts)


# ----------------------------------------------------------------- results and the choice


@dataclasses.dataclass(frozen=True)
class CandidateResult:
    candidate: Candidate
    measurements: tuple[Measurement, ...] = ()
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class Choice:
    """The best (candidate, concurrency) under the bound, and the model's own config's best beside it."""

    candidate: Candidate
    measurement: Measurement
    baseline: Measurement | None

    @property
    def gain(self) -> float | None:
        if self.baseline is None or self.baseline.throughput <= 0:
            return None
        return self.measurement.throughput / self.baseline.throughput


def _best(
    rows: Sequence[tuple[Candidate, Measurement]], percentile: int
) -> tuple[Candidate, Measurement] | None:
    if not rows:
        return None
    # Most throughput; then lower latency; then the earlier candidate (the model's own first).
    return max(rows, key=lambda r: (r[1].throughput, -r[1].latency(percentile), -r[0].index))


def choose(results: Sequence[CandidateResult], percentile: int, bound_us: int | None) -> Choice | None:
    """The highest throughput measured within ``bound_us`` at ``percentile`` (None: any latency)."""
    rows = [
        (r.candidate, m)
        for r in results
        if r.error is None
        for m in r.measurements
        if bound_us is None or m.latency(percentile) <= bound_us
    ]
    best = _best(rows, percentile)
    if best is None:
        return None
    baseline = _best([row for row in rows if row[0].default], percentile)
    return Choice(best[0], best[1], baseline[1] if baseline else None)


def spec_patch(spec: Mapping[str, Any], model: str, config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSON patch (RFC 6902) that gives ``model`` ``config`` in a TritonService with ``spec``;
    its first operation tests the model's name, so it fails rather than change another model."""
    index = _model_index(spec, model)
    return [
        {"op": "test", "path": f"/spec/models/{index}/name", "value": model},
        {"op": "replace", "path": f"/spec/models/{index}/config", "value": dict(config)},
    ]


def patch_yaml(patch: Sequence[Mapping[str, Any]]) -> str:
    return yaml.safe_dump([dict(p) for p in patch], sort_keys=False, default_flow_style=None)


# ----------------------------------------------------------------- the record on the cluster


def measurement_dict(m: Measurement) -> dict[str, Any]:
    return dataclasses.asdict(m)
