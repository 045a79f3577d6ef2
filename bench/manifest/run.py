"""How large repositories are stored: manifest sizes, ConfigMaps per revision, and the time each side takes.

For each object count (and with and without S3 version ids) it builds a realistic manifest
(tests/bigmanifest.py), lets the operator build the revision's objects (core.decision.actions.plan_actions)
and prints one markdown table: JSON and gzipped bytes, bytes an object, ConfigMaps, the largest
ConfigMap against the API server's 1 MiB and its request body against 3 MiB, the time to pack a
new revision, to re-plan a stored one (what every reconcile does), and for the pod to read the
parts back (join, gunzip, parse and check every entry), and one whole reconcile of a TritonService
whose revision is stored and serving (an in-memory API server, tests/fakeapi.py: the operator's
own work per event at that size). No cluster is needed.

    .venv/bin/python bench/manifest/run.py                      # 5,000 / 50,000 / 200,000 objects
    .venv/bin/python bench/manifest/run.py --counts 50000 --repeat 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "support"))

from bigmanifest import (  # noqa: E402
    CONFIGMAP_LIMIT,
    REQUEST_LIMIT,
    host_path,
    mount,
    payload_bytes,
    plan_for,
    realistic_manifest,
    refusal,
    spec_for,
)
from fakeapi import FakeClient  # noqa: E402
from triton_operator.adapters.kube import Kube  # noqa: E402
from triton_operator.adapters.storage import PinResult  # noqa: E402
from triton_operator.commands.sync import load_manifest  # noqa: E402
from triton_operator.core.decision.actions import Actions, Target, plan_actions  # noqa: E402
from triton_operator.core.objects.builders import compute_revision  # noqa: E402
from triton_operator.core.objects.names import SYNC_CONTAINER  # noqa: E402
from triton_operator.core.observed.observation import check_body  # noqa: E402
from triton_operator.core.repository import manifestparts  # noqa: E402
from triton_operator.core.repository.manifest import Manifest, manifest_digest, manifest_to_json  # noqa: E402
from triton_operator.models import TritonService  # noqa: E402
from triton_operator.reconcile.pinning import RepositoryPinner  # noqa: E402
from triton_operator.reconcile.reconcile_pass import reconcile  # noqa: E402
from triton_operator.settings import Settings  # noqa: E402

T = TypeVar("T")
SETTINGS = Settings()


def tritonservice(manifest: Manifest) -> dict[str, Any]:
    """A TritonService of one replica serving every model of ``manifest`` (polled every 10 minutes)."""
    spec = spec_for(manifest)
    spec["repository"]["pollIntervalSeconds"] = 600
    return {
        "apiVersion": "triton-operator.io/v1alpha1",
        "kind": "TritonService",
        "metadata": {"name": "bench", "namespace": "ml", "uid": "00000000-0000-0000-0000-00000000b0b0"},
        "spec": {"replicas": 1, **spec},
    }


def timed(repeat: int, fn: Callable[[], T]) -> tuple[float, T]:
    """Median seconds of ``repeat`` calls, and the last result."""
    times = []
    result: Any = None
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


class ListedPinner(RepositoryPinner):
    """The operator's pinner, with a listing that returns ``manifest`` instead of asking a store."""

    def __init__(self, kube: Kube, manifest: Manifest) -> None:
        super().__init__(kube)
        self.manifest = manifest

    async def _list(self, ts: TritonService) -> PinResult:
        return PinResult(self.manifest, versioned=True)


async def steady_reconcile(manifest: Manifest, repeat: int) -> float:
    """Median seconds of a reconcile once the revision is stored, stable and Ready."""
    api = FakeClient()
    api.put(tritonservice(manifest))
    kube = Kube(api)  # type: ignore[arg-type]
    pinner = ListedPinner(kube, manifest)
    await reconcile(kube, "ml", "bench", SETTINGS, pin_manifest=pinner)
    for deployment in api.of_kind("Deployment"):
        deployment["status"] = dict.fromkeys(
            ("replicas", "readyReplicas", "updatedReplicas", "availableReplicas"), 1
        )
    await reconcile(kube, "ml", "bench", SETTINGS, pin_manifest=pinner)
    times = []
    for _ in range(repeat):
        writes = len(api.writes)
        started = time.perf_counter()
        result = await reconcile(kube, "ml", "bench", SETTINGS, pin_manifest=pinner)
        times.append(time.perf_counter() - started)
        assert result.invalid is None and (result.status or {}).get("stableRevision"), result.invalid
        assert not [w for w in api.writes[writes:] if w[1] == "ConfigMap"]
    return statistics.median(times)


def row(count: int, versioned: bool, repeat: int) -> dict[str, Any]:
    manifest = realistic_manifest(count, versioned=versioned)
    text = manifest_to_json(manifest)
    checked = check_body(tritonservice(manifest))
    assert checked.ts is not None and not checked.problems
    ts, configs = checked.ts, checked.configs
    revision = compute_revision(ts, SETTINGS, configs, manifest_digest(manifest))

    def actions(deployments: list[dict[str, Any]], configmaps: list[dict[str, Any]]) -> Actions:
        return plan_actions(
            Target(ts, revision, configs, text),
            SETTINGS,
            plan_for(revision),
            deployments=deployments,
            configmaps=configmaps,
        )

    out: dict[str, Any] = {"objects": count, "version ids": "yes" if versioned else "no"}
    out["JSON bytes"] = len(text.encode())
    try:
        pack_s, first = timed(repeat, lambda: actions([], []))
    except manifestparts.ManifestTooLarge as exc:
        out["ConfigMaps"] = f"refused: {exc.parts} parts > {manifestparts.MAX_PARTS}"
        out["gzipped bytes"] = exc.compressed_bytes
        out["bytes/object"] = round(exc.compressed_bytes / count, 1)
        return out
    configmaps = [x for x in first.apply if x["kind"] == "ConfigMap"]
    deployment = next(x for x in first.apply if x["kind"] == "Deployment")
    assert all(refusal(x) is None for x in first.apply)
    parts = manifestparts.stored_parts(configmaps)
    gzipped = sum(len(p) for p in parts.values()) if parts else 0
    out["gzipped bytes"] = gzipped or "(plain)"
    out["bytes/object"] = round((gzipped or len(text.encode())) / count, 1)
    out["ConfigMaps"] = len(configmaps)
    out["largest ConfigMap"] = f"{max(payload_bytes(c) for c in configmaps) / CONFIGMAP_LIMIT:.0%} of 1 MiB"
    out["largest request"] = f"{max(len(json.dumps(c)) for c in configmaps) / REQUEST_LIMIT:.0%} of 3 MiB"
    out["pack (new revision) s"] = round(pack_s, 3)
    replan_s, again = timed(repeat, lambda: actions([deployment], configmaps))
    assert not [x for x in again.apply if x["kind"] == "ConfigMap"]
    out["re-plan (stored) s"] = round(replan_s, 3)
    with tempfile.TemporaryDirectory() as folder:
        mounted = mount(Path(folder), deployment, configmaps, SYNC_CONTAINER)
        args = deployment["spec"]["template"]["spec"]["initContainers"][0]["args"]
        path = host_path(mounted, args[args.index("--manifest") + 1])
        read_s, loaded = timed(repeat, lambda: load_manifest(path))
    assert manifest_digest(loaded) == manifest_digest(manifest)
    out["pod reads s"] = round(read_s, 3)
    out["reconcile (steady) s"] = round(asyncio.run(steady_reconcile(manifest, repeat)), 3)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--counts", default="5000,50000,200000", help="object counts, comma-separated")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each step (median)")
    args = parser.parse_args()
    rows = []
    for count in (int(c) for c in args.counts.split(",")):
        for versioned in (True, False):
            rows.append(row(count, versioned, args.repeat))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join("---:" for _ in columns) + "|")
    for r in rows:
        print("| " + " | ".join(str(r.get(c, "")) for c in columns) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
