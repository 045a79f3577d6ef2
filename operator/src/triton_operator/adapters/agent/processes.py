"""The Python backend's stub processes as /proc shows them (the pod shares one process namespace)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

STUB = b"triton_python_backend_stub"
"""The Python backend's per-instance process: argv[0] ends with it, argv[1] is the model's model.py."""
SERVER = b"tritonserver"
"""tritonserver's own process: argv[0]'s last part."""
REPOSITORY_FLAGS = ("--model-repository", "--model-store")


def _listed(proc: Path) -> list[tuple[Path, list[bytes]]]:
    """Each live process's /proc folder and argv; a zombie or one gone while read is left out."""
    out: list[tuple[Path, list[bytes]]] = []
    try:
        entries = list(proc.iterdir())
    except OSError:
        return out
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
        except (OSError, UnicodeDecodeError):
            continue
        if stat.rpartition(")")[2].split()[:1] in (["Z"], ["X"]):
            continue
        out.append((entry, argv))
    return out


def _processes(proc: Path) -> list[list[bytes]]:
    """Each live process's argv; a zombie or one gone while read is left out."""
    return [argv for _, argv in _listed(proc)]


def _rss(entry: Path) -> int | None:
    """A process's resident memory in bytes (VmRSS of /proc/<pid>/status, readable across the pod's
    containers); None when it is gone or says none."""
    try:
        lines = (entry / "status").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("VmRSS:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) * 1024  # "VmRSS:  1234 kB"
    return None


def model_memory(models_dir: Path, model: str, proc: Path = Path("/proc")) -> tuple[int, int] | None:
    """The resident memory of the tritonserver serving ``models_dir``, and that of ``model``'s Python
    backend stubs (the processes its instances run in; 0 for another backend), in bytes. None when no
    such tritonserver is visible (a pod that does not share its process namespace): nothing measured."""
    want = str(models_dir).rstrip("/")
    prefix = want + "/"
    server: int | None = None
    stubs = 0
    for entry, argv in _listed(proc):
        repo = repository_of(argv)
        if repo is not None and repo.rstrip("/") == want:
            server = (server or 0) + (_rss(entry) or 0)
        elif len(argv) >= 2 and argv[0].endswith(STUB):
            path = argv[1].decode(errors="replace")
            if path.startswith(prefix) and path[len(prefix) :].split("/", 1)[0] == model:
                stubs += _rss(entry) or 0
    return None if server is None else (server, stubs)


def repository_of(argv: list[bytes]) -> str | None:
    """The model repository a tritonserver command line names (``--model-repository=X`` or
    ``--model-repository X``, or the older ``--model-store``); None when ``argv`` is no tritonserver's."""
    if not argv or argv[0].rsplit(b"/", 1)[-1] != SERVER:
        return None
    args = [a.decode(errors="replace") for a in argv[1:]]
    for index, arg in enumerate(args):
        name, has_value, value = arg.partition("=")
        if name in REPOSITORY_FLAGS:
            if has_value:
                return value
            if index + 1 < len(args):
                return args[index + 1]
    return None


def tritonserver_running(models_dir: Path, proc: Path = Path("/proc")) -> bool:
    """Whether a tritonserver process serving ``models_dir`` is alive (the pod shares its process
    namespace; False when none is visible)."""
    want = str(models_dir).rstrip("/")
    return any(
        (repo := repository_of(argv)) is not None and repo.rstrip("/") == want for argv in _processes(proc)
    )


def python_stubs(models_dir: Path, proc: Path = Path("/proc")) -> Counter[str]:
    """The live stub processes of each model under ``models_dir`` (by the folder their model.py is
    in); a zombie or a process gone while read is not counted. Empty when none is visible (a pod
    that does not share its process namespace sees none: the check then finds nothing missing)."""
    return Counter(model for model, _ in _stubs(models_dir, proc))


def stub_instances(models_dir: Path, proc: Path = Path("/proc")) -> dict[str, frozenset[str]]:
    """The model instances (``small-1_0_0``: the stub's argv[8], after its model.py, shared memory
    region and sizes, backend folder and parent pid) that have a live stub process, by model under
    ``models_dir``. While Triton reloads a model both its old and its new stub of an instance live,
    under one name: an instance with none left is one whose stub is gone."""
    out: dict[str, set[str]] = {}
    for model, argv in _stubs(models_dir, proc):
        name = argv[8].decode(errors="replace") if len(argv) > 8 and argv[8] else "\0".join(map(repr, argv))
        out.setdefault(model, set()).add(name)
    return {model: frozenset(names) for model, names in out.items()}


def _stubs(models_dir: Path, proc: Path) -> list[tuple[str, list[bytes]]]:
    """Each live stub process of a model under ``models_dir``: the model, its argv."""
    out: list[tuple[str, list[bytes]]] = []
    prefix = str(models_dir).rstrip("/") + "/"
    for argv in _processes(proc):
        if len(argv) < 2 or not argv[0].endswith(STUB):
            continue
        path = argv[1].decode(errors="replace")
        if path.startswith(prefix):
            out.append((path[len(prefix) :].split("/", 1)[0], argv))
    return out
