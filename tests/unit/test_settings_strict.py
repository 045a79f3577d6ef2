"""Settings.from_env reads every TRITON_OPERATOR_* variable strictly: a value it cannot read stops the
process with a message naming the variable and what it accepts, never a silent default."""

from __future__ import annotations

import base64
import pathlib
import re
import subprocess
import sys

import pytest

from testkit import REPO
from triton_operator import metrics
from triton_operator.settings import ENV_PREFIX, ENV_SETTINGS, Settings, SettingsError

BAD = [
    # on main, "y" and "enabled" were read as False: pinning and scraping silently off
    ("PIN_REPOSITORIES", "y"),
    ("PROMETHEUS_SCRAPE", "enabled"),
    ("ALLOW_PRIVILEGED", "ture"),
    ("ALLOW_ROOT", "2"),
    ("NODE_CACHE_SHARED_FILES", "yes please"),
    ("ALL_NAMESPACES", "all"),
    # on main, never checked
    ("LOG_LEVEL", "verbose"),
    ("EVENT_LEVEL", "warn"),
    ("SYNC_IMAGE_PULL_POLICY", "always"),
    ("LIVENESS_ENDPOINT", "0.0.0.0:8081/healthz"),
    ("LIVENESS_ENDPOINT", "http://0.0.0.0/healthz"),
    ("TRITON_READ_CIDRS", "10.0.0.0/33"),
    # on main, a bare ValueError that named nothing
    ("PEERING_PRIORITY", "high"),
    ("TRITON_READ_SECONDS", "soon"),
    # on main, 0 turned reads off and a rollout with analysis waited for ever (issue 38, item 11)
    ("TRITON_READ_SECONDS", "0"),
    ("TRITON_READ_SECONDS", "-5"),
    ("TRITON_READ_SECONDS", "nan"),
    ("TRITON_READ_SECONDS", "inf"),
    ("MAX_LISTED_OBJECTS", "0"),
    ("NODE_CACHE_PORT", "70000"),
    ("NODE_CACHE_PORT", "http"),
]


@pytest.mark.parametrize(("name", "value"), BAD)
def test_a_bad_value_stops_with_the_variable_and_what_it_accepts(name: str, value: str) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env({ENV_PREFIX + name: value})
    message = str(info.value)
    assert f"{ENV_PREFIX}{name}={value!r}" in message
    assert f"accepts {ENV_SETTINGS[name]}" in message


GOOD = [
    ("PIN_REPOSITORIES", "off", "pin_repositories", False),
    ("PIN_REPOSITORIES", "YES", "pin_repositories", True),
    ("PROMETHEUS_SCRAPE", "0", "prometheus_scrape", False),
    ("ALLOW_ROOT", "True", "allow_root", True),
    ("NODE_CACHE_SHARED_FILES", "true", "node_cache_shared_files", True),
    ("LOG_LEVEL", "debug", "log_level", "DEBUG"),
    ("EVENT_LEVEL", "Error", "event_level", "ERROR"),
    ("SYNC_IMAGE_PULL_POLICY", "IfNotPresent", "sync_image_pull_policy", "IfNotPresent"),
    ("LIVENESS_ENDPOINT", "http://0.0.0.0:8081/healthz", "liveness_endpoint", "http://0.0.0.0:8081/healthz"),
    ("PEERING_PRIORITY", "-3", "peering_priority", -3),
    ("TRITON_READ_SECONDS", "0.5", "triton_read_seconds", 0.5),
    ("TRITON_READ_CIDRS", "10.244.0.0/16, fd00::/64", "triton_read_cidrs", ("10.244.0.0/16", "fd00::/64")),
    ("NODE_CACHE_PORT", "65535", "node_cache_port", 65535),
    ("PIN_REPOSITORIES", "  ", "pin_repositories", True),  # blank: the default
]


@pytest.mark.parametrize(("name", "value", "field", "expected"), GOOD)
def test_every_accepted_value_is_read(name: str, value: str, field: str, expected: object) -> None:
    assert getattr(Settings.from_env({ENV_PREFIX + name: value}), field) == expected


def test_every_bad_variable_is_named_at_once() -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env({ENV_PREFIX + "PIN_REPOSITORIES": "y", ENV_PREFIX + "LOG_LEVEL": "loud"})
    assert "PIN_REPOSITORIES" in str(info.value) and "LOG_LEVEL" in str(info.value)


def test_reads_cannot_be_turned_off_in_code_either() -> None:
    """Settings built without the environment keep the rule (0 would leave an analysis waiting for ever)."""
    with pytest.raises(SettingsError, match="TRITON_READ_SECONDS"):
        Settings(triton_read_seconds=0)


def test_the_metrics_port_names_its_variable() -> None:
    with pytest.raises(SettingsError, match=f"{metrics.PORT_ENV}='metrics': accepts a port"):
        metrics.port_from_env({metrics.PORT_ENV: "metrics"})


def test_a_bad_setting_stops_the_command_with_its_message() -> None:
    """`triton-operator render` (as `run`) exits 2 naming the variable, with no traceback."""
    env = {
        "PYTHONPATH": str(REPO / "operator" / "src"),
        "PATH": "/usr/bin:/bin",
        ENV_PREFIX + "PIN_REPOSITORIES": "y",
    }
    done = subprocess.run(
        [sys.executable, "-m", "triton_operator.cli", "render", "-f", str(REPO / "examples" / "tiny.yaml")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "TRITON_OPERATOR_PIN_REPOSITORIES='y': accepts true or false" in done.stderr
    assert "Traceback" not in done.stderr


def test_operations_md_lists_exactly_the_settings() -> None:
    """docs/operations.md's table of settings names every variable the operator reads, and no other."""
    text = (REPO / "docs" / "operations.md").read_text()
    section = text.split("## Settings", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `TRITON_OPERATOR_([A-Z_]+)` \|", section, flags=re.MULTILINE)
    assert sorted(listed) == sorted([*ENV_SETTINGS, metrics.PORT_ENV.removeprefix(ENV_PREFIX)])
    assert len(listed) == len(set(listed))


def test_the_node_caches_key_file_gives_the_operator_its_public_key(tmp_path: pathlib.Path) -> None:
    """TRITON_OPERATOR_NODE_CACHE_SIGNING_KEY_FILE: the cache's own key (PEM or base64 of 32 bytes);
    the operator keeps only its public key, for new revisions' pods."""
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: PLC0415

    from triton_operator.adapters.nodecache.statements import Signer  # noqa: PLC0415

    key = Ed25519PrivateKey.generate()
    pem = tmp_path / "pem"
    pem.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    raw = tmp_path / "raw"
    raw.write_text(
        base64.b64encode(
            key.private_bytes(
                serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
            )
        ).decode()
    )
    expected = Signer.from_file(pem).public_key()
    for path in (pem, raw):
        read = Settings.from_env({ENV_PREFIX + "NODE_CACHE_SIGNING_KEY_FILE": str(path)})
        assert read.node_cache_public_key == expected
    assert Settings.from_env({}).node_cache_public_key is None


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "cannot be read"),
        (b"not a key", "holds no Ed25519 private key"),
        (base64.b64encode(b"k" * 16), "holds no Ed25519 private key"),
        (b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "holds no Ed25519 private key"),
    ],
    ids=["missing", "text", "short", "bad-pem"],
)
def test_a_bad_key_file_stops_the_operator_naming_the_setting(
    tmp_path: pathlib.Path, content: bytes | None, says: str
) -> None:
    path = tmp_path / "signing-key"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(SettingsError) as info:
        Settings.from_env({ENV_PREFIX + "NODE_CACHE_SIGNING_KEY_FILE": str(path)})
    assert f"{ENV_PREFIX}NODE_CACHE_SIGNING_KEY_FILE={str(path)!r}: {says}" in str(info.value)


def test_a_key_of_another_kind_is_refused(tmp_path: pathlib.Path) -> None:
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415

    path = tmp_path / "ec.pem"
    path.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    with pytest.raises(SettingsError, match=r"NODE_CACHE_SIGNING_KEY_FILE=.*holds no Ed25519 private key"):
        Settings.from_env({ENV_PREFIX + "NODE_CACHE_SIGNING_KEY_FILE": str(path)})
