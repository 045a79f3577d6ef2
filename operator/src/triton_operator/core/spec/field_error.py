"""The error a parser of the spec raises: which field, and what is wrong with it (no protobuf import)."""

from __future__ import annotations


class ModelConfigError(ValueError):
    """A model's config (or another part of the spec) is not valid; ``field`` names where.

    Defined apart from core.spec.modelconfig so that what only parses manifests (the sync command, the
    node cache) raises it without importing protobuf."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem
