"""The pinned manifest as a revision's ConfigMaps hold it: gzipped and split into parts that fit.

kube-apiserver refuses a ConfigMap whose data and binaryData hold more than 1 MiB (422, "Too long")
and any request body over 3 MiB (413). A manifest costs about 300 bytes of JSON an object, so
plain JSON in one ConfigMap stops at a few thousand objects. Here the canonical JSON is gzipped
(about 70 bytes an object with random ETags and S3 version ids, 40 without version ids) and cut
into parts of at most CONFIGMAP_BUDGET bytes: part 0 beside the rendered configs in the revision's
ConfigMap, the others in ConfigMaps of their own. The sync container joins the parts in order and
gunzips them; gzip's CRC and length check that nothing is missing or damaged, and the JSON that
comes out is the canonical JSON, byte for byte (the revision hash is its digest, whatever the
storage).

A manifest that fits beside the configs stays plain JSON under MANIFEST_KEY, as every revision
made before parts has it: those revisions keep that layout (their pods, and the sync image they
were made with, read it there), and a small manifest stays readable in the ConfigMap.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import gzip
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from triton_operator.core.repository.manifest import ManifestError

MANIFEST_KEY = "manifest.json"
"""data key of a manifest kept as plain JSON: one that fits beside the configs, as in every revision
made before parts."""
PART_PREFIX = "manifest.json.gz."
"""binaryData key (and file name in the pod) of part N: manifest.json.gz.000, .001, ..."""
CONFIGMAP_LIMIT = 1024 * 1024
"""kube-apiserver's limit on a ConfigMap's data and binaryData together (MaxSecretSize)."""
CONFIGMAP_BUDGET = 900 * 1024
"""What the operator puts in one ConfigMap: well below CONFIGMAP_LIMIT, and as base64 in a request
body (1.2 MB) well below the API server's 3 MiB and etcd's 1.5 MiB per object."""
MAX_PARTS = 16
"""At most this many ConfigMaps of manifest per revision (about 14 MiB gzipped, some 200,000
objects with version ids): every kept revision holds its own copy in etcd."""
COMPRESS_LEVEL = 6

_PART = re.compile(r"^manifest\.json\.gz\.([0-9]{3,})$")


def part_key(index: int) -> str:
    return f"{PART_PREFIX}{index:03d}"


def part_index(key: str) -> int | None:
    """N of a part's key or file name ``manifest.json.gz.NNN``; None for anything else."""
    match = _PART.match(key)
    return int(match.group(1)) if match else None


class ManifestTooLarge(ValueError):  # noqa: N818 (a condition's reason, not a bug)
    """The gzipped manifest needs more than MAX_PARTS ConfigMaps."""

    def __init__(self, json_bytes: int, compressed_bytes: int, parts: int) -> None:
        super().__init__(
            f"{compressed_bytes} bytes gzipped need {parts} ConfigMaps of {CONFIGMAP_BUDGET} bytes; "
            f"the operator writes at most {MAX_PARTS} per revision"
        )
        self.json_bytes = json_bytes
        self.compressed_bytes = compressed_bytes
        self.parts = parts


@dataclasses.dataclass(frozen=True)
class PackedManifest:
    """The canonical manifest JSON gzipped and cut into parts (part 0 may be empty)."""

    parts: tuple[bytes, ...]
    json_bytes: int

    @property
    def compressed_bytes(self) -> int:
        return sum(len(p) for p in self.parts)


def compress(text: str) -> bytes:
    """gzip with no timestamp: the same JSON gives the same bytes (no write when nothing changed)."""
    return gzip.compress(text.encode("utf-8"), compresslevel=COMPRESS_LEVEL, mtime=0)


def split(blob: bytes, first: int, rest: int | None = None) -> tuple[bytes, ...]:
    """``blob`` in pieces: the first of at most ``first`` bytes (possibly empty), then ``rest``
    (CONFIGMAP_BUDGET) each."""
    rest = rest or CONFIGMAP_BUDGET
    head = blob[: max(first, 0)]
    tail = blob[len(head) :]
    return (head, *(tail[i : i + rest] for i in range(0, len(tail), rest)))


def pack(text: str, first: int, *, kept: Sequence[bytes] | None = None) -> PackedManifest:
    """The manifest JSON ``text`` as parts; part 0 holds at most ``first`` bytes (what the configs
    leave of the revision's ConfigMap). ``kept``: the parts the revision's ConfigMaps hold now,
    reused as they are when they give back ``text`` (so a different zlib after an operator upgrade
    neither rewrites them nor changes the number of parts, which the pod template names).

    Raises ManifestTooLarge when more than MAX_PARTS parts are needed.
    """
    json_bytes = len(text.encode("utf-8"))
    if kept and _gives_back(kept, text):
        return PackedManifest(tuple(kept), json_bytes)
    parts = split(compress(text), first)
    packed = PackedManifest(parts, json_bytes)
    if len(parts) > MAX_PARTS:
        raise ManifestTooLarge(json_bytes, packed.compressed_bytes, len(parts))
    return packed


def _gives_back(parts: Sequence[bytes], text: str) -> bool:
    try:
        return unpack(parts) == text.encode("utf-8")
    except ManifestError:
        return False


def unpack(parts: Iterable[bytes]) -> bytes:
    """The manifest JSON the parts hold, in order; ManifestError when one is missing or damaged."""
    blob = b"".join(parts)
    try:
        return gzip.decompress(blob)
    except EOFError as exc:
        raise ManifestError("manifest", "its gzipped parts end early: a part is missing") from exc
    except (OSError, zlib.error) as exc:
        raise ManifestError("manifest", f"its gzipped parts are damaged ({exc})") from exc


def ordered(parts: Mapping[int, bytes]) -> list[bytes]:
    """Parts by index, checking they run 0, 1, ... with none missing."""
    for expected, index in enumerate(sorted(parts)):
        if index != expected:
            raise ManifestError("manifest", f"part {part_key(expected)} is missing")
    return [parts[i] for i in sorted(parts)]


def _b64(value: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ManifestError("manifest", f"a part is not base64 ({exc})") from exc


def encode_part(part: bytes) -> str:
    """binaryData values are base64 in the API."""
    return base64.b64encode(part).decode("ascii")


def stored_parts(configmaps: Iterable[Mapping[str, Any]]) -> dict[int, bytes]:
    """The manifest parts the ConfigMaps of one revision hold, by index."""
    found: dict[int, bytes] = {}
    for configmap in configmaps:
        for key, value in (configmap.get("binaryData") or {}).items():
            index = part_index(str(key))
            if index is not None:
                found[index] = _b64(str(value))
    return found


def stored_manifest(configmaps: Iterable[Mapping[str, Any]]) -> str | None:
    """The manifest JSON the ConfigMaps of one revision hold: plain (a revision made before parts)
    or gzipped parts; None when they hold none, or parts that do not give back a whole manifest."""
    configmaps = list(configmaps)
    for configmap in configmaps:
        plain = (configmap.get("data") or {}).get(MANIFEST_KEY)
        if plain is not None:
            return str(plain)
    try:
        parts = stored_parts(configmaps)
        return unpack(ordered(parts)).decode("utf-8") if parts else None
    except (ManifestError, UnicodeDecodeError):
        return None
