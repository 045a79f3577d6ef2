"""The operator's policy (core.policy): allowed tritonserver images and forbidden volume types,
from its settings to the reconcile that holds a refused spec while the serving revision stays."""

from __future__ import annotations

import doctest
import io
from pathlib import Path
from typing import Any

import pytest
import yaml

from fakeapi import FakeClient
from triton_operator.adapters.kube import Kube
from triton_operator.commands import render
from triton_operator.core import conditions as cond
from triton_operator.core import policy
from triton_operator.core.observation import check_body
from triton_operator.reconcile import steps
from triton_operator.settings import DEFAULT_FORBIDDEN_VOLUME_TYPES, Settings

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
UID = "0b4f3c2e-0000-4000-8000-000000000001"


def tritonservice(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "triton-operator.io/v1alpha1",
        "kind": "TritonService",
        "metadata": {"name": "svc", "namespace": "ml", "uid": UID, "generation": 1},
        "spec": {
            "replicas": 1,
            "repository": {"uri": "pvc://models/triton"},
            "models": [{"name": "add"}],
            **spec,
        },
    }


def parsed(**spec: Any) -> Any:
    checked = check_body(tritonservice(**spec))
    assert not checked.problems, checked.problems
    return checked.ts


HOST_PATH = {"name": "node", "hostPath": {"path": "/etc"}}
EMPTY_DIR = {"name": "scratch", "emptyDir": {}}


def test_the_docstring_examples_hold() -> None:
    assert doctest.testmod(policy).failed == 0


@pytest.mark.parametrize(
    ("image", "prefixes", "allowed"),
    [
        ("nvcr.io/nvidia/tritonserver:25.01-py3", [], True),
        ("nvcr.io/nvidia/tritonserver:25.01-py3", ["nvcr.io/nvidia"], True),
        ("nvcr.io/nvidia/tritonserver:25.01-py3", ["nvcr.io/nvidia/"], True),
        ("nvcr.io/nvidia/tritonserver@sha256:abc", ["nvcr.io/nvidia/tritonserver"], True),
        ("nvcr.io/nvidia", ["nvcr.io/nvidia"], True),
        # a prefix matches at a reference boundary only
        ("nvcr.io/nvidia-evil/tritonserver:1", ["nvcr.io/nvidia"], False),
        ("nvcr.io/nvidiax", ["nvcr.io/nvidia"], False),
        ("docker.io/library/busybox", ["nvcr.io/nvidia", "registry.local/ml"], False),
        ("registry.local/ml/triton:1", ["nvcr.io/nvidia", "registry.local/ml"], True),
        # the tag is part of what a prefix may pin
        ("nvcr.io/nvidia/tritonserver:24.01-py3", ["nvcr.io/nvidia/tritonserver:25."], False),
    ],
)
def test_image_allowed(image: str, prefixes: list[str], allowed: bool) -> None:
    assert policy.image_allowed(image, prefixes) is allowed


def test_host_path_is_refused_by_default_and_names_the_field() -> None:
    errors = policy.policy_errors(parsed(volumes=[EMPTY_DIR, HOST_PATH]), Settings())
    assert [e.field for e in errors] == ["spec.volumes[1].hostPath"]
    assert "TRITON_OPERATOR_FORBIDDEN_VOLUME_TYPES" in errors[0].message


def test_other_volume_types_and_an_emptied_list_are_allowed() -> None:
    assert policy.policy_errors(parsed(volumes=[EMPTY_DIR]), Settings()) == []
    assert policy.policy_errors(parsed(volumes=[HOST_PATH]), Settings(forbidden_volume_types=())) == []


def test_an_image_outside_the_prefixes_is_refused() -> None:
    settings = Settings(allowed_image_prefixes=("registry.local/ml",))
    errors = policy.policy_errors(parsed(image="docker.io/evil/triton:1"), settings)
    assert [e.field for e in errors] == ["spec.image"]
    assert "'registry.local/ml'" in errors[0].message
    assert policy.policy_errors(parsed(image="registry.local/ml/triton:1"), settings) == []


def test_the_default_image_is_checked_when_the_spec_names_none() -> None:
    """A default image outside the allowed prefixes is an operator misconfiguration: it shows."""
    settings = Settings(allowed_image_prefixes=("registry.local/ml",))
    errors = policy.policy_errors(parsed(), settings)
    assert [e.field for e in errors] == ["spec.image (the operator's default image)"]


@pytest.mark.parametrize(
    ("env", "prefixes", "forbidden"),
    [
        ({}, (), DEFAULT_FORBIDDEN_VOLUME_TYPES),
        ({"TRITON_OPERATOR_FORBIDDEN_VOLUME_TYPES": ""}, (), ()),
        ({"TRITON_OPERATOR_FORBIDDEN_VOLUME_TYPES": "none"}, (), ()),  # what the chart sets for []
        (
            {
                "TRITON_OPERATOR_FORBIDDEN_VOLUME_TYPES": "hostPath, nfs",
                "TRITON_OPERATOR_ALLOWED_IMAGE_PREFIXES": "nvcr.io/nvidia, registry.local/ml",
            },
            ("nvcr.io/nvidia", "registry.local/ml"),
            ("hostPath", "nfs"),
        ),
    ],
)
def test_settings_from_the_environment(
    env: dict[str, str], prefixes: tuple[str, ...], forbidden: tuple[str, ...]
) -> None:
    settings = Settings.from_env(env)
    assert settings.allowed_image_prefixes == prefixes
    assert settings.forbidden_volume_types == forbidden


def test_render_refuses_what_the_policy_refuses() -> None:
    doc = yaml.safe_load((EXAMPLES / "tiny.yaml").read_text())
    doc["spec"]["volumes"] = [HOST_PATH]
    out, err = io.StringIO(), io.StringIO()
    assert render.render([doc], Settings(), out=out, err=err) == 1
    assert "refused by the operator's policy: spec.volumes[0].hostPath" in err.getvalue()
    assert out.getvalue() == ""


async def test_a_refused_spec_is_held_and_the_serving_revision_stays() -> None:
    """Through the reconcile (an in-memory API, tests/support/fakeapi.py): a serving TritonService
    whose spec gains a hostPath volume keeps its Deployment as it was; Ready says why."""
    api = FakeClient()
    api.put(tritonservice())
    kube = Kube(api)  # type: ignore[arg-type]
    first = await steps.reconcile(kube, "ml", "svc", Settings())
    assert first.invalid is None, first.invalid
    deployments = api.of_kind("Deployment")
    assert [d["metadata"]["name"] for d in deployments] == [f"svc-{first.revision}"]
    before = [dict(d["spec"]) for d in deployments]

    body = api.find("TritonService", "ml", "svc")
    assert body is not None
    body["spec"]["volumes"] = [HOST_PATH]
    body["metadata"]["generation"] = 2
    held = await steps.reconcile(kube, "ml", "svc", Settings())

    assert held.reason == cond.REFUSED_BY_POLICY
    assert held.invalid is not None and "spec.volumes[0].hostPath" in held.invalid
    assert [dict(d["spec"]) for d in api.of_kind("Deployment")] == before
    ready = next(c for c in body["status"]["conditions"] if c["type"] == cond.READY)
    assert (ready["status"], ready["reason"]) == (cond.FALSE, cond.REFUSED_BY_POLICY)
    assert "spec.volumes[0].hostPath" in ready["message"]
