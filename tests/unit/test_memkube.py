"""The in-memory KubeAPI fake (tests/support/memkube.py): its semantics, pinned so that the reconcile
layer's tests over it mean what they say."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest

from memkube import Call, MemKube, merge
from triton_operator.adapters.kube import ConflictError, Kube, KubeAPI, ObjectRejectedError

NS = "ml"


def configmap(name: str, data: dict[str, str], **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "data": data,
    }


def deployment(name: str, replicas: int = 1, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"replicas": replicas, "template": {"metadata": {"labels": labels}}},
    }


def test_the_real_kube_and_the_fake_are_both_a_kube_api() -> None:
    # mypy checks the assignments; at run time the names must at least be there.
    real: type[KubeAPI] = Kube
    fake: KubeAPI = MemKube()
    assert all(callable(getattr(real, m)) and callable(getattr(fake, m)) for m in ("apply", "merge_patch"))


def test_rfc_7386_merge() -> None:
    # The examples of RFC 7386, section 3.
    assert merge({"a": "b"}, {"a": "c"}) == {"a": "c"}
    assert merge({"a": "b"}, {"b": "c"}) == {"a": "b", "b": "c"}
    assert merge({"a": "b"}, {"a": None}) == {}
    assert merge({"a": "b", "b": "c"}, {"a": None}) == {"b": "c"}
    assert merge({"a": ["b"]}, {"a": "c"}) == {"a": "c"}
    assert merge({"a": "c"}, {"a": ["b"]}) == {"a": ["b"]}
    assert merge({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}) == {"a": {"b": "d"}}
    assert merge({"a": [{"b": "c"}]}, {"a": [1]}) == {"a": [1]}
    assert merge(["a", "b"], ["c", "d"]) == ["c", "d"]
    assert merge({"a": "b"}, ["c"]) == ["c"]
    assert merge({"a": "foo"}, None) is None
    assert merge({"e": None}, {"a": 1}) == {"e": None, "a": 1}
    assert merge([1, 2], {"a": "b", "c": None}) == {"a": "b"}
    assert merge({}, {"a": {"bb": {"ccc": None}}}) == {"a": {"bb": {}}}


async def test_apply_replaces_the_whole_object_keeps_status_and_records_the_order() -> None:
    kube = MemKube()
    first = await kube.apply(configmap("a", {"x": "1", "y": "2"}))
    kube.edit("ConfigMap", NS, "a", lambda o: o.update(status={"kept": True}))
    second = await kube.apply(configmap("a", {"x": "3"}))
    await kube.apply(deployment("d"))
    stored = kube.find("ConfigMap", NS, "a")
    assert stored is not None
    assert stored["data"] == {"x": "3"}  # replaced, not merged: "y" is gone
    assert stored["status"] == {"kept": True}
    assert second["metadata"]["uid"] == first["metadata"]["uid"]
    assert kube.applied == [("ConfigMap", NS, "a"), ("ConfigMap", NS, "a"), ("Deployment", NS, "d")]


async def test_every_write_bumps_the_resource_version_and_a_spec_change_the_generation() -> None:
    kube = MemKube()
    created = await kube.apply(deployment("d", 1))
    assert created["metadata"]["generation"] == 1
    versions = [int(created["metadata"]["resourceVersion"])]
    same = await kube.apply(deployment("d", 1))
    versions.append(int(same["metadata"]["resourceVersion"]))
    assert await kube.scale(NS, "d", 3)
    scaled = await kube.get("Deployment", NS, "d")
    assert scaled is not None
    versions.append(int(scaled["metadata"]["resourceVersion"]))
    labelled = await kube.merge_patch("Deployment", NS, "d", {"metadata": {"labels": {"x": "y"}}})
    assert labelled is not None
    versions.append(int(labelled["metadata"]["resourceVersion"]))
    assert versions == sorted(set(versions))  # strictly increasing
    assert same["metadata"]["generation"] == 1  # the same spec
    assert scaled["metadata"]["generation"] == 2
    assert labelled["metadata"]["generation"] == 2  # metadata only


async def test_reads_return_copies() -> None:
    kube = MemKube()
    await kube.apply(configmap("a", {"x": "1"}))
    read = await kube.get("ConfigMap", NS, "a")
    assert read is not None
    read["data"]["x"] = "changed"
    again = await kube.get("ConfigMap", NS, "a")
    assert again is not None and again["data"] == {"x": "1"}


async def test_missing_objects_and_unknown_kinds() -> None:
    kube = MemKube()
    assert await kube.get("HTTPRoute", NS, "nope") is None
    assert await kube.get_tritonservice(NS, "nope") is None
    assert await kube.merge_patch("HTTPRoute", NS, "nope", {"spec": {}}) is None  # never creates
    assert kube.find("HTTPRoute", NS, "nope") is None
    assert await kube.scale(NS, "nope", 2) is False
    assert await kube.delete("Deployment", NS, "nope") is False
    assert await kube.apply_status(NS, "nope", {"a": 1}, resource_version=None) is None
    assert kube.writes == []
    with pytest.raises(KeyError):
        await kube.get("Gadget", NS, "x")


async def test_merge_patch_with_a_resource_version_is_conditional() -> None:
    kube = MemKube()
    stored = await kube.apply(configmap("a", {"x": "1"}))
    version = stored["metadata"]["resourceVersion"]
    kube.edit("ConfigMap", NS, "a", lambda o: o["data"].update(y="user"))
    with pytest.raises(ConflictError):
        await kube.merge_patch(
            "ConfigMap", NS, "a", {"metadata": {"resourceVersion": version}, "data": {"x": "2"}}
        )
    current = kube.find("ConfigMap", NS, "a")
    assert current is not None and current["data"] == {"x": "1", "y": "user"}
    fresh = current["metadata"]["resourceVersion"]
    patched = await kube.merge_patch(
        "ConfigMap", NS, "a", {"metadata": {"resourceVersion": fresh}, "data": {"x": "2", "y": None}}
    )
    assert patched is not None and patched["data"] == {"x": "2"}


def tritonservice(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "triton-operator.io/v1alpha1",
        "kind": "TritonService",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"replicas": 1},
    }


async def test_apply_status_with_a_resource_version_is_conditional_as_on_the_api_server() -> None:
    # kube-apiserver refuses a write whose metadata.resourceVersion is not the stored one (409),
    # server-side apply and the /status subresource included.
    kube = MemKube()
    read = kube.put(tritonservice("s"))
    version = read["metadata"]["resourceVersion"]
    kube.edit("TritonService", NS, "s", lambda o: o.update(status={"observedGeneration": 2}))
    with pytest.raises(ConflictError):
        await kube.apply_status(NS, "s", {"observedGeneration": 1}, resource_version=version)
    current = kube.find("TritonService", NS, "s")
    assert current is not None and current["status"] == {"observedGeneration": 2}
    assert kube.writes == []
    fresh = current["metadata"]["resourceVersion"]
    written = await kube.apply_status(NS, "s", {"observedGeneration": 3}, resource_version=fresh)
    assert written is not None and written["status"] == {"observedGeneration": 3}
    assert written["metadata"]["resourceVersion"] != fresh  # a write is a new version
    # a version the object never had is refused too, and a missing object is still None (404)
    with pytest.raises(ConflictError):
        await kube.apply_status(NS, "s", {"observedGeneration": 4}, resource_version="0")
    assert await kube.apply_status(NS, "nope", {}, resource_version=fresh) is None


async def test_apply_with_a_resource_version_is_conditional() -> None:
    kube = MemKube()
    stored = await kube.apply(configmap("a", {"x": "1"}))
    body = configmap("a", {"x": "2"})
    body["metadata"]["resourceVersion"] = stored["metadata"]["resourceVersion"]
    kube.edit("ConfigMap", NS, "a", lambda o: o["data"].update(y="user"))
    with pytest.raises(ConflictError):
        await kube.apply(body)
    current = kube.find("ConfigMap", NS, "a")
    assert current is not None and current["data"] == {"x": "1", "y": "user"}
    body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    assert (await kube.apply(body))["data"] == {"x": "2"}
    missing = configmap("b", {})
    missing["metadata"]["resourceVersion"] = "1"
    with pytest.raises(ConflictError):
        await kube.apply(missing)  # no object holds that version
    assert kube.find("ConfigMap", NS, "b") is None


async def test_delete_scale_events_status_and_the_write_log() -> None:
    kube = MemKube()
    kube.put(tritonservice("s"))
    await kube.apply(deployment("d", 1))
    assert await kube.scale(NS, "d", 0)
    assert await kube.apply_status(NS, "s", {"phase": "x"}, resource_version=None) is not None
    await kube.post_event({"metadata": {"name": "s.1", "namespace": NS}, "reason": "Why"})
    assert await kube.delete("Deployment", NS, "d")
    assert kube.find("Deployment", NS, "d") is None
    ts = await kube.get_tritonservice(NS, "s")
    assert ts is not None and ts["status"] == {"phase": "x"} and ts["spec"] == {"replicas": 1}
    assert [e["reason"] for e in kube.events] == ["Why"]
    assert [(w.method, w.kind, w.name) for w in kube.writes] == [
        ("apply", "Deployment", "d"),
        ("scale", "Deployment", "d"),
        ("apply_status", "TritonService", "s"),
        ("post_event", "Event", "s.1"),
        ("delete", "Deployment", "d"),
    ]


async def test_list_owned_selects_by_namespace_and_every_label() -> None:
    kube = MemKube()
    await kube.apply(deployment("mine", app="a", team="t"))
    await kube.apply(deployment("other", app="b", team="t"))
    await kube.apply(configmap("cm", {}, app="a", team="t"))
    await kube.apply(
        {
            **deployment("elsewhere", app="a", team="t"),
            "metadata": {"name": "elsewhere", "namespace": "x", "labels": {"app": "a", "team": "t"}},
        }
    )
    owned = await kube.list_owned(NS, {"app": "a", "team": "t"})
    assert [d["metadata"]["name"] for d in owned.deployments] == ["mine"]
    assert [c["metadata"]["name"] for c in owned.configmaps] == ["cm"]
    assert owned.pods == []


async def test_secret_data_is_decoded() -> None:
    kube = MemKube()
    kube.put(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "creds", "namespace": NS},
            "data": {"key": base64.b64encode(b"id").decode(), "bad": base64.b64encode(b"\xff").decode()},
            "stringData": {"token": "t"},
        }
    )
    assert await kube.get_secret_data(NS, "creds") == {"key": "id", "token": "t"}
    assert await kube.get_secret_data(NS, "missing") is None


async def test_fail_next_raises_for_the_given_number_of_calls_and_changes_nothing() -> None:
    kube = MemKube()
    await kube.apply(configmap("a", {"x": "1"}))
    kube.fail_next("merge_patch", ConflictError("ConfigMap", "a"), times=2)
    for _ in range(2):
        with pytest.raises(ConflictError):
            await kube.merge_patch("ConfigMap", NS, "a", {"data": {"x": "2"}})
    stored = kube.find("ConfigMap", NS, "a")
    assert stored is not None and stored["data"] == {"x": "1"}
    assert await kube.merge_patch("ConfigMap", NS, "a", {"data": {"x": "2"}}) is not None
    assert kube.count("merge_patch") == 3  # failed calls are logged too
    assert [w.method for w in kube.writes] == ["apply", "merge_patch"]


async def test_fail_next_for_one_kind_leaves_the_others_alone() -> None:
    kube = MemKube()
    kube.fail_next("apply", ObjectRejectedError("Deployment", "d", "no"), kind="Deployment")
    await kube.apply(configmap("a", {}))
    with pytest.raises(ObjectRejectedError):
        await kube.apply(deployment("d"))
    await kube.apply(deployment("d"))
    assert kube.applied == [("ConfigMap", NS, "a"), ("Deployment", NS, "d")]


async def test_a_hook_runs_before_the_call_so_it_can_change_what_the_call_meets() -> None:
    kube = MemKube()
    stored = await kube.apply(configmap("a", {"x": "1"}))
    seen: list[Call] = []

    def user_edit(call: Call) -> None:
        seen.append(call)
        kube.edit("ConfigMap", NS, "a", lambda o: o["data"].update(x="user"))

    kube.before("merge_patch", user_edit)
    patch = {"metadata": {"resourceVersion": stored["metadata"]["resourceVersion"]}, "data": {"x": "2"}}
    with pytest.raises(ConflictError):
        await kube.merge_patch("ConfigMap", NS, "a", patch)
    assert seen == [Call("merge_patch", "ConfigMap", NS, "a")]
    fresh = kube.find("ConfigMap", NS, "a")
    assert fresh is not None
    patch["metadata"]["resourceVersion"] = fresh["metadata"]["resourceVersion"]
    assert await kube.merge_patch("ConfigMap", NS, "a", patch) is not None  # the hook ran once
    assert len(seen) == 1


async def test_an_async_hook_holds_the_call_until_released() -> None:
    kube = MemKube()
    release = asyncio.Event()

    async def hold(call: Call) -> None:
        await release.wait()

    kube.before("get", hold, times=None)
    task = asyncio.create_task(kube.get("ConfigMap", NS, "a"))
    await asyncio.sleep(0.01)
    assert not task.done() and kube.count("get") == 1
    release.set()
    assert await task is None


def test_arming_a_method_kube_api_does_not_have_is_an_error() -> None:
    with pytest.raises(ValueError, match="no method"):
        MemKube().fail_next("patch", RuntimeError())
