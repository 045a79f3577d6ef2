"""A pool pod's per-model labels and the per-model object names: valid Kubernetes names for any model."""

from __future__ import annotations

import hashlib
import re

MODEL_LABEL_PREFIX = "model.triton-operator.io/"
"""A pod of a pool carries ``model.triton-operator.io/<model>: ready`` for each model Triton reports READY
on it; the label is taken off before the model is unloaded."""
READY = "ready"

_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.\-]{0,61}[A-Za-z0-9])?$")
_NOT_DNS = re.compile(r"[^a-z0-9-]+")


def _digest(name: str, length: int) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:length]


def model_label_key(model: str) -> str:
    """The pod label that says ``model`` is READY on the pod: the model's own name where it is a valid
    label name (63 characters, alphanumeric at both ends), else a readable part of it and a digest."""
    if _LABEL_NAME.match(model):
        return MODEL_LABEL_PREFIX + model
    readable = re.sub(r"[^A-Za-z0-9_.\-]", "", model).strip("_.-")[:50].rstrip("_.-")
    return MODEL_LABEL_PREFIX + (f"{readable}.{_digest(model, 8)}" if readable else f"m.{_digest(model, 8)}")


def model_object_name(service: str, model: str) -> str:
    """The name of ``model``'s objects (its Service) in TritonService ``service``: ``<service>-m-<model>``
    where that is a DNS-1035 label as it stands, else a lowercase readable part and a digest (unique:
    models differing only in case or in characters a name cannot hold get different names)."""
    plain = f"{service}-m-{model}"
    if len(plain) <= 63 and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", plain):
        return plain
    slug = _NOT_DNS.sub("-", model.lower()).strip("-")
    head = f"{service}-m-{slug}"[: 63 - 9].rstrip("-")
    return f"{head}-{_digest(model, 8)}"
