"""Installing for real: the Helm chart and manifests/ against a real API server, and the chart's RBAC
proven sufficient by running the operator with its ServiceAccount's token (not the admin's).

The CRDs are cluster-scoped and shared with every other cluster test, so the two install tests
run with the triton-operator CRDs removed first (only when no TritonService exists anywhere) and
put back afterwards exactly as the session's `crd` fixture applies them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, Client
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import ConfigMap, Event, Namespace, Pod, Service

from e2e_helpers import (
    REVISION_LABEL,
    SERVICE_LABEL,
    TS,
    UNPINNED_REPOSITORY,
    LocalOperator,
    apply,
    as_dict,
    condition,
    create_store_secret,
    get_ts,
    names,
    observed,
    owned,
    store_repository,
    tritonservice,
    write_token_kubeconfig,
)
from testkit import (
    CRD_FILE,
    apply_crds,
    crd_document,
    crd_established,
    load_chartlib,
    sh,
    wait_for,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "triton-operator"
MANIFESTS = REPO / "manifests"
OUR_CRDS = (
    "tritonservices.triton-operator.io",
    "kopfpeerings.kopf.dev",
    "clusterkopfpeerings.kopf.dev",
)
# A refusal as the operator (kopf, lightkube) logs it: the API server's message or its status code
# (after the line's "[date time,msec]" prefix, whose milliseconds may well read 403).
FORBIDDEN = re.compile(r"(?i)forbidden|\b403\b")
LOG_PREFIX = re.compile(r"^\[[^\]]*\]")


def refusals(log: str) -> list[str]:
    return [line for line in log.splitlines() if FORBIDDEN.search(LOG_PREFIX.sub("", line))]


chartlib = load_chartlib()


# ----------------------------------------------------------------- helpers


@dataclass
class Tools:
    kubectl: str
    helm: str
    kubeconfig: Path

    def k(
        self, *args: str | Path, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return sh(self.kubectl, f"--kubeconfig={self.kubeconfig}", *args, stdin=stdin, check=check)

    def h(self, *args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
        return sh(self.helm, f"--kubeconfig={self.kubeconfig}", *args, check=check)


@pytest.fixture(scope="module")
def tools(cluster: Path, kubectl: str | None) -> Tools:
    if kubectl is None:
        pytest.skip("no kubectl binary (python3 e2e/cluster.py build provides one)")
    helm = chartlib.find_tool("helm")
    if helm is None:
        pytest.skip("no helm binary (python3 e2e/cluster.py build provides one)")
    return Tools(kubectl=kubectl, helm=str(helm), kubeconfig=cluster)


def suffix() -> str:
    return uuid.uuid4().hex[:6]


def all_ts(kube: Client) -> list[dict[str, Any]]:
    return [as_dict(o) for o in kube.list(TS, namespace="*")]


def terminating(kube: Client, namespace: str) -> bool:
    try:
        ns = as_dict(kube.get(Namespace, namespace))
    except ApiError as exc:
        return exc.status.code == 404
    return bool(ns["metadata"].get("deletionTimestamp"))


def crd_exists(kube: Client, name: str) -> bool:
    try:
        kube.get(CustomResourceDefinition, name)
    except ApiError as exc:
        if exc.status.code == 404:
            return False
        raise
    return True


# ----------------------------------------------------------------- CRDs out of the way, and back


@pytest.fixture
def without_crds(kube: Client, tools: Tools) -> Iterator[None]:
    """No triton-operator/kopf CRD on the cluster during the test; the TritonService CRD back after.

    Deleting a CRD deletes every object of its kind, so this only goes ahead when no TritonService
    is left (waiting for the namespaces of earlier tests to finish terminating).
    """
    existed = {name for name in OUR_CRDS if crd_exists(kube, name)}
    if "tritonservices.triton-operator.io" in existed:
        deadline = time.monotonic() + 120
        while left := all_ts(kube):
            staying = [
                f"{o['metadata']['namespace']}/{o['metadata']['name']}"
                for o in left
                if not o["metadata"].get("deletionTimestamp")
                and not terminating(kube, o["metadata"]["namespace"])
            ]
            if staying or time.monotonic() > deadline:
                names = staying or [f"{o['metadata']['namespace']}/{o['metadata']['name']}" for o in left]
                pytest.skip(f"TritonServices exist ({names[:5]}): removing the CRD would delete them")
            time.sleep(1)  # the namespaces of earlier tests are still terminating
    for name in existed:
        try:
            kube.delete(CustomResourceDefinition, name)
        except ApiError as exc:  # already being deleted
            if exc.status.code != 404:
                raise
    wait_for(
        lambda: not any(crd_exists(kube, n) for n in OUR_CRDS), timeout=120, what="the CRDs to be deleted"
    )
    try:
        yield
    finally:
        # Leave the cluster as it was: our CRD applied by the tests' field manager (as the
        # session's `crd` fixture does), the kopf ones back only if they were there before.
        kopf_crds = [d for d in yaml.safe_load_all((CHART / "crds" / "kopfpeerings.yaml").read_text()) if d]
        docs = [crd_document()]
        docs += [d for d in kopf_crds if d["metadata"]["name"] in existed]
        for name in OUR_CRDS:
            if name not in existed and name != "tritonservices.triton-operator.io":
                tools.k("delete", "crd", name, "--ignore-not-found", "--wait=true")
        apply_crds(kube, docs, timeout=60)


# ----------------------------------------------------------------- (a) helm install / upgrade / uninstall


def manifest_objects(text: str) -> list[tuple[str, str, str | None]]:
    """(kind, name, namespace) of each document of a rendered manifest."""
    return [
        (d["kind"], d["metadata"]["name"], d["metadata"].get("namespace"))
        for d in yaml.safe_load_all(text)
        if d
    ]


def test_helm_install_upgrade_and_uninstall(kube: Client, tools: Tools, without_crds: None) -> None:
    release, ns = f"ti-{suffix()}", f"helm-{suffix()}"
    watched = f"watched-{suffix()}"
    full = f"{release}-triton-operator"
    try:
        out = tools.h(
            "install", release, CHART, "-n", ns, "--create-namespace", "--wait", "--timeout", "3m"
        ).stdout
        assert "STATUS: deployed" in out, out

        # The CRDs from the chart's crds/ were created, and the API server serves them.
        for name in OUR_CRDS:
            wait_for(partial(crd_established, kube, name), timeout=60, what=f"CRD {name} Established")
        served = yaml.safe_load(CRD_FILE.read_text())
        live = kube.get(CustomResourceDefinition, "tritonservices.triton-operator.io").to_dict()
        assert [v["name"] for v in live["spec"]["versions"]] == [
            v["name"] for v in served["spec"]["versions"]
        ]

        # Every object of the release exists on the server (kubectl get -f fails on any missing).
        manifest = tools.h("get", "manifest", release, "-n", ns).stdout
        objects = manifest_objects(manifest)
        kinds = Counter(kind for kind, _, _ in objects)
        assert kinds == Counter(
            {
                "ServiceAccount": 1,
                "ClusterRole": 1,
                "ClusterRoleBinding": 1,
                "Service": 1,
                "Deployment": 1,
            }
        ), kinds
        tools.k("get", "-f", "-", "-o", "name", stdin=manifest)
        sa = tools.k("get", "serviceaccount", full, "-n", ns, "-o", "json").stdout
        assert json.loads(sa)["metadata"]["annotations"]["meta.helm.sh/release-name"] == release
        svc = kube.get(Service, f"{full}-metrics", namespace=ns).to_dict()
        assert [p["port"] for p in svc["spec"]["ports"]] == [8080]
        dep = kube.get(Deployment, full, namespace=ns).to_dict()
        # kwok runs no container, but the pod was created from the template, scheduled and is Ready
        assert dep["status"].get("availableReplicas") == 1, dep["status"]
        container = dep["spec"]["template"]["spec"]["containers"][0]
        assert container["args"] == ["run", "--all-namespaces"]
        assert dep["spec"]["template"]["spec"]["serviceAccountName"] == full
        binding = tools.k("get", "clusterrolebinding", full, "-o", "json").stdout
        assert json.loads(binding)["subjects"] == [{"kind": "ServiceAccount", "name": full, "namespace": ns}]

        # helm upgrade into watchNamespaces mode: Roles there, the cluster-wide role goes away.
        tools.k("create", "namespace", watched)
        tools.h(
            "upgrade",
            release,
            CHART,
            "-n",
            ns,
            "--reuse-values",
            "--set",
            f"watchNamespaces={{{watched}}}",
            "--wait",
            "--timeout",
            "3m",
        )
        role = tools.k("get", "role", full, "-n", watched, "-o", "json").stdout
        assert any("deployments" in r["resources"] for r in json.loads(role)["rules"])
        assert tools.k("get", "clusterrole", full, check=False).returncode != 0
        assert tools.k("get", "clusterrole", f"{full}-discovery", check=False).returncode == 0
        dep = kube.get(Deployment, full, namespace=ns).to_dict()
        assert dep["spec"]["template"]["spec"]["containers"][0]["args"] == ["run", f"--namespace={watched}"]
        history = json.loads(tools.h("history", release, "-n", ns, "-o", "json").stdout)
        assert [h["status"] for h in history] == ["superseded", "deployed"]

        # helm uninstall removes every object of the release, and keeps the CRDs (Helm never
        # deletes crds/: TritonServices survive an uninstall/reinstall of the operator).
        final = tools.h("get", "manifest", release, "-n", ns).stdout
        tools.h("uninstall", release, "-n", ns, "--wait", "--timeout", "3m")
        left = tools.k("get", "-f", "-", "-o", "name", "--ignore-not-found", stdin=final).stdout
        assert left.strip() == "", f"left behind by helm uninstall:\n{left}"
        assert tools.k("get", "role", full, "-n", watched, "--ignore-not-found", "-o", "name").stdout == ""
        assert all(crd_exists(kube, n) for n in OUR_CRDS)
        tools.k("delete", "namespace", watched, "--wait=false")
    finally:
        tools.h("uninstall", release, "-n", ns, "--ignore-not-found", check=False)
        tools.k("delete", "namespace", ns, "--ignore-not-found", "--wait=false", check=False)
        # Gone before the next test: the release's operator pod (cluster-wide, a kopf peer) still
        # ran while its namespace terminated, and the next test, deleting the kopf CRDs again at
        # once, timed out on them in two runs of three.
        wait_for(
            lambda: not any(_exists(tools, "namespace", n) for n in (ns, watched)),
            timeout=180,
            what="the release's namespaces gone",
        )


# ----------------------------------------------------------------- (b) kubectl apply -f manifests/


def test_plain_manifests_dry_run_then_apply(kube: Client, tools: Tools, without_crds: None) -> None:
    namespace = yaml.safe_load((MANIFESTS / "00-namespace.yaml").read_text())["metadata"]["name"]
    leftover = tools.k("get", "namespace", namespace, "--ignore-not-found", "-o", "name").stdout
    if leftover.strip():  # an interrupted earlier run: remove exactly what the manifests name
        tools.k("delete", "-f", MANIFESTS, "--ignore-not-found", "--wait=true")
        wait_for(lambda: not _exists(tools, "namespace", namespace), timeout=180, what="old namespace gone")
    files = sorted(MANIFESTS.glob("*.yaml"))
    expected = [o for f in files for o in manifest_objects(f.read_text())]
    try:
        # Cluster-scoped files first: the namespaced objects need their namespace to exist even
        # for a server-side dry run.
        dry = tools.k(
            "apply",
            "--dry-run=server",
            "-f",
            MANIFESTS / "00-namespace.yaml",
            "-f",
            MANIFESTS / "01-crds.yaml",
        ).stdout
        assert dry.count("(server dry run)") == 1 + len(OUR_CRDS), dry
        assert not _exists(tools, "namespace", namespace), "a server-side dry run created the namespace"
        assert not crd_exists(kube, "tritonservices.triton-operator.io")

        tools.k("apply", "-f", MANIFESTS / "00-namespace.yaml")
        dry = tools.k("apply", "--dry-run=server", "-f", MANIFESTS).stdout
        lines = [line for line in dry.splitlines() if line.strip()]
        assert len(lines) == len(expected), dry
        assert all(line.endswith("(server dry run)") for line in lines[1:]), dry
        assert not crd_exists(kube, "tritonservices.triton-operator.io")

        applied = tools.k("apply", "-f", MANIFESTS).stdout
        assert len([line for line in applied.splitlines() if line.strip()]) == len(expected), applied
        wait_for(
            lambda: crd_established(kube, "tritonservices.triton-operator.io"),
            timeout=60,
            what="the CRD from manifests/ Established",
        )
        tools.k("rollout", "status", "deployment/triton-operator", "-n", namespace, "--timeout=180s")
        names = tools.k("get", "-f", MANIFESTS, "-o", "name").stdout.split()
        assert len(names) == len(expected)

        # Applying again changes nothing (what a GitOps tool does on every sync).
        again = tools.k("apply", "-f", MANIFESTS).stdout
        assert all(line.endswith(" unchanged") for line in again.splitlines() if line.strip()), again

        tools.k("delete", "-f", MANIFESTS, "--wait=true", "--timeout=180s")
        wait_for(lambda: not _exists(tools, "namespace", namespace), timeout=180, what="namespace gone")
        left = tools.k("get", "-f", MANIFESTS, "-o", "name", "--ignore-not-found").stdout
        assert left.strip() == "", left
    finally:
        tools.k("delete", "-f", MANIFESTS, "--ignore-not-found", "--wait=false", check=False)


def _exists(tools: Tools, kind: str, name: str, namespace: str | None = None) -> bool:
    args = ["get", kind, name, "--ignore-not-found", "-o", "name"]
    if namespace:
        args += ["-n", namespace]
    return bool(tools.k(*args).stdout.strip())


# ----------------------------------------------------------------- (c) the chart's RBAC is enough


@dataclass
class Release:
    name: str
    namespace: str
    service_account: str
    watched: str
    mode: str


def _install_release(tools: Tools, watched: str, mode: str) -> Release:
    release, ns = f"rb-{suffix()}", f"rbac-{suffix()}"
    sets = ["--set", f"watchNamespaces={{{watched}}}"] if mode == "namespaced" else []
    tools.h("install", release, CHART, "-n", ns, "--create-namespace", "--skip-crds", "--wait", *sets)
    return Release(release, ns, f"{release}-triton-operator", watched, mode)


def _uninstall(tools: Tools, release: Release) -> None:
    tools.h("uninstall", release.name, "-n", release.namespace, "--ignore-not-found", check=False)
    tools.k("delete", "namespace", release.namespace, "--ignore-not-found", "--wait=false", check=False)


def _operator_for(
    tools: Tools, release: Release, sa: str, tmp_path: Path, env: dict[str, str]
) -> LocalOperator:
    token = tools.k("create", "token", sa, "-n", release.namespace, "--duration=1h").stdout.strip()
    assert token.count(".") == 2, "not a JWT"
    kubeconfig = write_token_kubeconfig(tools.kubeconfig, token, tmp_path / f"{sa}.kubeconfig")
    # the chart's args: --all-namespaces, or --namespace=X per watched namespace
    args = ["--all-namespaces"] if release.mode == "cluster" else [f"--namespace={release.watched}"]
    return LocalOperator(kubeconfig, args, tmp_path / f"{sa}.log", env=env)


def ready(kube: Client, namespace: str, name: str) -> dict[str, Any] | None:
    obj = get_ts(kube, namespace, name)
    return obj if observed(obj) and condition(obj, "Ready").get("status") == "True" else None


def owned_names(kube: Client, resource: Any, namespace: str, name: str) -> set[str]:
    return names(owned(kube, resource, namespace, name))


def _s3_repository(kube: Client, store: Any, namespace: str) -> dict[str, Any]:
    """A bucket with one model version, a credentials Secret in ``namespace``; the spec's repository.

    ``store``: the `seaweedfs` fixture (tests/conftest.py), which the operator pins from (the chart's
    `secrets: get` reads the credentials Secret)."""
    import storage_servers  # noqa: PLC0415

    s3 = storage_servers.s3_client(store.endpoint)
    bucket = f"rbac-{suffix()}"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="models/add/1/model.py", Body=b"# version 1\n")
    create_store_secret(kube, namespace, store.extra["access"], store.extra["secret"])
    return store_repository(store, bucket)


@pytest.mark.parametrize("mode", ["cluster", "namespaced"])
def test_operator_runs_a_full_lifecycle_with_only_the_charts_rbac(  # noqa: PLR0917 (fixtures)
    kube: Client,
    tools: Tools,
    crd: dict[str, Any],
    namespace: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    mode: str,
) -> None:
    """create -> Ready -> spec update (a new revision rolls out, the old is deleted) -> delete,
    by an operator whose only credential is a token of the chart's ServiceAccount.

    Cluster mode also pins the repository from a real S3 server, reading its credentials Secret
    (the chart's `secrets: get`); namespaced mode (Roles only) runs unpinned.
    """
    release = _install_release(tools, namespace, mode)
    operator: LocalOperator | None = None
    try:
        if mode == "cluster":
            store = request.getfixturevalue("seaweedfs")
            repository = _s3_repository(kube, store, namespace)
            env = {"TRITON_OPERATOR_PIN_REPOSITORIES": "true"}
        else:
            repository, env = dict(UNPINNED_REPOSITORY), {"TRITON_OPERATOR_PIN_REPOSITORIES": "false"}
        # the token's identity is the ServiceAccount's, and it is not the admin
        operator = _operator_for(tools, release, release.service_account, tmp_path, env)
        whoami = tools.k(f"--token={_token_of(operator)}", "auth", "whoami", "-o", "json").stdout
        username = json.loads(whoami)["status"]["userInfo"]["username"]
        assert username == f"system:serviceaccount:{release.namespace}:{release.service_account}"
        operator.start()

        body = tritonservice("lifecycle", namespace, repository=repository)
        apply(kube, body)
        first = wait_for(
            lambda: ready(kube, namespace, "lifecycle"), timeout=90, what="Ready=True after create"
        )
        rev_a = first["status"]["stableRevision"]
        if mode == "cluster":
            assert condition(first, "RepositoryReady")["reason"] == "ManifestPinned", first["status"]
        assert owned_names(kube, Deployment, namespace, "lifecycle") == {f"lifecycle-{rev_a}"}
        assert owned_names(kube, Service, namespace, "lifecycle") == {"lifecycle"}

        body["spec"]["serverArgs"] = ["--log-verbose=1"]
        apply(kube, body)

        def rolled() -> dict[str, Any] | None:
            # the new revision serves every pod; the old one's Deployment is gone or scaled to 0
            obj = ready(kube, namespace, "lifecycle")
            if obj is None or obj["status"]["stableRevision"] == rev_a:
                return None
            rev = obj["status"]["stableRevision"]
            pods = kube.list(Pod, namespace=namespace, labels={SERVICE_LABEL: "lifecycle"})
            if {p.metadata.labels[REVISION_LABEL] for p in pods if p.metadata and p.metadata.labels} != {rev}:
                return None
            deployments = kube.list(Deployment, namespace=namespace, labels={SERVICE_LABEL: "lifecycle"})
            others = [d for d in deployments if d.metadata and d.metadata.name != f"lifecycle-{rev}"]
            return obj if all(d.spec and d.spec.replicas == 0 for d in others) else None

        second = wait_for(
            rolled, timeout=90, what="the new revision to serve every pod and the old one to be scaled down"
        )
        rev_b = second["status"]["stableRevision"]
        assert rev_b != rev_a

        kube.delete(TS, "lifecycle", namespace=namespace)
        wait_for(
            lambda: (
                not any(
                    owned_names(kube, r, namespace, "lifecycle")
                    for r in (Deployment, ConfigMap, Service, Pod)
                )
            ),
            timeout=120,
            what="the owned objects to be garbage-collected",
        )
        log = operator.log()
        refused = refusals(log)
        assert not refused, "the operator was refused something:\n" + "\n".join(refused)
        assert "Traceback" not in log, log
    except BaseException:
        if operator is not None:
            sys.stdout.write(f"\n----- operator log ({operator.log_path}) -----\n{operator.log()[-20000:]}\n")
        raise
    finally:
        if operator is not None:
            operator.stop()
        _uninstall(tools, release)


def _token_of(operator: LocalOperator) -> str:
    config = json.loads(operator.kubeconfig.read_text())
    token: str = config["users"][0]["user"]["token"]
    return token


# ----------------------------------------------------------------- without deployments: it fails, visibly


@dataclass
class WeakRun:
    operator: LocalOperator
    namespace: str
    username: str


@pytest.fixture(scope="module")
def weak_run(
    kube: Client, tools: Tools, crd: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WeakRun]:
    """The operator with the chart's ClusterRole minus its deployments rule, one TritonService created.

    Yields once the operator's log shows the refusal; the run goes on while the tests look.
    """
    workload = f"weak-{suffix()}"
    tools.k("create", "namespace", workload)
    release = _install_release(tools, workload, "cluster")
    weak_sa, weak_role = f"{release.name}-weak", f"{release.name}-weak"
    operator: LocalOperator | None = None
    try:
        rules = json.loads(tools.k("get", "clusterrole", release.service_account, "-o", "json").stdout)[
            "rules"
        ]
        without = [r for r in rules if "deployments" not in r.get("resources", [])]
        assert len(without) == len(rules) - 1
        tools.k("create", "serviceaccount", weak_sa, "-n", release.namespace)
        tools.k(
            "apply",
            "-f",
            "-",
            stdin=json.dumps(
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRole",
                    "metadata": {"name": weak_role},
                    "rules": without,
                }
            ),
        )
        tools.k(
            "create",
            "clusterrolebinding",
            weak_role,
            f"--clusterrole={weak_role}",
            f"--serviceaccount={release.namespace}:{weak_sa}",
        )
        tmp = tmp_path_factory.mktemp("weak")
        operator = _operator_for(tools, release, weak_sa, tmp, {"TRITON_OPERATOR_PIN_REPOSITORIES": "false"})
        operator.start()
        apply(kube, tritonservice("weak", workload))
        weak = operator

        def refused() -> bool:
            log = weak.log()
            return "deployments.apps is forbidden" in log and "failed temporarily" in log

        wait_for(
            refused,
            timeout=120,
            what="the operator to report that it may not touch Deployments",
        )
        yield WeakRun(
            operator,
            workload,
            f"system:serviceaccount:{release.namespace}:{weak_sa}",
        )
    finally:
        if operator is not None:
            operator.stop()
        tools.k("delete", "clusterrolebinding,clusterrole", weak_role, "--ignore-not-found", check=False)
        _uninstall(tools, release)
        tools.k("delete", "namespace", workload, "--ignore-not-found", "--wait=false", check=False)


def test_without_deployments_permission_the_operator_fails_visibly(kube: Client, weak_run: WeakRun) -> None:
    """The same run, with a ServiceAccount lacking the deployments rule, is refused and says so."""
    log = weak_run.operator.log()
    refused = refusals(log)
    assert refused, log
    assert any(weak_run.username in line and "deployments" in line for line in refused), refused
    assert owned_names(kube, Deployment, weak_run.namespace, "weak") == set()
    obj = as_dict(kube.get(TS, "weak", namespace=weak_run.namespace))
    assert condition(obj, "Ready").get("status") != "True"


def test_a_refused_reconcile_is_posted_as_a_warning_event(kube: Client, weak_run: WeakRun) -> None:
    def posted() -> list[dict[str, Any]]:
        events = [e.to_dict() for e in kube.list(Event, namespace=weak_run.namespace)]
        return [
            e
            for e in events
            if e["involvedObject"].get("kind") == "TritonService"
            and e["involvedObject"].get("name") == "weak"
            and "forbidden" in e.get("message", "")
        ]

    # kopf posts Events from a background task right after the log record: a few seconds at most
    events = wait_for(posted, timeout=20, what="an Event on the TritonService naming the refusal")
    assert events[0]["type"] in ("Warning", "Error")
