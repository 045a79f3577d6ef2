"""A Python model is dead when one of its instances has no stub process left, not when there are
fewer stubs than at some moment: Triton reloads a model on its own (an ensemble's load reloads a
composing model whose files' ctime moved, which a new pod's view of the node cache's files does to
every blob it links), and for a while the old and the new stub of each instance live side by side."""

from __future__ import annotations

import shutil
from pathlib import Path

from test_agent_probe_drain import Triton, revision  # type: ignore[import-not-found,unused-ignore]

from triton_operator.adapters.agent.runner import Agent, AgentOptions

STUB = "/opt/tritonserver/backends/python/triton_python_backend_stub"


def stub(proc: Path, pid: int, models: Path, instance: str) -> None:
    """A live stub process of ``instance`` of adder, as /proc shows it."""
    folder = proc / str(pid)
    folder.mkdir(parents=True)
    model = f"{models}/adder/1/model.py"
    argv = [STUB, model, "shm", "1048576", "1048576", "7", "/b", "336", instance, "DEFAULT"]
    (folder / "cmdline").write_bytes("\0".join(argv).encode() + b"\0")
    (folder / "stat").write_text(f"{pid} (triton_python_b) S 1 2 3")


def test_a_stub_replaced_by_tritons_own_reload_is_not_dead_and_one_gone_is(tmp_path: Path) -> None:
    proc, models = tmp_path / "proc", tmp_path / "models"
    options = AgentOptions(
        dest=models,
        state_dir=tmp_path / "state",
        base=revision("r1", 0),
        triton=Triton(),  # type: ignore[arg-type,unused-ignore]
        proc=proc,
    )
    Agent(options).once()  # the init container: r1 recorded
    agent = Agent(options)
    stub(proc, 10, models, "adder_0_0")
    assert agent.check().ready

    # Triton reloads adder on its own: the new stub of adder_0_0 starts beside the old, which ends.
    stub(proc, 11, models, "adder_0_0")
    assert agent.check().ready
    shutil.rmtree(proc / "10")
    result = agent.check()
    assert result.ready, result  # counted, this was "1 of its 2 stub processes gone"

    # A second instance (adder loaded with two by the agent), then the stub of adder_0_0 killed:
    # no process of that instance is left, though as many stubs live as before the second came.
    agent._stub_known.pop("adder")  # what the agent's own load of adder does
    stub(proc, 12, models, "adder_0_1")
    assert agent.check().ready
    shutil.rmtree(proc / "11")
    stub(proc, 13, models, "adder_0_1")  # and Triton reloading adder_0_1 meanwhile
    result = agent.check()
    assert not result.ready
    assert result.models["adder"] == "dead: 1 of its 2 Python backend stub processes are gone"
