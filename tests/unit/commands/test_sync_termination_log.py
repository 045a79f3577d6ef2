"""`triton-operator sync`'s termination log: what Kubernetes keeps of it (at most 4096 bytes), written
only into a file that exists."""

from __future__ import annotations

from pathlib import Path

from triton_operator.commands.sync import write_termination_log
from triton_operator.core.pod.startup import format_summary, parse_summary


def test_a_failure_line_is_written_as_it_was(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    log.write_text("")
    reason = "object 'models/a/1/w.bin' (a/1/w.bin): sha256 is 00, the manifest pins ff"
    write_termination_log(log, reason)
    assert log.read_text() == reason + "\n"


def test_a_long_message_is_cut_to_kubernetes_limit_between_characters(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    log.write_text("")
    message = "modèle " * 1000  # 8000 bytes, two-byte characters throughout
    write_termination_log(log, message)
    data = log.read_bytes()
    assert 4090 < len(data) <= 4096
    assert message.startswith(data.decode("utf-8"))  # valid UTF-8, nothing but the message's start


def test_the_summary_fits_and_reads_back(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    log.write_text("a failure of an earlier attempt\n")
    write_termination_log(log, format_summary(120_000, 10**12, 10**12, 3599.5))
    parsed = parse_summary(log.read_text())
    assert parsed is not None and (parsed.objects, parsed.fetched, parsed.seconds) == (
        120_000,
        10**12,
        3599.5,
    )


def test_nothing_is_written_where_no_file_exists(tmp_path: Path) -> None:
    write_termination_log(tmp_path / "absent", "synced 1 object")
    write_termination_log(None, "synced 1 object")
    assert list(tmp_path.iterdir()) == []
