"""A local tritonserver from the nvidia-pytriton wheel: find it, prepare a runnable copy, start, stop."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from testkit import free_port

_DIST = "nvidia-pytriton"
_MARKER = ".triton-operator-source.json"
_LOG_TAIL_LINES = 80


class TritonNotInstalledError(RuntimeError):
    """No bundled tritonserver: the nvidia-pytriton wheel (or a file of it) is missing."""


class TritonSetupError(RuntimeError):
    """The bundled tritonserver is there but cannot run here (a shared library is missing)."""


class TritonStartError(RuntimeError):
    """tritonserver did not become ready; the message ends with the tail of its log."""

    def __init__(self, problem: str, log_tail: str) -> None:
        super().__init__(f"{problem}\n--- tritonserver log (tail) ---\n{log_tail}")
        self.problem = problem
        self.log_tail = log_tail


@dataclass(frozen=True)
class BundledServer:
    """The files of the tritonserver shipped inside the installed pytriton package."""

    version: str
    server_dir: Path
    libs_dir: Path
    stub: Path

    @property
    def binary(self) -> Path:
        return self.server_dir / "bin" / "tritonserver"


@dataclass(frozen=True)
class TritonInstall:
    """A runnable tritonserver folder with the environment it needs."""

    root: Path
    binary: Path
    backend_dir: Path
    env: dict[str, str]


def python_tag() -> str:
    """The running interpreter's version as the stub folders name it (3.11)."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def find_bundled_server() -> BundledServer:
    """Locate pytriton's tritonserver, its libraries and the stub for this Python, importing nothing."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise TritonNotInstalledError(f"the pytriton package is not installed (pip install {_DIST})")
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    server_dir = package_dir / "tritonserver"
    libs_dir = package_dir.parent / "nvidia_pytriton.libs"
    stub = server_dir / "python_backend_stubs" / python_tag() / "triton_python_backend_stub"
    for needed in (server_dir / "bin" / "tritonserver", server_dir / "backends" / "python", libs_dir, stub):
        if not needed.exists():
            raise TritonNotInstalledError(f"{needed} is missing from the installed {_DIST}")
    try:
        version = importlib.metadata.version(_DIST)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return BundledServer(version=version, server_dir=server_dir, libs_dir=libs_dir, stub=stub)


def _fingerprint(bundled: BundledServer) -> dict[str, str]:
    """What a prepared copy was made from; a copy is reused only when this matches."""
    binary = bundled.binary.stat()
    stub = bundled.stub.stat()
    return {
        "dist": f"{_DIST}=={bundled.version}",
        "server_dir": str(bundled.server_dir),
        "binary": f"{binary.st_size}:{binary.st_mtime_ns}",
        "python": python_tag(),
        "stub": f"{stub.st_size}:{stub.st_mtime_ns}",
    }


def _libpython_dir() -> Path | None:
    """The folder of this interpreter's shared libpython, when it was built with --enable-shared.

    The stub links ``libpython3.X.so.1.0``; loading the running interpreter's own copy keeps the
    embedded Python and the venv's packages on one build, and spares the system package.
    """
    if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        return None
    libdir = sysconfig.get_config_var("LIBDIR")
    soname = sysconfig.get_config_var("INSTSONAME") or sysconfig.get_config_var("LDLIBRARY")
    if libdir and soname and (Path(libdir) / soname).exists():
        return Path(libdir)
    return None


def _environment(libs_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    lib_path = [str(libs_dir)]
    libpython = _libpython_dir()
    if libpython is not None:
        lib_path.append(str(libpython))
    if env.get("LD_LIBRARY_PATH"):
        lib_path.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(lib_path)
    # The stub's embedded Python finds its prefix through PATH: the venv's bin first means the
    # models see the venv's site-packages (numpy).
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", os.defpath)])
    env.pop("PYTHONHOME", None)
    return env


def missing_libraries(binary: Path, env: dict[str, str]) -> list[str]:
    """Shared libraries ``binary`` needs that the loader cannot find under ``env`` (ldd; [] without it)."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return []
    result = subprocess.run([ldd, str(binary)], env=env, capture_output=True, text=True, check=False)
    return [line.split("=>")[0].strip() for line in result.stdout.splitlines() if "not found" in line]


def _check_libraries(install: TritonInstall) -> None:
    stub = install.backend_dir / "python" / "triton_python_backend_stub"
    python_backend = install.backend_dir / "python" / "libtriton_python.so"
    missing = {
        str(path): libs
        for path in (install.binary, python_backend, stub)
        if (libs := missing_libraries(path, install.env))
    }
    if not missing:
        return
    hint = ""
    if any(lib.startswith("libpython") for libs in missing.values() for lib in libs):
        tag = python_tag()
        hint = (
            f"\nThe Python backend stub links libpython{tag}.so.1.0: this interpreter is not a shared "
            f"build, so the system's is needed (Debian/Ubuntu: apt-get install libpython{tag})."
        )
    details = "; ".join(f"{path}: {', '.join(libs)}" for path, libs in missing.items())
    raise TritonSetupError(f"missing shared libraries: {details}{hint}")


def prepare_server(cache_dir: Path) -> TritonInstall:
    """Copy the bundled tritonserver into ``cache_dir`` (once) with the stub for this Python.

    Raises TritonNotInstalledError when pytriton is absent, TritonSetupError when it cannot run here.
    """
    bundled = find_bundled_server()
    fingerprint = _fingerprint(bundled)
    key = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]
    root = cache_dir / f"tritonserver-{bundled.version}-py{python_tag()}-{key}"
    marker = root / _MARKER
    if not (marker.exists() and json.loads(marker.read_text()) == fingerprint):
        cache_dir.mkdir(parents=True, exist_ok=True)
        staging = cache_dir / f".{root.name}.{os.getpid()}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(
            bundled.server_dir,
            staging,
            ignore=shutil.ignore_patterns("python_backend_stubs", "__pycache__"),
        )
        shutil.copy2(bundled.stub, staging / "backends" / "python" / "triton_python_backend_stub")
        (staging / _MARKER).write_text(json.dumps(fingerprint, sort_keys=True))
        shutil.rmtree(root, ignore_errors=True)
        try:
            staging.rename(root)
        except OSError:
            # Another process finished the same copy first; use theirs.
            shutil.rmtree(staging, ignore_errors=True)
    install = TritonInstall(
        root=root,
        binary=root / "bin" / "tritonserver",
        backend_dir=root / "backends",
        env=_environment(bundled.libs_dir),
    )
    _check_libraries(install)
    return install


def log_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ('' when there is none)."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group, read from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


@dataclass
class RunningServer:
    """A tritonserver process on loopback ports, in its own process group."""

    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    metrics_port: int
    log_path: Path
    args: list[str] = field(default_factory=list)
    startup_seconds: float | None = None

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        return log_tail(self.log_path, lines)

    def processes(self) -> list[int]:
        """Live processes of the server's group: tritonserver and its Python backend stubs."""
        return _group_members(self.process.pid)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then SIGKILL to the whole group after ``timeout``; returns the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        # Stubs exit when their parent does; whatever is left of the group is killed.
        deadline = time.monotonic() + timeout
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        return self.process.returncode

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def server_command(
    install: TritonInstall,
    model_repository: Path,
    models: Sequence[str],
    ports: tuple[int, int, int],
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The tritonserver command line: explicit model control, loopback-only ports."""
    http, grpc, metrics = ports
    args = [
        str(install.binary),
        f"--model-repository={model_repository}",
        f"--backend-directory={install.backend_dir}",
        f"--cache-directory={install.root / 'caches'}",
        "--model-control-mode=explicit",
        "--http-address=127.0.0.1",
        f"--http-port={http}",
        "--grpc-address=127.0.0.1",
        f"--grpc-port={grpc}",
        "--metrics-address=127.0.0.1",
        f"--metrics-port={metrics}",
        "--allow-gpu-metrics=false",
        "--exit-timeout-secs=10",
    ]
    args += [f"--load-model={name}" for name in models]
    args += list(extra_args)
    return args


def start_server(
    install: TritonInstall,
    model_repository: Path,
    models: Sequence[str],
    log_path: Path,
    *,
    timeout: float = 180.0,
    extra_args: Sequence[str] = (),
) -> RunningServer:
    """Start tritonserver loading ``models`` and wait for /v2/health/ready.

    Raises TritonStartError, with the log's tail, when the process exits or is not ready in time.
    """
    ports = (free_port(), free_port(), free_port())
    while len(set(ports)) < 3:
        ports = (free_port(), free_port(), free_port())
    args = server_command(install, model_repository, models, ports, extra_args)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=install.env,
            cwd=install.root,
            start_new_session=True,
        )
    server = RunningServer(process, *ports, log_path=log_path, args=args)
    ready_url = f"{server.http_url}/v2/health/ready"
    deadline = started + timeout
    while True:
        code = process.poll()
        if code is not None:
            server.stop()
            raise TritonStartError(
                f"tritonserver exited with status {code} before it was ready", server.log_tail()
            )
        if _ready(ready_url):
            server.startup_seconds = time.monotonic() - started
            return server
        if time.monotonic() > deadline:
            server.stop()
            raise TritonStartError(f"tritonserver was not ready within {timeout:.0f} s", server.log_tail())
        time.sleep(0.1)
