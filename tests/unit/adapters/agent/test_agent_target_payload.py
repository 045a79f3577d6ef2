"""The pod's target revision never flips back after an in-place rollout completed (issue 38, item 10).

The operator completes a rollout in this order: state.json `stable := N` in the in-place ConfigMap,
then (once it sees the ConfigMap say so) the pod's target annotation removed. The kubelet writes each
volume as one atomic payload but refreshes different volumes at different moments. A kubelet is
simulated here from the pod the operator builds (its volumes and the agent's own arguments): a
target read from a volume of its own could show the annotation gone while the ConfigMap's volume
still said `{stable: S, next: N}`, and the agent went back to S."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from triton_operator.adapters.agent import files as agent_files
from triton_operator.adapters.agent import runner
from triton_operator.adapters.agent.runner import Agent, AgentOptions
from triton_operator.cli import build_parser
from triton_operator.core.objects.builders import build_deployment
from triton_operator.core.objects.names import (
    AGENT_CONTAINER,
    INPLACE_TARGET_ANNOTATION,
    inplace_config_key,
    inplace_manifest_key,
)
from triton_operator.core.pod.agent_plan import RevisionFiles
from triton_operator.core.repository.manifest import (
    Manifest,
    ManifestModel,
    StoreRef,
    VersionPolicy,
    manifest_to_json,
)
from tritonservice_bodies import SETTINGS, ts_of

CONFIG = 'name: "m"\nbackend: "python"\n'


def files(revision: str) -> RevisionFiles:
    model = ManifestModel("m", "m", VersionPolicy(), ("1",))
    return RevisionFiles(revision, Manifest(StoreRef("s3://bucket/repo"), (model,), ()), {"m": CONFIG})


S, N = files("s1"), files("n2")


def configmap(stable: RevisionFiles, nxt: RevisionFiles | None) -> dict[str, str]:
    """The in-place ConfigMap's data as the operator writes it."""
    data = {"state.json": json.dumps({"stable": stable.revision, "next": nxt.revision if nxt else None})}
    for rev in (stable, nxt):
        if rev is not None:
            data[inplace_manifest_key(rev.revision)] = manifest_to_json(rev.manifest)
            data[inplace_config_key(rev.revision, "m")] = CONFIG
    return data


def write_payload(folder: Path, data: Mapping[str, str]) -> None:
    """The kubelet's atomic writer: a new timestamped folder, one rename of ..data, the old deleted."""
    folder.mkdir(parents=True, exist_ok=True)
    payload = folder / f"..{os.urandom(4).hex()}"
    payload.mkdir()
    for key, text in data.items():
        (payload / key).write_text(text)
    link = folder / "..data"
    old = os.readlink(link) if link.is_symlink() else None
    os.symlink(payload.name, folder / "..data_tmp")
    os.replace(folder / "..data_tmp", link)
    for key in data:
        if not (folder / key).is_symlink():
            os.symlink(f"..data/{key}", folder / key)
    if old is not None:
        shutil.rmtree(folder / old)


class Kubelet:
    """The agent's volumes of the pod the operator builds, refreshed one volume at a time."""

    def __init__(self, root: Path) -> None:
        template = build_deployment(ts_of(rollout={"modelUpdates": "InPlace"}), "s1", SETTINGS, 2)
        spec: dict[str, Any] = template["spec"]["template"]["spec"]
        agent = next(c for c in spec["containers"] if c["name"] == AGENT_CONTAINER)
        self.root = root
        self.mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
        self.volumes = {v["name"]: v for v in spec["volumes"] if v["name"] in self.mounts}
        # the volumes of the in-place ConfigMap and of the target annotation (on main, two volumes)
        self.volumes = {n: v for n, v in self.volumes.items() if self._followed(v)}
        self.args = build_parser().parse_args([*agent["command"][1:], *agent["args"]])

    @staticmethod
    def _followed(volume: dict[str, Any]) -> bool:
        sources = volume["projected"]["sources"] if "projected" in volume else [volume]
        return any(
            "downwardAPI" in s or s.get("configMap", {}).get("name", "").endswith("-inplace") for s in sources
        )

    def path(self, in_pod: Path | str) -> Path:
        return self.root / str(in_pod).lstrip("/")

    def sources(self, name: str) -> list[dict[str, Any]]:
        volume = self.volumes[name]
        return list(volume["projected"]["sources"]) if "projected" in volume else [volume]

    def refresh(self, name: str, data: Mapping[str, str], annotations: Mapping[str, str]) -> None:
        """One volume's payload, from the ConfigMap and the pod's annotations as they are now."""
        out: dict[str, str] = {}
        for source in self.sources(name):
            if "configMap" in source:
                out.update(data)
            for item in source.get("downwardAPI", {}).get("items", []):
                key = item["fieldRef"]["fieldPath"].split("'")[1]
                out[item["path"]] = annotations.get(key, "")
        write_payload(self.path(self.mounts[name]), out)

    def configmap_volume(self) -> str:
        """The one volume that holds the in-place ConfigMap."""
        (name,) = [n for n in self.annotation_first() if any("configMap" in s for s in self.sources(n))]
        return name

    def annotation_first(self) -> list[str]:
        """The volumes in the order that shows the lag: the one with the annotation first."""
        return sorted(self.volumes, key=lambda n: not any("downwardAPI" in s for s in self.sources(n)))

    def agent(self) -> Agent:
        return Agent(
            AgentOptions(
                dest=self.root / "models",
                state_dir=self.path(self.args.state_dir),
                base=S,
                inplace_dir=self.path(self.args.inplace_dir),
                target_file=self.path(self.args.target_file),
            )
        )


def test_a_completed_rollout_never_flips_back_while_the_kubelet_refreshes_its_volumes(tmp_path: Path) -> None:
    kubelet = Kubelet(tmp_path)
    rolling = configmap(S, N)
    for name in kubelet.annotation_first():
        kubelet.refresh(name, rolling, {INPLACE_TARGET_ANNOTATION: N.revision})
    agent = kubelet.agent()
    assert agent.resolve().revision == N.revision

    # The operator: state.json stable := N first, then the annotation removed.
    done = configmap(N, None)
    seen = []
    for name in kubelet.annotation_first():
        kubelet.refresh(name, done, {})
        seen.append(agent.resolve().revision)
    assert seen == [N.revision] * len(seen), seen


def test_a_payload_swapped_between_two_reads_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """state.json and the target come from one payload even when the kubelet swaps (and deletes) the
    payload between the two reads."""
    kubelet = Kubelet(tmp_path)
    volume = kubelet.configmap_volume()
    kubelet.refresh(volume, configmap(S, N), {INPLACE_TARGET_ANNOTATION: N.revision})
    agent = kubelet.agent()
    assert agent.resolve().revision == N.revision

    real = agent_files.read_text
    swapped: list[Path] = []

    def read_then_swap(path: Path) -> str | None:
        text = real(path)
        if path.name == "state.json" and not swapped:
            swapped.append(path)
            kubelet.refresh(volume, configmap(N, None), {})  # the next payload lands right here
        return text

    monkeypatch.setattr(agent_files, "read_text", read_then_swap)
    assert agent.resolve().revision == N.revision
    assert swapped


def test_an_older_state_json_is_not_followed_but_a_rollback_and_an_undo_are(tmp_path: Path) -> None:
    kubelet = Kubelet(tmp_path)
    volume = kubelet.configmap_volume()
    agent = kubelet.agent()
    ann = {INPLACE_TARGET_ANNOTATION: N.revision}

    kubelet.refresh(volume, configmap(S, N), ann)
    assert agent.resolve().revision == N.revision
    kubelet.refresh(volume, configmap(N, None), ann)
    assert agent.resolve().revision == N.revision
    kubelet.refresh(volume, configmap(S, N), {})  # a copy older than one seen: a lag
    assert agent.resolve().revision == N.revision
    assert kubelet.agent().resolve().revision == N.revision  # a restarted agent too (its state folder)
    kubelet.refresh(volume, configmap(N, None), {})
    assert agent.resolve().revision == N.revision
    # an undo to S is a new rollout with next = S: followed
    kubelet.refresh(volume, configmap(N, S), {INPLACE_TARGET_ANNOTATION: S.revision})
    assert agent.resolve().revision == S.revision

    # a rollback (the annotation gone, state.json unchanged) is followed
    other = Kubelet(tmp_path / "other")
    name = other.configmap_volume()
    rolling_back = other.agent()
    other.refresh(name, configmap(S, N), ann)
    assert rolling_back.resolve().revision == N.revision
    other.refresh(name, configmap(S, N), {})
    assert rolling_back.resolve().revision == S.revision


def test_an_undo_shown_without_the_completion_before_it_is_followed(tmp_path: Path) -> None:
    """A pod that saw the rollout to N (asked for N) is next refreshed when the undo asks it for S:
    the kubelet refreshes a volume on the pod's own change or its periodic sync, so the pod never
    saw `{stable: N}` in between and goes from `{stable: S, next: N}` straight to `{stable: N, next:
    S}`. That is the undo, never an older copy: the agent follows it to S (CI, stop 48: the pod
    stayed on N until the undo's progress deadline rolled it back)."""
    kubelet = Kubelet(tmp_path)
    volume = kubelet.configmap_volume()
    agent = kubelet.agent()
    kubelet.refresh(volume, configmap(S, N), {INPLACE_TARGET_ANNOTATION: N.revision})
    assert agent.resolve().revision == N.revision
    kubelet.refresh(volume, configmap(N, S), {INPLACE_TARGET_ANNOTATION: S.revision})
    assert agent.resolve().revision == S.revision
    assert kubelet.agent().resolve().revision == S.revision  # a restarted agent too (its state folder)


def test_a_target_whose_files_never_show_is_said_once_in_the_log_and_the_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The pod's annotation names N, which the in-place ConfigMap does not carry (it dropped it): the
    agent serves S, quiet for FILES_WAIT_SECONDS, then says once what it waits for and where it looks,
    in its log and in the status's message the operator reads; once N shows, it follows N and waits for
    nothing."""
    monkeypatch.setattr(runner, "FILES_WAIT_SECONDS", 0.2)
    kubelet = Kubelet(tmp_path)
    for name in kubelet.annotation_first():
        kubelet.refresh(name, configmap(S, None), {INPLACE_TARGET_ANNOTATION: N.revision})
    agent = kubelet.agent()
    with caplog.at_level("WARNING", logger="triton_operator.agent"):
        assert agent.resolve().revision == S.revision
        assert agent.waiting == "" and not caplog.records  # the kubelet may show it a little later
        time.sleep(0.25)
        for _ in range(3):
            assert agent.resolve().revision == S.revision
    where = kubelet.path(kubelet.args.inplace_dir) / inplace_manifest_key(N.revision)
    said = (
        f"the pod's target names revision {N.revision}, whose files are not in the in-place volume "
        f"({where} and its configs) or which its state.json does not name, after 0.2s: "
        f"it serves {S.revision} meanwhile"
    )
    assert [r.getMessage() for r in caplog.records] == [said]  # once, not every pass
    assert agent._status_now()["message"] == said
    for name in kubelet.annotation_first():
        kubelet.refresh(name, configmap(S, N), {INPLACE_TARGET_ANNOTATION: N.revision})
    assert agent.resolve().revision == N.revision
    assert agent.waiting == "" and agent._status_now()["message"] == ""
