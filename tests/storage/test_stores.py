"""Listing, pinning and typed errors of the S3, GCS and Azure stores against the real servers."""

from __future__ import annotations

import hashlib

import pytest

from storage_backends import Backend
from testkit import free_port
from triton_operator.adapters.storage import (
    AccessDenied,
    BucketNotFound,
    ListingTooLarge,
    StoreUnavailable,
    open_store,
    pin_repository,
)
from triton_operator.core.repository.manifest import (
    ModelFolderMissing,
    SelectionFailed,
    UnsafeKey,
    VersionMissing,
    manifest_digest,
)
from triton_operator.models import ModelSpec, Repository

pytestmark = pytest.mark.storage

REPO_FILES = {
    "models/resnet/1/model.onnx": b"resnet version one",
    "models/resnet/2/model.onnx": b"resnet version two!",
    "models/resnet/3/model.onnx": b"resnet version three",
    "models/resnet/3/extra/weights.bin": bytes(range(256)) * 10,
    "models/resnet/config.pbtxt": b'name: "resnet"',
    "models/resnet/labels.txt": b"cat\ndog\n",
    "models/tokenizer/1/model.py": b"print('hi')\n",
    "elsewhere/ignored.bin": b"not under the prefix",
}


def upload(backend: Backend, bucket: str, files: dict[str, bytes]) -> None:
    for key, data in files.items():
        backend.put(bucket, key, data)


def spec(name: str, policy: dict[str, object] | None = None, path: str | None = None) -> ModelSpec:
    config: dict[str, object] = {"backend": "python"}
    if policy is not None:
        config["versionPolicy"] = policy
    return ModelSpec(name=name, path=path, config=config)


def test_listing_gives_keys_sizes_and_checksums(backend: Backend, bucket: str) -> None:
    upload(backend, bucket, REPO_FILES)
    store = backend.store(bucket)
    try:
        listing = {o.key: o for o in store.list(store.prefix)}
    finally:
        store.close()
    expected = {k: v for k, v in REPO_FILES.items() if k.startswith("models/")}
    assert set(listing) == set(expected)
    for key, data in expected.items():
        assert listing[key].size == len(data), key
        assert listing[key].etag, key
        assert listing[key].md5 == hashlib.md5(data).hexdigest(), key
    if backend.name == "gcs":
        assert all(o.generation and o.crc32c for o in listing.values())


@pytest.mark.parametrize(
    ("policy", "versions"),
    [
        (None, ["3"]),
        ({"latest": {"numVersions": 2}}, ["2", "3"]),
        ({"latest": {"numVersions": 9}}, ["1", "2", "3"]),
        ({"specific": {"versions": ["1", "3"]}}, ["1", "3"]),
        ({"all": {}}, ["1", "2", "3"]),
    ],
)
def test_pinning_follows_the_version_policy(
    backend: Backend, bucket: str, policy: dict[str, object] | None, versions: list[str]
) -> None:
    upload(backend, bucket, REPO_FILES)
    manifest = pin_repository(backend.repository(bucket), [spec("resnet", policy)], backend.credentials)
    assert [m.versions for m in manifest.models] == [tuple(versions)]
    dests = {e.dest for e in manifest.entries}
    expected = {f"resnet/{v}/model.onnx" for v in versions} | {"resnet/labels.txt"}
    if "3" in versions:
        expected.add("resnet/3/extra/weights.bin")
    assert dests == expected  # the user's config.pbtxt is left out: the operator renders it
    by_dest = {e.dest: e for e in manifest.entries}
    for v in versions:
        entry = by_dest[f"resnet/{v}/model.onnx"]
        data = REPO_FILES[entry.key]
        assert (entry.size, entry.checksum_kind, entry.checksum) == (
            len(data),
            "md5",
            hashlib.md5(data).hexdigest(),
        )
        assert entry.etag


def test_digest_is_stable_for_an_unchanged_bucket_and_changes_on_upload(
    backend: Backend, bucket: str
) -> None:
    upload(backend, bucket, REPO_FILES)
    repo = backend.repository(bucket)
    models = [spec("resnet", {"latest": {"numVersions": 1}}), spec("tokenizer")]
    first = pin_repository(repo, models, backend.credentials)
    again = pin_repository(repo, models, backend.credentials)
    assert manifest_digest(first) == manifest_digest(again)

    backend.put(bucket, "models/resnet/4/model.onnx", b"resnet version four")
    newer = pin_repository(repo, models, backend.credentials)
    assert manifest_digest(newer) != manifest_digest(first)
    assert newer.models[0].versions == ("4",)

    backend.put(bucket, "models/tokenizer/1/model.py", b"print('changed')\n")
    changed = pin_repository(repo, models, backend.credentials)
    assert manifest_digest(changed) != manifest_digest(newer)


def test_missing_folder_and_versions_are_reported_as_data(backend: Backend, bucket: str) -> None:
    upload(backend, bucket, REPO_FILES)
    models = [
        spec("resnet", {"specific": {"versions": ["2", "9"]}}),
        spec("ghost", path="no/such/folder"),
        spec("tokenizer"),
    ]
    with pytest.raises(SelectionFailed) as info:
        pin_repository(backend.repository(bucket), models, backend.credentials)
    assert set(info.value.errors) == {
        VersionMissing("resnet", ("9",), ("1", "2", "3")),
        ModelFolderMissing("ghost", "no/such/folder"),
    }
    assert "'no/such/folder'" in str(info.value) and "asks for 9" in str(info.value)


def test_missing_bucket_raises_bucket_not_found(backend: Backend) -> None:
    store = backend.store("no-such-bucket-x1")
    with pytest.raises(BucketNotFound) as info:
        list(store.list(store.prefix))
    assert info.value.bucket == "no-such-bucket-x1"
    assert "no-such-bucket-x1" in str(info.value)


@pytest.mark.parametrize("name", ["s3", "azure"])
def test_wrong_secret_raises_access_denied(request: pytest.FixtureRequest, name: str) -> None:
    # fake-gcs-server does not check credentials, so GCS has no such case here.
    backend: Backend = request.getfixturevalue(f"{name}_backend")
    bucket = backend.new_bucket()
    backend.put(bucket, "models/m/1/f", b"x")
    if name == "s3":
        creds = {**backend.credentials, "AWS_SECRET_ACCESS_KEY": "wrong-secret"}
    else:
        cs = backend.credentials["AZURE_STORAGE_CONNECTION_STRING"]
        creds = {"AZURE_STORAGE_CONNECTION_STRING": cs.replace("AccountKey=Eby8", "AccountKey=AAAA")}
    store = open_store(backend.repository(bucket), creds)
    with pytest.raises(AccessDenied) as info:
        list(store.list(store.prefix))
    assert bucket in str(info.value)
    with pytest.raises(AccessDenied):
        pin_repository(backend.repository(bucket), [spec("m")], creds)


@pytest.mark.parametrize(
    ("uri", "creds"),
    [
        ("s3://bucket/models", {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}),
        ("gs://bucket/models", {}),
        ("as://devstoreaccount1/container/models", {"AZURE_STORAGE_KEY": "QUFBQQ=="}),
    ],
)
def test_unreachable_store_raises_store_unavailable(uri: str, creds: dict[str, str]) -> None:
    port = free_port()  # nothing listens there
    suffix = "/devstoreaccount1" if uri.startswith("as://") else ""
    repo = Repository(uri=uri, endpoint=f"http://127.0.0.1:{port}{suffix}")
    store = open_store(repo, creds, timeout=2.0, max_attempts=1)
    with pytest.raises(StoreUnavailable) as info:
        list(store.list(store.prefix))
    assert uri in str(info.value)


@pytest.mark.parametrize("name", ["gcs", "azure"])
def test_a_key_escaping_the_model_folder_is_refused(request: pytest.FixtureRequest, name: str) -> None:
    # seaweedfs itself refuses keys with '..' segments, so S3 has no such object to list here.
    backend: Backend = request.getfixturevalue(f"{name}_backend")
    bucket = backend.new_bucket()
    upload(backend, bucket, {"models/evil/1/model.py": b"ok"})
    # Azurite turns backslashes into slashes, so this key is stored as models/evil/1/../../../etc/x.
    key = "models/evil/1/../../../etc/x" if name == "gcs" else "models/evil/1/..\\..\\..\\etc\\x"
    backend.put(bucket, key, b"escape")
    with pytest.raises(SelectionFailed) as info:
        pin_repository(backend.repository(bucket), [spec("evil")], backend.credentials)
    (error,) = info.value.errors
    assert isinstance(error, UnsafeKey)
    assert error.key == "models/evil/1/../../../etc/x"
    assert "'..'" in error.reason and error.key in str(info.value)


def test_a_listing_stops_at_the_cap_and_names_it(backend: Backend, bucket: str) -> None:
    upload(backend, bucket, REPO_FILES)  # 7 objects under the prefix
    with pytest.raises(ListingTooLarge) as info:
        pin_repository(backend.repository(bucket), [spec("resnet")], backend.credentials, max_objects=3)
    assert info.value.cap == 3 and "more than 3 objects" in str(info.value)
    pinned = pin_repository(backend.repository(bucket), [spec("resnet")], backend.credentials, max_objects=7)
    assert pinned.entries
