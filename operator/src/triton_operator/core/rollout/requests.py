"""Control requests: the `triton-operator.io/<action>` annotations kubectl triton writes, read and made."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from triton_operator import GROUP
from triton_operator.core.rollout.state import RolloutStatus

ANNOTATION_PREFIX = f"{GROUP}/"
Action = Literal["promote", "promote-full", "abort", "pause", "resume", "retry", "undo"]
ACTIONS: tuple[Action, ...] = ("promote", "promote-full", "abort", "pause", "resume", "retry", "undo")
UNDO_TARGET_ANNOTATION = f"{GROUP}/undo-to-revision"
FOR_REVISION: tuple[Action, ...] = ("promote", "promote-full", "abort")
"""Requests made for one revision: `triton-operator.io/<action>-revision` names it (kubectl triton
writes the canary, or the aborted revision, that the status showed)."""
REVISION_SUFFIX = "-revision"


@dataclasses.dataclass(frozen=True)
class ControlRequest:
    """A request from an annotation, applied once (its id is recorded in status.handledRequests)."""

    action: Action
    request_id: str
    to_revision: str | None = None
    revision: str | None = None
    """The revision a FOR_REVISION request was made for (None: one made without, taken as made for
    the revision in progress when the engine first sees it)."""


def parse_control_requests(annotations: Mapping[str, str] | None) -> tuple[ControlRequest, ...]:
    """Control requests from metadata.annotations: `triton-operator.io/<action>: <request id>`."""
    annotations = annotations or {}
    out: list[ControlRequest] = []
    for action in ACTIONS:
        request_id = annotations.get(ANNOTATION_PREFIX + action)
        if not request_id:
            continue
        target = annotations.get(UNDO_TARGET_ANNOTATION) if action == "undo" else None
        revision = (
            annotations.get(ANNOTATION_PREFIX + action + REVISION_SUFFIX) if action in FOR_REVISION else None
        )
        out.append(
            ControlRequest(
                action=action,
                request_id=str(request_id),
                to_revision=target or None,
                revision=str(revision) if revision else None,
            )
        )
    return tuple(out)


def pending_requests(
    annotations: Mapping[str, str] | None, status: Mapping[str, Any] | None
) -> tuple[ControlRequest, ...]:
    """The control requests of the annotations that status.handledRequests does not record yet."""
    handled = RolloutStatus.from_status(status).handled_requests
    return tuple(r for r in parse_control_requests(annotations) if handled.get(r.action) != r.request_id)


def control_annotations(
    action: Action, request_id: str, to_revision: str | None = None, *, revision: str | None = None
) -> dict[str, str | None]:
    """The metadata.annotations of a merge patch that makes a request (None removes a key).

    ``revision``: the revision a promote, promote-full or abort is made for (the engine ignores it
    for any other); None removes what an earlier request named."""
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}; one of {', '.join(ACTIONS)}")
    if not request_id:
        raise ValueError("a request needs an id")
    patch: dict[str, str | None] = {ANNOTATION_PREFIX + action: request_id}
    if action == "undo":
        patch[UNDO_TARGET_ANNOTATION] = to_revision or None
    elif to_revision:
        raise ValueError("only undo takes a target revision")
    if action in FOR_REVISION:
        patch[ANNOTATION_PREFIX + action + REVISION_SUFFIX] = revision or None
    elif revision:
        raise ValueError(f"{action} is not made for a revision (only {', '.join(FOR_REVISION)})")
    return patch


def request_revision(status: Mapping[str, Any] | None) -> str | None:
    """The revision a promote or abort made now is for: the canary in progress, else the revision
    loading in place (status.inPlace.next), else the aborted one (a canary's, or an in-place one's)."""
    st = RolloutStatus.from_status(status)
    raw = (status or {}).get("inPlace")
    in_place: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    moving = str(in_place["next"]) if in_place.get("next") else None
    held = str(in_place["abortedRevision"]) if in_place.get("abortedRevision") else None
    return st.canary_revision or moving or st.aborted_revision or held
