"""The dynamic and sequence batchers, their priority queues and sequence controls, as Triton checks them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from triton_operator.core.spec.validation.errors import SpecError, as_int

BOOLEAN_CONTROLS = ("CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_END", "CONTROL_SEQUENCE_READY")
CORRID_CONTROL = "CONTROL_SEQUENCE_CORRID"
CORRID_TYPES = ("TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32", "TYPE_INT32", "TYPE_STRING")
FALSE_TRUE_FIELDS = ("int32FalseTrue", "fp32FalseTrue", "boolFalseTrue")


def batching_errors(config: Mapping[str, Any], path: str) -> list[SpecError]:
    """ValidateModelConfig's checks of dynamic_batching and sequence_batching."""
    errors = []
    dynamic = config.get("dynamicBatching")
    if dynamic is not None:
        errors.extend(_dynamic_errors(dynamic, as_int(config.get("maxBatchSize")), f"{path}.dynamicBatching"))
    sequence = config.get("sequenceBatching")
    if sequence is not None:
        errors.extend(_sequence_errors(config, sequence, f"{path}.sequenceBatching"))
    return errors


# ---------------------------------------------------------------- dynamic batching


def _dynamic_errors(dynamic: Mapping[str, Any], max_batch: int, dpath: str) -> list[SpecError]:
    errors = []
    if max_batch <= 0:
        # Stricter than Triton, which accepts the batcher and runs batches of one.
        message = f"needs maxBatchSize > 0 (it is {max_batch}): a model that does not batch cannot batch"
        errors.append(SpecError(dpath, message))
    for index, size in enumerate(dynamic.get("preferredBatchSize") or []):
        # "dynamic batching preferred size must be positive" / "must be <= max batch size"
        if max_batch > 0 and not 0 < as_int(size) <= max_batch:
            errors.append(
                SpecError(
                    f"{dpath}.preferredBatchSize[{index}]",
                    f"is {size}; must be in [1, maxBatchSize={max_batch}]",
                )
            )
    errors.extend(_priority_errors(dynamic, dpath))
    errors.extend(_preserve_ordering_errors(dynamic, dpath))
    return errors


def _priority_errors(dynamic: Mapping[str, Any], dpath: str) -> list[SpecError]:
    """ "default priority level must be in range" and "priority queue policy must have priority level
    in range"; a policy without levels is refused too (Triton ignores it)."""
    levels = as_int(dynamic.get("priorityLevels"))
    if not levels:
        if dynamic.get("priorityQueuePolicy"):
            return [SpecError(f"{dpath}.priorityQueuePolicy", "needs priorityLevels")]
        return []
    errors = []
    default_level = as_int(dynamic.get("defaultPriorityLevel"))
    if not 1 <= default_level <= levels:
        errors.append(
            SpecError(
                f"{dpath}.defaultPriorityLevel",
                f"is {default_level}; must be in [1, priorityLevels={levels}]",
            )
        )
    for key in dynamic.get("priorityQueuePolicy") or {}:
        if not 1 <= as_int(key) <= levels:
            errors.append(
                SpecError(f"{dpath}.priorityQueuePolicy[{key}]", f"priority level must be in [1, {levels}]")
            )
    return errors


def _delays(policy: Mapping[str, Any] | None) -> bool:
    """A queue policy that delays timed-out requests (DELAY with a timeout), reordering them."""
    policy = policy or {}
    return policy.get("timeoutAction") == "DELAY" and as_int(policy.get("defaultTimeoutMicroseconds")) != 0


def _preserve_ordering_errors(dynamic: Mapping[str, Any], dpath: str) -> list[SpecError]:
    """preserve_ordering conflicts with priorities and with delaying timed-out requests."""
    if not dynamic.get("preserveOrdering"):
        return []
    errors = []
    if as_int(dynamic.get("priorityLevels")) > 1:
        # "Only one priority level is allowed when 'preserve_ordering' is true"
        errors.append(SpecError(f"{dpath}.preserveOrdering", "allows only one priority level"))
    # "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true"
    message = "DELAY reorders timed-out requests, which preserveOrdering forbids"
    if _delays(dynamic.get("defaultQueuePolicy")):
        errors.append(SpecError(f"{dpath}.defaultQueuePolicy.timeoutAction", message))
    for key, policy in (dynamic.get("priorityQueuePolicy") or {}).items():
        if _delays(policy):
            errors.append(SpecError(f"{dpath}.priorityQueuePolicy[{key}].timeoutAction", message))
    return errors


# ---------------------------------------------------------------- sequence batching


def _sequence_errors(config: Mapping[str, Any], sequence: Mapping[str, Any], spath: str) -> list[SpecError]:
    errors = []
    if (config.get("responseCache") or {}).get("enable"):
        # "Response Cache does not currently support model ... with sequence batching scheduler"
        errors.append(
            SpecError(spath, "cannot be used with responseCache.enable: the cache does not serve sequences")
        )
    errors.extend(_control_errors(sequence, spath))
    max_batch = as_int(config.get("maxBatchSize"))
    for index, size in enumerate((sequence.get("oldest") or {}).get("preferredBatchSize") or []):
        # "sequence batching preferred batch size must be positive" / "must be <= max batch size"
        if not 0 < as_int(size) <= max_batch:
            errors.append(
                SpecError(
                    f"{spath}.oldest.preferredBatchSize[{index}]",
                    f"is {size}; must be in [1, maxBatchSize={max_batch}]",
                )
            )
    utilization = (sequence.get("direct") or {}).get("minimumSlotUtilization")
    if utilization is not None and not 0.0 <= float(utilization) <= 1.0:
        # "sequence batching minimum slot utilization must be in range (0.0, 1.0]"
        errors.append(
            SpecError(f"{spath}.direct.minimumSlotUtilization", f"is {utilization}; must be in [0, 1]")
        )
    return errors


def _control_errors(sequence: Mapping[str, Any], spath: str) -> list[SpecError]:
    """GetBooleanSequenceControlProperties and GetTypedSequenceControlProperties, for every kind: each
    control tensor is named once, each kind is given once, with its values."""
    errors = []
    names: dict[str, int] = {}
    kinds: dict[str, str] = {}
    for index, control_input in enumerate(sequence.get("controlInput") or []):
        cpath = f"{spath}.controlInput[{index}]"
        name = control_input.get("name") or ""
        if not name:
            # "sequence batching control tensor must have a name"
            errors.append(SpecError(f"{cpath}.name", "is required"))
        elif name in names:
            # "sequence batching control tensor ... is specified for multiple control kinds"
            message = (
                f"control tensor {name!r} is also controlInput[{names[name]}]: a tensor carries one control"
            )
            errors.append(SpecError(f"{cpath}.name", message))
        else:
            names[name] = index
        for cindex, control in enumerate(control_input.get("control") or []):
            kpath = f"{cpath}.control[{cindex}]"
            kind = control.get("kind") or BOOLEAN_CONTROLS[0]
            if kind in kinds:
                # "sequence batching specifies multiple ... tensors"
                message = f"{kind} is also given by {kinds[kind]}: one tensor per control kind"
                errors.append(SpecError(f"{kpath}.kind", message))
            else:
                kinds[kind] = f"controlInput[{index}].control[{cindex}]"
            errors.extend(_control_value_errors(control, kind, kpath))
    return errors


def _control_value_errors(control: Mapping[str, Any], kind: str, kpath: str) -> list[SpecError]:
    given = [key for key in FALSE_TRUE_FIELDS if control.get(key)]
    if kind == CORRID_CONTROL:
        # "sequence batching must not specify either 'int32_false_true', ..." and "unexpected data
        # type for control CONTROL_SEQUENCE_CORRID"
        errors = [
            SpecError(f"{kpath}.{key}", f"{kind} carries the correlation ID: it takes no false/true values")
            for key in given
        ]
        data_type = control.get("dataType", "TYPE_INVALID")
        if data_type not in CORRID_TYPES:
            shown = "is required" if data_type == "TYPE_INVALID" else f"is {data_type}"
            errors.append(
                SpecError(f"{kpath}.dataType", f"{shown}; {kind} takes one of {', '.join(CORRID_TYPES)}")
            )
        return errors
    if not given:
        # "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true'"
        return [
            SpecError(kpath, f"{kind} needs its false and true values: one of {', '.join(FALSE_TRUE_FIELDS)}")
        ]
    if len(given) > 1:
        # "sequence batching specifies more than one from 'int32_false_true', ..."
        return [
            SpecError(f"{kpath}.{given[1]}", f"set together with {given[0]}; a control takes one of them")
        ]
    values = control[given[0]]
    if len(values) != 2:
        # "sequence batching control '...' must have exactly 2 entries"
        message = f"has {len(values)} entries; it takes exactly 2: the false value, then the true value"
        return [SpecError(f"{kpath}.{given[0]}", message)]
    return []
