"""GitOps: what Argo CD and Flux see of a TritonService and the objects the operator owns.

- Re-applying the same TritonService (server-side as Argo CD/Flux do, or client-side as Argo CD
  does by default) makes no write at all, and the operator is not even woken.
- The user's field manager owns the spec, the operator only the status (kopf writes nothing to
  it): a changed spec re-applied without --force-conflicts never conflicts, and the
  operator never reverts it. The owned Deployments are the operator's: a GitOps tool applying
  one of their fields gets a conflict naming triton-operator, and a `kubectl scale` is reverted.
- docs/gitops/: the Argo CD health check (Lua, run here as Lua 5.1 in a sandbox like Argo CD's),
  the Flux health expressions (CEL), and the Argo CD/Flux examples validated with kubeconform
  against the CRDs of pinned Argo CD and Flux releases.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import ConfigMap, Service

from e2e_helpers import (
    CRASH,
    ENSEMBLE_OF_A_MISSING_MODEL,
    NEVER_READY,
    get_ts,
    owned,
    tritonservice,
    versions,
    wait_condition,
)
from testkit import load_chartlib, sh, wait_for

REPO = Path(__file__).resolve().parents[2]
GITOPS = REPO / "docs" / "gitops"
HEALTH_LUA = GITOPS / "argocd-health.lua"
USER = "argocd-controller"  # Argo CD's field manager with ServerSideApply=true
OPERATOR = "triton-operator"


chartlib = load_chartlib()


# ----------------------------------------------------------------- the Argo CD health check (Lua)

# What Argo CD's gopher-lua sandbox lacks, or what a health check must not use: removed here, so
# a script that relies on any of it fails in this test as it would in Argo CD.
LUA_REMOVED = (
    "os",
    "io",
    "string",
    "math",
    "debug",
    "package",
    "require",
    "module",
    "dofile",
    "loadfile",
    "load",
    "loadstring",
    "coroutine",
    "collectgarbage",
    "getfenv",
    "setfenv",
    "newproxy",
    "python",
)


def argocd_health(obj: dict[str, Any], script: str | None = None) -> dict[str, str]:
    """Run the health check on ``obj`` as Argo CD does: Lua 5.1, ``obj`` global, a table returned."""
    lua51: Any = pytest.importorskip("lupa.lua51", reason="lupa (the test extras) runs the Lua check")
    runtime = lua51.LuaRuntime(register_eval=False, register_builtins=False, unpack_returned_tuples=True)
    env = runtime.globals()
    for name in LUA_REMOVED:
        env[name] = None
    env.obj = runtime.table_from(json.loads(json.dumps(obj)), recursive=True)
    result = runtime.execute(script if script is not None else HEALTH_LUA.read_text())
    assert result is not None, "the health check returned nothing"
    return {str(k): str(v) for k, v in dict(result).items()}


def health_cases() -> list[tuple[str, dict[str, Any], dict[str, str]]]:
    spec = yaml.safe_load((GITOPS / "health_test.yaml").read_text())
    return [
        (
            Path(t["inputPath"]).stem,
            yaml.safe_load((GITOPS / t["inputPath"]).read_text()),
            dict(t["healthStatus"]),
        )
        for t in spec["tests"]
    ]


@pytest.mark.parametrize(
    ("obj", "expected"), [c[1:] for c in health_cases()], ids=[c[0] for c in health_cases()]
)
def test_argocd_health_check_cases(obj: dict[str, Any], expected: dict[str, str]) -> None:
    assert argocd_health(obj) == expected


def test_health_cases_cover_every_health_status() -> None:
    assert {c[2]["status"] for c in health_cases()} == {"Healthy", "Progressing", "Degraded", "Suspended"}


@pytest.mark.parametrize(
    "body",
    [
        'hs = {}; hs.status = string.upper("healthy"); return hs',
        "hs = {}; hs.status = tostring(os.time()); return hs",
        'local json = require("json"); return {status = "Healthy"}',
    ],
    ids=["string-library", "os-library", "require"],
)
def test_the_lua_sandbox_refuses_what_argocd_does_not_offer(body: str) -> None:
    """A check using a library the sandbox removes fails here (so the real one is held to it)."""
    lua_error: Any = pytest.importorskip("lupa.lua51").LuaError
    with pytest.raises(lua_error):
        argocd_health({"metadata": {"generation": 1}}, body)


def test_argocd_cm_carries_the_health_check_verbatim() -> None:
    cm = yaml.safe_load((GITOPS / "argocd-cm.yaml").read_text())
    assert (cm["kind"], cm["metadata"]["name"]) == ("ConfigMap", "argocd-cm")
    key = "resource.customizations.health.triton-operator.io_TritonService"
    assert cm["data"][key] == HEALTH_LUA.read_text()


# ----------------------------------------------------------------- the Flux health expressions (CEL)

# Flux's mapping of each Argo CD health: Flux has no Suspended; a held rollout is current there.
FLUX_OF_ARGOCD = {
    "Healthy": "Current",
    "Suspended": "Current",
    "Degraded": "Failed",
    "Progressing": "InProgress",
}


def flux_exprs() -> dict[str, str]:
    docs = list(yaml.safe_load_all((GITOPS / "flux" / "tritonservices-kustomization.yaml").read_text()))
    (check,) = [
        c
        for d in docs
        for c in d["spec"].get("healthCheckExprs", [])
        if (c["apiVersion"], c["kind"]) == ("triton-operator.io/v1alpha1", "TritonService")
    ]
    return {k: v for k, v in check.items() if k in ("inProgress", "failed", "current")}


def flux_health(obj: dict[str, Any], exprs: dict[str, str]) -> str:
    """kustomize-controller's evaluation (fluxcd/pkg runtime/cel StatusEvaluator, RFC 0009):
    observedGeneration != generation is InProgress; then inProgress, failed, current in this
    order, the first true one wins; none true is InProgress; an evaluation error is Unknown."""
    celpy: Any = pytest.importorskip("celpy", reason="cel-python (the test extras) evaluates CEL")
    observed = obj.get("status", {}).get("observedGeneration")
    if observed is not None and observed != obj["metadata"].get("generation"):
        return "InProgress"
    env = celpy.Environment()
    activation = {k: celpy.json_to_cel(v) for k, v in json.loads(json.dumps(obj)).items()}
    for key, status in (("inProgress", "InProgress"), ("failed", "Failed"), ("current", "Current")):
        if not exprs.get(key):
            continue
        try:
            result = env.program(env.compile(exprs[key])).evaluate(activation)
        except celpy.CELEvalError:
            return "Unknown"
        if isinstance(result, celpy.CELEvalError):
            return "Unknown"
        if bool(result):
            return status
    return "InProgress"


@pytest.mark.parametrize(
    ("obj", "expected"), [c[1:] for c in health_cases()], ids=[c[0] for c in health_cases()]
)
def test_flux_health_expressions_agree_with_the_argocd_check(
    obj: dict[str, Any], expected: dict[str, str]
) -> None:
    got = flux_health(obj, flux_exprs())
    if "status" not in obj:
        # cel-go (Flux) fails on the missing `status` and keeps polling: Unknown, i.e. not yet Current
        assert got in ("InProgress", "Unknown")
    else:
        assert got == FLUX_OF_ARGOCD[expected["status"]]


# ----------------------------------------------------------------- the examples


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_gitops_examples_are_complete_and_point_at_this_repository() -> None:
    """Always runs (no tool needed): the fields each kind requires, and references that resolve."""
    crd = yaml.safe_load((REPO / "crds" / "tritonservices.yaml").read_text())
    served = {f"{crd['spec']['group']}/{v['name']}" for v in crd["spec"]["versions"] if v["served"]}
    apps = _docs(GITOPS / "argocd-application.yaml")
    assert [a["kind"] for a in apps] == ["Application", "Application"]
    for app in apps:
        assert app["apiVersion"] == "argoproj.io/v1alpha1"
        spec = app["spec"]
        assert spec["project"] and spec["destination"]["server"] and spec["destination"]["namespace"]
        assert spec["source"]["repoURL"] and spec["source"]["path"] and spec["source"]["targetRevision"]
        assert "ServerSideApply=true" in spec["syncPolicy"]["syncOptions"]
    chart_app = next(a for a in apps if a["spec"]["source"]["path"] == "charts/triton-operator")
    assert (REPO / chart_app["spec"]["source"]["path"] / "Chart.yaml").is_file()
    values = chart_app["spec"]["source"]["helm"]["valuesObject"]
    chart_values = yaml.safe_load((REPO / "charts" / "triton-operator" / "values.yaml").read_text())
    assert set(values) <= set(chart_values), set(values) - set(chart_values)

    sources = {d["metadata"]["name"]: d for d in _docs(GITOPS / "flux" / "sources.yaml")}
    assert all(
        d["kind"] == "GitRepository" and d["spec"]["url"] and d["spec"]["ref"] for d in sources.values()
    )
    (release,) = _docs(GITOPS / "flux" / "helmrelease.yaml")
    chart = release["spec"]["chart"]["spec"]
    assert chart["sourceRef"]["kind"] == "GitRepository" and chart["sourceRef"]["name"] in sources
    assert (REPO / chart["chart"] / "Chart.yaml").is_file()
    assert set(release["spec"]["values"]) <= set(chart_values)
    kustomizations = {
        d["metadata"]["name"]: d for d in _docs(GITOPS / "flux" / "tritonservices-kustomization.yaml")
    }
    for k in kustomizations.values():
        assert k["kind"] == "Kustomization" and k["spec"]["interval"] and k["spec"]["path"]
        assert k["spec"]["sourceRef"]["kind"] == "GitRepository"
        for dep in k["spec"].get("dependsOn", []):
            assert dep["name"] in kustomizations
    services = kustomizations["tritonservices"]["spec"]
    assert services["sourceRef"]["name"] in sources
    assert {c["apiVersion"] for c in services["healthCheckExprs"]} <= served
    assert set(flux_exprs()) >= {"current", "failed"}


def _validate(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "charts" / "validate"), "--gitops", *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def gitops_schemas() -> None:
    """kubeconform, the Kubernetes OpenAPI spec and the Argo CD/Flux CRDs (Go module cache or proxy)."""
    if chartlib.find_tool("kubeconform") is None or chartlib.find_tool("helm") is None:
        pytest.skip("kubeconform/helm not built (python3 e2e/cluster.py build)")
    try:
        chartlib.openapi_spec()
        chartlib.gitops_crds()
    except chartlib.ToolMissingError as exc:
        pytest.skip(f"no schemas offline: {exc}")


def test_gitops_examples_validate_against_the_argocd_and_flux_crds(gitops_schemas: None) -> None:
    proc = _validate()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    summaries = [line for line in out.splitlines() if "Summary:" in line]
    files = chartlib.gitops_files()
    assert len(summaries) == len(files), out
    assert all("Invalid: 0, Errors: 0, Skipped: 0" in s for s in summaries), out
    kinds = Counter(d["kind"] for f in files for d in _docs(f))
    assert {
        "Application",
        "GitRepository",
        "Kustomization",
        "HelmRelease",
        "ConfigMap",
        "TritonService",
    } <= set(kinds)


@pytest.mark.parametrize(
    ("file", "mutate", "message"),
    [
        (
            "flux/tritonservices-kustomization.yaml",
            lambda d: d["spec"].update(healthCheckExpr=d["spec"].pop("healthCheckExprs", [])),
            "healthCheckExpr",
        ),
        ("flux/helmrelease.yaml", lambda d: d["spec"]["install"].update(crds="Always"), "crds"),
        (
            "argocd-application.yaml",
            lambda d: d["spec"]["syncPolicy"]["automated"].update(prunee=True),
            "prunee",
        ),
        ("flux/sources.yaml", lambda d: d["spec"].update(interval=60), "interval"),
    ],
    ids=["flux-unknown-field", "flux-bad-enum", "argocd-unknown-field", "flux-wrong-type"],
)
def test_gitops_validation_rejects_broken_examples(
    gitops_schemas: None, tmp_path: Path, file: str, mutate: Callable[[dict[str, Any]], None], message: str
) -> None:
    docs = _docs(GITOPS / file)
    mutate(next((d for d in docs if d["metadata"]["name"] == "tritonservices"), docs[0]))
    broken = tmp_path / Path(file).name
    broken.write_text(yaml.safe_dump_all(docs))
    proc = _validate("--file", broken)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert message in proc.stdout, proc.stdout


# ----------------------------------------------------------------- against the cluster


class Kubectl:
    def __init__(self, binary: str, kubeconfig: Path) -> None:
        self.binary, self.kubeconfig = binary, kubeconfig

    def __call__(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return sh(
            self.binary, f"--kubeconfig={self.kubeconfig}", *args, stdin=stdin, check=check, timeout=120
        )

    def apply(self, body: dict[str, Any], how: str = "server-side", manager: str = USER, **kw: Any) -> str:
        """`kubectl apply` of ``body`` as a GitOps tool does it: server-side under ``manager``, or
        client-side (Argo CD's default, the last-applied-configuration annotation)."""
        args = ["apply", "-f", "-"]
        if how == "server-side":
            args += ["--server-side", f"--field-manager={manager}"]
        return self(*args, stdin=json.dumps(body), **kw).stdout


@pytest.fixture
def k(cluster: Path, kubectl: str | None) -> Kubectl:
    if kubectl is None:
        pytest.skip("no kubectl binary (python3 e2e/cluster.py build provides one)")
    return Kubectl(kubectl, cluster)


def owned_objects(kube: Client, namespace: str, name: str) -> list[dict[str, Any]]:
    return [
        o for resource in (Deployment, ConfigMap, Service) for o in owned(kube, resource, namespace, name)
    ]


def reconciles(operator: Any) -> int:
    """How many reconciles the operator has run: its own /metrics (port from its log)."""
    m = re.search(r"metrics on http://0\.0\.0\.0:(\d+)/metrics", operator.log_path.read_text())
    assert m, "the operator did not log its metrics port"
    with urllib.request.urlopen(f"http://127.0.0.1:{m.group(1)}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("triton_operator_reconcile_duration_seconds_count")
    )


# The operator writes by server-side apply and merge patches; the metrics are cluster-wide,
# so the controllers' own requests (PUT of Deployment status, pod status patches) are left out.
WRITE_VERBS = {"APPLY", "PATCH"}
WRITTEN = ("tritonservices", "deployments", "configmaps", "services")


def write_requests(k: Kubectl) -> Counter[str]:
    """Write requests the API server has served, per resource[/subresource] (its own /metrics)."""
    counts: Counter[str] = Counter()
    for line in k("get", "--raw", "/metrics").stdout.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        if labels.get("dry_run"):  # e.g. `kubectl diff --server-side`: nothing is stored
            continue
        if labels.get("verb") in WRITE_VERBS and labels.get("resource") in WRITTEN:
            key = labels["resource"] + (f"/{labels['subresource']}" if labels.get("subresource") else "")
            counts[key] += int(float(line.rsplit(" ", 1)[1]))
    return counts


def settle(kube: Client, operator: Any, namespace: str, name: str) -> dict[str, str]:
    """Wait until neither the objects nor the operator's reconcile count move for 2 s (pod events
    of a fresh rollout trail the Ready condition); return the objects' resourceVersions."""
    history: list[tuple[int, dict[str, str]]] = []

    def still() -> dict[str, str] | None:
        history.append((reconciles(operator), versions(kube, namespace, name)))
        recent = history[-5:]
        return recent[-1][1] if len(recent) == 5 and all(h == recent[0] for h in recent) else None

    return wait_for(still, timeout=60, interval=0.5, what="the operator to settle")


def managed(obj: dict[str, Any]) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = obj["metadata"].get("managedFields", [])
    return entries


@pytest.mark.cluster
@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["server-side", "client-side"])
def test_reapplying_the_same_tritonservice_writes_nothing(
    kube: Client, namespace: str, operator: Any, k: Kubectl, how: str
) -> None:
    body = tritonservice("synced", namespace)
    k.apply(body, how)  # the first sync
    wait_condition(kube, namespace, "synced", "Ready", "True")
    before = settle(kube, operator, namespace, "synced")
    reconciled = reconciles(operator)

    out = k.apply(body, how)  # the next sync: the same manifest
    assert ("serverside-applied" if how == "server-side" else "unchanged") in out, out
    # the API server stored nothing: the operator wrote no field the user's apply would reclaim
    assert versions(kube, namespace, "synced") == before
    writes = write_requests(k)
    if how == "server-side":
        # and a server-side diff (Argo CD's ServerSideDiff, Flux's drift detection) finds no drift
        diff = k(
            "diff", "--server-side", f"--field-manager={USER}", "-f", "-", stdin=json.dumps(body), check=False
        )
        assert diff.returncode == 0, diff.stdout + diff.stderr

    time.sleep(5)  # a quiet period: anything the operator did would show
    assert versions(kube, namespace, "synced") == before, "something was written after the re-apply"
    assert reconciles(operator) == reconciled, "the operator was woken by a re-apply that changed nothing"
    assert write_requests(k) == writes, "a write request was made during the quiet period"


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_a_label_or_annotation_from_the_gitops_tool_leaves_the_operators_objects_alone(
    kube: Client, namespace: str, operator: Any, k: Kubectl
) -> None:
    """Argo CD adds its tracking annotation, Flux its labels: a metadata-only change (same
    generation) re-runs the reconcile, which finds nothing to change, and nothing is written (kopf
    keeps no record of what it handled on the object); then quiet."""
    body = tritonservice("tracked", namespace)
    k.apply(body)
    wait_condition(kube, namespace, "tracked", "Ready", "True")
    before = settle(kube, operator, namespace, "tracked")
    ts_before = get_ts(kube, namespace, "tracked")
    status_time = next(m["time"] for m in managed(ts_before) if m["manager"] == OPERATOR)

    body["metadata"]["annotations"] = {
        "argocd.argoproj.io/tracking-id": f"models:triton-operator.io/TritonService:{namespace}/tracked"
    }
    body["metadata"]["labels"] = {"kustomize.toolkit.fluxcd.io/name": "tritonservices"}
    k.apply(body)
    after = settle(kube, operator, namespace, "tracked")
    ts = get_ts(kube, namespace, "tracked")
    assert ts["metadata"]["generation"] == ts_before["metadata"]["generation"]
    assert {key: v for key, v in after.items() if key != "TritonService"} == {
        key: v for key, v in before.items() if key != "TritonService"
    }, "an owned object was written"
    assert ts["status"] == ts_before["status"]
    assert next(m["time"] for m in managed(ts) if m["manager"] == OPERATOR) == status_time
    assert {m["manager"] for m in managed(ts)} <= {USER, OPERATOR}, "kopf (or another) wrote to it"
    time.sleep(3)
    assert versions(kube, namespace, "tracked") == after


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_the_user_owns_the_spec_and_the_operator_only_the_status(
    kube: Client, namespace: str, operator: Any, k: Kubectl
) -> None:
    body = tritonservice("owned", namespace)
    k.apply(body)
    first = wait_condition(kube, namespace, "owned", "Ready", "True")

    def check_ownership(obj: dict[str, Any]) -> None:
        by_manager = {m["manager"]: m for m in managed(obj)}
        spec_owners = {m["manager"] for m in managed(obj) if "f:spec" in m["fieldsV1"]}
        assert spec_owners == {USER}, spec_owners
        operator_entry = by_manager[OPERATOR]
        assert operator_entry["operation"] == "Apply" and operator_entry["subresource"] == "status"
        assert set(operator_entry["fieldsV1"]) == {"f:status"}
        # kopf writes nothing to a TritonService (no progress, no last handled spec)
        assert set(by_manager) == {USER, OPERATOR}, set(by_manager)

    check_ownership(first)

    # a changed spec, applied again WITHOUT --force-conflicts: no conflict, and it stays as applied
    body["spec"]["replicas"] = 3
    body["spec"]["serverArgs"] = ["--log-verbose=1"]
    k.apply(body)
    second = wait_condition(kube, namespace, "owned", "Ready", "True", reason="Available")
    wait_for(
        lambda: get_ts(kube, namespace, "owned")["status"].get("readyReplicas") == 3,
        timeout=90,
        what="3 ready replicas of the new revision",
    )
    final = get_ts(kube, namespace, "owned")
    assert final["spec"]["replicas"] == 3 and final["spec"]["serverArgs"] == ["--log-verbose=1"]
    assert final["status"]["stableRevision"] != first["status"]["stableRevision"]
    assert second["metadata"]["generation"] == final["metadata"]["generation"]
    check_ownership(final)


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_owned_objects_are_the_operators_and_a_manual_scale_is_reverted(
    kube: Client, namespace: str, operator: Any, k: Kubectl
) -> None:
    k.apply(tritonservice("scaled", namespace))
    ready = wait_condition(kube, namespace, "scaled", "Ready", "True")
    revision = ready["status"]["stableRevision"]
    settle(kube, operator, namespace, "scaled")
    for obj in owned_objects(kube, namespace, "scaled"):
        managers = {m["manager"] for m in managed(obj)}
        assert managers <= {OPERATOR, "kube-controller-manager"}, (obj["kind"], managers)
        content = {m["manager"] for m in managed(obj) if {"f:spec", "f:data"} & set(m["fieldsV1"])}
        assert content == {OPERATOR}, (obj["kind"], content)
    name = f"scaled-{revision}"

    # a GitOps tool applying a field the operator owns is told so (and must not force it)
    patch = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": 5},
    }
    refused = k(
        "apply", "--server-side", f"--field-manager={USER}", "-f", "-", stdin=json.dumps(patch), check=False
    )
    assert refused.returncode != 0
    assert "conflict" in refused.stderr.lower() and OPERATOR in refused.stderr, refused.stderr

    # `kubectl scale` of an owned Deployment: the operator puts spec.replicas back (the
    # TritonService's spec.replicas is the one to change) and takes the field back
    generation = kube.get(Deployment, name, namespace=namespace).to_dict()["metadata"]["generation"]
    k("scale", f"deployment/{name}", "-n", namespace, "--replicas=5")

    def reverted() -> dict[str, Any] | None:
        dep: dict[str, Any] = kube.get(Deployment, name, namespace=namespace).to_dict()
        back = dep["metadata"]["generation"] >= generation + 2 and dep["spec"]["replicas"] == 2
        return dep if back else None

    dep = wait_for(reverted, timeout=90, what="the operator to revert the manual scale")
    assert {m["manager"] for m in managed(dep)} <= {OPERATOR, "kube-controller-manager"}
    assert get_ts(kube, namespace, "scaled")["spec"]["replicas"] == 2


@pytest.mark.cluster
@pytest.mark.timeout(400)
def test_health_checks_follow_live_tritonservices(
    kube: Client, namespace: str, operator: Any, k: Kubectl
) -> None:
    """The Argo CD Lua and the Flux CEL on objects the operator is driving right now."""
    exprs = flux_exprs()

    def both(obj: dict[str, Any]) -> tuple[str, str]:
        return argocd_health(obj)["status"], flux_health(obj, exprs)

    body = tritonservice(
        "live", namespace, rollout={"strategy": "Canary", "steps": [{"setWeight": 50}, {"pause": {}}]}
    )
    k.apply(body)
    obj = wait_condition(kube, namespace, "live", "Ready", "True")
    assert both(obj) == ("Healthy", "Current")

    held = copy.deepcopy(body)
    held["spec"]["podAnnotations"] = {NEVER_READY: "true"}
    k.apply(held)
    obj = wait_condition(kube, namespace, "live", "Progressing", "True")
    assert both(obj) == ("Progressing", "InProgress")

    promoted = copy.deepcopy(body)
    promoted["spec"]["serverArgs"] = ["--log-verbose=1"]
    k.apply(promoted)
    obj = wait_condition(kube, namespace, "live", "Progressing", "False", reason="StepPaused")
    assert both(obj) == ("Suspended", "Current")

    invalid = copy.deepcopy(promoted)  # admitted by the CRD, refused by the operator
    invalid["spec"]["models"].append(copy.deepcopy(ENSEMBLE_OF_A_MISSING_MODEL))
    k.apply(invalid)
    obj = wait_condition(kube, namespace, "live", "Ready", "False", reason="InvalidSpec")
    health = argocd_health(obj)
    assert health["status"] == "Degraded" and "missing" in health["message"], health
    assert flux_health(obj, exprs) == "Failed"

    k.apply(tritonservice("crashy", namespace, replicas=1, podAnnotations={CRASH: "true"}))
    obj = wait_condition(kube, namespace, "crashy", "Degraded", "True")
    assert both(obj) == ("Degraded", "Failed")
