"""A pool against every model everywhere, on the same models: pods and memory needed, and placement's time.

Models of ``--mib`` MiB each (``--spread`` percent either way, seeded), pods of ``--pod-mib`` MiB. Two
loads: every model one copy, and a skewed one where one model in ten wants ``--hot-copies`` copies
(every model everywhere gives each model the copies of the busiest, so it needs that many pods of all
the models' memory). Placement's own time: one placement from nothing on the pods it needs, then one
more model added to it (what moves: only the new model's copies). Usage:
``.venv/bin/python bench/pool/placement.py [--models 40 400 4000] [--small]``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "operator" / "src"))

from triton_operator.core.pool.placement import PoolModel, PoolPod, place, pods_needed  # noqa: E402

MiB = 1024 * 1024


def make_models(count: int, mib: int, spread: int, hot_copies: int, seed: int) -> list[PoolModel]:
    rng = random.Random(seed)
    models = []
    for i in range(count):
        memory = int(mib * MiB * (1 + rng.uniform(-spread, spread) / 100))
        wanted = hot_copies if hot_copies > 1 and i % 10 == 0 else 1
        models.append(PoolModel(f"model-{i:05d}", memory, min_copies=1, wanted=wanted))
    return models


def row(count: int, load: str, models: list[PoolModel], pod_bytes: int) -> list[list[str]]:
    """Two rows: every model everywhere, then the pool."""
    total = sum(m.memory for m in models)
    busiest = max(m.target for m in models)
    everywhere = [
        str(count),
        load,
        "every model everywhere",
        str(busiest),
        f"{total / MiB:,.0f}",
        f"{busiest * total / MiB:,.0f}",
        "yes" if total <= pod_bytes else "no",
        "-",
        "-",
    ]
    started = time.perf_counter()
    pods = pods_needed(models, pod_bytes)
    sized = time.perf_counter() - started
    pool = [PoolPod(f"pod-{i:05d}", f"node-{i % 8}", pod_bytes) for i in range(pods)]
    started = time.perf_counter()
    placed = place(pool, models)
    fresh = time.perf_counter() - started
    assert not placed.least_unmet(models)
    extra = PoolModel("model-new", models[0].memory, min_copies=1, wanted=1)
    current = {pod: held for pod, held in placed.pods.items() if held}
    started = time.perf_counter()
    again = place([*pool, PoolPod("pod-new", "node-new", pod_bytes)], [*models, extra], current)
    added = time.perf_counter() - started
    assert again.unloads == () and {model for _, model in again.loads} == {"model-new"}
    used = max(sum(m.memory for m in models if m.name in held) for held in placed.pods.values())
    pooled = [
        str(count),
        load,
        "pool",
        str(pods),
        f"{used / MiB:,.0f}",
        f"{pods * pod_bytes / MiB:,.0f}",
        "yes",
        f"{fresh:.3f} (+{sized:.3f} sizing)",
        f"{added:.3f}",
    ]
    return [everywhere, pooled]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, nargs="+", default=[40, 400, 4000])
    parser.add_argument("--mib", type=int, default=100, help="memory of a model, MiB")
    parser.add_argument("--spread", type=int, default=10, help="percent either way around --mib")
    parser.add_argument("--pod-mib", type=int, default=1200, help="memory a pod gives its models, MiB")
    parser.add_argument("--hot-copies", type=int, default=4, help="copies a busy model wants")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--small", action="store_true", help="40 models only (for CI)")
    args = parser.parse_args()
    counts = [40] if args.small else args.models
    header = [
        "models",
        "load",
        "layout",
        "pods",
        "MiB a pod needs",
        "MiB in all",
        f"fits pods of {args.pod_mib} MiB",
        "placement s",
        "add one model s",
    ]
    print(f"models of {args.mib} MiB ±{args.spread}%, pods of {args.pod_mib} MiB, seed {args.seed}")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for count in counts:
        for load, hot in (("one copy each", 1), (f"1 in 10 wants {args.hot_copies}", args.hot_copies)):
            models = make_models(count, args.mib, args.spread, hot, args.seed)
            for cells in row(count, load, models, args.pod_mib * MiB):
                print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
