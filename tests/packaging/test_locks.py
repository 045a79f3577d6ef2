"""The hash-pinned locks (requirements/*.lock, `make lock`) agree with pyproject.toml's ranges, with one
another and with the environment the tests run in, so that neither can drift from the other unseen."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import locks  # e2e/locks.py
from testkit import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
BUILD = locks.read_lock(REPO / "requirements" / "build.lock")
TEST = locks.read_lock(REPO / "requirements" / "test.lock")
RUNTIME = locks.read_lock(REPO / "requirements" / "runtime.lock")
DEPENDENCIES = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
TEST_EXTRA = [Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["test"]]
BUILD_REQUIRES = [Requirement(r) for r in PYPROJECT["build-system"]["requires"]]


def outside(requirements: list[Requirement], lock: dict[str, tuple[str, list[str]]]) -> list[str]:
    """The requirements the lock does not pin, or pins at a version outside the declared range."""
    wrong = []
    for requirement in requirements:
        pinned = lock.get(locks.canonical(requirement.name))
        if pinned is None:
            wrong.append(f"{requirement}: not in the lock")
        elif not requirement.specifier.contains(pinned[0], prereleases=True):
            wrong.append(f"{requirement}: locked at {pinned[0]}")
    return wrong


def test_the_lock_reader_sees_pins_and_hashes(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    lock.write_text(
        "# header\nfoo-bar[x, y]==1.2 \\\n    --hash=sha256:" + "a" * 64 + " \\\n"
        "    --hash=sha256:" + "b" * 64 + "\n    # via baz\nqux==3\n"
    )
    assert locks.read_lock(lock) == {"foo-bar": ("1.2", ["a" * 64, "b" * 64]), "qux": ("3", [])}
    lock.write_text("foo>=1\n")
    with pytest.raises(ValueError, match="not a `name==version` pin"):
        locks.read_lock(lock)


@pytest.mark.parametrize("lock", [BUILD, TEST, RUNTIME], ids=["build", "test", "runtime"])
def test_every_pin_has_hashes(lock: dict[str, tuple[str, list[str]]]) -> None:
    assert lock, "an empty lock"
    assert [name for name, (_, hashes) in lock.items() if not hashes] == []


def test_every_declared_dependency_is_locked_inside_its_range() -> None:
    assert outside(DEPENDENCIES, RUNTIME) == []
    assert outside(DEPENDENCIES + TEST_EXTRA, TEST) == []
    assert outside(BUILD_REQUIRES, BUILD) == []
    assert outside(BUILD_REQUIRES, TEST) == []


def test_every_lower_bound_is_the_tested_version() -> None:
    """A declared lower bound is the version of the test lock, the one the tests run against (a `>=`
    older than it would promise versions no test has run)."""
    stale = []
    for requirement in DEPENDENCIES + TEST_EXTRA:
        locked = TEST[locks.canonical(requirement.name)][0]
        for spec in requirement.specifier:
            if spec.operator in (">=", "==") and spec.version != locked:
                stale.append(f"{requirement}: the test lock has {locked}")
    assert stale == []


def test_the_image_installs_what_the_tests_ran() -> None:
    """The runtime lock is the test lock's dependencies at the same versions and files: no test tool."""
    differ = [name for name, pin in RUNTIME.items() if TEST.get(name) != pin]
    assert differ == []
    for tool in ("pytest", "mypy", "ruff", "nvidia-pytriton"):
        assert tool in TEST
        assert tool not in RUNTIME
    assert set(BUILD) <= set(TEST)
    assert [name for name, pin in BUILD.items() if TEST[name] != pin] == []


def test_the_test_environment_is_the_test_lock() -> None:
    """This Python has exactly the test lock's versions (e2e/bootstrap installs it): the snapshot of
    the CRD (tests/unit/test_crd.py), derived from tritonclient's model_config.proto, is then the
    locked tritonclient's."""
    installed = {
        locks.canonical(d.metadata["Name"]): d.version
        for d in importlib.metadata.distributions()
        if locks.canonical(d.metadata["Name"]) != locks.PROJECT
    }
    assert {n: v for n, v in installed.items() if TEST.get(n, (None,))[0] != v} == {}
    assert set(TEST) - set(installed) == set()
    assert installed["tritonclient"] == RUNTIME["tritonclient"][0]
