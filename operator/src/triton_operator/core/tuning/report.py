"""A sweep's record as `kubectl triton tune` shows it: the summary, the results table, the refusals."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# ----------------------------------------------------------------- what people read


def _us(value: Any) -> str:
    return f"{int(value) / 1000:.1f}" if value is not None else "-"


def result_rows(data: Mapping[str, Any]) -> list[list[str]]:
    """The table of a record: one row per candidate and concurrency (a row per candidate not measured)."""
    chosen = (data.get("choice") or {}).get("candidate")
    best_conc = ((data.get("choice") or {}).get("measurement") or {}).get("concurrency")
    bound = data.get("latencyBoundMicroseconds")
    percentile = int(data.get("percentile") or 95)
    rows: list[list[str]] = []
    for c in data.get("candidates") or []:
        name = str(c.get("name")) + (" (own)" if c.get("default") else "")
        if not c.get("measurements"):
            reason = c.get("error") or ("not run" if not c.get("measured") else "no measurement")
            rows.append([name, str(c.get("settings")), "-", "-", "-", "-", "-", str(reason)])
            continue
        for m in c["measurements"]:
            latency = m.get(f"p{percentile}_us")
            note = ""
            if bound is not None and latency is not None and latency > bound:
                note = "over bound"
            if c.get("name") == chosen and m.get("concurrency") == best_conc:
                note = "<- best"
            rows.append(
                [
                    name,
                    str(c.get("settings")),
                    str(m.get("concurrency")),
                    f"{float(m.get('throughput', 0)):.1f}",
                    _us(m.get("p50_us")),
                    _us(m.get("p95_us")),
                    _us(m.get("p99_us")),
                    note,
                ]
            )
    return rows


RESULT_HEADER = ["CANDIDATE", "SETTINGS", "CONC", "INFER/S", "P50 MS", "P95 MS", "P99 MS", ""]


def summary(data: Mapping[str, Any]) -> str:
    """One line: the run, its state, and the choice with its gain over the model's own config."""
    percentile = data.get("percentile")
    bound = data.get("latencyBoundMicroseconds")
    under = f"p{percentile} <= {_us(bound)} ms" if bound is not None else f"p{percentile}, no bound"
    head = f"run {data.get('run')} of model {data.get('model')}: {data.get('state')}"
    if data.get("message"):
        head += f" ({data['message']})"
    choice = data.get("choice")
    if not choice:
        return f"{head}; best under {under}: none"
    m = choice.get("measurement") or {}
    gain = (
        f", x{choice['gain']:.2f} the model's own" if choice.get("gain") and not choice.get("default") else ""
    )
    own = " (the model's own config)" if choice.get("default") else ""
    return (
        f"{head}; best under {under}: {choice.get('candidate')}{own} [{choice.get('settings')}] at "
        f"concurrency {m.get('concurrency')}, {float(m.get('throughput', 0)):.1f} infer/s{gain}"
    )


def refused_lines(data: Mapping[str, Any]) -> list[str]:
    return [
        f"  {json.dumps(r.get('settings'), sort_keys=True)}: {'; '.join(r.get('problems') or [])}"
        for r in data.get("refused") or []
    ]
