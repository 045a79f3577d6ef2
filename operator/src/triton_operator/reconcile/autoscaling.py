"""Autoscaling reads: the namespace's HPAs, sorted into the owned one and others (core.decision.scaling)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from triton_operator.adapters.kube import KubeAPI
from triton_operator.core.decision.scaling import HPA_KIND, Autoscalers, autoscalers_wanted
from triton_operator.models import TritonService

AUTOSCALER_RETRY_SECONDS = 60.0
"""HPAs are not watched: while spec.autoscaling is set, the condition is refreshed this often."""


async def look(
    kube: KubeAPI, specs: Sequence[TritonService], metadata: Mapping[str, Any], previous: Mapping[str, Any]
) -> list[Autoscalers | None]:
    """The HPAs of the namespace that target each of ``specs`` (one TritonService's specs: the one a
    pass carries out, and the last valid one); None for a spec with nothing to look at.

    They are listed (once) only while spec.autoscaling is set, or while the status says the operator
    may still own an HPA (its Autoscaling condition): a service that never asked costs no request.
    """
    wanted = [autoscalers_wanted(ts, previous) for ts in specs]
    if not any(wanted):
        return [None for _ in specs]
    hpas = await kube.list_kind(HPA_KIND, specs[0].namespace)
    return [
        Autoscalers.of(hpas, ts.name, metadata.get("uid")) if want else None
        for ts, want in zip(specs, wanted, strict=True)
    ]
