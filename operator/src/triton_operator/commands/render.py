"""`triton-operator render -f ts.yaml`: print every desired object as YAML, without a cluster."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TextIO

import yaml

from triton_operator import KIND
from triton_operator.core.commandline.output import FORMATS, render_objects
from triton_operator.core.decision.decide import Observed, Target, decide
from triton_operator.core.decision.scaling import Autoscalers
from triton_operator.core.objects.builders import compute_revision, triton_image
from triton_operator.core.objects.names import PLACEHOLDER_UID
from triton_operator.core.observed.observation import check_body
from triton_operator.core.pod.policy import policy_errors
from triton_operator.core.repository.manifest import manifest_digest, manifest_to_json
from triton_operator.core.rollout.clock import utcnow
from triton_operator.core.spec.crd_schema import dump_yaml_all
from triton_operator.core.spec.validation.spec import spec_warnings
from triton_operator.models import TritonService
from triton_operator.settings import Settings

HEADER = (
    "# Rendered by `triton-operator render` for {ref}, revision {revision}.\n"
    "# ownerReferences carry the placeholder uid " + PLACEHOLDER_UID + ": the TritonService does not exist\n"
    "# yet; the operator sets the real uid. Manifest: {manifest}.\n"
)


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "render",
        help="print the objects a TritonService becomes (no cluster needed)",
        description="Validate TritonServices and print every object the operator would apply when it "
        "first meets them (ConfigMap, Deployment, Services, PodDisruptionBudget), as multi-document "
        "YAML (for GitOps dry runs and reviews).",
    )
    parser.add_argument(
        "-f", "--filename", required=True, help="YAML file with one or more TritonServices; - reads stdin"
    )
    parser.add_argument(
        "-n", "--namespace", help="namespace for objects whose metadata names none (default: default)"
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=FORMATS,
        default="yaml",
        metavar="yaml|json|name",
        help="YAML documents with a header per TritonService (default); JSON: one v1 List of every object; "
        "name: kind.group/name lines",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="list the repository with this environment's credentials and pin the manifest "
        "(needs the storage adapter); without it object-store repositories render unpinned",
    )
    parser.set_defaults(func=run)


def _load(filename: str) -> list[dict[str, Any]]:
    text = sys.stdin.read() if filename == "-" else Path(filename).read_text()
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _pin(ts: TritonService, err: TextIO) -> tuple[str, str] | None:
    """(manifest JSON, digest) listed with this environment's credentials; None when that failed."""
    try:  # only --pin needs the storage adapter: render alone stays without it
        from triton_operator.adapters import storage  # noqa: PLC0415
        from triton_operator.commands import sync  # noqa: PLC0415
    except ImportError as exc:
        err.write(f"--pin: the storage adapter is not available ({exc})\n")
        return None
    try:
        manifest = storage.pin_repository(ts.spec.repository, ts.spec.models, sync.credentials_from_env())
    except Exception as exc:  # any store or selection failure is reported, then rendered unpinned
        err.write(f"--pin: listing {ts.spec.repository.uri} failed: {exc}\n")
        return None
    return manifest_to_json(manifest), manifest_digest(manifest)


def render(
    documents: list[dict[str, Any]],
    settings: Settings,
    *,
    namespace: str | None = None,
    pin: bool = False,
    fmt: str = "yaml",
    out: TextIO,
    err: TextIO,
) -> int:
    """Write the desired objects of every TritonService in ``documents`` to ``out`` (``fmt``: yaml, json
    or name); 1 on any invalid one."""
    failed = False
    rendered: list[dict[str, Any]] = []
    first = True
    for index, doc in enumerate(documents):
        if doc.get("kind") != KIND:
            err.write(f"document {index}: skipped, kind {doc.get('kind')!r} is not {KIND}\n")
            continue
        body = dict(doc)
        metadata = dict(body.get("metadata") or {})
        metadata.setdefault("namespace", namespace or "default")
        body["metadata"] = metadata
        ref = f"{metadata['namespace']}/{metadata.get('name', '?')}"
        checked = check_body(body)
        if checked.problems or checked.ts is None:
            failed = True
            for problem in checked.problems:
                err.write(f"{ref}: invalid: {problem}\n")
            continue
        ts = checked.ts
        refused = policy_errors(ts, settings)
        if refused:
            failed = True
            for refusal in refused:
                err.write(f"{ref}: refused by the operator's policy: {refusal}\n")
            continue
        for warning in spec_warnings(ts.spec, triton_image(ts, settings)):
            err.write(f"{ref}: warning: {warning}\n")
        manifest_json: str | None = None
        digest: str | None = None
        if ts.spec.repository.scheme == "pvc":
            manifest_note = "unpinned (the claim is linked as it is)"
        else:
            pinned = _pin(ts, err) if pin else None
            if pinned is None:
                manifest_note = "unpinned"
                why = "listing failed" if pin else "--pin was not given"
                err.write(
                    f"{ref}: repository {ts.spec.repository.uri} rendered with an unpinned manifest ({why}); "
                    "once the operator pins it, the revision hash differs\n"
                )
            else:
                manifest_json, digest = pinned
                manifest_note = f"pinned, digest {digest}"
        revision = compute_revision(ts, settings, checked.configs, digest)
        # What the operator applies when it first meets this TritonService: the reconcile's own
        # decision (core.decision.decide), from an observation of nothing (no status, no owned objects). No
        # other autoscaler can be seen without a cluster: the owned HPA, as first applied.
        first_meeting = Observed(moment=utcnow(), autoscalers=Autoscalers.of((), ts.name, None))
        target = Target(ts, revision, configs=checked.configs, manifest_json=manifest_json)
        decision = decide(target, settings, first_meeting)
        objects = list(decision.actions.apply)
        if fmt != "yaml":
            rendered += objects
            continue
        if not first:
            out.write("---\n")
        first = False
        out.write(HEADER.format(ref=ref, revision=revision, manifest=manifest_note))
        out.write(dump_yaml_all(objects))
    if fmt != "yaml" and (rendered or fmt == "json"):
        out.write(render_objects(rendered, fmt) + "\n")
    return 1 if failed else 0


def run(args: argparse.Namespace) -> int:
    try:
        documents = _load(args.filename)
    except (OSError, yaml.YAMLError) as exc:
        sys.stderr.write(f"render: cannot read {args.filename}: {exc}\n")
        return 2
    return render(
        documents,
        Settings.from_env(),
        namespace=args.namespace,
        pin=args.pin,
        fmt=args.output,
        out=sys.stdout,
        err=sys.stderr,
    )
