"""The TritonService specs of tests/support/realrepo.py are ones the operator accepts, and its shapes and
sizes refuse what they cannot generate (nothing is generated here: the specs depend on the shape alone)."""

from __future__ import annotations

import copy

import pytest

from crd_schema import ROOT, validate
from realrepo import ENSEMBLE, GiB, KiB, MiB, RepoShape, parse_size, spec_models
from triton_operator.core.spec.validation.spec import check_spec, spec_warnings
from triton_operator.settings import DEFAULT_TRITON_IMAGE

SHAPES = {
    "default": RepoShape(),
    "all-versions": RepoShape(versions=(1, 2), version_policy={"all": {}}),
    "no-ensemble": RepoShape(big_bytes=0, small_count=1, ensemble=False),
}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_the_generated_spec_passes_the_operators_validation_and_the_crd_schema(shape: RepoShape) -> None:
    raw = {"repository": {"uri": "s3://models/real"}, "models": spec_models(shape)}
    spec, errors = check_spec(copy.deepcopy(raw))
    assert spec is not None and errors == []
    assert spec_warnings(spec, DEFAULT_TRITON_IMAGE) == []
    service = {
        "apiVersion": "triton-operator.io/v1alpha1",
        "kind": "TritonService",
        "metadata": {"name": "real"},
        "spec": raw,
    }
    assert validate(service, ROOT) == []
    names = [m.name for m in spec.models]
    assert names == [name for name, _ in shape.weighted()] + ([ENSEMBLE] if shape.ensemble else [])


def test_the_default_shape_is_the_benchmarks_size() -> None:
    assert dict(RepoShape().weighted()) == {
        "llm": 2 * GiB,
        "encoder": 500 * MiB,
        "small-1": MiB,
        "small-2": MiB,
        "small-3": MiB,
    }


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("2GiB", 2 * GiB),
        ("500MiB", 500 * MiB),
        ("1.5GB", 1_500_000_000),
        ("4096", 4096),
        ("64 kib", 64 * KiB),
    ],
)
def test_sizes_read_binary_and_decimal_units(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "2 GiBs", "-1MiB", "MiB"])
def test_a_size_that_is_not_one_is_refused_quoting_it(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"shard_bytes": 0}, "shard_bytes must be positive"),
        ({"medium_bytes": -1}, "cannot be negative"),
        ({"versions": ()}, "versions must be distinct numbers >= 1"),
        ({"versions": (1, 1)}, "versions must be distinct numbers >= 1"),
        ({"versions": (0,)}, "versions must be distinct numbers >= 1"),
        ({"small_count": 1}, "the ensemble chains two small models"),
    ],
)
def test_a_shape_that_cannot_be_generated_is_refused_saying_why(
    fields: dict[str, object], words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        RepoShape(**fields)  # type: ignore[arg-type]
