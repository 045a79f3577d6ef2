"""Autoscaling reads: the namespace's HPAs, sorted into the owned one and others (core.autoscaling)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from triton_operator.adapters.kube import KubeAPI
from triton_operator.core.autoscaling import HPA_KIND, Autoscalers, autoscalers_wanted
from triton_operator.models import TritonService

AUTOSCALER_RETRY_SECONDS = 60.0
"""HPAs are not watched: while spec.autoscaling is set, the condition is refreshed this often."""


async def look(
    kube: KubeAPI, ts: TritonService, metadata: Mapping[str, Any], previous: Mapping[str, Any]
) -> Autoscalers | None:
    """The HPAs of the namespace that target ``ts``; None when there is nothing to look at.

    They are listed only while spec.autoscaling is set, or while the status says the operator may
    still own an HPA (its Autoscaling condition): a service that never asked costs no request.
    """
    if not autoscalers_wanted(ts, previous):
        return None
    hpas = await kube.list_kind(HPA_KIND, ts.namespace)
    return Autoscalers.of(hpas, ts.name, metadata.get("uid"))
