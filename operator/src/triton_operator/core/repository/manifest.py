"""The pinned repository manifest: version-policy selection, safe destinations, canonical JSON, digest."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from triton_operator.core.spec.field_error import ModelConfigError

MANIFEST_FORMAT = 1
CONFIG_FILE = "config.pbtxt"

CHECKSUM_KINDS: tuple[str, ...] = ("sha256", "md5", "sha1", "crc32c", "crc32", "s3-multipart", "none")
# Kinds whose value is derived from the bytes alone, so a file can be verified and cached by it.
CONTENT_KINDS: frozenset[str] = frozenset({"sha256", "md5", "sha1", "crc32c", "crc32", "s3-multipart"})

_HEX32 = re.compile(r"^[0-9a-f]{32}$")
_MULTIPART_ETAG = re.compile(r"^[0-9a-f]{32}-[1-9][0-9]{0,4}$")
_SCHEMES = ("s3", "gs", "as", "pvc")


# ---------------------------------------------------------------- objects and locations


@dataclass(frozen=True)
class ObjectInfo:
    """One object of a store listing; checksums are lower-case hex, empty when the store has none.

    ``sha1``/``crc32`` (and ``sha256``/``crc32c``) are also S3's additional checksums of the whole
    object. ``etag_is_digest`` is False when the store said the ETag is no digest of the content
    (S3 SSE-KMS, SSE-C, an encrypting S3-compatible store): the ETag then only names the object.
    """

    key: str
    size: int
    etag: str = ""
    md5: str = ""
    crc32c: str = ""
    sha256: str = ""
    generation: str = ""  # GCS generation, S3/Azure version id
    sha1: str = ""
    crc32: str = ""
    etag_is_digest: bool = True


@dataclass(frozen=True)
class Location:
    """A parsed repository URI: ``bucket`` is the S3/GCS bucket, Azure container or PVC claim."""

    scheme: str
    bucket: str
    prefix: str  # "" or ends with "/"
    account: str = ""  # Azure storage account


def parse_repository_uri(uri: str, *, field_name: str = "repository.uri") -> Location:
    """Split ``s3://bucket/prefix``, ``gs://...``, ``as://account/container/prefix`` or ``pvc://claim/path``."""
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme not in _SCHEMES:
        raise ModelConfigError(field_name, f"{uri!r} must start with one of s3://, gs://, as://, pvc://")
    parts = rest.split("/")
    account = ""
    if scheme == "as":
        if len(parts) < 2 or not parts[0] or not parts[1]:
            raise ModelConfigError(field_name, f"{uri!r} must be as://ACCOUNT/CONTAINER[/prefix]")
        account = parts.pop(0)
    bucket = parts[0]
    if not bucket:
        raise ModelConfigError(field_name, f"{uri!r} names no bucket")
    prefix = "/".join(p for p in parts[1:] if p)
    for segment in prefix.split("/"):
        if segment in (".", ".."):
            raise ModelConfigError(field_name, f"{uri!r}: the path may not contain {segment!r} segments")
    return Location(scheme, bucket, prefix + "/" if prefix else "", account)


def hex_from_base64(value: str | None) -> str:
    """GCS and Azure report digests in base64; the manifest keeps lower-case hex."""
    if not value:
        return ""
    try:
        return base64.b64decode(value, validate=True).hex()
    except (binascii.Error, ValueError):
        return ""


def checksum_of(obj: ObjectInfo) -> tuple[str, str]:
    """The strongest checksum a listing gives for an object: (kind, value).

    An ETag counts (as a multipart ETag) only while ``etag_is_digest``; with no checksum at all
    the kind is "none": sync checks the size and reads the pinned object by its ETag/version.
    """
    if obj.sha256:
        return "sha256", obj.sha256
    if obj.md5:
        return "md5", obj.md5
    if obj.sha1:
        return "sha1", obj.sha1
    if obj.crc32c:
        return "crc32c", obj.crc32c
    if obj.crc32:
        return "crc32", obj.crc32
    etag = obj.etag.strip('"').lower()
    if obj.etag_is_digest and _MULTIPART_ETAG.match(etag):
        return "s3-multipart", etag
    return "none", ""


def s3_etag_md5(etag: str) -> str:
    """The MD5 an S3 ETag stands for when it is a single-part upload's ETag, else ""."""
    value = etag.strip('"').lower()
    return value if _HEX32.match(value) else ""


# ---------------------------------------------------------------- safe destinations


class UnsafeKeyError(ValueError):
    """A key that would land outside the destination directory."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"object key {key!r} is refused: {reason}")
        self.key = key
        self.reason = reason


def safe_destination(key: str) -> str:
    """Return ``key`` as a relative path that stays inside the destination, or raise UnsafeKeyError."""
    if not key:
        raise UnsafeKeyError(key, "it is empty")
    if "\x00" in key:
        raise UnsafeKeyError(key, "it contains a NUL byte")
    if "\\" in key:
        raise UnsafeKeyError(key, "it contains a backslash")
    if key.startswith("/"):
        raise UnsafeKeyError(key, "it is an absolute path")
    if len(key.encode()) > MAX_PATH_BYTES:
        raise UnsafeKeyError(key, f"it is longer than {MAX_PATH_BYTES} bytes")
    for segment in key.split("/"):
        if segment == "":
            raise UnsafeKeyError(key, "it has an empty path segment")
        if segment in (".", ".."):
            raise UnsafeKeyError(key, f"it has a {segment!r} path segment")
        if len(segment.encode()) > MAX_NAME_BYTES:
            raise UnsafeKeyError(key, f"a path segment is longer than {MAX_NAME_BYTES} bytes")
    return key


MAX_NAME_BYTES = 255
"""The longest file or folder name Linux file systems take (NAME_MAX)."""
MAX_PATH_BYTES = 3800
"""Room under PATH_MAX (4096) for the destination folder and sync's temporary suffixes."""


def file_and_folder(dests: Iterable[str]) -> list[str]:
    """Destinations that are a file and also the folder of another destination (a/b and a/b/c)."""
    files = set(dests)
    clashes = set()
    for d in files:
        parts = d.split("/")
        for n in range(1, len(parts)):
            if "/".join(parts[:n]) in files:
                clashes.add("/".join(parts[:n]))
    return sorted(clashes)


# ---------------------------------------------------------------- version policies


@dataclass(frozen=True)
class VersionPolicy:
    """Triton's ModelVersionPolicy: latest N, all, or specific versions."""

    kind: Literal["latest", "all", "specific"] = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        if self.kind == "latest":
            return {"latest": {"numVersions": self.num_versions}}
        if self.kind == "all":
            return {"all": {}}
        return {"specific": {"versions": [str(v) for v in self.versions]}}

    def describe(self) -> str:
        if self.kind == "latest":
            return f"latest {self.num_versions}"
        if self.kind == "all":
            return "all"
        return "specific " + ", ".join(str(v) for v in self.versions)


def _as_int(value: Any, field_name: str) -> int:
    if isinstance(value, bool):
        raise ModelConfigError(field_name, f"must be an integer, not {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"[0-9]+", value):
        return int(value)
    raise ModelConfigError(field_name, f"must be an integer, not {value!r}")


def parse_version_policy(policy: Any, *, field_name: str = "config.versionPolicy") -> VersionPolicy:
    """Parse a proto3-JSON versionPolicy; None means Triton's default, latest 1."""
    if policy is None:
        return VersionPolicy()
    if not isinstance(policy, Mapping) or len(policy) != 1:
        raise ModelConfigError(field_name, "must set exactly one of latest, all, specific")
    ((kind, body),) = policy.items()
    body = {} if body is None else body
    if not isinstance(body, Mapping):
        raise ModelConfigError(f"{field_name}.{kind}", "must be an object")
    if kind == "latest":
        unknown = set(body) - {"numVersions", "num_versions"}
        if unknown:
            raise ModelConfigError(f"{field_name}.latest", f"unknown field {sorted(unknown)[0]!r}")
        n = _as_int(body.get("numVersions", body.get("num_versions", 1)), f"{field_name}.latest.numVersions")
        if n < 1:
            raise ModelConfigError(f"{field_name}.latest.numVersions", f"must be at least 1, not {n}")
        return VersionPolicy("latest", num_versions=n)
    if kind == "all":
        if body:
            raise ModelConfigError(f"{field_name}.all", "takes no fields")
        return VersionPolicy("all")
    if kind == "specific":
        unknown = set(body) - {"versions"}
        if unknown:
            raise ModelConfigError(f"{field_name}.specific", f"unknown field {sorted(unknown)[0]!r}")
        raw = body.get("versions")
        if not isinstance(raw, list) or not raw:
            raise ModelConfigError(f"{field_name}.specific.versions", "must be a non-empty list")
        versions = tuple(
            sorted({_as_int(v, f"{field_name}.specific.versions[{i}]") for i, v in enumerate(raw)})
        )
        return VersionPolicy("specific", versions=versions)
    raise ModelConfigError(field_name, f"unknown policy {kind!r}; use latest, all or specific")


@dataclass(frozen=True)
class ModelSource:
    """What selection needs of one spec model: its name, its folder and its version policy."""

    name: str
    folder: str
    policy: VersionPolicy = field(default_factory=VersionPolicy)
    ensemble: bool = False
    """An ensemble: Triton needs a version folder, but it holds no files an object store keeps."""


def model_sources(models: Sequence[Any]) -> list[ModelSource]:
    """ModelSources from the spec's ModelSpec list (anything with name, folder and config)."""
    out = []
    for i, m in enumerate(models):
        cfg = m.config or {}
        policy = parse_version_policy(
            cfg.get("versionPolicy", cfg.get("version_policy")),
            field_name=f"spec.models[{i}].config.versionPolicy",
        )
        out.append(ModelSource(m.name, m.folder, policy, ensemble=cfg.get("platform") == "ensemble"))
    return out


# ---------------------------------------------------------------- selection


@dataclass(frozen=True)
class ModelFolderMissing:
    """No object lies under the model's folder."""

    model: str
    folder: str

    @property
    def message(self) -> str:
        return f"model {self.model!r}: no objects under folder {self.folder!r} of the repository"


@dataclass(frozen=True)
class VersionMissing:
    """The version policy asks for versions the folder does not hold."""

    model: str
    asked: tuple[str, ...]
    found: tuple[str, ...]

    @property
    def message(self) -> str:
        found = ", ".join(self.found) if self.found else "none"
        return (
            f"model {self.model!r}: version policy asks for {', '.join(self.asked)} "
            f"but the repository holds versions: {found}"
        )


@dataclass(frozen=True)
class UnsafeKey:
    """A selected object whose key would escape the model directory."""

    model: str
    key: str
    reason: str

    @property
    def message(self) -> str:
        return f"model {self.model!r}: object key {self.key!r} is refused: {self.reason}"


SelectionError = ModelFolderMissing | VersionMissing | UnsafeKey


@dataclass(frozen=True)
class SelectedObject:
    obj: ObjectInfo
    dest: str  # <model>/<version>/<file> or <model>/<file>


@dataclass(frozen=True)
class SelectedModel:
    name: str
    folder: str
    policy: VersionPolicy
    versions: tuple[str, ...]
    objects: tuple[SelectedObject, ...]


@dataclass(frozen=True)
class Selection:
    """The result of selection: per-model objects, and errors as data."""

    models: tuple[SelectedModel, ...]
    errors: tuple[SelectionError, ...]

    @property
    def objects(self) -> dict[str, list[ObjectInfo]]:
        return {m.name: [s.obj for s in m.objects] for m in self.models}

    @property
    def ok(self) -> bool:
        return not self.errors

    def with_objects(self, objects: Iterable[ObjectInfo]) -> Selection:
        """This selection with each selected object replaced by the one of ``objects`` with its key
        (what a store learnt of them after the listing: encryption, additional checksums)."""
        by_key = {o.key: o for o in objects}
        return Selection(
            tuple(
                dataclasses.replace(
                    m,
                    objects=tuple(SelectedObject(by_key.get(s.obj.key, s.obj), s.dest) for s in m.objects),
                )
                for m in self.models
            ),
            self.errors,
        )


def _is_version(segment: str) -> bool:
    """A folder Triton reads as a version: digits without leading zeros ("0" itself counts).

    Checked against tritonserver 2.51: it loads "0" and "2", ignores "010" ("contains leading
    zeros"), and takes "+3" for version 3 and then fails to find "3/"; only canonical numbers
    are versions here, everything else under the model folder is an ordinary file or folder.
    """
    if not (segment.isascii() and segment.isdigit()):
        return False
    return segment == "0" or not segment.startswith("0")


def _select_versions(policy: VersionPolicy, found: dict[int, list[str]]) -> tuple[set[int], tuple[str, ...]]:
    """Versions picked by the policy, and the versions asked for that are missing (as text)."""
    numbers = sorted(found)
    if policy.kind == "all":
        return set(numbers), () if numbers else ("all versions",)
    if policy.kind == "latest":
        picked = set(numbers[-policy.num_versions :]) if numbers else set()
        return picked, () if numbers else (f"latest {policy.num_versions}",)
    missing = tuple(str(v) for v in policy.versions if v not in found)
    return {v for v in policy.versions if v in found}, missing


def _clashes(model: str, chosen: Sequence[SelectedObject]) -> list[SelectionError]:
    """The check sync makes on a manifest, made at pin time (a pod must never be the first to find
    that the pinned objects cannot be written): no file may also be a folder, the rendered
    config.pbtxt included."""
    out: list[SelectionError] = []
    for clash in file_and_folder([s.dest for s in chosen] + [f"{model}/{CONFIG_FILE}"]):
        key = next((s.obj.key for s in chosen if s.dest == clash), clash)
        out.append(UnsafeKey(model, key, f"{clash!r} would be both a file and a folder"))
    return out


def select_objects(
    models: Sequence[ModelSource], listing: Iterable[ObjectInfo], *, prefix: str = ""
) -> Selection:
    """Select the objects each model's version policy picks from a listing under ``prefix``.

    Versions are numeric folders ``<folder>/<N>/...``; other files and folders under the model
    folder are kept, except a top-level ``config.pbtxt`` (the operator renders that). Folder
    markers (keys ending in "/") are ignored.
    """
    objects = [o for o in listing if o.key.startswith(prefix) and not o.key.endswith("/")]
    selected: list[SelectedModel] = []
    errors: list[SelectionError] = []
    for model in models:
        folder = model.folder.strip("/")
        base = f"{prefix}{folder}/" if folder else prefix
        found: dict[int, list[str]] = {}
        version_objs: list[tuple[int, str, ObjectInfo]] = []
        other: list[tuple[str, ObjectInfo]] = []
        for obj in objects:
            if not obj.key.startswith(base):
                continue
            rel = obj.key[len(base) :]
            first, sep, _ = rel.partition("/")
            if sep and _is_version(first):
                number = int(first)
                names = found.setdefault(number, [])
                if first not in names:
                    names.append(first)
                version_objs.append((number, rel, obj))
            elif rel != CONFIG_FILE:
                other.append((rel, obj))
        if model.ensemble and not version_objs:
            # An ensemble's version folder is empty, and object stores keep no empty folders:
            # the manifest names the version and sync creates the folder.
            asked = model.policy.versions if model.policy.kind == "specific" else (1,)
            picked: set[int] = set()
            versions = tuple(str(v) for v in asked)
        else:
            if not version_objs and not other and not any(o.key == base + CONFIG_FILE for o in objects):
                errors.append(ModelFolderMissing(model.name, folder))
                continue
            picked, missing = _select_versions(model.policy, found)
            if missing:
                errors.append(
                    VersionMissing(
                        model.name,
                        missing,
                        tuple(name for n in sorted(found) for name in sorted(found[n])),
                    )
                )
                continue
            versions = tuple(name for n in sorted(picked) for name in sorted(found[n]))
        chosen: list[SelectedObject] = []
        unsafe = False
        for rel, obj in [(r, o) for n, r, o in version_objs if n in picked] + other:
            try:
                safe_destination(rel)
            except UnsafeKeyError as exc:
                errors.append(UnsafeKey(model.name, obj.key, exc.reason))
                unsafe = True
                continue
            chosen.append(SelectedObject(obj, f"{model.name}/{rel}"))
        clashes = _clashes(model.name, chosen)
        errors.extend(clashes)
        if unsafe or clashes:
            continue
        chosen.sort(key=lambda s: s.dest)
        selected.append(SelectedModel(model.name, folder, model.policy, versions, tuple(chosen)))
    return Selection(tuple(selected), tuple(errors))


# ---------------------------------------------------------------- the manifest


class ManifestError(ValueError):
    """A manifest that cannot be built or read; ``field`` names where."""

    def __init__(self, field_name: str, problem: str) -> None:
        super().__init__(f"{field_name}: {problem}")
        self.field = field_name
        self.problem = problem


class SelectionFailed(ValueError):  # noqa: N818
    """Selection found errors; they are kept as data in ``errors``."""

    def __init__(self, errors: Sequence[SelectionError]) -> None:
        super().__init__("; ".join(e.message for e in errors))
        self.errors = tuple(errors)


@dataclass(frozen=True)
class StoreRef:
    """How to reach the repository again: its URI and endpoint options (never credentials)."""

    uri: str
    endpoint: str = ""
    s3_addressing_style: str = "auto"
    s3_region: str = ""

    @classmethod
    def from_repository(cls, repository: Any) -> StoreRef:
        s3 = getattr(repository, "s3", None)
        return cls(
            uri=repository.uri,
            endpoint=repository.endpoint or "",
            s3_addressing_style=(s3.addressing_style if s3 else "auto") or "auto",
            s3_region=(s3.region if s3 else "") or "",
        )


@dataclass(frozen=True)
class ManifestEntry:
    key: str
    dest: str
    size: int
    checksum_kind: str
    checksum: str
    etag: str = ""
    generation: str = ""

    @property
    def version_pinned(self) -> bool:
        """Whether reads name an object version that an upload to the same key leaves in place.

        S3's "null" version (an object written while the bucket's versioning was suspended) is
        replaced by the next upload, like an object of an unversioned bucket.
        """
        return self.generation not in ("", "null")


@dataclass(frozen=True)
class ManifestModel:
    name: str
    folder: str
    policy: VersionPolicy
    versions: tuple[str, ...]  # empty when the manifest is not pinned


@dataclass(frozen=True)
class Manifest:
    """Everything a pod fetches: pinned objects by key, size, checksum and etag/generation.

    ``pinned`` is False for a pvc:// repository that the operator cannot read: the pod then
    links the claim's version folders as they are, with no sizes or checksums to check.
    """

    repository: StoreRef
    models: tuple[ManifestModel, ...]
    entries: tuple[ManifestEntry, ...]
    pinned: bool = True

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries)


def stale_pins(pinned: Manifest, current: Manifest, *, versions_kept: bool = True) -> str | None:
    """Why ``pinned`` can no longer be synced, judged by a newer listing ``current``; None if it can.

    An entry pinned by ETag alone (no object version, or one an upload replaces; any entry when
    the store keeps no old versions: ``versions_kept`` False) whose key now lists with another
    ETag or size was overwritten in place: a pod would fail its sync and crash-loop. A key the
    newer listing does not hold proves nothing (the spec may no longer select it).
    """
    if not pinned.pinned or not current.pinned or pinned.repository != current.repository:
        return None
    now = {e.key: e for e in current.entries}
    for entry in pinned.entries:
        later = now.get(entry.key)
        if (versions_kept and entry.version_pinned) or later is None:
            continue
        if (later.etag, later.size) != (entry.etag, entry.size):
            return (
                f"{entry.key} was overwritten since it was pinned (etag {entry.etag or '-'}, now "
                f"{later.etag or '-'}) and the bucket keeps no object versions"
            )
    return None


def build_manifest(repository: StoreRef, selection: Selection) -> Manifest:
    """The pinned manifest of a successful selection; raises SelectionFailed with its errors."""
    if selection.errors:
        raise SelectionFailed(selection.errors)
    models = []
    entries = []
    for m in sorted(selection.models, key=lambda m: m.name):
        models.append(ManifestModel(m.name, m.folder, m.policy, m.versions))
        for s in m.objects:
            kind, value = checksum_of(s.obj)
            entries.append(
                ManifestEntry(s.obj.key, s.dest, s.obj.size, kind, value, s.obj.etag, s.obj.generation)
            )
    entries.sort(key=lambda e: e.dest)
    return Manifest(repository, tuple(models), tuple(entries), pinned=True)


def unpinned_manifest(repository: StoreRef, models: Sequence[ModelSource]) -> Manifest:
    """A manifest that names the models and policies only (pvc:// the operator cannot read)."""
    return Manifest(
        repository,
        tuple(
            ManifestModel(m.name, m.folder.strip("/"), m.policy, ())
            for m in sorted(models, key=lambda m: m.name)
        ),
        (),
        pinned=False,
    )


def manifest_to_dict(manifest: Manifest) -> dict[str, Any]:
    repo = manifest.repository
    return {
        "format": MANIFEST_FORMAT,
        "pinned": manifest.pinned,
        "repository": {
            "uri": repo.uri,
            "endpoint": repo.endpoint,
            "s3AddressingStyle": repo.s3_addressing_style,
            "s3Region": repo.s3_region,
        },
        "models": [
            {"name": m.name, "folder": m.folder, "policy": m.policy.to_json(), "versions": list(m.versions)}
            for m in sorted(manifest.models, key=lambda m: m.name)
        ],
        "entries": [
            {
                "key": e.key,
                "dest": e.dest,
                "size": e.size,
                "checksum": {"kind": e.checksum_kind, "value": e.checksum},
                "etag": e.etag,
                "generation": e.generation,
            }
            for e in sorted(manifest.entries, key=lambda e: e.dest)
        ],
    }


def manifest_to_json(manifest: Manifest) -> str:
    """Canonical JSON: sorted keys, entries sorted by destination, no whitespace."""
    return json.dumps(manifest_to_dict(manifest), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def manifest_digest(manifest: Manifest) -> str:
    """sha256 of the canonical JSON: a new upload changes it, an unchanged bucket keeps it."""
    return json_digest(manifest_to_json(manifest))


def json_digest(text: str) -> str:
    """manifest_digest of the manifest whose canonical JSON is ``text``."""
    return hashlib.sha256(text.encode()).hexdigest()


def _get(d: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in d:
        raise ManifestError(f"{where}.{key}", "is missing")
    value = d[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ManifestError(f"{where}.{key}", f"has the wrong type {type(value).__name__}")
    return value


def _objects(data: Mapping[str, Any], key: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Each item of the manifest's list ``key`` with its field path; an item that is no object is refused."""
    for i, item in enumerate(_get(data, key, list, "manifest")):
        where = f"manifest.{key}[{i}]"
        if not isinstance(item, Mapping):
            raise ManifestError(where, "must be an object")
        yield where, item


def _check_destination(path: str, field_name: str) -> None:
    try:
        safe_destination(path)
    except UnsafeKeyError as exc:
        raise ManifestError(field_name, exc.reason) from exc


def manifest_from_dict(data: Any) -> Manifest:
    """Read a manifest back, checking every field and every destination path."""
    if not isinstance(data, Mapping):
        raise ManifestError("manifest", "must be a JSON object")
    fmt = _get(data, "format", int, "manifest")
    if fmt != MANIFEST_FORMAT:
        raise ManifestError("manifest.format", f"is {fmt}; this sync reads format {MANIFEST_FORMAT}")
    pinned = _get(data, "pinned", bool, "manifest")
    r = _get(data, "repository", dict, "manifest")
    repo = StoreRef(
        uri=_get(r, "uri", str, "manifest.repository"),
        endpoint=r.get("endpoint") or "",
        s3_addressing_style=r.get("s3AddressingStyle") or "auto",
        s3_region=r.get("s3Region") or "",
    )
    parse_repository_uri(repo.uri, field_name="manifest.repository.uri")
    models = []
    names: set[str] = set()
    for where, m in _objects(data, "models"):
        name = _get(m, "name", str, where)
        _check_destination(name, f"{where}.name")
        if "/" in name or name in names:
            raise ManifestError(f"{where}.name", f"{name!r} is not a unique single folder name")
        names.add(name)
        try:
            policy = parse_version_policy(m.get("policy"), field_name=f"{where}.policy")
        except ModelConfigError as exc:
            raise ManifestError(exc.field, exc.problem) from exc
        versions = _get(m, "versions", list, where)
        if not all(isinstance(v, str) and _is_version(v) for v in versions):
            raise ManifestError(f"{where}.versions", "must be a list of numeric strings")
        models.append(ManifestModel(name, _get(m, "folder", str, where), policy, tuple(versions)))
    entries = []
    dests: set[str] = set()
    for where, e in _objects(data, "entries"):
        dest = _get(e, "dest", str, where)
        _check_destination(dest, f"{where}.dest")
        top = dest.split("/", 1)[0]
        if top not in names or "/" not in dest:
            raise ManifestError(f"{where}.dest", f"{dest!r} is not inside a model folder of the manifest")
        if dest in dests:
            raise ManifestError(f"{where}.dest", f"{dest!r} appears twice")
        dests.add(dest)
        size = _get(e, "size", int, where)
        if size < 0:
            raise ManifestError(f"{where}.size", "must not be negative")
        checksum = _get(e, "checksum", dict, where)
        kind = _get(checksum, "kind", str, f"{where}.checksum")
        if kind not in CHECKSUM_KINDS:
            raise ManifestError(
                f"{where}.checksum.kind", f"{kind!r} is not one of {', '.join(CHECKSUM_KINDS)}"
            )
        value = _get(checksum, "value", str, f"{where}.checksum")
        if kind != "none" and not re.fullmatch(r"[0-9a-f]+(-[0-9]+)?", value):
            raise ManifestError(f"{where}.checksum.value", f"{value!r} is not lower-case hex")
        entries.append(
            ManifestEntry(
                key=_get(e, "key", str, where),
                dest=dest,
                size=size,
                checksum_kind=kind,
                checksum=value,
                etag=e.get("etag") or "",
                generation=e.get("generation") or "",
            )
        )
    # A file may not also be a directory of another entry (a/b and a/b/c).
    clashes = file_and_folder(dests)
    if clashes:
        raise ManifestError("manifest.entries", f"{clashes[0]!r} is both a file and a folder")
    return Manifest(repo, tuple(models), tuple(entries), pinned=pinned)


def manifest_from_json(text: str | bytes) -> Manifest:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ManifestError("manifest", f"is not valid JSON: {exc}") from exc
    return manifest_from_dict(data)
