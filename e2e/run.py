#!/usr/bin/env python3
"""The main job (`make run`): a cluster, the CRD, the operator and an example TritonService, converging.

Without KUBECONFIG it starts the project's own local Kubernetes (e2e/cluster.py: a real
kube-apiserver, etcd, controller-manager, scheduler, kwok with fake GPU nodes, and a real node:
kubelet, containerd, runc, a CNI bridge and kube-proxy) and a real S3 server (seaweedfs) holding a
small Python-backend model, listening where the pods reach it. It installs the CRD, runs the
operator, applies the example onto the real node, and prints the TritonService's status each time
it changes, until it is Ready; then it sends an inference through the TritonService's Service and
prints the inputs and outputs (then it keeps the operator running until Ctrl-C, or exits with
--exit-when-ready). Everything it started is stopped on exit (the cluster too, unless --keep-cluster).

Where the machine cannot run containers the local cluster has no real node: the example then runs
on kwok's fake nodes (Ready is written by kwok, nothing serves) and the command says so.

"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "e2e"))
sys.path.insert(0, str(ROOT / "tests" / "support"))

import cluster  # noqa: E402
import images  # noqa: E402
import node  # noqa: E402
from inference import INPUT0, INPUT1, InferenceError, infer_add_sub  # noqa: E402
from triton_operator.core.repository.manifestparts import stored_manifest  # noqa: E402

MODEL_FILE = ROOT / "tests" / "data" / "triton_models" / "adder" / "1" / "model.py"
# The CPU tritonserver image built from the project's own files (e2e/images/tritonserver).
LOCAL_TRITON_IMAGE = images.IMAGES["tritonserver"]["ref"]


def say(msg: str) -> None:
    print(f"[run] {msg}", flush=True)


def kubectl_binary() -> str:
    """The project's kubectl (built with the cluster), else one on PATH."""
    built = cluster.bin_dir() / "kubectl"
    if built.exists():
        return str(built)
    found = shutil.which("kubectl")
    if not found:
        raise SystemExit("no kubectl: run `python3 e2e/cluster.py build` (make bootstrap does)")
    return found


class Kubectl:
    def __init__(self, binary: str, kubeconfig: str) -> None:
        self.binary = binary
        self.env = {**os.environ, "KUBECONFIG": kubeconfig}

    def __call__(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        proc = subprocess.run(
            [self.binary, *args], input=stdin, env=self.env, capture_output=True, text=True, check=False
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout


def start_s3(workdir: Path, host: str = "127.0.0.1") -> Any:
    """A real S3 server on ``host`` (this machine) with the example's model under s3://models/tiny."""
    from storage_servers import S3_ACCESS_KEY, S3_SECRET_KEY, s3_client, start_seaweedfs  # noqa: PLC0415

    server = start_seaweedfs(workdir / "weed", workdir / "weed.log", host=host)
    s3 = s3_client(server.endpoint)
    s3.create_bucket(Bucket="models")
    s3.put_object(Bucket="models", Key="tiny/add_sub/1/model.py", Body=MODEL_FILE.read_bytes())
    say(f"S3 (seaweedfs) at {server.endpoint}: uploaded s3://models/tiny/add_sub/1/model.py")
    return server, S3_ACCESS_KEY, S3_SECRET_KEY


def summarize(obj: dict[str, Any]) -> str:
    status = obj.get("status") or {}
    conds = {c["type"]: c for c in status.get("conditions", [])}
    parts = [
        f"generation={obj['metadata'].get('generation')} observed={status.get('observedGeneration')}",
        f"stable={status.get('stableRevision')} canary={status.get('canaryRevision')}",
        f"ready={status.get('readyReplicas')}/{status.get('replicas')}",
    ]
    for ctype in ("Ready", "RepositoryReady", "PodsScheduled", "Progressing", "Degraded"):
        if ctype in conds:
            c = conds[ctype]
            parts.append(f"{ctype}={c['status']}({c['reason']})")
    return "  ".join(parts)


def show_revision(kubectl: Kubectl, namespace: str, name: str) -> None:
    """Print what the stable revision serves: the rendered config.pbtxt files and the pinned objects."""
    obj = json.loads(kubectl("get", "tritonservice", name, "-n", namespace, "-o", "json"))
    revision = (obj.get("status") or {}).get("stableRevision")
    if not revision:
        return
    # The revision's ConfigMaps: the configs and the manifest, plain or in gzipped parts.
    selector = f"triton-operator.io/service={name},triton-operator.io/revision={revision}"
    listed = json.loads(kubectl("get", "configmap", "-n", namespace, "-l", selector, "-o", "json"))
    configmaps = listed.get("items") or []
    cm: dict[str, Any] = next((c for c in configmaps if c["metadata"]["name"] == f"{name}-{revision}"), {})
    for key, text in sorted(cm.get("data", {}).items()):
        if key.endswith(".config.pbtxt"):
            say(f"revision {revision} renders {key.removesuffix('.config.pbtxt')}/config.pbtxt:")
            print("    " + text.rstrip().replace("\n", "\n    "), flush=True)
    manifest = json.loads(stored_manifest(configmaps) or "{}")
    entries = manifest.get("entries") or manifest.get("objects") or []
    source = (manifest.get("repository") or {}).get("uri", "?")
    say(f"revision {revision} pins {len(entries)} object(s) of {source}:")
    for entry in entries:
        print("    " + json.dumps(entry, sort_keys=True), flush=True)


def place_on_real_node(ts: dict[str, Any]) -> None:
    """Tolerate the real node's taint and select it (the kwok nodes run no containers)."""
    spec, there = ts["spec"], node.placement()
    spec["nodeSelector"] = {**spec.get("nodeSelector", {}), **there["nodeSelector"]}
    spec["tolerations"] = [*spec.get("tolerations", []), *there["tolerations"]]


def first_inference(kubectl: Kubectl, namespace: str, name: str, timeout: float = 30.0) -> bool:
    """Send one inference through the TritonService's Service; print inputs and outputs."""
    svc = json.loads(kubectl("get", "service", name, "-n", namespace, "-o", "json"))
    host = svc["spec"]["clusterIP"]
    say(f"inference through Service {namespace}/{name} ({host}:8000), model add_sub:")
    deadline = time.monotonic() + timeout
    while True:
        try:
            outputs = infer_add_sub(host, 8000)
            break
        except InferenceError as exc:
            if time.monotonic() > deadline:
                say(f"  no answer within {timeout:.0f}s: {exc}")
                return False
            time.sleep(0.5)
    print(f"    INPUT0  = {INPUT0}\n    INPUT1  = {INPUT1}", flush=True)
    for out_name, values in sorted(outputs.items()):
        print(f"    {out_name} = {values}", flush=True)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--example", type=Path, default=ROOT / "examples" / "tiny.yaml")
    ap.add_argument("--namespace", default="default")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for Ready")
    ap.add_argument("--exit-when-ready", action="store_true", help="stop everything once Ready")
    ap.add_argument("--keep-cluster", action="store_true", help="leave the local cluster running")
    ap.add_argument(
        "--kwok", action="store_true", help="local cluster: run on kwok's fake nodes, not on the real node"
    )
    args = ap.parse_args(argv)
    # SIGTERM and SIGHUP (a closed terminal, `timeout`, a CI job's cancel) stop it as Ctrl-C does:
    # everything it started, the local cluster included, is stopped on the way out
    with cluster.stop_signals_interrupt():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    cleanups: list[tuple[str, Any]] = []
    workdir = Path(tempfile.mkdtemp(prefix="triton-operator-run-"))
    rc = 1
    try:
        kubeconfig = os.environ.get("KUBECONFIG")
        local = not kubeconfig
        if local:
            say("no KUBECONFIG: starting the local cluster (e2e/cluster.py)")
            if not args.keep_cluster:  # before up: an interrupted up is brought down too
                cleanups.append(("local cluster", cluster.down))
            kubeconfig = str(cluster.up())
        assert kubeconfig
        kubectl = Kubectl(kubectl_binary(), kubeconfig)
        server = json.loads(kubectl("version", "-o", "json"))["serverVersion"]["gitVersion"]
        say(f"Kubernetes {server} at {kubeconfig}")

        say("installing the CRD (server-side apply)")
        crd_file = str(ROOT / "crds" / "tritonservices.yaml")
        kubectl("apply", "--server-side", "--force-conflicts", "-f", crd_file)
        kubectl(
            "wait", "--for=condition=Established", "crd/tritonservices.triton-operator.io", "--timeout=60s"
        )

        if not kubectl("get", "namespace", args.namespace, "--ignore-not-found", "-o", "name"):
            say(f"creating namespace {args.namespace}")
            kubectl("create", "namespace", args.namespace)
        docs = [d for d in yaml.safe_load_all(args.example.read_text()) if d]
        ts = next(d for d in docs if d.get("kind") == "TritonService")
        ts.setdefault("metadata", {})["namespace"] = args.namespace
        node: dict[str, Any] | None = None
        operator_env: dict[str, str] = {}
        # The project's own cluster (started here, or named by KUBECONFIG) may have a real node.
        ours = local or Path(kubeconfig).resolve() == cluster.kubeconfig_path().resolve()
        if ours and not args.kwok:
            node, why = cluster.real_node()
            if node:
                place_on_real_node(ts)
                operator_env["TRITON_OPERATOR_DEFAULT_IMAGE"] = LOCAL_TRITON_IMAGE
                say(
                    f"real node {node['name']} ({node['ip']}): the example runs there, with the images "
                    f"built from this repository (tritonserver {LOCAL_TRITON_IMAGE})"
                )
            else:
                say(f"no real node ({why}): the pods run on kwok's fake nodes and nothing will serve")
        repo = ts["spec"]["repository"]
        if repo["uri"].startswith("s3://models/tiny") and "127.0.0.1" in repo.get("endpoint", ""):
            # The example's store is on loopback: start it here, where the operator runs too (on the
            # pod bridge's gateway, an address of this machine, when real pods must reach it).
            server, access, secret = start_s3(workdir, host=node["ip"] if node else "127.0.0.1")
            cleanups.append(("S3 server", server.stop))
            repo["endpoint"] = server.endpoint
            secret_doc = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": repo["credentialsSecret"], "namespace": args.namespace},
                "stringData": {"AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret},
            }
            kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(secret_doc))

        log_path = workdir / "operator.log"
        say(f"starting the operator: triton-operator run -n {args.namespace} (log: {log_path})")
        log_file = log_path.open("wb")
        operator = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "triton-operator"),
                "run",
                "-n",
                args.namespace,
                "--no-metrics",
            ],
            env={**os.environ, "KUBECONFIG": kubeconfig, **operator_env},
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

        def stop_operator() -> None:
            cluster.stop_group(operator)
            log_file.close()

        cleanups.append(("operator", stop_operator))

        name = ts["metadata"]["name"]
        shown = args.example.relative_to(ROOT) if args.example.is_relative_to(ROOT) else args.example
        say(f"applying {shown}")
        kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(ts))

        deadline = time.monotonic() + args.timeout
        last = ""
        ready = False
        while time.monotonic() < deadline:
            if operator.poll() is not None:
                say(f"the operator exited ({operator.returncode}); its log:\n{log_path.read_text()[-4000:]}")
                return 1
            out = kubectl("get", "tritonservice", name, "-n", args.namespace, "-o", "json", check=False)
            if out:
                obj = json.loads(out)
                line = summarize(obj)
                if line != last:
                    say(f"tritonservice/{name}: {line}")
                    last = line
                conds = {c["type"]: c for c in (obj.get("status") or {}).get("conditions", [])}
                gen_ok = (obj.get("status") or {}).get("observedGeneration") == obj["metadata"]["generation"]
                if gen_ok and conds.get("Ready", {}).get("status") == "True":
                    ready = True
                    break
            time.sleep(0.5)
        if not ready:
            say(f"not Ready within {args.timeout:.0f}s; operator log tail:\n{log_path.read_text()[-4000:]}")
            return 1

        selector = f"triton-operator.io/service={name}"
        print(
            kubectl(
                "get",
                "tritonservice,deployments,configmaps,services,pods",
                "-n",
                args.namespace,
                "-l",
                selector,
                "-o",
                "wide",
                check=False,
            ),
            flush=True,
        )
        print(kubectl("get", "tritonservice", name, "-n", args.namespace), flush=True)
        show_revision(kubectl, args.namespace, name)
        if node and not first_inference(kubectl, args.namespace, name):
            return 1
        say("Ready. Try: kubectl get tsvc; kubectl-triton status " + name)
        say(f"export KUBECONFIG={kubeconfig}")
        rc = 0
        if not args.exit_when_ready:
            with contextlib.suppress(KeyboardInterrupt):  # from here, stopping it is its normal end
                say("the operator keeps running; Ctrl-C stops everything this command started")
                operator.wait()
        return rc
    except KeyboardInterrupt as e:
        say(f"interrupted ({e or 'Ctrl-C'})")
        return 130
    finally:
        with cluster.signals_deferred():  # a second Ctrl-C or SIGTERM does not cut the clean-up short
            for what, stop in reversed(cleanups):
                say(f"stopping the {what}")
                try:
                    stop()
                except Exception as exc:  # report it and go on stopping the rest
                    say(f"  could not stop the {what}: {exc}")
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
