"""kubectl-triton against the shared cluster as a user runs it: kubeconfig files and contexts
(one live, one dead), $KUBECONFIG with several files, --watch ended by Ctrl-C, --version. Each test reads
TritonServices of its own namespace (other tests' namespaces come and go while it runs)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from e2e_helpers import apply
from tritonservice_bodies import body

DEAD = "https://127.0.0.1:9"


def split_kubeconfig(cluster: Path, tmp_path: Path) -> tuple[Path, Path]:
    """Two files: `dead.yaml` (context dead, current, at a dead address; and the cluster's context
    again under the name shared) and `live.yaml` (the cluster's kubeconfig as it is)."""
    live: dict[str, Any] = yaml.safe_load(cluster.read_text())
    current = live["current-context"]
    context = next(c for c in live["contexts"] if c["name"] == current)
    dead = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "dead", "cluster": {"server": DEAD, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "dead", "user": {"token": "none"}}],
        "contexts": [
            {"name": "dead", "context": {"cluster": "dead", "user": "dead"}},
            {"name": "shared", "context": {**context["context"], "namespace": "default"}},
        ],
        "current-context": "dead",
    }
    (tmp_path / "dead.yaml").write_text(yaml.safe_dump(dead))
    (tmp_path / "live.yaml").write_text(yaml.safe_dump(live))
    return tmp_path / "dead.yaml", tmp_path / "live.yaml"


def plugin(
    *argv: str, kubeconfig: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("KUBECONFIG", None)
    if kubeconfig is not None:
        env["KUBECONFIG"] = kubeconfig
    return subprocess.run(
        [sys.executable, "-m", "triton_operator.kubectl_plugin", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def two_services(kube: Any, namespace: str) -> list[str]:
    """Two TritonServices of this test's own namespace (objects only: nothing needs to serve them).
    The tests read this namespace, not every one (-A): other tests' namespaces come and go meanwhile."""
    for name in ("alpha", "beta"):
        obj = body()
        obj["metadata"] = {"name": name, "namespace": namespace}
        apply(kube, obj)
    return sorted(f"{namespace}/{name}" for name in ("alpha", "beta"))


def listed_names(cluster: Path, namespace: str) -> list[str]:
    """The TritonServices of ``namespace``, read directly (what `get -n NS -o json` must show)."""
    from lightkube import Client, KubeConfig  # noqa: PLC0415
    from lightkube.generic_resource import create_namespaced_resource  # noqa: PLC0415

    from triton_operator import GROUP, KIND, PLURAL, VERSION  # noqa: PLC0415

    client = Client(config=KubeConfig.from_file(str(cluster)))
    resource = create_namespaced_resource(GROUP, VERSION, KIND, PLURAL)
    listed = [o.to_dict()["metadata"] for o in client.list(resource, namespace=namespace)]  # type: ignore[no-untyped-call]
    return sorted(f"{m['namespace']}/{m['name']}" for m in listed)


def names_of(listing: dict[str, Any]) -> list[str]:
    assert listing["apiVersion"] == "v1" and listing["kind"] == "List"
    return sorted(f"{i['metadata']['namespace']}/{i['metadata']['name']}" for i in listing["items"])


def test_contexts_kubeconfig_files_and_their_merge(
    cluster: Path, tmp_path: Path, kube: Any, namespace: str
) -> None:
    dead, live = split_kubeconfig(cluster, tmp_path)
    expected = two_services(kube, namespace)
    assert listed_names(cluster, namespace) == expected
    merged = f"{dead}{os.pathsep}{live}"
    # The first file's current-context (dead) wins: refused, one line, exit 1, quickly.
    started = time.monotonic()
    done = plugin("get", "-n", namespace, "-o", "json", kubeconfig=merged)
    assert done.returncode == 1 and done.stderr.startswith("error: ") and done.stdout == ""
    assert time.monotonic() - started < 30
    # --context picks the shared cluster's context, named in the first file, its cluster from the second.
    done = plugin("--context", "shared", "get", "-n", namespace, "-o", "json", kubeconfig=merged)
    assert done.returncode == 0, done.stderr
    assert names_of(json.loads(done.stdout)) == expected
    # --kubeconfig wins over $KUBECONFIG; --context after the verb works too.
    done = plugin("get", "-n", namespace, "-o", "json", "--kubeconfig", str(live), kubeconfig=str(dead))
    assert done.returncode == 0, done.stderr
    assert names_of(json.loads(done.stdout)) == expected
    done = plugin("get", "-n", namespace, "-o", "json", "--kubeconfig", str(dead), "--context", "nope")
    assert done.returncode == 1 and "Context 'nope' not found" in done.stderr


def test_watch_ends_on_ctrl_c_with_exit_0(cluster: Path, tmp_path: Path, kube: Any, namespace: str) -> None:
    _, live = split_kubeconfig(cluster, tmp_path)
    expected = two_services(kube, namespace)
    env = {**os.environ, "KUBECONFIG": str(live)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "triton_operator.kubectl_plugin",
            "get",
            "-n",
            namespace,
            "-o",
            "name",
            "--watch",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        time.sleep(5)  # at least two reads
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    # each object once: nothing changed while it watched
    assert sorted(out.split()) == [f"tritonservice.triton-operator.io/{n.split('/')[1]}" for n in expected]


def test_version_names_the_operator_running_in_the_cluster_or_why_not(cluster: Path, tmp_path: Path) -> None:
    from lightkube import ALL_NS, Client, KubeConfig  # noqa: PLC0415
    from lightkube.resources.apps_v1 import Deployment  # noqa: PLC0415

    from triton_operator import __version__  # noqa: PLC0415

    dead, live = split_kubeconfig(cluster, tmp_path)
    client = Client(config=KubeConfig.from_file(str(cluster)))
    labels: dict[str, Any] = {"app.kubernetes.io/part-of": "triton-operator"}
    labels["app.kubernetes.io/component"] = "operator"
    found = client.list(Deployment, namespace=ALL_NS, labels=labels)
    deployments = [d.to_dict()["metadata"] for d in found]
    done = plugin("--version", kubeconfig=str(live))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == [f"kubectl-triton {__version__}", "API: triton-operator.io/v1alpha1"]
    if deployments:
        for meta in deployments:
            assert f"({meta['namespace']}/{meta['name']}, image " in lines[2]
    else:
        assert lines[2].startswith("Operator: unknown (no Deployment labelled")
    started = time.monotonic()
    done = plugin("--version", kubeconfig=str(dead))
    assert done.returncode == 0
    assert done.stdout.splitlines()[2].startswith("Operator: unknown (cannot read it from the cluster: ")
    assert time.monotonic() - started < 30


def test_the_single_file_plugin_reads_the_cluster(
    cluster: Path, tmp_path: Path, kube: Any, namespace: str
) -> None:
    """`make plugin`'s dist/kubectl-triton on the base interpreter (no venv): the same List as the API."""
    out = tmp_path / "kubectl-triton"
    repo = Path(__file__).resolve().parents[2]
    subprocess.run(
        [sys.executable, str(repo / "e2e" / "build_plugin.py"), "--output", str(out)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    _, live = split_kubeconfig(cluster, tmp_path)
    expected = two_services(kube, namespace)
    base = Path(sys.base_prefix) / "bin" / "python{}.{}".format(*sys.version_info[:2])
    done = subprocess.run(
        [str(base), "-I", str(out), "get", "-n", namespace, "-o", "json"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KUBECONFIG": str(live)},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert names_of(json.loads(done.stdout)) == expected == listed_names(cluster, namespace)
