"""Large pinned manifests and what the API server and the kubelet do with the objects that carry them.

Shared by the unit tests, the e2e test and bench/manifest (which put tests/ on sys.path):
``realistic_manifest`` builds a manifest like a big versioned S3 repository's, ``refusal`` says
whether the API server would refuse an object for its size (the rules measured on the local
cluster's kube-apiserver), and ``mount`` lays out a pod's volume as the kubelet does, so a test
can run the sync container's reader on it.
"""

from __future__ import annotations

import base64
import json
import random
import string
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from triton_operator.core.objects.traffic import TrafficWeights
from triton_operator.core.repository.manifest import (
    Manifest,
    ManifestEntry,
    ManifestModel,
    StoreRef,
    VersionPolicy,
)
from triton_operator.core.rollout.plan import RolloutPlan
from triton_operator.core.rollout.state import RolloutStatus

CONFIGMAP_LIMIT = 1024 * 1024
"""kube-apiserver: data + binaryData of a ConfigMap (422 FieldValueTooLong above it)."""
REQUEST_LIMIT = 3 * 1024 * 1024
"""kube-apiserver: a request body (413 RequestEntityTooLarge above it)."""

_FAMILIES = ("bert", "resnet", "llama", "whisper", "t5", "vit", "clip", "yolo")
_SIZES = ("base", "large", "xl", "7b", "13b")
_VERSION_ID = string.ascii_letters + string.digits + "._"


def realistic_manifest(count: int = 50_000, *, seed: int = 11, versioned: bool = True) -> Manifest:
    """``count`` objects as a big model repository holds them: models of 1 to 5 version folders of 20
    to 200 weight shards (times count / 50,000 above that), random MD5 ETags (30 % multipart, as
    large uploads are), sizes up to 5 GB, and S3 version ids when ``versioned`` (the worst case:
    32 more random characters an object)."""
    rng = random.Random(seed)
    scale = max(1, count // 50_000)  # larger repositories: larger models (a spec holds 256 at most)
    models: list[ManifestModel] = []
    entries: list[ManifestEntry] = []
    while len(entries) < count:
        name = f"{rng.choice(_FAMILIES)}-{rng.choice(_SIZES)}-{len(models):03d}"
        versions = tuple(str(v) for v in range(1, rng.randint(2, 6)))
        models.append(ManifestModel(name, name, VersionPolicy("all"), versions))
        for version in versions:
            shards = rng.randint(20, 200) * scale
            for shard in range(1, shards + 1):
                if len(entries) == count:
                    break
                rel = f"{version}/model-{shard:05d}-of-{shards:05d}.safetensors"
                etag = f"{rng.getrandbits(128):032x}"
                kind = "md5"
                if rng.random() < 0.3:
                    etag, kind = f"{etag}-{rng.randint(2, 80)}", "s3-multipart"
                generation = "".join(rng.choices(_VERSION_ID, k=32)) if versioned else ""
                size = rng.randint(1_000, 5_000_000_000)
                entries.append(
                    ManifestEntry(
                        f"triton/prod/{name}/{rel}", f"{name}/{rel}", size, kind, etag, etag, generation
                    )
                )
    repository = StoreRef("s3://models-prod/triton/prod", "https://s3.eu-west-1.amazonaws.com")
    return Manifest(repository, tuple(models), tuple(entries))


def spec_for(manifest: Manifest) -> dict[str, Any]:
    """A TritonService spec whose repository and models are those the manifest was pinned for."""
    repository = {"uri": manifest.repository.uri}
    if manifest.repository.endpoint:
        repository["endpoint"] = manifest.repository.endpoint
    config = {"backend": "python", "maxBatchSize": 8, "versionPolicy": {"all": {}}}
    return {
        "repository": repository,
        "models": [{"name": m.name, "path": m.folder, "config": dict(config)} for m in manifest.models],
    }


def payload_bytes(configmap: Mapping[str, Any]) -> int:
    """What kube-apiserver counts against CONFIGMAP_LIMIT: data values (UTF-8) and binaryData (decoded)."""
    data = sum(len(str(v).encode()) for v in (configmap.get("data") or {}).values())
    binary = sum(len(base64.b64decode(v)) for v in (configmap.get("binaryData") or {}).values())
    return data + binary


def refusal(obj: Mapping[str, Any]) -> tuple[int, str] | None:
    """(HTTP status, message) kube-apiserver answers an apply of ``obj`` with for its size, else None.

    The messages are the API server's own (v1.36, as the local cluster answered them).
    """
    body = len(json.dumps(obj).encode())
    if body > REQUEST_LIMIT:
        return 413, f"Request entity too large: limit is {REQUEST_LIMIT}"
    if obj.get("kind") == "ConfigMap" and payload_bytes(obj) > CONFIGMAP_LIMIT:
        name = obj["metadata"]["name"]
        return (
            422,
            f'ConfigMap "{name}" is invalid: []: Too long: may not be more than {CONFIGMAP_LIMIT} bytes',
        )
    return None


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _value(configmap: Mapping[str, Any], key: str) -> bytes:
    data = configmap.get("data") or {}
    if key in data:
        return str(data[key]).encode()
    binary = configmap.get("binaryData") or {}
    if key in binary:
        return base64.b64decode(binary[key])
    raise AssertionError(
        f"ConfigMap {configmap['metadata']['name']} has no key {key!r}: the pod would not start"
    )


def _project(root: Path, source: Mapping[str, Any], configmaps: Mapping[str, Mapping[str, Any]]) -> None:
    name = source["name"]
    if name not in configmaps and source.get("optional"):
        return  # the kubelet starts the pod without it (the in-place ConfigMap before an update)
    if name not in configmaps:
        raise AssertionError(f"ConfigMap {name} is mounted but not applied: the pod would not start")
    configmap = configmaps[name]
    items = source.get("items")
    if items is None:
        keys = [*(configmap.get("data") or {}), *(configmap.get("binaryData") or {})]
        items = [{"key": k, "path": k} for k in keys]
    for item in items:
        _write(root / item["path"], _value(configmap, item["key"]))


def mount(
    root: Path, deployment: Mapping[str, Any], configmaps: Sequence[Mapping[str, Any]], container: str
) -> dict[str, Path]:
    """Write ``container``'s ConfigMap volumes under ``root`` as the kubelet would (configMap and
    projected volumes, items or whole maps); returns mountPath -> the folder standing for it."""
    by_name = {str(c["metadata"]["name"]): c for c in configmaps}
    pod = deployment["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    spec = next(c for c in [*pod.get("initContainers", []), *pod["containers"]] if c["name"] == container)
    mounted: dict[str, Path] = {}
    for index, volume_mount in enumerate(spec.get("volumeMounts") or []):
        volume = volumes[volume_mount["name"]]
        folder = root / f"volume-{index}"
        if "configMap" in volume:
            _project(folder, volume["configMap"], by_name)
        elif "projected" in volume:
            for source in volume["projected"]["sources"]:
                if "configMap" in source:
                    _project(folder, source["configMap"], by_name)
        else:
            continue
        mounted[volume_mount["mountPath"]] = folder
    return mounted


def host_path(mounted: Mapping[str, Path], path: str) -> Path:
    """The file under ``mount``'s folders that a container path names."""
    for mount_path, folder in sorted(mounted.items(), key=lambda kv: -len(kv[0])):
        if path == mount_path or path.startswith(mount_path.rstrip("/") + "/"):
            return folder / path[len(mount_path) :].lstrip("/")
    raise AssertionError(f"{path} is on no mounted ConfigMap volume")


def plan_for(revision: str) -> RolloutPlan:
    """The rollout plan of one revision serving alone at 1 replica (what plan_actions renders)."""
    return RolloutPlan(
        replicas={revision: 1},
        delete=(),
        weights=TrafficWeights(),
        header_route=None,
        stable_service_revision=revision,
        canary_service_revision=None,
        status=RolloutStatus(),
        conditions={},
        events=(),
        requeue_after=None,
    )
