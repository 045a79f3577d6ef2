"""The pool's models as placement sees them: memory (declared or measured: the larger), copies."""

from __future__ import annotations

from collections.abc import Mapping

from triton_operator.core.pool.copies import Thresholds, rate
from triton_operator.core.pool.placement import PoolModel
from triton_operator.models import TritonServiceSpec
from triton_operator.quantities import quantity_bytes


def pool_budget(spec: TritonServiceSpec) -> int:
    """spec.pool.memoryPerPod in bytes; ValueError without spec.pool."""
    if spec.pool is None:
        raise ValueError("spec.pool is not set")
    return quantity_bytes(spec.pool.memory_per_pod)


def thresholds(spec: TritonServiceSpec) -> Thresholds:
    """spec.pool.scaling as the copies decision's numbers; ValueError without spec.pool."""
    if spec.pool is None:
        raise ValueError("spec.pool is not set")
    scaling = spec.pool.scaling
    return Thresholds(
        busy_queue_us=float(scaling.busy_queue_microseconds),
        idle_rate=float(rate(scaling.idle_inferences_per_second)),
        stabilization_s=float(scaling.scale_down_stabilization_seconds),
        busy_rate=(
            float(rate(scaling.busy_inferences_per_second))
            if scaling.busy_inferences_per_second is not None
            else None
        ),
        up_stabilization_s=float(scaling.scale_up_stabilization_seconds),
    )


def most_pods(spec: TritonServiceSpec) -> int:
    """The most pods the pool may have: spec.autoscaling.maxReplicas when set, else spec.replicas."""
    return spec.autoscaling.max_replicas if spec.autoscaling is not None else spec.replicas


def pool_models(
    spec: TritonServiceSpec,
    measured: Mapping[str, int] | None = None,
    wanted: Mapping[str, int] | None = None,
    last_used: Mapping[str, float] | None = None,
) -> list[PoolModel]:
    """spec.models as PoolModels: one copy's memory is the larger of the declared spec.models[].memory and
    the figure measured at its load (``measured``, from status.pool.models[].measuredMemory): a model
    measured larger than declared never overfills a pod, and one measured smaller keeps the room its
    owner declared (what it takes serving may exceed what its load took). Wanted copies default to the
    least. A model without either figure raises ValueError (validation refuses it first)."""
    measured, wanted, last_used = measured or {}, wanted or {}, last_used or {}
    out = []
    for index, model in enumerate(spec.models):
        figures = [measured[model.name]] if model.name in measured else []
        if model.memory is not None:
            figures.append(quantity_bytes(model.memory))
        if not figures:
            raise ValueError(f"spec.models[{index}].memory: is required under spec.pool")
        memory = max(figures)
        least = model.min_copies if model.min_copies is not None else 1
        out.append(
            PoolModel(
                name=model.name,
                memory=memory,
                min_copies=least,
                max_copies=model.max_copies,
                wanted=wanted.get(model.name, least),
                last_used=last_used.get(model.name),
            )
        )
    return out
