"""kubectl-triton finds its cluster as kubectl does: --kubeconfig, --context, -n, $KUBECONFIG merged."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from triton_operator import kubectl_plugin as kp
from triton_operator.adapters.control import kube_client, load_kubeconfig, merge_kubeconfigs

DEAD = "https://127.0.0.1:9"  # the discard port: nothing listens, a connection is refused at once


def kubeconfig(
    path: Path,
    contexts: dict[str, tuple[str, str | None]],
    current: str | None,
    *,
    ca: str | None = None,
) -> Path:
    """A kubeconfig file: context name -> (server, namespace); each context has its own cluster and user."""
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": f"{n}-cluster",
                "cluster": {"server": s, **({"certificate-authority": ca} if ca else {})},
            }
            for n, (s, _) in contexts.items()
        ],
        "users": [{"name": f"{n}-user", "user": {"token": f"token-{n}"}} for n in contexts],
        "contexts": [
            {
                "name": n,
                "context": {
                    "cluster": f"{n}-cluster",
                    "user": f"{n}-user",
                    **({"namespace": ns} if ns else {}),
                },
            }
            for n, (_, ns) in contexts.items()
        ],
    }
    if current:
        doc["current-context"] = current
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


def test_kubeconfig_files_merge_as_kubectl_merges_them(tmp_path: Path) -> None:
    first = kubeconfig(tmp_path / "a" / "config", {"shared": ("https://first:6443", "ml")}, None, ca="ca.crt")
    second = kubeconfig(
        tmp_path / "b" / "config",
        {"shared": ("https://second:6443", "other"), "dead": (DEAD, None)},
        "dead",
        ca="/etc/ca.crt",
    )
    env = {"KUBECONFIG": f"{first}:{tmp_path / 'missing'}:{second}"}
    config = load_kubeconfig(env=env)
    assert config.current_context == "dead"  # the first file to set one (the first sets none)
    shared = config.get("shared")
    assert shared is not None
    assert shared.cluster.server == "https://first:6443"  # the first file to name it wins
    assert shared.namespace == "ml"
    assert shared.cluster.certificate_auth == str(tmp_path / "a" / "ca.crt")  # from its own file's folder
    dead = config.get("dead")
    assert dead is not None and dead.cluster.server == DEAD and dead.cluster.certificate_auth == "/etc/ca.crt"
    merged = merge_kubeconfigs([(first, yaml.safe_load(first.read_text()))])
    assert [c["name"] for c in merged["contexts"]] == ["shared"] and "current-context" not in merged


def test_kubeconfig_flag_wins_over_the_environment_and_an_empty_list_is_an_error(tmp_path: Path) -> None:
    only = kubeconfig(tmp_path / "only", {"one": ("https://one:6443", None)}, "one")
    other = kubeconfig(tmp_path / "other", {"two": ("https://two:6443", None)}, "two")
    assert load_kubeconfig(str(only), env={"KUBECONFIG": str(other)}).current_context == "one"
    with pytest.raises(ValueError, match=r"KUBECONFIG=.*none of its files exists"):
        load_kubeconfig(env={"KUBECONFIG": str(tmp_path / "nope")})


def test_context_flag_picks_the_cluster_and_an_unknown_one_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = kubeconfig(tmp_path / "k", {"live": ("https://live:6443", "ml"), "dead": (DEAD, "x")}, "live")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert str(kube_client(str(path), "dead").namespace) == "x"
    assert str(kube_client(str(path), None).namespace) == "ml"
    monkeypatch.setenv("KUBECONFIG", str(path))
    assert str(kube_client(None, "dead").namespace) == "x"
    with pytest.raises(ValueError, match=r"kubeconfig .*: Context 'nope' not found"):
        kube_client(str(path), "nope")


@pytest.mark.parametrize(
    "argv",
    [
        ["--context", "dead", "get", "-o", "json"],
        ["get", "--context", "dead", "-o", "json"],
        ["--kubeconfig", "{k}", "--context", "dead", "status", "x"],
    ],
)
def test_the_plugin_reaches_the_context_it_is_given(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = kubeconfig(
        tmp_path / "k", {"live": ("https://live.invalid:6443", None), "dead": (DEAD, None)}, "live"
    )
    monkeypatch.setenv("KUBECONFIG", str(path))
    started = time.monotonic()
    assert kp.main([a.replace("{k}", str(path)) for a in argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "refused" in err.lower()  # 127.0.0.1:9, not live.invalid
    assert time.monotonic() - started < 10


def test_namespace_before_or_after_the_verb(tmp_path: Path) -> None:
    parser = kp.build_parser()
    assert parser.parse_args(["-n", "ml", "get"]).namespace == "ml"
    assert parser.parse_args(["get", "-n", "ml"]).namespace == "ml"
    assert parser.parse_args(["-n", "a", "get", "-n", "b"]).namespace == "b"
    args = parser.parse_args(["--context", "c", "--kubeconfig", "f", "promote", "x"])
    assert (args.context, args.kubeconfig, args.namespace) == ("c", "f", None)
