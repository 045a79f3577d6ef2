"""The memory a pooled model takes, read from /proc (a fake one here): tritonserver's RSS and its stubs'."""

from __future__ import annotations

from pathlib import Path

from triton_operator.adapters.agent.processes import model_memory


def process(proc: Path, pid: int, argv: list[str], rss_kb: int | None, state: str = "S") -> None:
    folder = proc / str(pid)
    folder.mkdir(parents=True)
    (folder / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (folder / "stat").write_text(f"{pid} (x) {state} 1 1")
    rss = f"VmRSS:\t{rss_kb} kB\n" if rss_kb is not None else ""
    (folder / "status").write_text(f"Name:\tx\nVmPeak:\t9 kB\n{rss}Threads:\t1\n")


def test_tritonserver_and_the_models_stubs_are_read_the_rest_left_out(tmp_path: Path) -> None:
    proc, models = tmp_path / "proc", tmp_path / "models"
    stub = "/opt/tritonserver/backends/python/triton_python_backend_stub"
    process(proc, 10, ["/opt/tritonserver/bin/tritonserver", f"--model-repository={models}"], 50_000)
    process(proc, 11, [stub, f"{models}/big/1/model.py", "shm"], 200_000)
    process(proc, 12, [stub, f"{models}/big/1/model.py", "shm"], 100_000)  # a second instance
    process(proc, 13, [stub, f"{models}/bigger/1/model.py", "shm"], 999_000)  # another model
    process(proc, 14, [stub, f"{models}/big/1/model.py", "shm"], 5_000, state="Z")  # a zombie
    process(proc, 15, [stub, f"{tmp_path}/elsewhere/big/1/model.py"], 7_000)  # another server's
    process(proc, 16, ["/bin/sh"], 1_000)
    assert model_memory(models, "big", proc) == (50_000 * 1024, 300_000 * 1024)
    assert model_memory(models, "absent", proc) == (50_000 * 1024, 0)


def test_nothing_is_measured_without_a_visible_tritonserver(tmp_path: Path) -> None:
    proc, models = tmp_path / "proc", tmp_path / "models"
    process(proc, 11, ["triton_python_backend_stub", f"{models}/big/1/model.py"], 200_000)
    assert model_memory(models, "big", proc) is None
    process(proc, 10, ["tritonserver", f"--model-repository={tmp_path}/other"], 50_000)
    assert model_memory(models, "big", proc) is None
    assert model_memory(models, "big", tmp_path / "no-proc") is None
