"""core.decision.actions: the writes (apply, scale, delete) that carry out a rollout plan."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from triton_operator.core.decision.actions import (
    Actions,
    Target,
    applied_as_built,
    applied_digest,
    plan_actions,
    stamped,
)
from triton_operator.core.objects.builders import disruption_budget_enabled
from triton_operator.core.objects.names import APPLIED_ANNOTATION, LABEL_REVISION, LABEL_SERVICE
from triton_operator.core.rollout.plan import RolloutPlan
from triton_operator.models import TritonService
from triton_operator.settings import Settings
from tritonservice_bodies import (
    OLDER_SHAPE,
    SETTINGS,
    UID,
    configs_of,
    deployment,
    fetcher,
    observed_configmap,
    observed_deployment,
    rollout_plan,
    ts_of,
)

# ----------------------------------------------------------------- plan_actions (a rollout plan -> writes)


def actions(ts: TritonService, revision: str, plan: RolloutPlan, **kw: Any) -> Actions:
    return plan_actions(Target(ts, revision, configs_of(ts)), SETTINGS, plan, **kw)


def test_only_the_specs_revision_is_rendered_others_only_scale() -> None:
    ts = ts_of()
    plan = rollout_plan({"old": 4, "new": 1, "hist": 0}, delete=("gone",))
    out = actions(
        ts,
        "new",
        plan,
        deployments=[
            observed_deployment("old", 4),  # already at 4: no write
            observed_deployment("hist", 2),  # a history revision goes to 0
            observed_deployment("gone", 1),
        ],
        configmaps=[observed_configmap(r) for r in ("old", "hist", "gone", "stray", "new")],
    )
    assert [(x["kind"], x["metadata"]["name"]) for x in out.apply] == [
        ("ConfigMap", "svc-new"),
        ("Deployment", "svc-new"),
        ("Service", "svc"),
    ]
    assert out.apply[1]["spec"]["replicas"] == 1
    assert out.scale == {"svc-hist": 0}
    # kept revisions keep their ConfigMaps (an undo serves the same bytes); others go
    assert out.delete == (
        ("Deployment", "svc-gone"),
        ("ConfigMap", "svc-gone"),
        ("ConfigMap", "svc-stray"),
    )


@pytest.mark.parametrize(("now", "planned", "applied", "scale"), [(2, 0, 2, {"svc-new": 0}), (1, 3, 3, {})])
def test_the_specs_revision_goes_down_only_in_scale_after_the_traffic_moved(
    now: int, planned: int, applied: int, scale: dict[str, int]
) -> None:
    """Issue 22 item 10: an abort applied the canary's Deployment at 0 replicas before its Service's
    selector and the route weights moved off it. Scaling down is a ``scale`` (carried out after the
    Services, the routes and the status); scaling up stays in the apply."""
    out = actions(
        ts_of(),
        "new",
        rollout_plan({"old": 4, "new": planned}),
        deployments=[observed_deployment("old", 4), observed_deployment("new", now)],
        configmaps=[observed_configmap(r) for r in ("old", "new")],
    )
    (deployment,) = [x for x in out.apply if x["kind"] == "Deployment"]
    assert deployment["spec"]["replicas"] == applied
    assert out.scale == scale


def test_spec_revision_not_planned_is_not_created() -> None:
    ts = ts_of()
    out = actions(ts, "new", rollout_plan({"old": 2}), deployments=[], configmaps=[])
    assert [x["kind"] for x in out.apply] == ["Service"]
    assert out.scale == {} and out.delete == ()


def test_gateway_api_adds_revision_services_and_removing_it_deletes_them() -> None:
    ts = ts_of(rollout={"trafficRouting": {"gatewayAPI": {"httpRoute": "r"}}})
    plan = rollout_plan({"old": 2, "new": 1}, stable="old", canary="new")
    out = actions(ts, "new", plan, deployments=[], configmaps=[])
    services = {x["metadata"]["name"]: x for x in out.apply if x["kind"] == "Service"}
    assert set(services) == {"svc", "svc-stable", "svc-canary"}
    assert services["svc-stable"]["spec"]["selector"][LABEL_REVISION] == "old"
    assert services["svc-canary"]["spec"]["selector"][LABEL_REVISION] == "new"
    assert services["svc-canary"]["metadata"]["ownerReferences"][0]["uid"] == UID
    plain = ts_of()
    kept = actions(plain, "new", plan, deployments=[], configmaps=[], revision_services=False)
    assert not any(kind == "Service" for kind, _ in kept.delete)
    dropped = actions(plain, "new", plan, deployments=[], configmaps=[], revision_services=True)
    assert ("Service", "svc-stable") in dropped.delete and ("Service", "svc-canary") in dropped.delete


def test_the_actions_render_only_the_desired_revision() -> None:
    ts = ts_of()
    out = actions(ts, "b", rollout_plan({"b": 2}), deployments=[], configmaps=[])
    assert [(x["kind"], x["metadata"]["name"]) for x in out.apply] == [
        ("ConfigMap", "svc-b"),
        ("Deployment", "svc-b"),
        ("Service", "svc"),
    ]
    only_service = actions(ts, "b", rollout_plan({}), deployments=[], configmaps=[])
    assert [x["kind"] for x in only_service.apply] == ["Service"]


# ----------------------------------------------------------------- PodDisruptionBudget


@pytest.mark.parametrize(
    ("spec", "wanted"),
    [
        ({"replicas": 1}, False),
        ({"replicas": 2}, True),
        ({"replicas": 0}, False),
        ({"replicas": 1, "disruptionBudget": {"enabled": True}}, True),
        ({"replicas": 4, "disruptionBudget": {"enabled": False}}, False),
    ],
)
def test_a_disruption_budget_by_default_when_more_than_one_replica_serves(
    spec: dict[str, Any], wanted: bool
) -> None:
    ts = ts_of(**spec)
    plan = rollout_plan({"new": ts.spec.replicas})
    out = actions(ts, "new", plan, deployments=[], configmaps=[])
    pdbs = [x for x in out.apply if x["kind"] == "PodDisruptionBudget"]
    assert len(pdbs) == int(wanted)
    assert disruption_budget_enabled(ts) is wanted
    rendered = actions(ts, "new", rollout_plan({}), deployments=[], configmaps=[])
    assert [x["kind"] for x in rendered.apply].count("PodDisruptionBudget") == int(wanted)


def test_a_disruption_budget_no_longer_wanted_is_deleted_only_when_it_exists() -> None:
    ts = ts_of(replicas=1)
    plan = rollout_plan({"new": 1})
    assert ("PodDisruptionBudget", "svc") not in actions(
        ts, "new", plan, deployments=[], configmaps=[]
    ).delete
    gone = actions(ts, "new", plan, deployments=[], configmaps=[], disruption_budget=True)
    assert ("PodDisruptionBudget", "svc") in gone.delete


# ----------------------------------------------------------------- who Service `<name>` reaches


@pytest.mark.parametrize(
    ("rollout", "only_stable"),
    [
        ({}, False),
        ({"strategy": "Canary", "steps": [{"setWeight": 20}]}, False),
        ({"strategy": "Recreate"}, False),
        ({"strategy": "BlueGreen"}, True),
        ({"strategy": "Canary", "trafficRouting": {"gatewayAPI": {"httpRoute": "r"}}}, True),
    ],
)
def test_the_service_reaches_only_the_revisions_meant_to_serve(
    rollout: dict[str, Any], only_stable: bool
) -> None:
    ts = ts_of(rollout=rollout)
    plan = rollout_plan({"blue": 2, "green": 2}, stable="blue", canary="green")
    (svc,) = [
        x
        for x in actions(ts, "green", plan, deployments=[], configmaps=[]).apply
        if x["metadata"]["name"] == "svc"
    ]
    selector = svc["spec"]["selector"]
    assert selector.get(LABEL_REVISION) == ("blue" if only_stable else None)
    assert selector[LABEL_SERVICE] == "svc"
    # before any revision is stable (the first one rolling out) it reaches every revision
    first = rollout_plan({"green": 2}, stable=None, canary="green")
    (svc,) = [
        x
        for x in actions(ts, "green", first, deployments=[], configmaps=[]).apply
        if x["metadata"]["name"] == "svc"
    ]
    assert LABEL_REVISION not in svc["spec"]["selector"]


# ----------------------------------------------------------------- operator upgrades


def test_an_existing_revision_keeps_its_sync_image_and_a_new_one_gets_the_operators() -> None:
    ts = ts_of()
    running = deployment(ts, "rev1", settings=OLDER_SHAPE)  # created by the old operator

    def sync_of(dep: dict[str, Any]) -> dict[str, Any]:
        return fetcher(dep["spec"]["template"]["spec"])  # the new revision's: the agent

    sync_of(running)["image"] = "ghcr.io/triton-operator/triton-operator:0.1.0"
    sync_of(running)["imagePullPolicy"] = "Always"  # set by the old operator's settings
    upgraded = Settings(
        sync_image="ghcr.io/triton-operator/triton-operator:0.2.0", sync_image_pull_policy="Never"
    )

    out = plan_actions(
        Target(ts, "rev1", configs_of(ts)),
        upgraded,
        rollout_plan({"rev1": 1}),
        deployments=[{**running, "metadata": {**running["metadata"]}}],
        configmaps=[],
    )
    (dep,) = [x for x in out.apply if x["kind"] == "Deployment"]
    assert dep["spec"]["template"] == running["spec"]["template"]  # no pod restarts
    fresh = plan_actions(
        Target(ts, "rev2", configs_of(ts)),
        upgraded,
        rollout_plan({"rev1": 1, "rev2": 1}),
        deployments=[running],
        configmaps=[],
    )
    (dep2,) = [x for x in fresh.apply if x["kind"] == "Deployment"]
    assert sync_of(dep2)["image"].endswith(":0.2.0") and sync_of(dep2)["imagePullPolicy"] == "Never"


def test_a_revision_made_before_the_security_defaults_keeps_its_pods_and_a_new_one_gets_them() -> None:
    """An operator upgrade restarts no serving pod: the running revision's Deployment is applied as
    it was written (no securityContext, no automountServiceAccountToken); the next revision, which
    a canary tries first, gets the restricted defaults."""
    ts = ts_of()
    running = deployment(ts, "rev1", settings=Settings(pod_security_defaults=False))
    template = running["spec"]["template"]["spec"]
    assert "securityContext" not in template["containers"][0]  # as the old operator wrote it

    def apply_of(revision: str, replicas: dict[str, int]) -> dict[str, Any]:
        out = plan_actions(
            Target(ts, revision, configs_of(ts)),
            SETTINGS,
            rollout_plan(replicas),
            deployments=[copy.deepcopy(running)],
            configmaps=[],
        )
        (dep,) = [x for x in out.apply if x["kind"] == "Deployment"]
        return dep

    assert apply_of("rev1", {"rev1": 1})["spec"]["template"] == running["spec"]["template"]
    fresh = apply_of("rev2", {"rev1": 1, "rev2": 1})["spec"]["template"]["spec"]
    assert fresh["securityContext"]["runAsNonRoot"] is True
    assert fresh["automountServiceAccountToken"] is False
    assert fresh["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_reapplying_a_revision_with_a_defaulted_pull_policy_leaves_the_template_as_written() -> None:
    """The API server adds imagePullPolicy to what the operator wrote without one: re-rendering the
    running revision must not claim that field (a write to a Deployment that should stay untouched)."""
    ts = ts_of()
    written = deployment(ts, "rev1", settings=OLDER_SHAPE)  # a sync init container
    stored = copy.deepcopy(written)
    for c in stored["spec"]["template"]["spec"]["initContainers"]:
        c["imagePullPolicy"] = "IfNotPresent"  # the API server's default for a tagged image
    out = plan_actions(
        Target(ts, "rev1", configs_of(ts)),
        SETTINGS,
        rollout_plan({"rev1": 1}),
        deployments=[stored],
        configmaps=[],
    )
    (dep,) = [x for x in out.apply if x["kind"] == "Deployment"]
    assert dep["spec"]["template"] == written["spec"]["template"]


# ----------------------------------------------------------------- a Deployment stored as built


def _stored(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as the API server stores it: its defaults filled in, a status, versions."""
    out = copy.deepcopy(obj)
    out["metadata"].update(uid="u-1", resourceVersion="7", generation=1)
    spec = out.get("spec") or {}
    if out["kind"] == "Deployment":
        spec.setdefault("progressDeadlineSeconds", 600)
        for container in spec["template"]["spec"]["containers"]:
            container.setdefault("terminationMessagePath", "/dev/termination-log")
        out["status"] = {"replicas": spec["replicas"], "observedGeneration": 1}
    return out


def _first_and_stored(ts: TritonService) -> tuple[Actions, list[dict[str, Any]], list[dict[str, Any]]]:
    """The first pass's actions, and the Deployments and ConfigMaps they leave stored."""
    first = actions(ts, "new", rollout_plan({"new": 1}), deployments=[], configmaps=[])
    stored = [_stored(o) for o in first.apply]
    return (
        first,
        [o for o in stored if o["kind"] == "Deployment"],
        [o for o in stored if o["kind"] == "ConfigMap"],
    )


def _kinds(out: Actions) -> list[str]:
    return [str(o["kind"]) for o in out.apply]


def test_a_deployment_stored_as_built_is_not_applied_again() -> None:
    """The next pass sends neither the ConfigMaps nor the Deployment it finds stored as built (the
    API server's defaults and status beside them): only the Service, which it does not observe."""
    ts = ts_of(replicas=1)
    first, deployments, configmaps = _first_and_stored(ts)
    assert "Deployment" in _kinds(first)
    again = actions(ts, "new", rollout_plan({"new": 1}), deployments=deployments, configmaps=configmaps)
    assert _kinds(again) == ["Service"]
    assert again.scale == {} and again.delete == ()


def _image(d: dict[str, Any]) -> None:
    d["spec"]["template"]["spec"]["containers"][0]["image"] = "nvcr.io/other:1"


def _port(d: dict[str, Any]) -> None:
    ports = d["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert ports
    ports.append({"name": "extra", "containerPort": 9999})


def _label(d: dict[str, Any]) -> None:
    d["metadata"]["labels"][LABEL_SERVICE] = "other"


def _digest(d: dict[str, Any]) -> None:
    d["metadata"]["annotations"][APPLIED_ANNOTATION] = "an-earlier-body"


def _no_digest(d: dict[str, Any]) -> None:
    del d["metadata"]["annotations"][APPLIED_ANNOTATION]


def _scaled_to_zero(d: dict[str, Any]) -> None:
    d["spec"]["replicas"] = 0


def _owner(d: dict[str, Any]) -> None:
    d["metadata"]["ownerReferences"][0]["uid"] = "another"


@pytest.mark.parametrize(
    "edit", [_image, _port, _label, _digest, _no_digest, _scaled_to_zero, _owner], ids=lambda f: f.__name__
)
def test_a_deployment_changed_since_it_was_applied_is_applied_again(edit: Any) -> None:
    """A hand edit of what the operator sets (an image, replicas, a label, its owner, a port
    added to the operator's list of ports), or a body applied by an earlier operator (another digest, or
    none): applied, as server-side apply puts the operator's fields back."""
    ts = ts_of(replicas=1)
    _, deployments, configmaps = _first_and_stored(ts)
    edit(deployments[0])
    again = actions(ts, "new", rollout_plan({"new": 1}), deployments=deployments, configmaps=configmaps)
    assert _kinds(again) == ["Deployment", "Service"]


def test_what_others_add_beside_the_operators_fields_does_not_make_it_apply() -> None:
    """`kubectl rollout restart` adds a template annotation the operator never set: its apply would
    leave it as it is, so it is not sent."""
    ts = ts_of(replicas=1)
    _, deployments, configmaps = _first_and_stored(ts)
    template = deployments[0]["spec"]["template"]["metadata"]
    template.setdefault("annotations", {})["kubectl.kubernetes.io/restartedAt"] = "2026-11-27T19:00:00Z"
    again = actions(ts, "new", rollout_plan({"new": 1}), deployments=deployments, configmaps=configmaps)
    assert _kinds(again) == ["Service"]


def test_a_deployment_is_applied_with_a_configmap_of_its_revision_that_is_not_stored() -> None:
    ts = ts_of(replicas=1)
    _, deployments, configmaps = _first_and_stored(ts)
    again = actions(ts, "new", rollout_plan({"new": 1}), deployments=deployments, configmaps=configmaps[1:])
    assert _kinds(again) == ["ConfigMap", "Deployment", "Service"]


def test_a_spec_change_that_removes_a_field_is_applied_though_every_other_value_is_there() -> None:
    """What the operator no longer sets is removed only by an apply: the digest tells."""
    ts = ts_of(replicas=1)
    stamped_body = stamped({"kind": "Deployment", "metadata": {"name": "d"}, "spec": {"a": 1, "b": 2}})
    stored = _stored_plain(stamped_body)
    assert applied_as_built(stamped_body, stored)
    fewer = stamped({"kind": "Deployment", "metadata": {"name": "d"}, "spec": {"a": 1}})
    assert not applied_as_built(fewer, stored)
    assert applied_digest(stamped_body) == applied_digest({**stamped_body, "metadata": {"name": "d"}})
    assert ts.spec.replicas == 1


def _stored_plain(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"]["resourceVersion"] = "3"
    return out
