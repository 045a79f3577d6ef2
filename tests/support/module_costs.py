"""What each test module cost in a run: wall seconds (setup, call and teardown together) and tests,
printed at the end of every run for the real-node modules (docs/testing.md quotes it)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Phase:
    """One report of one test's phase, as pytest hands it over."""

    nodeid: str
    when: str
    duration: float


def module_costs(phases: Iterable[Phase], prefix: str) -> list[tuple[str, float, int]]:
    """(module, seconds, tests) for every module under ``prefix``, the most costly first.

    Seconds add up every phase of every test of the module; a module-scoped fixture's set-up counts
    in its first test's setup phase, as pytest reports it. Tests are counted by their call phase."""
    seconds: dict[str, float] = {}
    tests: dict[str, int] = {}
    for phase in phases:
        module = phase.nodeid.split("::", 1)[0]
        if not module.startswith(prefix):
            continue
        seconds[module] = seconds.get(module, 0.0) + phase.duration
        tests.setdefault(module, 0)
        if phase.when == "call":
            tests[module] += 1
    return sorted(((m, s, tests[m]) for m, s in seconds.items()), key=lambda row: (-row[1], row[0]))


def costs_table(rows: list[tuple[str, float, int]]) -> list[str]:
    """The rows as the lines of a Markdown table, with a total."""
    lines = ["| module | tests | seconds |", "|---|---:|---:|"]
    lines += [f"| {m} | {n} | {s:.0f} |" for m, s, n in rows]
    lines.append(f"| total | {sum(n for _, _, n in rows)} | {sum(s for _, s, _ in rows):.0f} |")
    return lines
