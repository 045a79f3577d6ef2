"""Autoscaling reads: the namespace's HPAs, to tell the owned one from a user's or KEDA's on the service."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from triton_operator.adapters.kube import KubeAPI
from triton_operator.core import conditions as cond
from triton_operator.core.autoscaling import (
    HPA_KIND,
    autoscaling_verdict,
    foreign_autoscalers,
    own_autoscaler,
)
from triton_operator.models import TritonService

AUTOSCALER_RETRY_SECONDS = 60.0
"""HPAs are not watched: while spec.autoscaling is set, the condition is refreshed this often."""


@dataclasses.dataclass(frozen=True)
class Autoscalers:
    """The HPAs that target one TritonService."""

    foreign: tuple[str, ...]
    """Names of the HPAs that are not the operator's (a user's, KEDA's): they win."""
    own: Mapping[str, Any] | None
    """The operator's HPA `<name>` as stored, if it exists."""

    def verdict(self, ts: TritonService) -> cond.Verdict | None:
        """The Autoscaling condition; None removes it (spec.autoscaling unset and the owned HPA gone).

        While an owned HPA the spec no longer asks for still exists, the condition stays and says
        so: the status keeps the record that an HPA may need deleting until it is seen gone.
        """
        if ts.spec.autoscaling is None:
            if self.own is None:
                return None
            return cond.Verdict(
                cond.FALSE,
                cond.AUTOSCALER_REMOVED,
                f"spec.autoscaling is unset: HorizontalPodAutoscaler {ts.name} is deleted, and"
                f" spec.replicas stays at {ts.spec.replicas}",
            )
        return autoscaling_verdict(ts.spec.autoscaling, self.foreign, self.own)

    def apply_own(self, ts: TritonService) -> bool:
        """Whether the owned HPA is to be written: spec.autoscaling asks and nothing else scales it."""
        return ts.spec.autoscaling is not None and not self.foreign

    def delete_own(self, ts: TritonService) -> bool:
        """Whether the owned HPA exists and is no longer wanted."""
        return self.own is not None and not self.apply_own(ts)


async def look(
    kube: KubeAPI, ts: TritonService, metadata: Mapping[str, Any], previous: Mapping[str, Any]
) -> Autoscalers | None:
    """The HPAs of the namespace that target ``ts``; None when there is nothing to look at.

    They are listed only while spec.autoscaling is set, or while the status says the operator may
    still own an HPA (its Autoscaling condition): a service that never asked costs no request.
    """
    had = cond.find_condition(previous.get("conditions") or [], cond.AUTOSCALING) is not None
    if ts.spec.autoscaling is None and not had:
        return None
    hpas = await kube.list_kind(HPA_KIND, ts.namespace)
    uid = metadata.get("uid")
    return Autoscalers(
        foreign=tuple(foreign_autoscalers(hpas, ts.name, uid)),
        own=own_autoscaler(hpas, ts.name, uid),
    )
