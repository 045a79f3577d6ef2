"""The Python backend's stub processes as /proc shows them (the pod shares one process namespace)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

STUB = b"triton_python_backend_stub"
"""The Python backend's per-instance process: argv[0] ends with it, argv[1] is the model's model.py."""


def python_stubs(models_dir: Path, proc: Path = Path("/proc")) -> Counter[str]:
    """The live stub processes of each model under ``models_dir`` (by the folder their model.py is
    in); a zombie or a process gone while read is not counted. Empty when none is visible (a pod
    that does not share its process namespace sees none: the check then finds nothing missing)."""
    counts: Counter[str] = Counter()
    prefix = str(models_dir).rstrip("/") + "/"
    try:
        entries = list(proc.iterdir())
    except OSError:
        return counts
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
        except (OSError, UnicodeDecodeError):
            continue
        if len(argv) < 2 or not argv[0].endswith(STUB):
            continue
        state = stat.rpartition(")")[2].split()[:1]
        if state in (["Z"], ["X"]):
            continue
        path = argv[1].decode(errors="replace")
        if path.startswith(prefix):
            counts[path[len(prefix) :].split("/", 1)[0]] += 1
    return counts
