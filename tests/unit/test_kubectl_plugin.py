"""Tests of kubectl-triton: pure rendering, the verbs against a fake cluster, and the request patch."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from triton_operator import kubectl_plugin as kp
from triton_operator.adapters.control import KubeControl, new_request_id, request_patch
from triton_operator.core.rollout.requests import Action, parse_control_requests

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
CHAIN = [{"setWeight": 10}, {"pause": {"durationSeconds": 60}}, {"setWeight": 50}, {"pause": {}}]


def ts(
    name: str = "resnet",
    namespace: str = "ml",
    *,
    replicas: int = 2,
    steps: list[dict[str, Any]] | None = None,
    created: datetime = NOW - timedelta(hours=3),
    **status: Any,
) -> dict[str, Any]:
    return {
        "apiVersion": "triton-operator.io/v1alpha1",
        "kind": "TritonService",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
        "spec": {"replicas": replicas, "rollout": {"steps": CHAIN if steps is None else steps}},
        "status": status,
    }


# ----------------------------------------------------------------- ages


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-5, "<invalid>"),
        (-0.5, "0s"),
        (0, "0s"),
        (59, "59s"),
        (119, "119s"),
        (120, "2m"),
        (192, "3m12s"),
        (599, "9m59s"),
        (600, "10m"),
        (179 * 60, "179m"),
        (3 * 3600, "3h"),
        (3 * 3600 + 5 * 60, "3h5m"),
        (8 * 3600, "8h"),
        (47 * 3600, "47h"),
        (48 * 3600, "2d"),
        (3 * 86400 + 4 * 3600, "3d4h"),
        (8 * 86400, "8d"),
        (400 * 86400, "400d"),
        (730 * 86400, "2y"),
        (731 * 86400, "2y1d"),
        (9 * 365 * 86400, "9y"),
    ],
)
def test_human_age_matches_kubectl(seconds: float, text: str) -> None:
    assert kp.human_age(seconds) == text


@pytest.mark.parametrize(
    ("stamp", "text"), [("2026-01-01T11:59:00Z", "60s"), (None, "<unknown>"), ("bad", "<unknown>")]
)
def test_age(stamp: Any, text: str) -> None:
    assert kp.age(stamp, NOW) == text


# ----------------------------------------------------------------- get


def test_table_steady_and_canary() -> None:
    items = [
        ts("zeta", readyReplicas=2, stableRevision="5d8f7c"),
        ts(
            "alpha",
            replicas=4,
            readyReplicas=4,
            stableRevision="5d8f7c",
            canaryRevision="9a1b2e",
            canaryWeight=10,
            currentStepIndex=1,
            created=NOW - timedelta(days=3, hours=4),
        ),
    ]
    assert kp.render_table(items, NOW).splitlines() == [
        "NAME    READY   STABLE   CANARY   WEIGHT   STEP   AGE",
        "alpha   4/4     5d8f7c   9a1b2e   10%      1/4    3d4h",
        "zeta    2/2     5d8f7c   -        -        -      3h",
    ]


@pytest.mark.parametrize(
    ("status", "canary", "weight", "step"),
    [
        (
            {"canaryRevision": "c1", "canaryWeight": 50, "currentStepIndex": 4, "promoting": True},
            "c1",
            "50%",
            "promoting",
        ),
        ({"abortedRevision": "c1", "abortedStepIndex": 2}, "c1 (aborted)", "-", "aborted"),
        ({"canaryRevision": "c1"}, "c1", "-", "0/4"),
        ({}, "-", "-", "-"),
    ],
)
def test_table_columns(status: dict[str, Any], canary: str, weight: str, step: str) -> None:
    line = kp.render_table([ts(stableRevision="s1", **status)], NOW).splitlines()[1]
    cells = line.split("   ")
    cells = [c.strip() for c in cells if c.strip()]
    assert cells[3:6] == [canary, weight, step]


def test_table_all_namespaces_and_empty() -> None:
    out = kp.render_table([ts("a", "ns2"), ts("b", "ns1")], NOW, all_namespaces=True).splitlines()
    assert out[0].split() == ["NAMESPACE", "NAME", "READY", "STABLE", "CANARY", "WEIGHT", "STEP", "AGE"]
    assert [line.split()[:2] for line in out[1:]] == [["ns1", "b"], ["ns2", "a"]]
    assert kp.render_table([], NOW) == "No TritonServices found."


# ----------------------------------------------------------------- status


def conditions(**reasons: tuple[str, str, str]) -> list[dict[str, Any]]:
    return [
        {"type": t, "status": s, "reason": r, "message": m, "lastTransitionTime": "2026-01-01T11:58:00Z"}
        for t, (s, r, m) in reasons.items()
    ]


def test_status_marks_the_current_step() -> None:
    obj = ts(
        stableRevision="5d8f7c",
        canaryRevision="9a1b2e",
        canaryWeight=10,
        currentStepIndex=2,
        readyReplicas=2,
        conditions=conditions(
            Degraded=("False", "AsExpected", "no rollout failed"),
            Progressing=(
                "True",
                "WaitingForCanaryReady",
                "step 2/4 (setWeight 50): canary 9a1b2e: 1/1 Ready",
            ),
            Ready=("False", "RolloutInProgress", "revision 9a1b2e: 1/2 replicas ready"),
        ),
        models=[{"name": "resnet50", "versions": ["3"], "ready": True}],
        history=[{"revision": "0ld0ne", "created": "2025-12-01T00:00:00Z"}],
        endpoints={"http": "resnet.ml.svc:8000", "grpc": "resnet.ml.svc:8001"},
    )
    out = kp.render_status(obj, NOW)
    lines = out.splitlines()
    assert lines[:7] == [
        "Name:      resnet",
        "Namespace: ml",
        "Status:    Progressing - WaitingForCanaryReady: step 2/4 (setWeight 50): canary 9a1b2e: 1/1 Ready",
        "Strategy:  Canary",
        "Replicas:  2 desired, 2 ready",
        "Stable:    5d8f7c",
        "Canary:    9a1b2e (weight 10%)",
    ]
    steps = lines[lines.index("Steps:") + 1 : lines.index("Steps:") + 5]
    assert [s.split()[0] for s in steps] == ["0", "1", "->", "3"]
    assert steps[0].endswith("done") and steps[1].endswith("done")
    assert steps[2] == "  ->  2  setWeight 50                 current"
    assert steps[3] == "      3  pause (until promoted)"
    conds = lines[lines.index("Conditions:") + 1 : lines.index("Conditions:") + 5]
    assert [c.split()[0] for c in conds] == ["TYPE", "Ready", "Progressing", "Degraded"]
    assert "2m" in conds[1]
    assert "  resnet50   3          true    -                 -" in lines
    assert "  0ld0ne (stable since 2025-12-01T00:00:00Z)" in lines
    assert "  http: resnet.ml.svc:8000" in lines


@pytest.mark.parametrize(
    ("status", "summary"),
    [
        ({"conditions": conditions(Ready=("True", "Available", "ok"))}, "Healthy"),
        (
            {
                "conditions": conditions(
                    Degraded=("True", "ProgressDeadlineExceeded", "rollout of x aborted at step 0")
                )
            },
            "Degraded - ProgressDeadlineExceeded: rollout of x aborted at step 0",
        ),
        ({"canaryRevision": "c", "pausedByUser": True}, "Paused"),
        (
            {"conditions": conditions(Ready=("False", "ReplicasNotReady", "1/2"))},
            "Not ready - ReplicasNotReady: 1/2",
        ),
        ({}, "Unknown (no status yet)"),
    ],
)
def test_status_summary(status: dict[str, Any], summary: str) -> None:
    assert kp.render_status(ts(**status), NOW).splitlines()[2] == f"Status:    {summary}"


def test_status_promoting_aborted_pinned_paused() -> None:
    promoting = kp.render_status(ts(canaryRevision="c", currentStepIndex=4, promoting=True), NOW)
    assert promoting.count("done") == 4
    assert "promotion: scaling the canary to full replicas" in promoting
    aborted = kp.render_status(
        ts(abortedRevision="c", abortedStepIndex=2, abortedReason="CanaryCrashLooping"), NOW
    )
    assert "Aborted:   c at step 2 (CanaryCrashLooping); kubectl triton retry to try again" in aborted
    assert "done" not in aborted  # no rollout in progress: no markers
    pinned = kp.render_status(ts(pinnedRevision="old", pinnedFor="new"), NOW)
    assert "Undo:      serving old while the spec still asks for new" in pinned
    undone = {"host": "h", "stable": "old", "pinned": "old", "pinnedFor": "new"}
    pinned = kp.render_status(
        ts(inPlace=undone, history=[{"revision": "new", "inPlaceHost": "h"}, {"revision": "h"}]), NOW
    )
    assert (
        "Undo:      serving old in place, in the pods of h, while the spec still asks for new "
        "(kubectl triton retry to roll forward)"
    ) in pinned
    history = pinned.splitlines()[-2:]
    assert history == ["  new (in place, in the pods of h)", "  h"]
    paused = kp.render_status(ts(pausedByUser=True), NOW)
    assert "Paused:    yes (kubectl triton pause)" in paused


@pytest.mark.parametrize(
    ("rollout", "text"),
    [
        ({"steps": []}, "Steps:     none (promote once the new revision is fully Ready)"),
        ({"steps": [{"setWeight": 10, "pause": {}}]}, "Steps:     (spec.rollout is not valid)"),
        (
            {"strategy": "BlueGreen", "paused": True, "steps": [{"pause": {}}]},
            "Paused:    yes (spec.rollout.paused)",
        ),
    ],
)
def test_status_rollout_variants(rollout: dict[str, Any], text: str) -> None:
    obj = ts()
    obj["spec"]["rollout"] = rollout
    assert text in kp.render_status(obj, NOW).splitlines()


# ----------------------------------------------------------------- verbs against a fake cluster


@dataclasses.dataclass
class FakeControl:
    objects: dict[tuple[str, str], dict[str, Any]] = dataclasses.field(default_factory=dict)
    requests: list[tuple[str, str, str, str | None]] = dataclasses.field(default_factory=list)
    made_for: list[str | None] = dataclasses.field(default_factory=list)
    namespace: str = "default"
    tunings: dict[tuple[str, str], list[dict[str, Any]]] = dataclasses.field(default_factory=dict)

    def get(self, name: str, namespace: str) -> dict[str, Any]:
        try:
            return self.objects[(namespace, name)]
        except KeyError:
            raise LookupError(f'tritonservices "{name}" not found') from None

    def tuning_results(self, name: str, namespace: str) -> list[dict[str, Any]]:
        return list(self.tunings.get((namespace, name), []))

    def list(self, namespace: str | None) -> list[dict[str, Any]]:
        return [o for (ns, _), o in self.objects.items() if namespace is None or ns == namespace]

    def request(
        self,
        name: str,
        namespace: str,
        action: Action,
        to_revision: str | None = None,
        *,
        revision: str | None = None,
    ) -> str:
        self.get(name, namespace)
        self.requests.append((namespace, name, action, to_revision))
        self.made_for.append(revision)
        return "rid-1"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["promote", "resnet", "-n", "ml"], ("ml", "resnet", "promote", None)),
        (["promote", "--full", "resnet", "-n", "ml"], ("ml", "resnet", "promote-full", None)),
        (["abort", "resnet", "-n", "ml"], ("ml", "resnet", "abort", None)),
        (["pause", "resnet", "-n", "ml"], ("ml", "resnet", "pause", None)),
        (["resume", "resnet", "-n", "ml"], ("ml", "resnet", "resume", None)),
        (["retry", "resnet", "-n", "ml"], ("ml", "resnet", "retry", None)),
        (["undo", "resnet", "-n", "ml"], ("ml", "resnet", "undo", None)),
        (
            ["undo", "resnet", "--to-revision", "5d8f7c", "--namespace", "ml"],
            ("ml", "resnet", "undo", "5d8f7c"),
        ),
        (["abort", "other"], ("default", "other", "abort", None)),
    ],
)
def test_control_verbs(
    argv: list[str], expected: tuple[str, str, str, str | None], capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeControl(objects={("ml", "resnet"): ts(), ("default", "other"): ts("other", "default")})
    assert kp.main(argv, client=fake) == 0
    assert fake.requests == [expected]
    out = capsys.readouterr().out
    assert f"tritonservice {expected[0]}/{expected[1]}: {expected[2]}" in out
    assert "request id rid-1" in out


@pytest.mark.parametrize(
    ("verb", "status", "made_for"),
    [
        (["promote"], {"canaryRevision": "c2", "stableRevision": "s1"}, "c2"),
        (["promote", "--full"], {"canaryRevision": "c2", "stableRevision": "s1"}, "c2"),
        (["abort"], {"canaryRevision": "c2", "stableRevision": "s1"}, "c2"),
        (["promote"], {"abortedRevision": "c2", "stableRevision": "s1"}, "c2"),  # a retry by promote
        (["promote"], {"stableRevision": "s1"}, None),  # nothing in progress
        (["pause"], {"canaryRevision": "c2", "stableRevision": "s1"}, None),  # for the whole rollout
    ],
)
def test_promote_and_abort_are_made_for_the_revision_the_status_shows(
    verb: list[str], status: dict[str, Any], made_for: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeControl(objects={("ml", "resnet"): ts(**status)})
    assert kp.main([*verb, "resnet", "-n", "ml"], client=fake) == 0
    assert fake.made_for == [made_for]
    out = capsys.readouterr().out
    assert (f"requested for revision {made_for} (" in out) is (made_for is not None)


def test_get_and_status_verbs(capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeControl(
        objects={("ml", "a"): ts("a", "ml"), ("ml", "b"): ts("b", "ml"), ("x", "c"): ts("c", "x")},
        namespace="ml",
    )
    assert kp.main(["get"], client=fake) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["NAME", "a", "b"]
    assert kp.main(["get", "-A"], client=fake) == 0
    assert [line.split()[1] for line in capsys.readouterr().out.splitlines()[1:]] == ["a", "b", "c"]
    assert kp.main(["get", "c", "-n", "x"], client=fake) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("c ")
    assert kp.main(["status", "b"], client=fake) == 0
    assert capsys.readouterr().out.startswith("Name:      b\nNamespace: ml\n")
    assert fake.requests == []


def test_errors_are_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert kp.main(["promote", "missing"], client=FakeControl()) == 1
    captured = capsys.readouterr()
    assert captured.err == 'error: tritonservices "missing" not found\n'
    assert captured.out == ""


@pytest.mark.parametrize("argv", [[], ["promote"], ["status"], ["bogus", "x"], ["get", "--to-revision", "r"]])
def test_bad_command_lines(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        kp.main(argv, client=FakeControl())
    assert exc.value.code == 2


# ----------------------------------------------------------------- the request patch and KubeControl


@pytest.mark.parametrize(
    ("action", "target"),
    [
        ("promote", None),
        ("promote-full", None),
        ("abort", None),
        ("pause", None),
        ("undo", None),
        ("undo", "r1"),
    ],
)
def test_request_patch_is_read_back_by_the_engine(action: Action, target: str | None) -> None:
    patch = request_patch(action, "2026-01-01T12:00:00.000001Z", target)
    annotations = {k: v for k, v in patch["metadata"]["annotations"].items() if v is not None}
    (request,) = parse_control_requests(annotations)
    assert (request.action, request.request_id, request.to_revision) == (
        action,
        "2026-01-01T12:00:00.000001Z",
        target,
    )


@pytest.mark.parametrize("action", ["promote", "promote-full", "abort"])
def test_the_revision_a_request_is_made_for_is_read_back_by_the_engine(action: Action) -> None:
    patch = request_patch(action, "id", revision="c2")
    annotations = {k: v for k, v in patch["metadata"]["annotations"].items() if v is not None}
    assert annotations == {
        f"triton-operator.io/{action}": "id",
        f"triton-operator.io/{action}-revision": "c2",
    }
    (request,) = parse_control_requests(annotations)
    assert (request.action, request.revision) == (action, "c2")
    # A later request made without one removes the earlier request's revision.
    assert (
        request_patch(action, "id2")["metadata"]["annotations"][f"triton-operator.io/{action}-revision"]
        is None
    )
    with pytest.raises(ValueError, match="not made for a revision"):
        request_patch("pause", "id", revision="c2")


def test_request_ids_sort_in_time_order() -> None:
    ids = [new_request_id(NOW + timedelta(microseconds=m)) for m in (0, 1, 999_999, 1_000_000, 10**7)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert ids[0] == "2026-01-01T12:00:00.000000Z"


class FakeLightkube:
    """Records the calls KubeControl makes on a lightkube Client."""

    namespace = "team"

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def get(self, res: Any, name: str, *, namespace: str) -> Any:
        self.calls.append(("get", res.__name__, name, namespace))
        return res.from_dict(ts(name, namespace))

    def list(self, res: Any, *, namespace: str) -> list[Any]:
        self.calls.append(("list", res.__name__, namespace))
        return [res.from_dict(ts("a", "team"))]

    def patch(self, res: Any, name: str, obj: Any, *, namespace: str, patch_type: Any) -> None:
        self.calls.append(("patch", res.__name__, name, obj, namespace, patch_type.value))


def test_kube_control_calls() -> None:
    fake = FakeLightkube()
    control = KubeControl(client=fake)
    assert control.namespace == "team"
    assert control.get("resnet", "ml")["metadata"]["name"] == "resnet"
    assert [o["metadata"]["name"] for o in control.list("team")] == ["a"]
    control.list(None)
    request_id = control.request("resnet", "ml", "undo", "r1")
    get, lst, lst_all, patch = fake.calls
    assert get == ("get", "TritonService", "resnet", "ml")
    assert lst == ("list", "TritonService", "team")
    assert lst_all == ("list", "TritonService", "*")
    assert patch == (
        "patch",
        "TritonService",
        "resnet",
        {
            "metadata": {
                "annotations": {
                    "triton-operator.io/undo": request_id,
                    "triton-operator.io/undo-to-revision": "r1",
                }
            }
        },
        "ml",
        "application/merge-patch+json",
    )


def test_status_shows_tritons_view_of_each_model_and_the_canarys_analysis() -> None:
    obj = {
        "metadata": {"name": "resnet", "namespace": "ml"},
        "spec": {"replicas": 2, "rollout": {"steps": [{"setWeight": 50}], "analysis": {}}},
        "status": {
            "stableRevision": "5d8f7c",
            "canaryRevision": "9a1b2e",
            "canaryWeight": 50,
            "models": [
                {
                    "name": "resnet50",
                    "versions": [],
                    "ready": True,
                    "serving": {"revision": "5d8f7c", "versions": [{"version": "1", "state": "READY"}]},
                    "canary": {
                        "revision": "9a1b2e",
                        "versions": [{"version": "2", "state": "UNAVAILABLE", "reason": "Internal: boom"}],
                    },
                }
            ],
            "analysis": {
                "revision": "9a1b2e",
                "weight": 50,
                "verdict": "Inconclusive",
                "windowStartedAt": "2026-01-01T00:00:00Z",
                "models": [
                    {
                        "name": "resnet50",
                        "verdict": "Inconclusive",
                        "requests": 12,
                        "stableRequests": 30,
                        "successRatio": "1.0000",
                        "latencyMicroseconds": 2100,
                        "stableLatencyMicroseconds": 2000,
                    }
                ],
            },
            "analysisRuns": [
                {
                    "revision": "9a1b2e",
                    "stepIndex": 1,
                    "weight": 50,
                    "verdict": "Passed",
                    "message": "analysis passed after 20s at weight 50: resnet50: ok",
                    "at": "2026-01-01T00:00:20Z",
                }
            ],
        },
    }
    lines = kp.render_status(obj, NOW).splitlines()
    row = next(line for line in lines if line.startswith("  resnet50   -"))
    assert "5d8f7c: 1 READY" in row and "9a1b2e: 2 UNAVAILABLE (Internal: boom)" in row
    assert "Analysis:  Inconclusive for 9a1b2e at weight 50%, since 2026-01-01T00:00:00Z" in lines
    figures = next(line for line in lines if line.startswith("  resnet50   Inconclusive"))
    assert figures.split() == ["resnet50", "Inconclusive", "12/30", "1.0000", "2100/2000"]
    assert lines[-1] == (
        "  2026-01-01T00:00:20Z step 1 weight 50%: Passed: "
        "analysis passed after 20s at weight 50: resnet50: ok"
    )


def test_status_says_when_the_serving_image_is_not_the_operators_default() -> None:
    """A new default applies to new revisions only: the status names the image the stable revision
    runs, and the operator's default when that is another."""
    same = kp.render_status(ts(stableRevision="r1", image="reg/triton:1"), NOW).splitlines()
    assert "Image:     reg/triton:1" in same
    assert not any("operator's default" in line for line in same)
    behind = kp.render_status(
        ts(stableRevision="r1", image="reg/triton:1", defaultImage="reg/triton:2"), NOW
    ).splitlines()
    at = behind.index("Image:     reg/triton:1")
    assert "not the operator's default reg/triton:2" in behind[at + 1]
    assert "the next change of the spec rolls it out" in behind[at + 1]


def test_status_shows_each_serving_revisions_time_to_serve() -> None:
    served: dict[str, Any] = {
        "revision": "5d8f7c",
        "pod": "resnet-5d8f7c-7d9c8b6f5-x2x9k",
        "readyAt": "2026-01-01T11:00:09Z",
        "seconds": 74.0,
        "phases": {
            "scheduling": 0,
            "imageAndSandbox": 1,
            "sync": 62,
            "tritonserverStart": 1,
            "tritonserverLoad": 10,
        },
        "objects": 40,
        "bytesFetched": 2684354560,
        "bytesPresent": 0,
    }
    canary = {
        **served,
        "revision": "9a1b2e",
        "pod": "resnet-9a1b2e-5c4d-q8w7e",
        "seconds": 13.0,
        "restarts": 2,
    }
    canary |= {"phases": {**served["phases"], "sync": 1}, "bytesFetched": 0, "bytesPresent": 2684354560}
    obj = ts(stableRevision="5d8f7c", canaryRevision="9a1b2e", timeToServe=[served, canary])
    lines = kp.render_status(obj, NOW).splitlines()
    at = lines.index("Time to serve (the revision's first Ready pod, created -> Ready):")
    assert lines[at + 1 : at + 5] == [
        "  5d8f7c (stable): 74 s: scheduling 0 s, image and sandbox 1 s, sync 62 s (2.5 GiB fetched), "
        "tritonserver start 1 s, tritonserver load 10 s",
        "    pod resnet-5d8f7c-7d9c8b6f5-x2x9k, Ready at 2026-01-01T11:00:09Z",
        "  9a1b2e (canary): 13 s: scheduling 0 s, image and sandbox 1 s, sync 1 s (0 B fetched, "
        "2.5 GiB already present), tritonserver start 1 s, tritonserver load 10 s "
        "(after 2 container restarts)",
        "    pod resnet-9a1b2e-5c4d-q8w7e, Ready at 2026-01-01T11:00:09Z",
    ]
    assert "Time to serve" not in kp.render_status(ts(stableRevision="5d8f7c"), NOW)


def test_status_shows_a_revision_loaded_in_place_with_its_host_and_its_drain() -> None:
    host: dict[str, Any] = {
        "revision": "5d8f7c",
        "pod": "resnet-5d8f7c-7d9c8b6f5-x2x9k",
        "readyAt": "2026-01-01T11:00:09Z",
        "seconds": 19.0,
        "phases": {"scheduling": 0, "imageAndSandbox": 1, "sync": 12, "tritonserverLoad": 6},
    }
    in_place = {
        "revision": "3c3748",
        "pod": "resnet-5d8f7c-7d9c8b6f5-x2x9k",
        "host": "5d8f7c",
        "readyAt": "2026-01-01T11:05:14Z",
        "seconds": 11.1,
        "phases": {"sync": 2.5, "drain": 5.7, "tritonserverLoad": 3},
        "objects": 23,
        "bytesFetched": 524288359,
        "bytesPresent": 2150646173,
    }
    obj = ts(stableRevision="5d8f7c", servedRevision="3c3748", timeToServe=[host, in_place])
    lines = kp.render_status(obj, NOW).splitlines()
    at = lines.index("Time to serve (the revision's first Ready pod, created -> Ready):")
    assert lines[at + 3 : at + 5] == [
        "  3c3748 (in place, in the pods of 5d8f7c): 11.1 s: sync 2.5 s (500 MiB fetched, 2 GiB already "
        "present), drain 5.7 s, tritonserver load 3 s",
        "    pod resnet-5d8f7c-7d9c8b6f5-x2x9k, loaded it at 2026-01-01T11:05:14Z",
    ]


# ----------------------------------------------------------------- -o json|yaml|name


def test_get_and_status_output_the_objects_as_the_api_returns_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json  # noqa: PLC0415

    import yaml  # noqa: PLC0415

    a, b = ts("a", "ml", canaryRevision="c2"), ts("b", "ml")
    fake = FakeControl(objects={("ml", "a"): a, ("ml", "b"): b, ("x", "c"): ts("c", "x")}, namespace="ml")
    assert kp.main(["get", "-o", "json"], client=fake) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed == {
        "apiVersion": "v1",
        "kind": "List",
        "items": [a, b],
        "metadata": {"resourceVersion": ""},
    }
    assert kp.main(["get", "a", "-o", "yaml"], client=fake) == 0
    assert yaml.safe_load(capsys.readouterr().out) == a
    assert kp.main(["get", "-A", "-o", "name"], client=fake) == 0
    assert capsys.readouterr().out.splitlines() == [
        "tritonservice.triton-operator.io/a",
        "tritonservice.triton-operator.io/b",
        "tritonservice.triton-operator.io/c",
    ]
    assert kp.main(["get", "-n", "empty", "-o", "name"], client=fake) == 0
    assert capsys.readouterr().out == ""
    assert kp.main(["status", "a", "-o", "json"], client=fake) == 0
    assert json.loads(capsys.readouterr().out) == a
    with pytest.raises(SystemExit):
        kp.main(["get", "-o", "wide"], client=fake)


def test_tune_show_output_json(capsys: pytest.CaptureFixture[str]) -> None:
    import json  # noqa: PLC0415

    records = [{"run": "r1", "state": "Succeeded"}, {"run": "r2", "state": "Failed"}]
    fake = FakeControl(objects={("ml", "a"): ts("a", "ml")}, tunings={("ml", "a"): records})
    assert kp.main(["tune", "a", "-n", "ml", "--model", "m", "--show", "all", "-o", "json"], client=fake) == 0
    assert json.loads(capsys.readouterr().out) == records
    assert kp.main(["tune", "a", "-n", "ml", "--model", "m", "--show", "r2", "-o", "json"], client=fake) == 0
    assert json.loads(capsys.readouterr().out) == records[1:]


# ----------------------------------------------------------------- --watch


class Ticks:
    """A fake sleep: runs ``changes`` (one a call) between reads, then a Ctrl-C."""

    def __init__(self, *changes: Any) -> None:
        self.changes = list(changes)
        self.calls = 0

    def __call__(self, seconds: float) -> None:
        assert seconds == kp.WATCH_PERIOD
        self.calls += 1
        if not self.changes:
            raise KeyboardInterrupt
        self.changes.pop(0)()


def test_status_watch_redraws_on_a_terminal_and_ends_on_ctrl_c(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading  # noqa: PLC0415

    obj = ts("a", "ml", canaryRevision="c2", stableRevision="s1", canaryWeight=10, currentStepIndex=0)
    fake = FakeControl(objects={("ml", "a"): obj})

    def move() -> None:
        obj["status"] = {**obj["status"], "canaryWeight": 50, "currentStepIndex": 2}

    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    threads = threading.active_count()
    ticks = Ticks(move)
    assert kp.main(["status", "a", "-n", "ml", "--watch"], client=fake, sleep=ticks) == 0
    out = capsys.readouterr().out
    frames = out.split(kp.CLEAR)[1:]
    assert len(frames) == 2 and ticks.calls == 2
    assert "Canary:    c2 (weight 10%)" in frames[0] and "Canary:    c2 (weight 50%)" in frames[1]
    assert threading.active_count() == threads  # nothing left running


def test_get_watch_with_output_prints_each_change_once(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import json  # noqa: PLC0415

    fake = FakeControl(objects={("ml", "a"): ts("a", "ml")}, namespace="ml")

    def add() -> None:
        fake.objects[("ml", "b")] = ts("b", "ml")

    monkeypatch.setattr("sys.stdout.isatty", lambda: True)  # a terminal: -o still streams, never redraws
    assert (
        kp.main(["get", "-o", "json", "-w"], client=fake, sleep=Ticks(lambda: None, add, lambda: None)) == 0
    )
    out = capsys.readouterr().out
    assert kp.CLEAR not in out
    decoder, docs, at = json.JSONDecoder(), [], 0
    while at < len(out.rstrip()):
        doc, at = decoder.raw_decode(out, at)
        docs.append(doc)
        at += 1
    assert [[i["metadata"]["name"] for i in d["items"]] for d in docs] == [["a"], ["a", "b"]]


def test_watch_retries_a_failed_read_and_a_missing_object_ends_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeControl(objects={("ml", "a"): ts("a", "ml")})
    monkeypatch.setattr("sys.stdout.isatty", lambda: False)
    saved = fake.objects.pop(("ml", "a"))
    assert kp.main(["status", "a", "-n", "ml", "-w"], client=fake, sleep=Ticks()) == 1
    assert capsys.readouterr().err == 'error: tritonservices "a" not found\n'
    fake.objects[("ml", "a")] = saved

    def lose() -> None:
        fake.objects.pop(("ml", "a"))

    def back() -> None:
        fake.objects[("ml", "a")] = saved

    assert kp.main(["status", "a", "-n", "ml", "-w"], client=fake, sleep=Ticks(lose, back)) == 0
    captured = capsys.readouterr()
    assert captured.err == f'error: tritonservices "a" not found (retrying every {kp.WATCH_PERIOD:g}s)\n'
    assert captured.out.count("Name:      a") == 1  # the same object again: not printed twice


# ----------------------------------------------------------------- --version


@pytest.mark.parametrize(
    ("found", "operator"),
    [
        (["0.1.0 (ops/triton-operator, image r/triton-operator:0.1.0)"], "0.1.0 (ops/triton-operator, image"),
        ([], "unknown (no Deployment labelled app.kubernetes.io/part-of=triton-operator,"),
        (PermissionError("deployments.apps is forbidden"), "unknown (cannot read it from the cluster: "),
    ],
)
def test_version_says_the_operators_or_why_it_is_unknown(
    found: Any, operator: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from triton_operator import __version__  # noqa: PLC0415

    def read() -> list[str]:
        if isinstance(found, Exception):
            raise found
        return list(found)

    assert kp.main(["--version"], operator=read) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == [f"kubectl-triton {__version__}", "API: triton-operator.io/v1alpha1"]
    assert lines[2].startswith(f"Operator: {operator}")


def test_version_from_a_dead_cluster_is_unknown_quickly(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import time  # noqa: PLC0415

    import yaml  # noqa: PLC0415

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "d", "cluster": {"server": "https://127.0.0.1:9"}}],
        "contexts": [{"name": "d", "context": {"cluster": "d"}}],
        "current-context": "d",
    }
    (tmp_path / "k").write_text(yaml.safe_dump(config))
    started = time.monotonic()
    assert kp.main(["--version", "--kubeconfig", str(tmp_path / "k")]) == 0
    assert time.monotonic() - started < kp.VERSION_TIMEOUT * 2
    assert (
        capsys.readouterr()
        .out.splitlines()[2]
        .startswith("Operator: unknown (cannot read it from the cluster")
    )


def test_operator_versions_read_the_labelled_deployments() -> None:
    from triton_operator.adapters.control import OPERATOR_LABELS, operator_versions  # noqa: PLC0415

    class Dep:
        def __init__(self, body: dict[str, Any]) -> None:
            self.body = body

        def to_dict(self) -> dict[str, Any]:
            return self.body

    def dep(name: str, image: str, labels: dict[str, str]) -> Dep:
        containers = [{"name": "operator", "image": image}]
        meta = {"name": name, "namespace": "ops", "labels": labels}
        return Dep({"metadata": meta, "spec": {"template": {"spec": {"containers": containers}}}})

    class Lister:
        asked: dict[str, Any] = {}

        def list(self, _kind: Any, **kwargs: Any) -> list[Dep]:
            self.asked.update(kwargs)
            return [
                dep("b", "localhost:5000/op:0.2.0", {}),
                dep("a", "r/op:x", {"app.kubernetes.io/version": "0.1.0"}),
                dep("c", "localhost:5000/op", {}),
            ]

    lister = Lister()
    assert operator_versions(lister) == [
        "0.1.0 (ops/a, image r/op:x)",
        "0.2.0 (ops/b, image localhost:5000/op:0.2.0)",
        "unknown (ops/c, image localhost:5000/op)",
    ]
    assert lister.asked["labels"] == OPERATOR_LABELS


# ----------------------------------------------------------------- progress of a rollout


def stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.parametrize(
    ("status", "line"),
    [
        (
            {
                "canaryRevision": "c2",
                "canaryWeight": 10,
                "currentStepIndex": 1,
                "stepStartedAt": stamp(NOW - timedelta(seconds=25)),
            },
            "Progress:  step 2 of 4 (pause 60s), canary 10% / stable 90%, this step waiting 25s of 60s "
            "(35s left)",
        ),
        (
            {
                "canaryRevision": "c2",
                "canaryWeight": 50,
                "currentStepIndex": 3,
                "stepStartedAt": stamp(NOW - timedelta(minutes=42)),
            },
            "Progress:  step 4 of 4 (pause (until promoted)), canary 50% / stable 50%, this step waiting 42m",
        ),
        (
            {
                "canaryRevision": "c2",
                "canaryWeight": 10,
                "currentStepIndex": 1,
                "stepStartedAt": stamp(NOW - timedelta(seconds=90)),
            },
            "Progress:  step 2 of 4 (pause 60s), canary 10% / stable 90%, this step waiting 90s of 60s "
            "(0s left)",
        ),
        (
            {
                "stableRevision": "s1",
                "inPlace": {
                    "host": "s1",
                    "stable": "s1",
                    "next": "n2",
                    "stepIndex": 0,
                    "pods": ["p-1"],
                    "stepStartedAt": stamp(NOW - timedelta(seconds=5)),
                },
            },
            "Progress:  step 1 of 4 (setWeight 10), 1 pod(s) asked to load n2, this step waiting 5s",
        ),
    ],
)
def test_status_shows_the_step_the_split_and_how_long_the_step_has_waited(
    status: dict[str, Any], line: str
) -> None:
    lines = kp.render_status(ts(**status), NOW).splitlines()
    assert [ln for ln in lines if ln.startswith("Progress:")] == [line]


@pytest.mark.parametrize("status", [{"stableRevision": "s1"}, {"canaryRevision": "c2", "promoting": True}])
def test_no_progress_line_without_a_step_in_progress(status: dict[str, Any]) -> None:
    assert "Progress:" not in kp.render_status(ts(**status), NOW)


def test_ctrl_c_during_the_first_read_of_a_watch_ends_it_quietly(capsys: pytest.CaptureFixture[str]) -> None:
    class Slow(FakeControl):
        def get(self, name: str, namespace: str) -> dict[str, Any]:
            raise KeyboardInterrupt

    assert kp.main(["status", "a", "-w"], client=Slow(), sleep=Ticks()) == 0
    assert capsys.readouterr() == ("", "")
    assert kp.main(["status", "a"], client=Slow()) == 130
    assert capsys.readouterr().err == "interrupted\n"
