"""Structured logs: TRITON_OPERATOR_LOG_FORMAT parsed strictly, JSON lines naming the TritonService,
for the operator (kopf's JSON format), sync, agent and node-cache."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit import REPO
from triton_operator import logs


@pytest.fixture
def root_handlers() -> Iterator[None]:
    """The root logger's handlers and level, put back after the test."""
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    yield
    root.handlers[:] = saved
    root.setLevel(level)


@pytest.mark.parametrize(
    ("env", "fmt"), [({}, "text"), ({logs.ENV: "text"}, "text"), ({logs.ENV: "json"}, "json")]
)
def test_the_format_setting(env: dict[str, str], fmt: str) -> None:
    assert logs.log_format(env) == fmt


@pytest.mark.parametrize("bad", ["JSON", "", "logfmt", " json"])
def test_an_unknown_format_is_an_error_naming_the_variable(bad: str) -> None:
    with pytest.raises(
        logs.LogFormatError, match=rf"^TRITON_OPERATOR_LOG_FORMAT={bad!r}: expected one of text, json$"
    ):
        logs.log_format({logs.ENV: bad})


def test_json_records_name_the_service_of_their_context(root_handlers: None) -> None:
    stream = io.StringIO()
    logs.configure("agent", "json", stream=stream, fixed={})
    log = logging.getLogger("triton_operator.test")
    log.info("outside")
    with logs.service_context("ml", "resnet"):
        log.warning("no revision yet %d", 1)
        logs.set_revision("5d8f7c")
        log.error("with one")
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed")
    log.info("outside again")
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [r["message"] for r in records] == [
        "outside",
        "no revision yet 1",
        "with one",
        "failed",
        "outside again",
    ]
    assert [r["severity"] for r in records] == ["info", "warn", "error", "error", "info"]
    assert {r["component"] for r in records} == {"agent"} and {r["logger"] for r in records} == {
        "triton_operator.test"
    }
    assert [(r.get("namespace"), r.get("tritonservice"), r.get("revision")) for r in records] == [
        (None, None, None),
        ("ml", "resnet", None),
        ("ml", "resnet", "5d8f7c"),
        ("ml", "resnet", "5d8f7c"),
        (None, None, None),
    ]
    assert "ValueError: boom" in records[3]["exc_info"]
    assert records[0]["timestamp"].endswith("+00:00")


def test_a_pods_process_names_its_service_from_its_environment(root_handlers: None) -> None:
    env = {logs.SERVICE_ENV: "ml/resnet", logs.REVISION_ENV: "5d8f7c"}
    stream = io.StringIO()
    logs.configure("sync", "json", stream=stream, fixed=logs.env_service(env))
    logging.getLogger("botocore").warning("retrying")
    record = json.loads(stream.getvalue())
    assert (record["namespace"], record["tritonservice"], record["revision"], record["component"]) == (
        "ml",
        "resnet",
        "5d8f7c",
        "sync",
    )
    assert logs.env_service({logs.SERVICE_ENV: "no-slash"}) == {}


def test_text_stays_text(root_handlers: None) -> None:
    stream = io.StringIO()
    logs.configure("node-cache", "text", stream=stream, text_format="%(levelname)s %(message)s")
    with logs.service_context("ml", "resnet", "r1"):
        logging.getLogger("x").info("hello")
    assert stream.getvalue() == "INFO hello\n"


def test_the_operator_uses_kopfs_json_format_with_the_service_added(
    root_handlers: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from triton_operator.commands.run import configure_logging  # noqa: PLC0415

    configure_logging(verbose=False, quiet=False, fmt="json")
    with logs.service_context("ml", "resnet"):
        logs.set_revision("5d8f7c")
        logging.getLogger("triton_operator.reconcile.apply").info("scaling Deployment %s to %d", "d", 2)
    ref = {
        "apiVersion": "triton-operator.io/v1alpha1",
        "kind": "TritonService",
        "name": "other",
        "namespace": "x",
    }
    logging.getLogger("kopf.objects").warning("from kopf", extra={"k8s_ref": ref, "k8s_skip": True})
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    ours = next(r for r in lines if r["message"] == "scaling Deployment d to 2")
    assert (ours["namespace"], ours["tritonservice"], ours["revision"], ours["severity"]) == (
        "ml",
        "resnet",
        "5d8f7c",
        "info",
    )
    assert ours["component"] == "operator" and "timestamp" in ours
    kopfs = next(r for r in lines if r["message"] == "from kopf")
    assert kopfs["object"] == ref and (kopfs["namespace"], kopfs["tritonservice"]) == ("x", "other")


ENV = {"PYTHONPATH": str(REPO / "operator" / "src"), "PATH": "/usr/bin:/bin"}


def cli(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "triton_operator.cli", *argv],
        capture_output=True,
        text=True,
        env={**ENV, **env},
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["sync", "--manifest", "/nonexistent", "--dest", "/tmp/x", "--termination-log", "/nonexistent/log"],
        [
            "agent",
            "--once",
            "--manifest",
            "/nonexistent",
            "--configs",
            "/nonexistent",
            "--base-revision",
            "r",
        ],
        ["node-cache", "--root", "/nonexistent", "--size-limit", "1Gi", "--port", "0"],
    ],
)
def test_each_process_stops_on_an_unknown_format_naming_the_variable(argv: list[str]) -> None:
    done = cli(*argv, env={logs.ENV: "xml"})
    assert done.returncode == 2, done.stderr
    assert f"error: {logs.ENV}='xml': expected one of text, json" in done.stderr


def test_the_operator_stops_on_an_unknown_format(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from triton_operator.cli import main  # noqa: PLC0415

    monkeypatch.setenv(logs.ENV, "yaml")
    assert main(["run", "--no-metrics"]) == 2
    assert (
        capsys.readouterr().err
        == f"triton-operator run: error: {logs.ENV}='yaml': expected one of text, json\n"
    )


def test_a_sync_failure_is_one_json_line_with_its_service(tmp_path: Path) -> None:
    env = {logs.ENV: "json", logs.SERVICE_ENV: "ml/resnet", logs.REVISION_ENV: "5d8f7c"}
    done = cli("sync", "--manifest", str(tmp_path / "missing.json"), "--dest", str(tmp_path / "m"), env=env)
    assert done.returncode == 2
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    failure = lines[-1]
    assert failure["message"].startswith("triton-operator sync: error: --manifest ")
    assert (failure["namespace"], failure["tritonservice"], failure["revision"]) == ("ml", "resnet", "5d8f7c")
    assert (failure["severity"], failure["component"], failure["exitCode"]) == ("error", "sync", 2)


async def test_a_reconcile_pass_names_its_service_and_revision_in_every_record() -> None:
    """The scheduler wraps each pass in service_context; the pass adds the revision once computed."""
    from e2e_helpers import tritonservice  # noqa: PLC0415
    from memkube import MemKube  # noqa: PLC0415
    from triton_operator.reconcile.scheduler import Reconciler  # noqa: PLC0415
    from triton_operator.settings import Settings  # noqa: PLC0415

    kube = MemKube()
    kube.put(tritonservice("svc", "ml"))
    seen: list[tuple[str | None, ...]] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(tuple(getattr(record, key, None) for key in logs.FIELDS))

    handler = Catch()
    handler.addFilter(logs.ServiceFilter(fixed={}))
    log = logging.getLogger("triton_operator.reconcile")
    log.addHandler(handler)
    level = log.level
    log.setLevel(logging.INFO)
    reconciler = Reconciler(kube, Settings())
    try:
        result = await reconciler("ml", "svc")
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        await reconciler.close()
    assert result is not None and result.revision
    assert seen, "a first pass logs what it applies"
    assert seen[-1] == ("ml", "svc", result.revision)
    assert all(s[:2] == ("ml", "svc") for s in seen)
