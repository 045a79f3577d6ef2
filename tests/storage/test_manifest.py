"""The pure manifest core: version-policy selection, safe keys, canonical JSON and its digest."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from triton_operator.adapters.sync.hashing import make_hasher
from triton_operator.core.repository.manifest import (
    Location,
    Manifest,
    ManifestError,
    ModelFolderMissing,
    ModelSource,
    ObjectInfo,
    SelectionFailed,
    StoreRef,
    UnsafeKey,
    UnsafeKeyError,
    VersionMissing,
    VersionPolicy,
    build_manifest,
    checksum_of,
    hex_from_base64,
    manifest_digest,
    manifest_from_json,
    manifest_to_dict,
    manifest_to_json,
    model_sources,
    parse_repository_uri,
    parse_version_policy,
    safe_destination,
    select_objects,
    stale_pins,
    unpinned_manifest,
)
from triton_operator.core.spec.field_error import ModelConfigError
from triton_operator.models import ModelSpec

REF = StoreRef("s3://bucket/repo", endpoint="http://127.0.0.1:8333")
MD5 = "0123456789abcdef0123456789abcdef"


def obj(key: str, size: int = 10, etag: str = MD5, **kw: Any) -> ObjectInfo:
    return ObjectInfo(key=key, size=size, etag=etag, md5=kw.pop("md5", MD5 if "-" not in etag else ""), **kw)


LISTING = [
    obj("repo/resnet/1/model.onnx"),
    obj("repo/resnet/2/model.onnx"),
    obj("repo/resnet/10/model.onnx"),
    obj("repo/resnet/10/assets/vocab.txt"),
    obj("repo/resnet/config.pbtxt"),
    obj("repo/resnet/labels.txt"),
    obj("repo/resnet/notes/readme.md"),
    obj("repo/resnet/"),  # a folder marker
    obj("repo/resnet-other/1/x"),  # shares a name prefix, not the folder
    obj("repo/bert/3/model.pt"),
    obj("other/resnet/1/model.onnx"),
]


def select(policy: VersionPolicy, listing: list[ObjectInfo] = LISTING) -> list[str]:
    selection = select_objects([ModelSource("resnet", "resnet", policy)], listing, prefix="repo/")
    assert selection.ok, selection.errors
    return [s.dest for s in selection.models[0].objects]


def test_latest_n_takes_the_highest_numeric_versions() -> None:
    assert select(VersionPolicy("latest", num_versions=2)) == [
        "resnet/10/assets/vocab.txt",
        "resnet/10/model.onnx",
        "resnet/2/model.onnx",
        "resnet/labels.txt",
        "resnet/notes/readme.md",
    ]
    assert select(VersionPolicy()) == [
        "resnet/10/assets/vocab.txt",
        "resnet/10/model.onnx",
        "resnet/labels.txt",
        "resnet/notes/readme.md",
    ]


def test_specific_and_all() -> None:
    assert "resnet/1/model.onnx" in select(VersionPolicy("all"))
    assert len([d for d in select(VersionPolicy("all")) if d.split("/")[1].isdigit()]) == 4
    assert select(VersionPolicy("specific", versions=(1,))) == [
        "resnet/1/model.onnx",
        "resnet/labels.txt",
        "resnet/notes/readme.md",
    ]


def test_the_users_config_pbtxt_and_folder_markers_are_left_out() -> None:
    dests = select(VersionPolicy("all"))
    assert "resnet/config.pbtxt" not in dests
    assert not any(d.endswith("/") for d in dests)
    assert not any("resnet-other" in d for d in dests)


def test_selection_is_independent_of_listing_order() -> None:
    shuffled = list(LISTING)
    random.Random(3).shuffle(shuffled)
    models = [ModelSource("resnet", "resnet", VersionPolicy("all")), ModelSource("bert", "bert")]
    a = build_manifest(REF, select_objects(models, LISTING, prefix="repo/"))
    b = build_manifest(REF, select_objects(list(reversed(models)), shuffled, prefix="repo/"))
    assert manifest_to_json(a) == manifest_to_json(b)
    assert manifest_digest(a) == manifest_digest(b)


def test_errors_are_data() -> None:
    models = [
        ModelSource("resnet", "resnet", VersionPolicy("specific", versions=(2, 7))),
        ModelSource("ghost", "ghost"),
        ModelSource("onlyconfig", "onlyconfig", VersionPolicy("all")),
    ]
    listing = [*LISTING, obj("repo/onlyconfig/config.pbtxt")]
    selection = select_objects(models, listing, prefix="repo/")
    assert selection.errors == (
        VersionMissing("resnet", ("7",), ("1", "2", "10")),
        ModelFolderMissing("ghost", "ghost"),
        VersionMissing("onlyconfig", ("all versions",), ()),
    )
    assert "version policy asks for 7" in selection.errors[0].message
    assert "versions: 1, 2, 10" in selection.errors[0].message
    with pytest.raises(SelectionFailed) as info:
        build_manifest(REF, selection)
    assert info.value.errors == selection.errors and "'ghost'" in str(info.value)


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("a/../../etc/passwd", "'..'"),
        ("../x", "'..'"),
        ("a/./b", "'.'"),
        ("/etc/passwd", "absolute"),
        ("a//b", "empty path segment"),
        ("a/b/", "empty path segment"),
        ("a\\..\\b", "backslash"),
        ("a/b\x00c", "NUL"),
        ("", "empty"),
    ],
)
def test_unsafe_keys_are_refused_naming_the_key(key: str, reason: str) -> None:
    with pytest.raises(UnsafeKeyError) as info:
        safe_destination(key)
    assert reason in str(info.value) and repr(key) in str(info.value)


@pytest.mark.parametrize("key", ["a/b/c", "model/1/model.onnx", "a/..b/c..", "a/.hidden", "x y/ü.bin"])
def test_safe_keys_pass(key: str) -> None:
    assert safe_destination(key) == key


def test_an_unsafe_selected_key_is_an_error_but_an_unselected_one_is_ignored() -> None:
    listing = [*LISTING, obj("repo/resnet/10/../../../etc/x"), obj("repo/resnet/1/..\\evil")]
    selection = select_objects([ModelSource("resnet", "resnet")], listing, prefix="repo/")
    assert selection.errors == (
        UnsafeKey("resnet", "repo/resnet/10/../../../etc/x", "it has a '..' path segment"),
    )
    selection = select_objects(
        [ModelSource("resnet", "resnet", VersionPolicy("specific", versions=(2,)))], listing, prefix="repo/"
    )
    assert selection.ok


def test_checksum_choice() -> None:
    assert checksum_of(ObjectInfo("k", 1, sha256="ab", md5="cd")) == ("sha256", "ab")
    assert checksum_of(ObjectInfo("k", 1, md5="cd", crc32c="ef")) == ("md5", "cd")
    assert checksum_of(ObjectInfo("k", 1, crc32c="ef")) == ("crc32c", "ef")
    assert checksum_of(ObjectInfo("k", 1, etag=f'"{MD5}-12"')) == ("s3-multipart", f"{MD5}-12")
    assert checksum_of(ObjectInfo("k", 1, etag="0x8DC0FFEE")) == ("none", "")
    assert hex_from_base64("Nx5Jyw==") == "371e49cb" and hex_from_base64("not base64!") == ""


def test_an_etag_that_is_no_digest_is_never_a_checksum() -> None:
    """S3 SSE-KMS/SSE-C: the ETag (single part or multipart) names the object, no MD5 of it."""
    assert checksum_of(ObjectInfo("k", 1, etag=f'"{MD5}-12"', etag_is_digest=False)) == ("none", "")
    assert checksum_of(ObjectInfo("k", 1, etag=MD5, sha1="ab", crc32="cd", etag_is_digest=False)) == (
        "sha1",
        "ab",
    )
    assert checksum_of(ObjectInfo("k", 1, etag=MD5, crc32c="ab", crc32="cd", etag_is_digest=False)) == (
        "crc32c",
        "ab",
    )
    assert checksum_of(ObjectInfo("k", 1, etag=MD5, crc32="cd", etag_is_digest=False)) == ("crc32", "cd")


def test_the_additional_checksum_kinds_round_trip_and_hash_like_s3() -> None:
    listing = [
        ObjectInfo(
            "repo/m/1/a", 3, etag=MD5, sha1="a9993e364706816aba3e25717850c26c9cd0d89d", etag_is_digest=False
        ),
        ObjectInfo("repo/m/1/b", 3, etag=MD5, crc32="352441c2", etag_is_digest=False),
        ObjectInfo("repo/m/1/c", 3, etag=MD5, etag_is_digest=False),
    ]
    manifest = build_manifest(REF, select_objects([ModelSource("m", "m")], listing, prefix="repo/"))
    assert manifest_from_json(manifest_to_json(manifest)) == manifest
    assert [(e.checksum_kind, e.checksum, e.etag) for e in manifest.entries] == [
        ("sha1", listing[0].sha1, MD5),
        ("crc32", listing[1].crc32, MD5),
        ("none", "", MD5),
    ]
    for kind, value in (("sha1", listing[0].sha1), ("crc32", listing[1].crc32)):
        hasher = make_hasher(kind)
        assert hasher is not None
        hasher.update(b"abc")
        assert hasher.hexdigest() == value
    # What seaweedfs answered as ChecksumCRC32 (base64) for these bytes.
    crc32 = make_hasher("crc32")
    assert crc32 is not None
    crc32.update(b"hello world" * 100)
    assert crc32.hexdigest() == hex_from_base64("VARHDQ==")


def test_json_round_trip_and_digest_sensitivity() -> None:
    models = [ModelSource("resnet", "resnet", VersionPolicy("latest", num_versions=2))]
    manifest = build_manifest(REF, select_objects(models, LISTING, prefix="repo/"))
    text = manifest_to_json(manifest)
    assert manifest_from_json(text) == manifest
    assert json.loads(text)["entries"][0]["checksum"] == {"kind": "md5", "value": MD5}

    regenerated = [
        obj(o.key, etag="f" * 32, md5="f" * 32) if o.key.endswith("2/model.onnx") else o for o in LISTING
    ]
    changed = build_manifest(REF, select_objects(models, regenerated, prefix="repo/"))
    assert manifest_digest(changed) != manifest_digest(manifest)
    moved = build_manifest(StoreRef("s3://bucket/repo"), select_objects(models, LISTING, prefix="repo/"))
    assert manifest_digest(moved) != manifest_digest(manifest)


def _doc() -> dict[str, object]:
    models = [ModelSource("resnet", "resnet")]
    return manifest_to_dict(build_manifest(REF, select_objects(models, LISTING, prefix="repo/")))


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d["entries"][0].__setitem__("dest", "resnet/../../x"), "manifest.entries[0].dest"),
        (lambda d: d["entries"][0].__setitem__("dest", "/abs/x"), "manifest.entries[0].dest"),
        (lambda d: d["entries"][0].__setitem__("dest", "other/1/x"), "manifest.entries[0].dest"),
        (lambda d: d["entries"][0].__setitem__("size", -1), "manifest.entries[0].size"),
        (lambda d: d["entries"][0].__setitem__("size", "10"), "manifest.entries[0].size"),
        (
            lambda d: d["entries"][0]["checksum"].__setitem__("kind", "crc64nvme"),
            "manifest.entries[0].checksum.kind",
        ),
        (
            lambda d: d["entries"][0]["checksum"].__setitem__("value", "XYZ"),
            "manifest.entries[0].checksum.value",
        ),
        (lambda d: d["entries"][0].pop("key"), "manifest.entries[0].key"),
        (lambda d: d.__setitem__("format", 99), "manifest.format"),
        (lambda d: d["models"][0].__setitem__("name", "../up"), "manifest.models[0].name"),
        (lambda d: d["models"][0].__setitem__("policy", {"newest": {}}), "manifest.models[0].policy"),
        (lambda d: d["repository"].__setitem__("uri", "ftp://x"), "manifest.repository.uri"),
        (lambda d: d["entries"].append(dict(d["entries"][0])), "manifest.entries[4].dest"),
    ],
)
def test_a_bad_manifest_is_refused_naming_the_field(mutate: object, field: str) -> None:
    doc = _doc()
    mutate(doc)  # type: ignore[operator]
    with pytest.raises((ManifestError, ModelConfigError)) as info:
        manifest_from_json(json.dumps(doc))
    assert str(info.value).startswith(field), str(info.value)


def test_a_file_that_is_also_a_folder_is_refused() -> None:
    doc = _doc()
    entry = dict(doc["entries"][0])  # type: ignore[index]
    entry["dest"] = doc["entries"][0]["dest"] + "/inner"  # type: ignore[index]
    doc["entries"].append(entry)  # type: ignore[attr-defined]
    with pytest.raises(ManifestError, match="both a file and a folder"):
        manifest_from_json(json.dumps(doc))


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (None, VersionPolicy()),
        ({"latest": {"numVersions": 3}}, VersionPolicy("latest", num_versions=3)),
        ({"latest": {"numVersions": "2"}}, VersionPolicy("latest", num_versions=2)),
        ({"latest": {}}, VersionPolicy("latest", num_versions=1)),
        ({"all": {}}, VersionPolicy("all")),
        ({"specific": {"versions": ["3", 1, "3"]}}, VersionPolicy("specific", versions=(1, 3))),
    ],
)
def test_version_policies_parse(policy: object, expected: VersionPolicy) -> None:
    assert parse_version_policy(policy) == expected
    assert parse_version_policy(expected.to_json()) == expected


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        ({"latest": {"numVersions": 0}}, "config.versionPolicy.latest.numVersions"),
        ({"latest": {"numVersions": True}}, "config.versionPolicy.latest.numVersions"),
        ({"specific": {"versions": []}}, "config.versionPolicy.specific.versions"),
        ({"specific": {"versions": ["v1"]}}, "config.versionPolicy.specific.versions[0]"),
        ({"all": {}, "latest": {}}, "config.versionPolicy"),
        ({"newest": {}}, "config.versionPolicy"),
        ("latest", "config.versionPolicy"),
    ],
)
def test_bad_version_policies_name_the_field(policy: object, field: str) -> None:
    with pytest.raises(ModelConfigError) as info:
        parse_version_policy(policy)
    assert info.value.field == field


def test_model_sources_from_the_spec() -> None:
    specs = [
        ModelSpec(name="a", path="deep/folder", config={"versionPolicy": {"all": {}}}),
        ModelSpec(name="b"),
    ]
    assert model_sources(specs) == [
        ModelSource("a", "deep/folder", VersionPolicy("all")),
        ModelSource("b", "b", VersionPolicy()),
    ]
    with pytest.raises(ModelConfigError) as info:
        model_sources([ModelSpec(name="c", config={"versionPolicy": {"latest": {"numVersions": -1}}})])
    assert info.value.field == "spec.models[0].config.versionPolicy.latest.numVersions"


@pytest.mark.parametrize(
    ("uri", "location"),
    [
        ("s3://bucket", Location("s3", "bucket", "")),
        ("s3://bucket/a/b/", Location("s3", "bucket", "a/b/")),
        ("gs://b/models", Location("gs", "b", "models/")),
        ("as://acct/container/p", Location("as", "container", "p/", account="acct")),
        ("pvc://claim/models", Location("pvc", "claim", "models/")),
    ],
)
def test_repository_uris(uri: str, location: Location) -> None:
    assert parse_repository_uri(uri) == location


@pytest.mark.parametrize("uri", ["http://x/y", "s3://", "as://acct", "s3://b/../x"])
def test_bad_repository_uris(uri: str) -> None:
    with pytest.raises(ModelConfigError) as info:
        parse_repository_uri(uri)
    assert info.value.field == "repository.uri"


def test_an_unpinned_manifest_names_models_only() -> None:
    manifest = unpinned_manifest(
        StoreRef("pvc://claim/models"), [ModelSource("m", "m/", VersionPolicy("all"))]
    )
    assert not manifest.pinned and manifest.entries == ()
    assert manifest_from_json(manifest_to_json(manifest)) == manifest


@pytest.mark.parametrize(
    ("folders", "latest"),
    [
        (["1", "2"], "2"),
        (["1", "010"], "1"),  # Triton 2.51 ignores "010" (leading zero): not a version
        (["0"], "0"),  # ... but loads "0"
        (["0", "3"], "3"),
        (["2", "+3"], "2"),  # "+3" Triton would read as 3 and then miss "3/": not a version here
    ],
)
def test_version_folders_count_as_triton_reads_them(folders: list[str], latest: str) -> None:
    listing = [obj(f"repo/m/{f}/model.py") for f in folders]
    selection = select_objects([ModelSource("m", "m", VersionPolicy())], listing, prefix="repo/")
    assert selection.ok, selection.errors
    assert selection.models[0].versions == (latest,)


@pytest.mark.parametrize(
    ("policy", "versions"),
    [
        (VersionPolicy(), ("1",)),
        (VersionPolicy("all"), ("1",)),
        (VersionPolicy("specific", versions=(4,)), ("4",)),
    ],
)
def test_an_ensemble_without_version_objects_gets_its_version_folder(
    policy: VersionPolicy, versions: tuple[str, ...]
) -> None:
    listing = [obj("repo/pipe/README")]
    selection = select_objects([ModelSource("pipe", "pipe", policy, ensemble=True)], listing, prefix="repo/")
    assert selection.ok, selection.errors
    (model,) = selection.models
    assert model.versions == versions and [s.dest for s in model.objects] == ["pipe/README"]
    # not an ensemble: the same listing has no version, and that is an error
    plain = select_objects([ModelSource("pipe", "pipe", policy)], listing, prefix="repo/")
    assert not plain.ok


@pytest.mark.parametrize(
    ("keys", "refused", "why"),
    [
        (["repo/m/1/model.py", "repo/m/1/model.py/x"], "repo/m/1/model.py", "both a file and a folder"),
        (["repo/m/1/model.py", "repo/m/config.pbtxt/x"], "m/config.pbtxt", "both a file and a folder"),
        (["repo/m/1/" + "w" * 256], "repo/m/1/" + "w" * 256, "longer than 255 bytes"),
        (["repo/m/1/" + "/".join(["d" * 200] * 20) + "/f"], "repo/m/1/", "longer than 3800 bytes"),
    ],
)
def test_what_sync_would_refuse_is_refused_at_pin_time(keys: list[str], refused: str, why: str) -> None:
    """A key sync cannot write fails the pin (RepositoryReady=False), never a pod's sync."""
    selection = select_objects(
        [ModelSource("m", "m", VersionPolicy())], [obj(k) for k in keys], prefix="repo/"
    )
    assert not selection.ok and not selection.models
    (error,) = selection.errors
    assert refused in error.message and why in error.message, error.message


# ----------------------------------------------------------------- pins an upload broke


def pinned_from(
    listing: list[ObjectInfo], ref: StoreRef = REF, versions: tuple[int, ...] = (1, 2)
) -> Manifest:
    policy = parse_version_policy({"specific": {"versions": list(versions)}})
    sources = [ModelSource("resnet", "resnet", policy)]
    return build_manifest(ref, select_objects(sources, listing, prefix="repo/"))


OTHER = "fedcba9876543210fedcba9876543210"


@pytest.mark.parametrize(
    ("later", "stale"),
    [
        ([], False),  # unchanged
        ([obj("repo/resnet/2/model.onnx", etag=OTHER, md5=OTHER)], True),  # overwritten in place
        ([obj("repo/resnet/2/model.onnx", size=11)], True),  # same etag, another size
        ([obj("repo/resnet/3/model.onnx")], False),  # a new version beside: nothing pinned changed
    ],
)
def test_an_object_overwritten_in_an_unversioned_bucket_makes_its_pin_stale(
    later: list[ObjectInfo], stale: bool
) -> None:
    before = pinned_from(LISTING)
    keys = {o.key for o in later}
    after = pinned_from([o for o in LISTING if o.key not in keys] + later)
    why = stale_pins(before, after)
    assert (why is not None) == stale
    if stale:
        assert why is not None and "repo/resnet/2/model.onnx was overwritten" in why


def test_a_key_the_newer_listing_lacks_or_a_versioned_pin_is_never_stale() -> None:
    before = pinned_from(LISTING)
    gone = pinned_from([o for o in LISTING if o.key != "repo/resnet/1/model.onnx"], versions=(2,))
    assert stale_pins(before, gone) is None  # not selected any more proves nothing
    versioned = pinned_from([obj(o.key, generation="v1") for o in LISTING])
    overwritten = pinned_from([obj(o.key, etag=OTHER, md5=OTHER, generation="v2") for o in LISTING])
    assert stale_pins(versioned, overwritten) is None  # read by version: the old bytes are there
    # a generation the store does not keep (GCS without object versioning) is gone after an upload
    assert stale_pins(versioned, overwritten, versions_kept=False) is not None
    # S3's "null" version is replaced by the next upload
    null = pinned_from([obj(o.key, generation="null") for o in LISTING])
    assert stale_pins(null, overwritten) is not None
    elsewhere = pinned_from([obj(o.key, etag=OTHER, md5=OTHER) for o in LISTING], StoreRef("s3://b2/repo"))
    assert stale_pins(before, elsewhere) is None
