"""Large repositories: a 50,000-object manifest in ConfigMaps the API server takes, read back by the pod;
size refusals as a condition; revisions made before parts keep their layout and their hash."""

from __future__ import annotations

import copy
import dataclasses
import gzip
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from bigmanifest import (
    CONFIGMAP_LIMIT,
    REQUEST_LIMIT,
    host_path,
    mount,
    payload_bytes,
    plan_for,
    realistic_manifest,
    refusal,
)
from fakeapi import FakeClient
from testkit import REPO
from triton_operator import cli
from triton_operator.adapters.kube import Kube
from triton_operator.commands import sync as sync_command
from triton_operator.core.decision.actions import Actions, Target, plan_actions
from triton_operator.core.objects.builders import (
    PLAIN,
    ManifestLayout,
    build_configmaps,
    build_deployment,
    build_owner_reference,
    compute_revision,
    configs_bytes,
    manifest_layout,
)
from triton_operator.core.objects.names import (
    CONFIGS_DIR,
    LABEL_REVISION,
    MANIFEST_PATH,
    OPERATOR_KEY,
    SPEC_KEY,
    SYNC_CONTAINER,
    object_name,
    part_configmap_name,
)
from triton_operator.core.observed.observation import CheckedSpec, check_body, layout_of
from triton_operator.core.repository import manifestparts
from triton_operator.core.repository.manifest import (
    Manifest,
    ManifestModel,
    StoreRef,
    VersionPolicy,
    json_digest,
    manifest_digest,
    manifest_from_json,
    manifest_to_json,
)
from triton_operator.core.rollout.plan import RolloutPlan
from triton_operator.core.vocabulary import conditions as cond
from triton_operator.reconcile import pinning, reconcile_pass
from triton_operator.settings import Settings
from tritonservice_bodies import fetcher

SETTINGS = Settings()
LEGACY = json.loads((REPO / "tests" / "data" / "legacy" / "revision.json").read_text())
UID = "0c3d6c2e-8d54-4bb8-9d1b-3c7a1f1e2a10"
CONFIG = {
    "backend": "python",
    "maxBatchSize": 8,
    "input": [{"name": "IN", "dataType": "TYPE_FP32", "dims": ["4"]}],
    "output": [{"name": "OUT", "dataType": "TYPE_FP32", "dims": ["4"]}],
}


@pytest.fixture(scope="module")
def big() -> tuple[Manifest, str]:
    manifest = realistic_manifest(50_000)
    return manifest, manifest_to_json(manifest)


def tritonservice(name: str = "big", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "triton-operator.io/v1alpha1",
        "kind": "TritonService",
        "metadata": {"name": name, "namespace": "ml", "uid": UID, "generation": 1},
        "spec": {
            "replicas": 1,
            "repository": {"uri": "s3://models-prod/triton/prod", "pollIntervalSeconds": 0},
            "models": [{"name": "add", "config": CONFIG}],
            **spec,
        },
    }


def checked(body: Mapping[str, Any]) -> CheckedSpec:
    result = check_body(body)
    assert not result.problems, result.problems
    return result


def actions_for(
    spec: CheckedSpec,
    manifest_json: str,
    revision: str = "r1",
    *,
    settings: Settings = SETTINGS,
    plan: RolloutPlan | None = None,
    deployments: Sequence[Mapping[str, Any]] = (),
    configmaps: Sequence[Mapping[str, Any]] = (),
) -> Actions:
    """plan_actions for ``spec``'s revision alone (or ``plan``), with what is stored already."""
    assert spec.ts is not None
    return plan_actions(
        Target(spec.ts, revision, spec.configs, manifest_json),
        settings,
        plan or plan_for(revision),
        deployments=deployments,
        configmaps=configmaps,
    )


def sync_args(deployment: Mapping[str, Any]) -> list[str]:
    return list(fetcher(deployment["spec"]["template"]["spec"])["args"])


def manifest_arg(deployment: Mapping[str, Any]) -> str:
    args = sync_args(deployment)
    return args[args.index("--manifest") + 1]


# ----------------------------------------------------------------- 50,000 objects


def test_50000_objects_fit_configmaps_the_api_server_takes_and_the_pod_reads_them_back(
    big: tuple[Manifest, str], tmp_path: Path
) -> None:
    manifest, text = big
    spec = checked(tritonservice())
    assert spec.ts is not None
    revision = compute_revision(spec.ts, SETTINGS, spec.configs, manifest_digest(manifest))
    actions = actions_for(spec, text, revision)
    configmaps = [x for x in actions.apply if x["kind"] == "ConfigMap"]
    # every object the operator would apply is one the API server takes
    for obj in actions.apply:
        assert refusal(obj) is None, (obj["kind"], obj["metadata"]["name"], refusal(obj))
    sizes = [payload_bytes(c) for c in configmaps]
    assert max(sizes) <= manifestparts.CONFIGMAP_BUDGET < CONFIGMAP_LIMIT
    assert max(len(json.dumps(c)) for c in configmaps) < REQUEST_LIMIT // 2
    assert len(text) > 14 * CONFIGMAP_LIMIT  # what one ConfigMap of plain JSON could never hold
    assert 2 <= len(configmaps) <= 6, sizes
    # all of them belong to the revision: owned, labelled, deleted with it
    for c in configmaps:
        assert c["metadata"]["labels"][LABEL_REVISION] == revision
        assert c["metadata"]["ownerReferences"] == [build_owner_reference(tritonservice())]
        assert c["metadata"]["name"].startswith(object_name(spec.ts, revision))

    # the sync container, given the volume as the kubelet lays it out, gets the JSON back byte for byte
    (deployment,) = [x for x in actions.apply if x["kind"] == "Deployment"]
    mounted = mount(tmp_path, deployment, configmaps, fetcher(deployment["spec"]["template"]["spec"])["name"])
    path = host_path(mounted, manifest_arg(deployment))
    assert sync_command.read_manifest_bytes(path) == text.encode()
    assert manifest_digest(sync_command.load_manifest(path)) == manifest_digest(manifest)
    # the configs are where they were
    configs = host_path(mounted, CONFIGS_DIR)
    assert (configs / "add" / "config.pbtxt").read_text() == spec.configs["add"]
    # and the operator reads the running revision's manifest back from the same ConfigMaps
    assert manifestparts.stored_manifest(configmaps) == text


def test_a_revision_whose_configmaps_are_stored_as_built_sends_none_of_them_again(
    big: tuple[Manifest, str],
) -> None:
    _, text = big
    spec = checked(tritonservice())
    assert spec.ts is not None
    first = actions_for(spec, text)
    stored = [copy.deepcopy(x) for x in first.apply if x["kind"] == "ConfigMap"]
    deployment = next(x for x in first.apply if x["kind"] == "Deployment")
    again = actions_for(spec, text, deployments=[deployment], configmaps=stored)
    assert [x["kind"] for x in again.apply] == ["Service"]  # the Deployment too is stored as built
    assert again.delete == ()
    # A Deployment to apply again (here: scaled by hand) reads the manifest parts as before.
    scaled = {**deployment, "spec": {**deployment["spec"], "replicas": 0}}
    again = actions_for(spec, text, deployments=[scaled], configmaps=stored)
    assert [x["kind"] for x in again.apply] == ["Deployment", "Service"]
    assert next(x for x in again.apply if x["kind"] == "Deployment") == deployment


def test_every_configmap_of_a_revision_let_go_is_deleted_and_stray_parts_of_the_specs_too(
    big: tuple[Manifest, str],
) -> None:
    _, text = big
    spec = checked(tritonservice())
    assert spec.ts is not None
    old = build_configmaps(spec.ts, "old", spec.configs, text)
    current = build_configmaps(spec.ts, "r1", spec.configs, text)
    stray = copy.deepcopy(current[-1])
    stray["metadata"]["name"] = part_configmap_name(spec.ts, "r1", 99)
    plan = dataclasses.replace(plan_for("r1"), delete=("old",))
    actions = actions_for(spec, text, plan=plan, configmaps=[*old, *current, stray])
    deleted = {name for kind, name in actions.delete if kind == "ConfigMap"}
    assert deleted == {c["metadata"]["name"] for c in old} | {stray["metadata"]["name"]}
    assert len(old) > 1


def test_stored_parts_are_kept_when_they_hold_the_same_manifest(big: tuple[Manifest, str]) -> None:
    """Another zlib (an operator upgrade) may gzip the same JSON to other bytes: the revision keeps
    the parts it has, so neither its ConfigMaps nor the number of parts its pods mount change."""
    _, text = big
    spec = checked(tritonservice())
    assert spec.ts is not None
    built = build_configmaps(spec.ts, "r1", spec.configs, text)
    # parts as another compressor would cut them: other bytes, another count, the same JSON
    room = manifestparts.CONFIGMAP_BUDGET - configs_bytes(spec.configs)
    other = manifestparts.split(
        gzip.compress(text.encode(), compresslevel=1, mtime=0), room, manifestparts.CONFIGMAP_BUDGET // 2
    )
    stored = copy.deepcopy(built[:1])
    stored[0]["binaryData"] = {manifestparts.part_key(0): manifestparts.encode_part(other[0])}
    for index, part in enumerate(other[1:], start=1):
        stored.append(
            {
                "metadata": {
                    "name": part_configmap_name(spec.ts, "r1", index),
                    "labels": {LABEL_REVISION: "r1"},
                },
                "binaryData": {manifestparts.part_key(index): manifestparts.encode_part(part)},
            }
        )
    assert len(other) != len(built)
    again = build_configmaps(
        spec.ts, "r1", spec.configs, text, layout=ManifestLayout(len(other)), existing=stored
    )
    assert [c.get("binaryData") for c in again] == [c.get("binaryData") for c in stored]
    assert manifest_layout(again).parts == len(other)


def test_more_parts_than_a_revision_gets_is_refused(
    big: tuple[Manifest, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, text = big
    monkeypatch.setattr(manifestparts, "MAX_PARTS", 2)
    spec = checked(tritonservice())
    assert spec.ts is not None
    with pytest.raises(manifestparts.ManifestTooLarge) as refused:
        build_configmaps(spec.ts, "r1", spec.configs, text)
    assert refused.value.json_bytes == len(text)
    assert refused.value.parts > 2
    assert "at most 2 per revision" in str(refused.value)


def test_a_small_manifest_stays_plain_json_in_one_configmap() -> None:
    spec = checked(tritonservice())
    assert spec.ts is not None
    manifest = Manifest(StoreRef("s3://m/p"), (ManifestModel("add", "add", VersionPolicy(), ("1",)),), ())
    actions = actions_for(spec, manifest_to_json(manifest))
    (configmap,) = [x for x in actions.apply if x["kind"] == "ConfigMap"]
    assert configmap["data"][manifestparts.MANIFEST_KEY] == manifest_to_json(manifest)
    assert "binaryData" not in configmap
    deployment = next(x for x in actions.apply if x["kind"] == "Deployment")
    assert manifest_arg(deployment) == MANIFEST_PATH


def test_configs_too_large_for_a_configmap_are_an_invalid_spec_naming_the_bytes() -> None:
    big_config = {**CONFIG, "parameters": {f"p{i}": {"stringValue": "x" * 1000} for i in range(1000)}}
    result = check_body(tritonservice(models=[{"name": "add", "config": big_config}]))
    assert any(p.startswith("spec.models: the rendered config.pbtxt files (") for p in result.problems)


async def test_configs_that_fit_only_without_the_spec_copy_are_an_invalid_spec_naming_both() -> None:
    """The revision's ConfigMap also keeps a copy of the spec (the models' configs again): configs
    that fit alone but not with it are refused before anything is written, as InvalidSpec naming
    both sizes, never sent to the API server and reported as a manifest to pin fewer objects of."""
    api = FakeClient()
    pinner = Pinner(small_manifest())
    stable = await serving(api, pinner)
    before = copy.deepcopy(api.objects)
    parameters = {f"p{i}": {"stringValue": "x" * 1000} for i in range(600)}
    big = {"name": "add", "config": {**CONFIG, "parameters": parameters}}
    ts = api.find("TritonService", "ml", "big")
    assert ts is not None
    ts["spec"]["models"] = [big]
    ts["metadata"]["generation"] = 2
    result = await reconcile_pass.reconcile(Kube(api), "ml", "big", SETTINGS, pin_manifest=pinner)  # type: ignore[arg-type]
    assert not api.refused
    assert result.reason == cond.INVALID_SPEC and result.invalid is not None
    assert "copy of the spec" in result.invalid and "Pin fewer objects" not in result.invalid
    checked_spec = check_body(ts)
    assert checked_spec.ts is not None
    rendered = configs_bytes(checked_spec.configs)
    assert rendered < manifestparts.CONFIGMAP_BUDGET  # the configs alone would fit
    assert f"config.pbtxt files ({rendered} bytes)" in result.invalid
    ready = condition(api, cond.READY)
    assert (ready["status"], ready["reason"]) == ("False", cond.INVALID_SPEC)
    for key, obj in before.items():
        if key[0] in ("Deployment", "ConfigMap"):
            assert api.objects[key] == obj
    stored = api.find("TritonService", "ml", "big")
    assert stored is not None and stored["status"]["stableRevision"] == stable


# ----------------------------------------------------------------- the sync command reads parts as mounted


def write_parts(folder: Path, text: str, cuts: int) -> list[Path]:
    """The gzipped manifest in ``cuts`` parts, as files named like the ConfigMap keys."""
    blob = manifestparts.compress(text)
    size = -(-len(blob) // cuts)
    folder.mkdir(parents=True)
    paths = []
    for index in range(cuts):
        path = folder / manifestparts.part_key(index)
        path.write_bytes(blob[index * size : (index + 1) * size])
        paths.append(path)
    return paths


def run_sync(*args: str | Path) -> int:
    return cli.main(["sync", *map(str, args)])


def test_sync_reads_a_manifest_in_parts_from_a_mounted_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`triton-operator sync --manifest FOLDER` as the pod runs it: an unpinned pvc:// manifest in three
    parts (the kubelet also puts its own ..data links beside them), linked into /models."""
    claim = tmp_path / "claim"
    (claim / "models" / "add" / "1").mkdir(parents=True)
    (claim / "models" / "add" / "1" / "model.py").write_text("# v1\n")
    manifest = Manifest(
        StoreRef("pvc://claim/models"), (ManifestModel("add", "add", VersionPolicy(), ()),), (), pinned=False
    )
    folder = tmp_path / "etc" / "manifest"
    write_parts(folder, manifest_to_json(manifest), 3)
    (folder / "..data").symlink_to(folder)  # what the kubelet leaves beside the files
    configs = tmp_path / "configs" / "add"
    configs.mkdir(parents=True)
    (configs / "config.pbtxt").write_text('name: "add"\nbackend: "python"\n')
    dest = tmp_path / "models"
    code = run_sync(
        "--manifest",
        folder,
        "--configs",
        tmp_path / "configs",
        "--dest",
        dest,
        "--pvc-root",
        claim,
        "--progress",
        "json",
    )
    assert code == 0, capsys.readouterr()
    assert (dest / "add" / "1" / "model.py").read_text() == "# v1\n"
    assert (dest / "add" / "config.pbtxt").read_text().startswith('name: "add"')


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda paths: paths[1].unlink(), "part manifest.json.gz.001 is missing"),
        (lambda paths: paths[-1].unlink(), "a part is missing"),
        (lambda paths: paths[1].write_bytes(b"\0" * len(paths[1].read_bytes())), "damaged"),
        (lambda paths: [p.unlink() for p in paths], "holds no manifest.json.gz.NNN parts"),
    ],
    ids=["middle-part-missing", "last-part-missing", "part-damaged", "no-parts"],
)
def test_sync_refuses_parts_that_do_not_give_back_the_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: Any, message: str
) -> None:
    manifest = realistic_manifest(3000)
    paths = write_parts(tmp_path / "manifest", manifest_to_json(manifest), 4)
    damage(paths)
    code = run_sync("--manifest", tmp_path / "manifest", "--dest", tmp_path / "models", "--progress", "json")
    assert code == sync_command.EXIT_USAGE
    assert message in capsys.readouterr().err


# ----------------------------------------------------------------- revisions made before parts


def test_a_revision_made_before_parts_keeps_its_hash_and_its_layout(tmp_path: Path) -> None:
    """The fixture is what the operator wrote before manifests were split: the same pinned manifest
    hashes to the same revision, and re-applying it changes neither its ConfigMap nor its pods."""
    spec = checked(LEGACY["tritonservice"])
    assert spec.ts is not None
    manifest = manifest_from_json(LEGACY["manifest"])
    old = Settings(sync_image=LEGACY["syncImage"], agent_pods=False)  # made before one pod shape
    revision = compute_revision(spec.ts, old, spec.configs, manifest_digest(manifest))
    assert revision == LEGACY["revision"]
    upgraded = Settings(sync_image="ghcr.io/triton-operator/triton-operator:9.9.9")
    recorded = {revision: old}  # what its Deployment shows (core.observed.observation.recorded_revisions)
    assert compute_revision(spec.ts, upgraded, spec.configs, manifest_digest(manifest), recorded) == revision
    actions = actions_for(
        spec,
        LEGACY["manifest"],
        revision,
        settings=upgraded,
        deployments=[LEGACY["deployment"]],
        configmaps=[LEGACY["configmap"]],
    )
    assert [x["kind"] for x in actions.apply] == [
        "ConfigMap",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
    ]
    # its ConfigMap as it is, plus the spec it was rendered from (kept for an invalid spec later,
    # never mounted): the manifest and configs are the same bytes, in the same plain layout
    (configmap,) = [x for x in actions.apply if x["kind"] == "ConfigMap"]
    # and the operator settings it was made with, as its Deployment shows them (OPERATOR_KEY)
    assert set(configmap["data"]) - set(LEGACY["configmap"]["data"]) == {SPEC_KEY, OPERATOR_KEY}
    assert json.loads(configmap["data"][OPERATOR_KEY])["syncImage"] == LEGACY["syncImage"]
    kept = {k: v for k, v in configmap["data"].items() if k not in (SPEC_KEY, OPERATOR_KEY)}
    assert kept == LEGACY["configmap"]["data"]
    assert "binaryData" not in configmap
    deployment = next(x for x in actions.apply if x["kind"] == "Deployment")
    assert deployment["spec"]["template"] == LEGACY["deployment"]["spec"]["template"]  # no pod restarts
    # a legacy ConfigMap that was edited away is put back as it was
    again = actions_for(
        spec, LEGACY["manifest"], revision, settings=upgraded, deployments=[LEGACY["deployment"]]
    )
    put_back = next(x for x in again.apply if x["kind"] == "ConfigMap")
    put_back_data = {k: v for k, v in put_back["data"].items() if k not in (SPEC_KEY, OPERATOR_KEY)}
    assert put_back_data == LEGACY["configmap"]["data"]
    assert {k: v for k, v in put_back.items() if k != "data"} == {
        k: v for k, v in LEGACY["configmap"].items() if k != "data"
    }
    # the operator and the pod both still read it
    assert manifestparts.stored_manifest([LEGACY["configmap"]]) == LEGACY["manifest"]
    mounted = mount(tmp_path, LEGACY["deployment"], [LEGACY["configmap"]], SYNC_CONTAINER)
    path = host_path(mounted, manifest_arg(LEGACY["deployment"]))
    assert sync_command.read_manifest_bytes(path) == LEGACY["manifest"].encode()


def test_a_deployment_says_which_layout_its_pods_read(big: tuple[Manifest, str]) -> None:
    _, text = big
    spec = checked(tritonservice())
    assert spec.ts is not None
    configmaps = build_configmaps(spec.ts, "r1", spec.configs, text)
    layout = manifest_layout(configmaps)
    assert layout.parts == len(configmaps)
    assert layout_of(build_deployment(spec.ts, "r1", SETTINGS, 1, layout)) == layout
    assert layout_of(LEGACY["deployment"]) == PLAIN
    assert layout_of(None) is None


# ----------------------------------------------------------------- one reconcile through the API


class Pinner:
    """A ManifestPinner that pins what a test says, and records the running manifest it was given."""

    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest
        self.current: list[str | None] = []
        self._json: dict[int, str] = {}

    async def __call__(self, ts: Any, current: str | None) -> pinning.PinnedManifest:
        self.current.append(current)
        text = self._json.setdefault(id(self.manifest), manifest_to_json(self.manifest))
        return pinning.PinnedManifest(
            json=text,
            digest=json_digest(text),
            objects=len(self.manifest.entries),
            total_bytes=self.manifest.total_bytes,
        )


def small_manifest() -> Manifest:
    return realistic_manifest(20)


async def serving(api: FakeClient, pinner: Pinner) -> str:
    """Reconcile a new TritonService to a stable revision whose pods are Ready; its revision."""
    api.put(tritonservice())
    kube = Kube(api)  # type: ignore[arg-type]
    await reconcile_pass.reconcile(kube, "ml", "big", SETTINGS, pin_manifest=pinner)
    for deployment in api.of_kind("Deployment"):
        replicas = deployment["spec"]["replicas"]
        deployment["status"] = {
            k: replicas for k in ("replicas", "readyReplicas", "updatedReplicas", "availableReplicas")
        }
    result = await reconcile_pass.reconcile(kube, "ml", "big", SETTINGS, pin_manifest=pinner)
    assert result.status is not None and result.status.get("stableRevision"), result.status
    return str(result.status["stableRevision"])


def condition(api: FakeClient, kind: str) -> dict[str, Any]:
    ts = api.find("TritonService", "ml", "big")
    assert ts is not None
    return next(c for c in ts["status"]["conditions"] if c["type"] == kind)


async def test_a_repository_grown_to_50000_objects_rolls_out_through_the_api_server(
    big: tuple[Manifest, str],
) -> None:
    manifest, text = big
    api = FakeClient()
    pinner = Pinner(small_manifest())
    stable = await serving(api, pinner)
    pinner.manifest = manifest
    result = await reconcile_pass.reconcile(Kube(api), "ml", "big", SETTINGS, pin_manifest=pinner)  # type: ignore[arg-type]
    assert result.invalid is None, result.invalid
    assert api.refused == []
    assert result.revision != stable
    configmaps = [
        c for c in api.of_kind("ConfigMap") if c["metadata"]["labels"][LABEL_REVISION] == result.revision
    ]
    assert len(configmaps) > 1
    assert manifestparts.stored_manifest(configmaps) == text
    ready = condition(api, cond.REPOSITORY_READY)
    assert (ready["status"], ready["reason"]) == ("True", cond.MANIFEST_PINNED)
    assert "50000 objects" in ready["message"]
    # the next reconcile gets the new revision's manifest back from its parts
    await reconcile_pass.reconcile(Kube(api), "ml", "big", SETTINGS, pin_manifest=pinner)  # type: ignore[arg-type]
    assert pinner.current[-1] == text


@pytest.mark.parametrize(("budget", "code"), [(2 * 1024 * 1024, 422), (2560 * 1024, 413)])
async def test_a_manifest_the_api_server_refuses_for_its_size_is_a_condition_and_the_serving_revision_stays(
    big: tuple[Manifest, str], monkeypatch: pytest.MonkeyPatch, budget: int, code: int
) -> None:
    """A cluster that takes less than the operator expects: the API server's 422 "Too long" or
    413 is RepositoryReady=False/ManifestTooLarge naming the objects and bytes, not InvalidSpec,
    and no retry loop (kopf gives up until the spec or the repository changes)."""
    manifest, text = big
    api = FakeClient()
    pinner = Pinner(small_manifest())
    stable = await serving(api, pinner)
    before = copy.deepcopy(api.objects)
    writes = len(api.writes)
    monkeypatch.setattr(manifestparts, "CONFIGMAP_BUDGET", budget)
    pinner.manifest = manifest
    result = await reconcile_pass.reconcile(Kube(api), "ml", "big", SETTINGS, pin_manifest=pinner)  # type: ignore[arg-type]
    assert [c for c, _, _ in api.refused] == [code]
    assert result.reason == cond.MANIFEST_TOO_LARGE
    assert result.ts is not None  # the repository poll goes on
    repository = condition(api, cond.REPOSITORY_READY)
    assert (repository["status"], repository["reason"]) == ("False", cond.MANIFEST_TOO_LARGE)
    assert "50000 objects" in repository["message"] and f"{len(text)} bytes of JSON" in repository["message"]
    assert "gzipped" in repository["message"]
    ready = condition(api, cond.READY)
    assert (ready["status"], ready["reason"]) == ("False", cond.MANIFEST_TOO_LARGE)
    # the serving revision: nothing changed, nothing scaled or deleted (the last valid spec's
    # objects are applied again as they are: the rollout goes on under it)
    for verb, kind, name in api.writes[writes:]:
        assert stable not in name or verb in ("status", "apply"), (verb, kind, name)
        assert verb not in ("delete", "patch"), (verb, kind, name)
    for key, obj in before.items():
        if key[0] in ("Deployment", "ConfigMap"):
            assert api.objects[key] == obj
    ts = api.find("TritonService", "ml", "big")
    assert ts is not None and ts["status"]["stableRevision"] == stable


async def test_more_parts_than_a_revision_gets_is_refused_before_anything_is_written(
    big: tuple[Manifest, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest, _ = big
    api = FakeClient()
    pinner = Pinner(small_manifest())
    await serving(api, pinner)
    writes = len(api.writes)
    monkeypatch.setattr(manifestparts, "MAX_PARTS", 2)
    pinner.manifest = manifest
    before = copy.deepcopy(api.objects)
    result = await reconcile_pass.reconcile(Kube(api), "ml", "big", SETTINGS, pin_manifest=pinner)  # type: ignore[arg-type]
    assert result.reason == cond.MANIFEST_TOO_LARGE
    # no part of the new manifest written; the serving revision's objects applied again unchanged
    assert not [kind for _, kind, _ in api.writes[writes:] if kind == "ConfigMap"]
    assert {k: v for k, v in api.objects.items() if k[0] != "TritonService"} == {
        k: v for k, v in before.items() if k[0] != "TritonService"
    }
    message = condition(api, cond.REPOSITORY_READY)["message"]
    assert "50000 objects" in message and "at most 2 per revision" in message
    assert "bytes of JSON" in message and "bytes gzipped need" in message
