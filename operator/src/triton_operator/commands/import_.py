"""`triton-operator import DIR`: a TritonService YAML for an existing Triton model repository folder."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from triton_operator.core.commandline.output import FORMATS, render_objects
from triton_operator.core.repository.manifest import CONFIG_FILE
from triton_operator.core.spec.crd_schema import DNS_1035_PATTERN, MAX_NAME_LENGTH, dump_yaml
from triton_operator.core.spec.field_error import ModelConfigError
from triton_operator.core.spec.modelconfig import (
    build_imported_service,
    build_model_entry,
    gpus_needed_why,
)
from triton_operator.core.spec.validation.spec import check_spec, spec_warnings
from triton_operator.settings import Settings

PLACEHOLDER_URI = "s3://BUCKET/PREFIX"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "import",
        help="print a TritonService for a model repository folder",
        description="Read a Triton model repository folder (one subfolder per model, each with a "
        "config.pbtxt and numeric version folders) and print a TritonService whose spec.models carry "
        "those configs in proto3 JSON. Rendering them back gives the same ModelConfig messages.",
    )
    parser.add_argument("directory", metavar="DIR", help="the model repository folder")
    parser.add_argument("--name", help="metadata.name of the TritonService (default: from DIR)")
    parser.add_argument(
        "--uri",
        help="spec.repository.uri where DIR is uploaded: s3://bucket/prefix, gs://..., as://..., pvc://claim/path",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=FORMATS,
        default="yaml",
        metavar="yaml|json|name",
        help="the TritonService as YAML (default), JSON, or its name (tritonservice.triton-operator.io/NAME)",
    )
    parser.add_argument("--output-file", metavar="FILE", help="write to FILE instead of stdout")
    parser.set_defaults(func=run)


def service_name(directory: Path) -> str:
    """A DNS-1035 label from a folder name: lower case, dashes, starting with a letter."""
    name = re.sub(r"[^a-z0-9-]+", "-", directory.resolve().name.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = f"triton-{name}".rstrip("-")
    return name[:MAX_NAME_LENGTH].rstrip("-")


def _versions(folder: Path) -> list[str]:
    return sorted((p.name for p in folder.iterdir() if p.is_dir() and p.name.isdigit()), key=int)


def read_repository(directory: Path) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """The spec.models entries of a repository folder, with notes and errors for stderr."""
    models: list[dict[str, Any]] = []
    notes: list[str] = []
    errors: list[str] = []
    for folder in sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith(".")):
        config_file = folder / CONFIG_FILE
        versions = _versions(folder)
        text: str | None = None
        if config_file.is_file():
            text = config_file.read_text()
        elif versions:
            notes.append(
                f"{folder.name}: no {CONFIG_FILE}; imported with an empty config "
                "(Triton can complete the config of some backends: ONNX, TensorRT, TensorFlow, Python)"
            )
        else:
            notes.append(f"{folder.name}: skipped, neither {CONFIG_FILE} nor numeric version folders")
            continue
        try:
            entry = build_model_entry(folder.name, text, source=str(config_file))
        except ModelConfigError as exc:
            errors.append(str(exc))
            continue
        if not versions:
            notes.append(f"{folder.name}: no numeric version folder; Triton will find no version to load")
        models.append(entry)
    return models, notes, errors


def run(args: argparse.Namespace) -> int:
    directory = Path(args.directory)
    if not directory.is_dir():
        print(f"error: {directory} is not a folder", file=sys.stderr)
        return 2
    name = args.name or service_name(directory)
    if len(name) > MAX_NAME_LENGTH or not re.match(DNS_1035_PATTERN, name):
        print(
            f"error: --name {name!r} must be a DNS-1035 label (a-z, 0-9, '-', starting with a letter) "
            f"of at most {MAX_NAME_LENGTH} characters",
            file=sys.stderr,
        )
        return 2
    models, notes, errors = read_repository(directory)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    if errors:
        return 1
    if not models:
        print(f"error: no model folders in {directory}", file=sys.stderr)
        return 1
    uri = args.uri
    if not uri:
        uri = PLACEHOLDER_URI
        print(f"note: spec.repository.uri is {uri}; pass --uri where the folder is uploaded", file=sys.stderr)
    service = build_imported_service(name, uri, models)
    gpus, why = gpus_needed_why(models)
    if why is not None:
        print(f"note: spec.resources.gpus is {gpus}: {why}", file=sys.stderr)
    parsed, problems = check_spec(service["spec"])
    # What the operator would refuse (Triton's own checks among them) is an error, never a warning:
    # the TritonService written would be held as InvalidSpec.
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if parsed is None or problems:
        return 1
    for warning in spec_warnings(parsed, Settings.from_env().default_image):
        print(f"warning: {warning}", file=sys.stderr)
    text = (
        dump_yaml(service)
        if args.output == "yaml"
        else render_objects([service], args.output, single=True) + "\n"
    )
    if args.output_file:
        Path(args.output_file).write_text(text)
    else:
        sys.stdout.write(text)
    return 0
