"""`triton-operator agent`'s command line: the pod's paths and ports by default, and its base revision."""

from __future__ import annotations

from pathlib import Path

import pytest

from triton_operator.cli import build_parser
from triton_operator.commands.agent import BASE, base_revision
from triton_operator.core.objects.names import (
    AGENT_PORT,
    AGENT_STATE_DIR,
    INPLACE_DIR,
    INPLACE_TARGET_FILE,
    MODELS_DIR,
)
from triton_operator.core.repository.manifest import (
    Manifest,
    ManifestModel,
    StoreRef,
    VersionPolicy,
    manifest_to_json,
)


def test_the_defaults_are_the_pods_paths() -> None:
    args = build_parser().parse_args(
        ["agent", "--manifest", "m.json", "--configs", "c", "--base-revision", "r1"]
    )
    assert (args.dest, args.inplace_dir, args.target_file, args.state_dir) == (
        Path(MODELS_DIR),
        Path(INPLACE_DIR),
        Path(INPLACE_TARGET_FILE),
        Path(AGENT_STATE_DIR),
    )
    assert args.listen == f"0.0.0.0:{AGENT_PORT}" and args.triton == "http://127.0.0.1:8000"
    assert args.once is False and args.interval == 0.2
    # tritonserver's metrics in the same pod: their GPU gauges measure a pooled GPU model's memory.
    assert (args.triton_metrics, args.triton_metrics_interval) == ("http://127.0.0.1:8002/metrics", 2.0)


@pytest.mark.parametrize(
    "bad",
    [
        ["--listen", "8009"],
        ["--interval", "0"],
        ["--load-timeout", "0"],
        ["--drain-seconds", "-1"],
        ["--drain-seconds", "soon"],  # no number: refused, not read as 0
        ["--triton-metrics", "127.0.0.1:8002"],  # no http:// URL
        ["--triton-metrics-interval", "0"],
    ],
)
def test_bad_values_are_refused(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(
            ["agent", "--manifest", "m", "--configs", "c", "--base-revision", "r", *bad]
        )
    assert bad[0] in capsys.readouterr().err


@pytest.mark.parametrize(("given", "name"), [("r1", "r1"), ("", BASE), (" ", BASE)])
def test_the_base_revision_is_the_pods_config_volume(tmp_path: Path, given: str, name: str) -> None:
    manifest = Manifest(StoreRef("s3://b/repo"), (ManifestModel("m", "m", VersionPolicy(), ("1",)),), ())
    (tmp_path / "manifest.json").write_text(manifest_to_json(manifest))
    (tmp_path / "configs/m").mkdir(parents=True)
    (tmp_path / "configs/m/config.pbtxt").write_text('name: "m"\n')
    files = ["--manifest", str(tmp_path / "manifest.json"), "--configs", str(tmp_path / "configs")]
    args = build_parser().parse_args(["agent", *files, "--base-revision", given])
    base = base_revision(args)
    assert (base.revision, base.manifest, dict(base.configs)) == (name, manifest, {"m": 'name: "m"\n'})


@pytest.mark.parametrize("bad", [["--after", "soon"], ["--seconds", "3601"], ["--interval", "0"]])
def test_leave_refuses_bad_values(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["leave", *bad])
    assert bad[0] in capsys.readouterr().err
