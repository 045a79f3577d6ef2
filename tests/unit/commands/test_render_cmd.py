"""`triton-operator render`: every desired object as multi-document YAML, without a cluster."""

from __future__ import annotations

import argparse
import copy
import datetime
import io
from pathlib import Path
from typing import Any

import pytest
import yaml

from memkube import MemKube
from testkit import REPO
from triton_operator.commands import render
from triton_operator.core.decision.actions import stamped
from triton_operator.core.objects.names import APPLIED_ANNOTATION, PLACEHOLDER_UID
from triton_operator.reconcile.reconcile_pass import reconcile
from triton_operator.settings import Settings
from tritonservice_bodies import fetcher

EXAMPLES = REPO / "examples"
NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)


def run_render(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    render.register(parser.add_subparsers())
    args = parser.parse_args(["render", *argv])
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err


def docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


@pytest.mark.parametrize("example", ["tiny.yaml", "resnet.yaml"])
def test_examples_render_configmap_deployment_service(
    example: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_render("-f", str(EXAMPLES / example), capsys=capsys)
    assert code == 0, err
    objects = docs(out)
    kinds = [o["kind"] for o in objects]
    source = yaml.safe_load((EXAMPLES / example).read_text())
    # more than one replica: a PodDisruptionBudget keeps node drains from taking them all
    budget = ["PodDisruptionBudget"] if source["spec"].get("replicas", 1) > 1 else []
    assert kinds == ["ConfigMap", "Deployment", "Service", *budget]
    name = source["metadata"]["name"]
    cm, dep, svc = objects[:3]
    revision = dep["metadata"]["labels"]["triton-operator.io/revision"]
    assert dep["metadata"]["name"] == cm["metadata"]["name"] == f"{name}-{revision}"
    assert svc["metadata"]["name"] == name
    for obj in objects:
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref["uid"] == PLACEHOLDER_UID
        assert ref["name"] == name
    assert PLACEHOLDER_UID in out.splitlines()[1] and out.splitlines()[1].startswith("#")
    assert "unpinned" in err
    for model in source["spec"]["models"]:
        assert f"{model['name']}.config.pbtxt" in cm["data"]


def test_namespace_defaults_and_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = yaml.safe_load((EXAMPLES / "tiny.yaml").read_text())
    path = tmp_path / "ts.yaml"
    path.write_text(yaml.safe_dump(doc))
    _, out, _ = run_render("-f", str(path), capsys=capsys)
    assert {o["metadata"]["namespace"] for o in docs(out)} == {"default"}
    _, out, _ = run_render("-f", str(path), "-n", "ml", capsys=capsys)
    assert {o["metadata"]["namespace"] for o in docs(out)} == {"ml"}


def test_invalid_spec_prints_nothing_and_names_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = yaml.safe_load((EXAMPLES / "tiny.yaml").read_text())
    doc["spec"]["models"][0]["config"]["maxBatchSizee"] = 3
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, out, err = run_render("-f", str(path), capsys=capsys)
    assert code == 1
    assert out == ""
    assert "spec.models[0].config" in err
    assert "maxBatchSizee" in err


def test_pvc_repository_needs_no_manifest(capsys: pytest.CaptureFixture[str]) -> None:
    doc = yaml.safe_load((EXAMPLES / "tiny.yaml").read_text())
    doc["spec"]["repository"] = {"uri": "pvc://models/tiny"}
    out, err = io.StringIO(), io.StringIO()
    code = render.render([doc], Settings(), out=out, err=err)
    assert code == 0
    assert err.getvalue() == ""
    cm, dep, _ = docs(out.getvalue())
    assert '"pinned":false' in cm["data"]["manifest.json"]  # a claim is linked, not pinned
    sync = fetcher(dep["spec"]["template"]["spec"])
    assert "--pvc-root" in sync["args"]


def test_several_documents_and_other_kinds(capsys: pytest.CaptureFixture[str]) -> None:
    tiny = yaml.safe_load((EXAMPLES / "tiny.yaml").read_text())
    other = {**tiny, "metadata": {"name": "tiny2"}}
    out, err = io.StringIO(), io.StringIO()
    code = render.render(
        [tiny, {"kind": "ConfigMap", "metadata": {"name": "x"}}, other], Settings(), out=out, err=err
    )
    assert code == 0
    names = [o["metadata"]["name"] for o in docs(out.getvalue()) if o["kind"] == "Service"]
    assert names == ["tiny", "tiny2"]
    assert "skipped" in err.getvalue()


def test_pin_says_why_it_did_not(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_render("-f", str(EXAMPLES / "tiny.yaml"), "--pin", capsys=capsys)
    # no store answers at the example's endpoint: the failure is reported and the output unpinned
    assert code == 0
    assert "--pin: listing s3://models/tiny failed" in err
    assert "listing failed" in err
    assert "Manifest: unpinned" in out


def test_settings_choose_images(capsys: pytest.CaptureFixture[str]) -> None:
    doc = yaml.safe_load((EXAMPLES / "tiny.yaml").read_text())
    out, err = io.StringIO(), io.StringIO()
    render.render([doc], Settings(default_image="reg/triton:x", sync_image="reg/op:y"), out=out, err=err)
    pod = docs(out.getvalue())[1]["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "reg/triton:x"
    assert fetcher(pod)["image"] == "reg/op:y"


def test_render_prints_the_revision_services_a_gateway_rollout_applies(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_render("-f", str(EXAMPLES / "canary-gateway.yaml"), capsys=capsys)
    assert code == 0, err
    objects = docs(out)
    source = next(
        d for d in docs((EXAMPLES / "canary-gateway.yaml").read_text()) if d["kind"] == "TritonService"
    )
    name = source["metadata"]["name"]
    services = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Service"}
    assert set(services) == {name, f"{name}-stable", f"{name}-canary"}
    revision = next(o for o in objects if o["kind"] == "Deployment")["metadata"]["labels"][
        "triton-operator.io/revision"
    ]
    # before any rollout both revision Services select the one revision there is
    for role in ("stable", "canary"):
        assert services[f"{name}-{role}"]["spec"]["selector"]["triton-operator.io/revision"] == revision


def test_the_autoscaled_example_renders_its_owned_hpa(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_render("-f", str(EXAMPLES / "autoscaled.yaml"), capsys=capsys)
    assert code == 0, err
    objects = docs(out)
    source = yaml.safe_load((EXAMPLES / "autoscaled.yaml").read_text())
    assert "replicas" not in source["spec"]  # the HPA owns it (README: GitOps and autoscaling)
    (hpa,) = [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"]["name"] == source["metadata"]["name"]
    wanted = source["spec"]["autoscaling"]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (
        wanted["minReplicas"],
        wanted["maxReplicas"],
    )
    names = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]]
    assert names == ["triton_queue_time_per_request_microseconds", "triton_inferences_per_second"]
    assert hpa["spec"]["behavior"] == wanted["behavior"]


@pytest.mark.parametrize("example", ["tiny.yaml", "canary-gateway.yaml", "autoscaled.yaml"])
async def test_render_prints_what_a_first_reconcile_pass_applies(example: str) -> None:
    """render and the reconcile share one decision (core.decision.decide): the objects render prints are the
    ones a first pass over the same TritonService applies, in the same order, with the same content
    (the real uid in ownerReferences, and so in the digest of a Deployment, aside)."""
    source = next(d for d in docs((EXAMPLES / example).read_text()) if d["kind"] == "TritonService")
    source["metadata"]["namespace"] = "ml"
    out, err = io.StringIO(), io.StringIO()
    assert render.render([source], Settings(), out=out, err=err) == 0, err.getvalue()
    kube = MemKube()
    stored = kube.put(source)
    await reconcile(kube, "ml", source["metadata"]["name"], Settings(), clock=lambda: NOW)
    uid = stored["metadata"]["uid"]

    def comparable(obj: dict[str, Any]) -> dict[str, Any]:
        metadata = {
            k: v for k, v in obj["metadata"].items() if k not in ("resourceVersion", "generation", "uid")
        }
        for ref in metadata.get("ownerReferences") or []:
            ref["uid"] = PLACEHOLDER_UID if ref["uid"] == uid else ref["uid"]
        out = {**{k: v for k, v in obj.items() if k != "status"}, "metadata": metadata}
        # The digest of what was applied covers the uid: render's is that of its placeholder.
        return stamped(out) if APPLIED_ANNOTATION in (metadata.get("annotations") or {}) else out

    applied = [comparable(copy.deepcopy(kube.objects[key])) for key in kube.applied]
    assert applied == docs(out.getvalue())


def test_render_writes_yaml_as_dump_yaml_does(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One YAML writer: strings YAML 1.1 reads as a bool are quoted (kubectl would read `y` as true
    and refuse a nodeSelector of booleans), multi-line strings stay literal blocks."""
    doc = yaml.safe_load((EXAMPLES / "tiny.yaml").read_text())
    doc["spec"]["nodeSelector"] = {"fast": "y"}
    path = tmp_path / "ts.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, out, err = run_render("-f", str(path), capsys=capsys)
    assert code == 0, err
    assert "fast: 'y'\n" in out and "fast: y\n" not in out
    assert "add_sub.config.pbtxt: |" in out
    cm, dep = docs(out)[:2]
    assert dep["spec"]["template"]["spec"]["nodeSelector"]["fast"] == "y"
    assert "\n" in cm["data"]["add_sub.config.pbtxt"]


def test_output_json_is_one_list_of_every_object_and_name_one_line_each(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json  # noqa: PLC0415

    code, yaml_out, _ = run_render("-f", str(EXAMPLES / "tiny.yaml"), capsys=capsys)
    assert code == 0
    code, out, _ = run_render("-f", str(EXAMPLES / "tiny.yaml"), "-o", "json", capsys=capsys)
    assert code == 0
    listed = json.loads(out)
    assert listed["apiVersion"] == "v1" and listed["kind"] == "List"
    assert listed["items"] == docs(yaml_out)  # the same objects as the YAML, without the header comments
    code, out, _ = run_render("-f", str(EXAMPLES / "tiny.yaml"), "-o", "name", capsys=capsys)
    assert code == 0
    name = yaml.safe_load((EXAMPLES / "tiny.yaml").read_text())["metadata"]["name"]
    lines = out.splitlines()
    assert lines[0].startswith(f"configmap/{name}-") and lines[1].startswith(f"deployment.apps/{name}-")
    assert lines[2] == f"service/{name}"
    with pytest.raises(SystemExit):
        run_render("-f", str(EXAMPLES / "tiny.yaml"), "-o", "xml", capsys=capsys)
