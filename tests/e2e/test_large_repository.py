"""A 50,000-object repository against the real API server: the revision's manifest goes in parts the
API server takes and comes back whole; what it refuses for size becomes a condition.

The reconcile runs in this process with a pinner that pins a generated manifest (listing 50,000
real objects would take minutes on this machine); the API server, its limits and its answers are
the real ones. The TritonServices ask for no replicas: no pod is needed to store a manifest. One
test then runs a pod on the real node that mounts the revision's config volume as the operator
renders it and reads the manifest with this checkout's sync code: the kubelet's own layout.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, cast

import pytest
from lightkube import Client
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import ConfigMap, Pod

from bigmanifest import realistic_manifest
from e2e_helpers import REVISION_LABEL, apply, as_dict, condition, get_ts, tritonservice, written_version
from real_pods import placement, real_node
from testkit import wait_for
from triton_operator.adapters.kube import Kube, make_client
from triton_operator.core.repository import manifestparts
from triton_operator.core.repository.manifest import Manifest, json_digest, manifest_to_json
from triton_operator.reconcile import pinning, reconcile_pass
from triton_operator.settings import Settings

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]

SETTINGS = Settings()


@pytest.fixture(scope="module")
def big() -> tuple[Manifest, str]:
    manifest = realistic_manifest(50_000)
    return manifest, manifest_to_json(manifest)


class Pinner:
    """Pins the manifest a test says; records the running manifest the reconcile read back."""

    def __init__(self, manifest: Manifest, text: str | None = None) -> None:
        self.manifest = manifest
        self.text = text if text is not None else manifest_to_json(manifest)
        self.current: list[str | None] = []

    def pin(self, manifest: Manifest, text: str) -> None:
        self.manifest, self.text = manifest, text

    async def __call__(self, ts: Any, current: str | None) -> pinning.PinnedManifest:
        self.current.append(current)
        return pinning.PinnedManifest(
            json=self.text,
            digest=json_digest(self.text),
            objects=len(self.manifest.entries),
            total_bytes=self.manifest.total_bytes,
        )


class RecordingKube(Kube):
    """The operator's Kube, noting (kind, name) of every apply it sends."""

    applied: list[tuple[str, str]] = []

    async def apply(self, obj: Any) -> dict[str, Any]:
        self.applied.append((str(obj["kind"]), str(obj["metadata"]["name"])))
        return await super().apply(obj)


async def reconcile_once(cluster: Path, namespace: str, name: str, pinner: Pinner) -> reconcile_pass.Result:
    kube = RecordingKube(make_client(cluster))
    RecordingKube.applied = []
    try:
        return await reconcile_pass.reconcile(kube, namespace, name, SETTINGS, pin_manifest=pinner)
    finally:
        await kube.close()


def revision_configmaps(kube: Client, namespace: str, revision: str) -> list[dict[str, Any]]:
    return [as_dict(c) for c in kube.list(ConfigMap, namespace=namespace, labels={REVISION_LABEL: revision})]


def versions(kube: Client, namespace: str, revision: str) -> dict[str, str]:
    found = {
        c["metadata"]["name"]: c["metadata"]["resourceVersion"]
        for c in revision_configmaps(kube, namespace, revision)
    }
    for d in kube.list(Deployment, namespace=namespace, labels={REVISION_LABEL: revision}):
        body = as_dict(d)
        found[f"Deployment/{body['metadata']['name']}"] = written_version({**body, "kind": "Deployment"})
    return found


async def serving(kube: Client, cluster: Path, namespace: str, pinner: Pinner) -> str:
    """A TritonService of no replicas whose first revision is stable; that revision."""
    apply(kube, tritonservice("big", namespace, replicas=0))
    for _ in range(120):
        result = await reconcile_once(cluster, namespace, "big", pinner)
        revision = (result.status or {}).get("stableRevision")
        if revision:
            return str(revision)
        await asyncio.sleep(0.5)
    pytest.fail("the first revision did not become stable")


async def test_a_50000_object_manifest_is_stored_in_parts_and_read_back(
    kube: Client, cluster: Path, namespace: str, big: tuple[Manifest, str]
) -> None:
    manifest, text = big
    pinner = Pinner(realistic_manifest(20))
    stable = await serving(kube, cluster, namespace, pinner)
    pinner.pin(manifest, text)
    result = await reconcile_once(cluster, namespace, "big", pinner)
    assert result.invalid is None, result.invalid
    assert result.revision is not None and result.revision != stable
    configmaps = revision_configmaps(kube, namespace, result.revision)
    assert len(configmaps) > 1
    # what the API server stored gives the manifest back, byte for byte
    assert manifestparts.stored_manifest(configmaps) == text
    deployment = as_dict(kube.get(Deployment, f"big-{result.revision}", namespace=namespace))
    volume = next(
        v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "triton-operator-config"
    )
    assert {s["configMap"]["name"] for s in volume["projected"]["sources"]} == {
        c["metadata"]["name"] for c in configmaps
    }
    repository = condition(get_ts(kube, namespace, "big"), "RepositoryReady")
    assert repository["reason"] == "ManifestPinned" and "50000 objects" in repository["message"]

    # the next reconcile reads the running manifest back from the parts and sends none of them again
    before = versions(kube, namespace, result.revision)
    await reconcile_once(cluster, namespace, "big", pinner)
    assert pinner.current[-1] == text
    assert not [name for kind, name in RecordingKube.applied if kind == "ConfigMap"], RecordingKube.applied
    assert versions(kube, namespace, result.revision) == before


@pytest.mark.parametrize(("budget", "answer"), [(2 * 1024 * 1024, "Too long"), (2560 * 1024, "too large")])
async def test_a_manifest_the_api_server_refuses_for_its_size_is_a_condition(  # noqa: PLR0917 (fixtures)
    kube: Client,
    cluster: Path,
    namespace: str,
    big: tuple[Manifest, str],
    monkeypatch: pytest.MonkeyPatch,
    budget: int,
    answer: str,
) -> None:
    """Parts larger than the API server takes (as if its limits were lower than the operator
    expects): its 422 "Too long" or 413 becomes RepositoryReady=False/ManifestTooLarge, and the
    serving revision's objects are not written."""
    manifest, text = big
    pinner = Pinner(realistic_manifest(20))
    stable = await serving(kube, cluster, namespace, pinner)
    before = versions(kube, namespace, stable)
    monkeypatch.setattr(manifestparts, "CONFIGMAP_BUDGET", budget)
    pinner.pin(manifest, text)
    result = await reconcile_once(cluster, namespace, "big", pinner)
    assert result.reason == "ManifestTooLarge", result.invalid
    obj = get_ts(kube, namespace, "big")
    repository = condition(obj, "RepositoryReady")
    assert (repository["status"], repository["reason"]) == ("False", "ManifestTooLarge")
    assert "50000 objects" in repository["message"] and answer in repository["message"]
    assert condition(obj, "Ready")["reason"] == "ManifestTooLarge"
    assert obj["status"]["stableRevision"] == stable
    assert versions(kube, namespace, stable) == before


# What the pod runs: this checkout's reader on the mounted folder; the answer goes to the
# termination message (no kubelet log proxy needed).
READER = """
import hashlib, json, pathlib
from triton_operator.commands.sync import load_manifest, read_manifest_bytes
root = pathlib.Path('/etc/triton-operator')
folder = root / 'manifest'
data = read_manifest_bytes(folder)
answer = {
    'sha256': hashlib.sha256(data).hexdigest(),
    'entries': len(load_manifest(folder).entries),
    'files': sorted(p.name for p in folder.iterdir()),
    'configs': sorted(str(p.relative_to(root)) for p in (root / 'configs').rglob('*.pbtxt')),
}
pathlib.Path('/dev/termination-log').write_text(json.dumps(answer))
"""


async def test_a_pod_on_the_real_node_reads_the_parts_as_the_kubelet_mounts_them(
    kube: Client, cluster: Path, namespace: str, big: tuple[Manifest, str]
) -> None:
    node, why = real_node()
    if node is None:
        pytest.skip(f"no real node: {why}")
    import images  # noqa: PLC0415 (e2e/images.py, on sys.path through real_pods)

    manifest, text = big
    pinner = Pinner(realistic_manifest(20))
    await serving(kube, cluster, namespace, pinner)
    pinner.pin(manifest, text)
    result = await reconcile_once(cluster, namespace, "big", pinner)
    assert result.invalid is None, result.invalid
    deployment = as_dict(kube.get(Deployment, f"big-{result.revision}", namespace=namespace))
    template = deployment["spec"]["template"]["spec"]
    config = next(v for v in template["volumes"] if v["name"] == "triton-operator-config")
    assert len(config["projected"]["sources"]) > 1
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "read-manifest", "namespace": namespace},
        "spec": {
            **placement(),
            "restartPolicy": "Never",
            "enableServiceLinks": False,
            "volumes": [config, {"name": "src", "hostPath": {"path": str(ROOT / "operator" / "src")}}],
            "containers": [
                {
                    "name": "read",
                    "image": images.IMAGES["operator"]["ref"],
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", READER],
                    "env": [{"name": "PYTHONPATH", "value": "/src"}],
                    "volumeMounts": [
                        {
                            "name": "triton-operator-config",
                            "mountPath": "/etc/triton-operator",
                            "readOnly": True,
                        },
                        {"name": "src", "mountPath": "/src", "readOnly": True},
                    ],
                }
            ],
        },
    }
    kube.create(cast(Pod, Pod.from_dict(pod)))

    def finished() -> dict[str, Any] | None:
        status = as_dict(kube.get(Pod, "read-manifest", namespace=namespace)).get("status") or {}
        for container in status.get("containerStatuses") or []:
            terminated = (container.get("state") or {}).get("terminated")
            if terminated:
                return dict(terminated)
        return None

    terminated = await asyncio.to_thread(wait_for, finished, timeout=120, what="the reading pod to finish")
    assert terminated["exitCode"] == 0, terminated
    answer = json.loads(terminated["message"])
    assert answer["sha256"] == json_digest(text)  # byte for byte
    assert answer["entries"] == 50_000
    assert answer["files"] == [manifestparts.part_key(i) for i in range(len(config["projected"]["sources"]))]
    assert answer["configs"] == ["configs/add/config.pbtxt"]
