"""The revision hash: short, stable over key order, and sensitive to every served input."""

from __future__ import annotations

import re

import pytest

from triton_operator.core.repository.revision import HASH_LENGTH, canonical_json, revision_hash

POD = {"image": "triton:1", "spec": {"shmSize": "1Gi", "models": [{"name": "m"}]}}
CONFIGS = {"m": 'name: "m"\n'}


def test_short_lowercase_hex() -> None:
    value = revision_hash(POD, CONFIGS, None)
    assert re.fullmatch(rf"[0-9a-f]{{{HASH_LENGTH}}}", value)
    assert HASH_LENGTH == 10


def test_key_order_does_not_matter() -> None:
    reordered = {"spec": {"models": [{"name": "m"}], "shmSize": "1Gi"}, "image": "triton:1"}
    assert revision_hash(reordered, dict(reversed(list(CONFIGS.items()))), None) == revision_hash(
        POD, CONFIGS, None
    )


def test_canonical_json_is_compact_and_sorted() -> None:
    assert canonical_json({"b": 1, "a": [1, {"d": 2, "c": 3}]}) == '{"a":[1,{"c":3,"d":2}],"b":1}'


@pytest.mark.parametrize(
    ("pod", "configs", "digest"),
    [
        ({**POD, "image": "triton:2"}, CONFIGS, None),
        (POD, {"m": 'name: "m"\nmax_batch_size: 4\n'}, None),
        (POD, {**CONFIGS, "n": 'name: "n"\n'}, None),
        (POD, CONFIGS, "sha256:abc"),
    ],
)
def test_any_served_input_changes_the_hash(
    pod: dict[str, object], configs: dict[str, str], digest: str | None
) -> None:
    assert revision_hash(pod, configs, digest) != revision_hash(POD, CONFIGS, None)


def test_list_order_matters() -> None:
    # model load order and argument order are part of what a pod does
    a = {"args": ["--a", "--b"]}
    b = {"args": ["--b", "--a"]}
    assert revision_hash(a, {}, None) != revision_hash(b, {}, None)
