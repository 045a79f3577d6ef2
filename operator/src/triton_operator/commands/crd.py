"""`triton-operator crd`: print, write or check the generated TritonService CustomResourceDefinition."""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path
from typing import Any

from triton_operator.core.spec.crd_schema import render_crd_yaml


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "crd",
        help="print the TritonService CRD (generated from the API models)",
        description="Print the TritonService CustomResourceDefinition generated from the pydantic models "
        "and Triton's ModelConfig protobuf; --output writes it to a file, --check compares a file with it.",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--output", "-o", metavar="FILE", help="write the CRD to FILE instead of stdout")
    where.add_argument(
        "--check", metavar="FILE", help="exit 1 with a diff when FILE differs from the generated CRD"
    )
    parser.set_defaults(func=run)


def check(path: Path, expected: str) -> tuple[bool, str]:
    """Whether the file at ``path`` holds ``expected``, and a unified diff when it does not."""
    try:
        actual = path.read_text()
    except FileNotFoundError:
        return False, f"{path} does not exist\n"
    if actual == expected:
        return True, ""
    diff = difflib.unified_diff(
        actual.splitlines(keepends=True),
        expected.splitlines(keepends=True),
        fromfile=str(path),
        tofile="generated",
    )
    return False, "".join(diff)


def run(args: argparse.Namespace) -> int:
    text = render_crd_yaml()
    if args.check:
        path = Path(args.check)
        same, diff = check(path, text)
        if same:
            print(f"{path} is up to date", file=sys.stderr)
            return 0
        sys.stdout.write(diff)
        print(
            f"{path} differs from the generated CRD; regenerate it with: triton-operator crd --output {path}",
            file=sys.stderr,
        )
        return 1
    if args.output:
        path = Path(args.output)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}", file=sys.stderr)
        return 0
    sys.stdout.write(text)
    return 0
