"""bench/node_cache/page_reporting.py at a small size: real writes into a temporary folder, the
reporting parameters a stand-in folder of the same files (sysfs cannot be written here without
root): rows for each setting and wait, the setting turned off only for its rows and put back after."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from testkit import bench_module


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    with bench_module("bench/node_cache/page_reporting.py", "bench_page_reporting") as module:
        yield module


def parameters(folder: Path, order: int = 9) -> Path:
    folder.mkdir()
    (folder / "page_reporting_order").write_text(f"{order}\n")
    (folder / "reported_kib").write_text("1024\n")
    return folder


def rows(out: str) -> list[list[str]]:
    return [line.strip("| ").split(" | ") for line in out.splitlines() if line.startswith("| ")][1:]


def test_each_row_turns_reporting_off_only_while_it_runs_and_puts_the_setting_back(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    params = parameters(tmp_path / "params")
    files = tmp_path / "files"
    files.mkdir()
    seen: list[tuple[str, int | None]] = []
    measure = bench.measure

    def watched(folder: Path, gib: float, wait: float, *, setting: str, **rest: object) -> object:
        seen.append((setting, bench.Reporting(params).order()))
        return measure(folder, gib, wait, setting=setting, **rest)

    monkeypatch.setattr(bench, "measure", watched)
    argv = ["--gib", "0.01", "--wait", "0", "0.05", "--runs", "2", "--dir", str(files), "--off"]
    assert bench.main([*argv, "--parameters", str(params)]) == 0
    table = rows(capsys.readouterr().out)
    assert [(r[0], r[1]) for r in table] == [
        ("on (page_reporting_order 9)", "0"),
        ("off (order 11)", "0"),
        ("on (page_reporting_order 9)", "0.05"),
        ("off (order 11)", "0.05"),
    ]
    assert all(r[2] == "0" for r in table)  # the stand-in reported nothing meanwhile
    assert all(float(r[3]) >= 0 and float(r[4]) >= 0 for r in table)
    assert {s: o for s, o in seen} == {"on (page_reporting_order 9)": 9, "off (order 11)": 11}
    assert len(seen) == 8
    assert (params / "page_reporting_order").read_text().strip() == "9"
    assert list(files.iterdir()) == []


def test_the_setting_is_put_back_when_a_row_fails(bench: ModuleType, tmp_path: Path) -> None:
    reporting = bench.Reporting(parameters(tmp_path / "params", order=7))
    with pytest.raises(RuntimeError), reporting.set_order(11):
        assert reporting.order() == 11
        raise RuntimeError("a row failed")
    assert reporting.order() == 7


def test_a_machine_without_reporting_has_rows_as_it_is_and_off_is_refused_by_name(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    none = tmp_path / "none"
    argv = ["--gib", "0.01", "--wait", "0", "--runs", "1", "--dir", str(tmp_path), "--parameters", str(none)]
    assert bench.main(argv) == 0
    assert [(r[0], r[2]) for r in rows(capsys.readouterr().out)] == [("none on this machine", "-")]
    with pytest.raises(SystemExit, match="--off: this machine has no free page reporting"):
        bench.main([*argv, "--off"])


@pytest.mark.parametrize(
    ("flag", "said"),
    [
        (["--gib", "0"], "--gib must be above 0"),
        (["--runs", "0"], "--runs must be at least 1"),
        (["--wait", "-1"], "--wait must not be negative"),
    ],
)
def test_a_bad_setting_stops_the_bench_naming_it(
    bench: ModuleType, flag: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        bench.parse(flag)
    assert said in capsys.readouterr().err


@pytest.mark.parametrize(
    ("available_kib", "touched"), [(3 * (1 << 20) + 500_000, 0), (4 * (1 << 20) + 10, 1)]
)
def test_the_free_memory_touched_is_what_is_available_less_the_margin_in_whole_gib(
    bench: ModuleType, tmp_path: Path, available_kib: int, touched: int
) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(
        f"MemTotal:       99999999 kB\nMemFree:        1 kB\nMemAvailable:   {available_kib} kB\n"
    )
    gib, seconds, system = bench.back_free_memory(margin_gib=3.0, meminfo=meminfo)
    assert gib == touched
    assert seconds >= 0 and system >= 0
