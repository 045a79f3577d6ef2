"""Revision hash: a short stable digest of everything a pod serves (template inputs, configs, manifest)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

HASH_LENGTH = 10
# Bump to force new revisions for every TritonService when the meaning of the inputs changes.
HASH_SCHEMA = 1


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: equal values give equal bytes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def canonical_digest(value: Any) -> str:
    """The sha256 (hex) of ``value``'s canonical JSON: equal values give equal digests."""
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


def revision_hash(
    pod_template_inputs: Mapping[str, Any],
    configs: Mapping[str, str],
    manifest_digest: str | None = None,
) -> str:
    """Name a revision: HASH_LENGTH hex chars of sha256 over the canonical JSON of what pods serve.

    ``pod_template_inputs`` holds only served inputs (images, args, resources, scheduling, ...),
    never replicas or rollout steps; ``configs`` maps model name to config.pbtxt text;
    ``manifest_digest`` is the pinned repository manifest's digest (None when unpinned).
    """
    document = {
        "schema": HASH_SCHEMA,
        "pod": dict(pod_template_inputs),
        "configs": dict(configs),
        "manifest": manifest_digest,
    }
    return canonical_digest(document)[:HASH_LENGTH]
