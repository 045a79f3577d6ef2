"""The node cache in the pods the operator makes: the sync container finds it through the downward API
(nothing of the node mounted), only in revisions made with it on (recorded, so no pod restarts)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from triton_operator.core.objects.builders import (
    PLAIN,
    build_configmaps,
    build_deployment,
    build_sync_container,
    compute_revision,
)
from triton_operator.core.objects.names import AGENT_CONTAINER
from triton_operator.core.observed.observation import recorded_revisions, recorded_settings
from triton_operator.core.repository.cache_rules import (
    AUDIENCE,
    HOST_ENV,
    POD_ENV,
    PORT_ENV,
    PUBLIC_KEY_ENV,
    TOKEN_DIR,
    TOKEN_ENV,
    TOKEN_PATH,
    TOKEN_VOLUME,
)
from triton_operator.core.repository.shared_files import DRIVER, FILES_ENV, MOUNT_PATH, VOLUME
from triton_operator.settings import Settings
from tritonservice_bodies import SETTINGS, configs_of, ts_of

ON = dataclasses.replace(SETTINGS, node_cache_port=8790)


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or []}


def test_with_the_cache_on_the_sync_container_is_told_the_nodes_address_port_and_its_pod() -> None:
    sync = build_sync_container(ts_of(), ON, PLAIN)
    assert env_of(sync) == {
        HOST_ENV: {"fieldRef": {"fieldPath": "status.hostIP"}},
        PORT_ENV: "8790",
        POD_ENV: {"fieldRef": {"fieldPath": "metadata.uid"}},
        TOKEN_ENV: TOKEN_PATH,
    }
    # Pod Security restricted as before: no hostPath, no host port, nothing of the node mounted.
    assert "hostPath" not in repr(build_deployment(ts_of(), "r1", ON, 1))
    assert "hostPort" not in repr(build_deployment(ts_of(), "r1", ON, 1))


def test_with_the_cache_on_the_pod_proves_who_it_is_with_a_projected_token_for_the_cache_only() -> None:
    """The sync container (and an in-place pod's agent, which copies its mounts) reads a projected
    ServiceAccount token for the node cache's audience; the pod still mounts no API token."""
    for ts in (ts_of(), ts_of(rollout={"modelUpdates": "InPlace"})):
        # revisions made before one pod shape (test_one_pod_shape has the pod of now)
        pod = build_deployment(ts, "r1", dataclasses.replace(ON, agent_pods=False), 1)["spec"]["template"][
            "spec"
        ]
        volumes = [v for v in pod["volumes"] if v["name"] == TOKEN_VOLUME]
        assert volumes == [
            {
                "name": TOKEN_VOLUME,
                "projected": {
                    "sources": [
                        {
                            "serviceAccountToken": {
                                "audience": AUDIENCE,
                                "expirationSeconds": 86400,
                                "path": "token",
                            }
                        }
                    ]
                },
            }
        ]
        assert pod["automountServiceAccountToken"] is False
        mounted = [*pod["initContainers"], *(c for c in pod["containers"] if c["name"] == AGENT_CONTAINER)]
        assert len(mounted) == (2 if ts.spec.rollout.model_updates == "InPlace" else 1)
        for container in mounted:
            assert {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True} in container[
                "volumeMounts"
            ]


def test_with_the_cache_off_nothing_changes() -> None:
    assert "env" not in build_sync_container(ts_of(), SETTINGS, PLAIN)
    pod = build_deployment(ts_of(), "r1", SETTINGS, 1)["spec"]["template"]["spec"]
    assert TOKEN_VOLUME not in repr(pod)


@pytest.mark.parametrize(
    ("before", "after"), [(SETTINGS, ON), (ON, SETTINGS)], ids=["turned-on", "turned-off"]
)
@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "live-deployment"])
def test_turning_the_cache_on_or_off_restarts_no_serving_pod(
    before: Settings, after: Settings, recorded: bool
) -> None:
    """An existing revision keeps the sync container it was made with; the next revision gets the
    operator's setting of the day. The revision's hash does not depend on it."""
    ts = ts_of()
    configs = configs_of(ts)
    revision = compute_revision(ts, before, configs, None)
    assert compute_revision(ts, after, configs, None) == revision
    configmaps = build_configmaps(ts, revision, configs, None, settings=before if recorded else None)
    deployment = build_deployment(ts, revision, before, 2)
    kept = recorded_settings(after, configmaps, deployment)
    assert build_deployment(ts, revision, kept, 2) == deployment
    assert (
        recorded_revisions(after, [deployment], configmaps)[revision].node_cache_port
        == before.node_cache_port
    )
    # a new revision (nothing stored) gets today's setting
    assert recorded_settings(after, [], None).node_cache_port == after.node_cache_port


@pytest.mark.parametrize(("value", "port"), [(None, None), ("", None), ("8790", 8790)])
def test_the_operator_reads_the_port_from_its_environment(value: str | None, port: int | None) -> None:
    env = {} if value is None else {"TRITON_OPERATOR_NODE_CACHE_PORT": value}
    assert Settings.from_env(env).node_cache_port == port


@pytest.mark.parametrize("value", ["0", "-1", "65536", "port"])
def test_a_port_that_is_no_port_stops_the_operator(value: str) -> None:
    with pytest.raises(ValueError, match="NODE_CACHE_PORT"):
        Settings.from_env({"TRITON_OPERATOR_NODE_CACHE_PORT": value})


def test_an_in_place_pods_agent_uses_the_node_cache_too() -> None:
    """With modelUpdates InPlace the init container (`agent --once`) and the model-agent sidecar sync
    the revision: both are told where the node cache is, so a warm node serves both from it."""
    ts = ts_of(rollout={"modelUpdates": "InPlace"})
    # a revision made before one pod shape (test_one_pod_shape has the pod of now)
    pod = build_deployment(ts, "r1", dataclasses.replace(ON, agent_pods=False), 1)["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    agent = next(c for c in pod["containers"] if c["name"] == AGENT_CONTAINER)
    assert init["command"] == agent["command"] == ["triton-operator", "agent"]
    assert env_of(init) == env_of(agent) == env_of(build_sync_container(ts_of(), ON, PLAIN))
    off = build_deployment(ts, "r1", dataclasses.replace(SETTINGS, agent_pods=False), 1)["spec"]["template"]
    assert all(
        "env" not in c
        for c in [*off["spec"]["initContainers"], *off["spec"]["containers"]]
        if c["name"] != "tritonserver"
    )


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "live-deployment"])
def test_a_revision_made_before_the_cache_checked_tokens_keeps_its_pods(recorded: bool) -> None:
    """An operator upgrade gives no token volume to an existing revision (its pods would restart):
    its sync reads the store when the cache refuses it; the next revision gets the token."""
    before = dataclasses.replace(ON, node_cache_token=False)
    ts = ts_of()
    configs = configs_of(ts)
    revision = compute_revision(ts, before, configs, None)
    assert compute_revision(ts, ON, configs, None) == revision
    deployment = build_deployment(ts, revision, before, 2)
    assert TOKEN_VOLUME not in repr(deployment)
    configmaps = build_configmaps(ts, revision, configs, None, settings=before if recorded else None)
    kept = recorded_settings(ON, configmaps, deployment)
    assert build_deployment(ts, revision, kept, 2) == deployment
    # a new revision gets it
    assert TOKEN_VOLUME in repr(build_deployment(ts, revision, recorded_settings(ON, [], None), 2))


KEY = "O2onvM62pC1io6jQKm8Nc2UyFXcd4kOmOsBIoYtZ2ik="  # base64 of 32 bytes: an Ed25519 public key
SIGNED = dataclasses.replace(ON, node_cache_public_key=KEY)


def test_with_the_caches_public_key_the_sync_and_agent_check_its_signed_statements() -> None:
    """The sync container (and an in-place pod's agent) get the key that checks the cache's signed
    SHA-256 ($TRITON_NODE_CACHE_PUBLIC_KEY); without one, nothing of a key is in the pod."""
    assert env_of(build_sync_container(ts_of(), SIGNED, PLAIN))[PUBLIC_KEY_ENV] == KEY
    older = dataclasses.replace(SIGNED, agent_pods=False)
    pod = build_deployment(ts_of(rollout={"modelUpdates": "InPlace"}), "r1", older, 1)["spec"]["template"]
    agent = next(c for c in pod["spec"]["containers"] if c["name"] == AGENT_CONTAINER)
    assert env_of(pod["spec"]["initContainers"][0])[PUBLIC_KEY_ENV] == env_of(agent)[PUBLIC_KEY_ENV] == KEY
    # The one pod shape: the agent fetches every model, with the key.
    pod = build_deployment(ts_of(), "r1", SIGNED, 1)["spec"]["template"]
    agent = next(c for c in pod["spec"]["containers"] if c["name"] == AGENT_CONTAINER)
    assert "initContainers" not in pod["spec"]
    assert env_of(agent)[PUBLIC_KEY_ENV] == KEY
    assert PUBLIC_KEY_ENV not in repr(build_deployment(ts_of(), "r1", ON, 1))
    # A pod that reads its store directly (pvc://) does not use the cache, nor its key.
    assert "env" not in build_sync_container(ts_of(repository={"uri": "pvc://models/repo"}), SIGNED, PLAIN)


ROTATED = dataclasses.replace(SIGNED, node_cache_public_key="pRb0Yv2w2tNMW0pKE6bYzI8oBB7z0gTJQYzKsE8Q0mI=")
SHARED = dataclasses.replace(SIGNED, node_cache_shared_files=True)


@pytest.mark.parametrize(
    ("before", "after"),
    [(ON, SIGNED), (SIGNED, ROTATED), (SIGNED, ON), (SIGNED, SHARED), (SHARED, SIGNED)],
    ids=["key-given", "key-rotated", "key-taken-away", "shared-files-on", "shared-files-off"],
)
@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "live-deployment"])
def test_giving_or_rotating_the_key_keeps_revisions_and_restarts_no_pod(
    before: Settings, after: Settings, recorded: bool
) -> None:
    """The key is the operator's plumbing: not in the revision's hash, and an existing revision keeps
    the key it was made with (its pods fall back to the pin check when the cache signs with another);
    the next revision gets today's key. So are the shared files: an existing revision keeps its pods
    with or without the volume."""
    ts = ts_of()
    configs = configs_of(ts)
    revision = compute_revision(ts, before, configs, None)
    assert compute_revision(ts, after, configs, None) == revision
    configmaps = build_configmaps(ts, revision, configs, None, settings=before if recorded else None)
    deployment = build_deployment(ts, revision, before, 2)
    kept = recorded_settings(after, configmaps, deployment)
    assert kept.node_cache_public_key == before.node_cache_public_key
    assert kept.node_cache_shared_files == before.node_cache_shared_files
    assert build_deployment(ts, revision, kept, 2) == deployment
    fresh = recorded_settings(after, [], None)
    assert fresh.node_cache_public_key == after.node_cache_public_key
    assert fresh.node_cache_shared_files == after.node_cache_shared_files


def test_with_shared_files_the_agent_and_tritonserver_see_the_caches_view_read_only() -> None:
    """The pod gets the node cache's CSI volume (an ephemeral inline volume, allowed under Pod
    Security `restricted`), read-only in the agent, which links to it, and in tritonserver, which
    follows the links at the same path; the agent is told where it is."""
    pod = build_deployment(ts_of(), "r1", SHARED, 1)["spec"]["template"]["spec"]
    assert {"name": VOLUME, "csi": {"driver": DRIVER, "readOnly": True}} in pod["volumes"]
    mount = {"name": VOLUME, "mountPath": MOUNT_PATH, "readOnly": True}
    for container in pod["containers"]:
        assert mount in container["volumeMounts"], container["name"]
    agent = next(c for c in pod["containers"] if c["name"] == AGENT_CONTAINER)
    assert env_of(agent)[FILES_ENV] == MOUNT_PATH
    assert "hostPath" not in repr(pod)
    # Off, without the node cache, with a pvc:// store, or in a revision of the shape before: none.
    for settings, ts in (
        (SIGNED, ts_of()),
        (dataclasses.replace(SHARED, node_cache_port=None), ts_of()),
        (SHARED, ts_of(repository={"uri": "pvc://models/repo"})),
        (dataclasses.replace(SHARED, agent_pods=False), ts_of(rollout={"modelUpdates": "InPlace"})),
    ):
        text = repr(build_deployment(ts, "r1", settings, 1))
        assert DRIVER not in text and FILES_ENV not in text
