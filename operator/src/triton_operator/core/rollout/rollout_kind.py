"""In-place or new pods: which kind of rollout a change between two revisions needs, from Triton's rules.

A revision is made of three things (core.repository.revision.revision_hash): the pod-template inputs
(core.objects.builders.pod_template_inputs), the rendered config.pbtxt of each model, and the pinned
manifest. ``rollout_kind`` compares what two revisions are made of and answers ``InPlace`` (the
running tritonservers can take the change through the model control API: the changed objects
fetched, then ``load`` of the changed models only) or ``NewPods`` (with every reason that forces
new pods). It decides only; core.pod.agent_plan turns the same difference (model_diff) into the steps
a pod's model agent takes to apply it.

The Triton behaviour the rules rely on (triton-inference-server/core and server, cited where used):

* A ``load`` of a loaded model loads the new copy in the background and swaps it in when every
  version is ready; the old copy serves meanwhile, and stays when the new one fails
  (core src/model_lifecycle.cc, ModelLifeCycle::AsyncLoad keeps a READY model serving and puts the
  new ModelInfo in ``background_models_``; OnLoadComplete releases the new versions on failure, or
  releases the earlier READY versions and marks the new ones READY on success; server
  docs/user_guide/model_management.md, "Model Control Mode EXPLICIT": "the newly loaded model will
  replace the already loaded model without any loss in availability"). So old and new copies are
  resident at once during a reload: twice the model's GPU memory.
* A change to instance_group counts only is documented to add or remove instances instead of a
  reload (core src/model_lifecycle.cc ModelLifeCycle::UpdateModelInstances; model_management.md,
  "Modifying the Model Repository"), but tritonserver 2.51 reloaded the whole model for it when the
  test (tests/triton/test_inplace_reload.py) rewrote only the instance count of a config.pbtxt, as
  sync writes it: the rules count it as a reload, with the GPU rule below.
* A backend's shared library stays loaded in the tritonserver process: "To update a model's backend
  you must first unload the model completely" (model_management.md, "Modifying the Model
  Repository"); a changed backend or platform is no reload of the same model.
* A sequence model reloaded with sequences in flight: "Triton does not guarantee any remaining
  request(s) from the in-flight sequence(s) will be routed to the same model instance"
  (model_management.md, same section).
* An ensemble holds its steps by name and version; Triton loads it only once its steps are loaded
  (core src/model_lifecycle.cc CreateModel: "the ensemble can't be loaded until the involved models
  are ready"), and a ``load`` of one step loads the ensembles over it again (tritonserver 2.51,
  tests/triton/test_inplace_reload.py: no request to the ensemble failed). Loading one model at a
  time shows a mix of old and new between two loads: an ensemble and its step that change
  together need new pods.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from triton_operator.core.repository.manifest import Manifest, ManifestEntry

# pod_template_inputs' keys under "spec" that do not shape the running pod's tritonserver once it has
# started: the model list (the models' names and folders; --load-model and the config volume's items
# follow it, but the model control API loads and unloads models at run time). Every other key is
# the pod's: a change to it needs new pods.
_MODEL_KEYS = frozenset({"models"})

GPU_KIND = "KIND_GPU"


@dataclass(frozen=True)
class RevisionParts:
    """What a revision is made of, as the revision hash sees it, plus the models' spec configs.

    ``pod``: core.objects.builders.pod_template_inputs; ``configs``: model name -> rendered config.pbtxt;
    ``model_configs``: model name -> the spec's proto3-JSON config (spec.models[].config), which the
    rules read (backend, platform, instance groups, sequence batching, ensemble steps);
    ``manifest``: the pinned manifest, None when the revision has none yet.
    """

    pod: Mapping[str, Any]
    configs: Mapping[str, str]
    model_configs: Mapping[str, Mapping[str, Any]]
    manifest: Manifest | None


@dataclass(frozen=True)
class InPlace:
    """The running pods can take the change: fetch ``objects_to_fetch`` (``bytes`` in all), remove
    ``objects_to_remove``, write the changed configs, then ``load`` each of ``models_changed`` and
    ``models_added`` and ``unload`` each of ``models_removed``; no other model is touched.

    ``ensembles_affected``: ensembles one of whose steps changes while
    the ensemble itself does not (Triton loads them again over the new step; they keep serving).
    """

    models_changed: tuple[str, ...] = ()
    models_added: tuple[str, ...] = ()
    models_removed: tuple[str, ...] = ()
    objects_to_fetch: tuple[ManifestEntry, ...] = ()
    objects_to_remove: tuple[str, ...] = ()
    bytes: int = 0
    ensembles_affected: tuple[str, ...] = ()

    @property
    def nothing_to_do(self) -> bool:
        return not (self.models_changed or self.models_added or self.models_removed)


@dataclass(frozen=True)
class NewPods:
    """The change needs new pods; ``reasons`` names everything that forces them, in a stable order."""

    reasons: tuple[str, ...] = field(default_factory=tuple)


RolloutKind = InPlace | NewPods


# ---------------------------------------------------------------- the pod


def _pod_reasons(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What changed in the pod-template inputs besides the model list."""
    reasons: list[str] = []
    old_spec = dict(old.get("spec") or {})
    new_spec = dict(new.get("spec") or {})
    for key in sorted((set(old) | set(new)) - {"spec"}):
        if old.get(key) != new.get(key):
            # "image" is spec.image or the operator's default image; the rest are derived settings.
            reasons.append("spec.image changed" if key == "image" else f"{key} changed")
    for key in sorted((set(old_spec) | set(new_spec)) - _MODEL_KEYS):
        if old_spec.get(key) != new_spec.get(key):
            reasons.append(f"spec.{key} changed")
    return reasons


def _gpus(pod: Mapping[str, Any]) -> int:
    resources = (pod.get("spec") or {}).get("resources") or {}
    gpus = resources.get("gpus", 0)
    return int(gpus) if isinstance(gpus, int) else 0


# ---------------------------------------------------------------- one model's config


def _instance_groups(config: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    groups = config.get("instanceGroup", config.get("instance_group")) or []
    return [g for g in groups if isinstance(g, Mapping)]


def _is_ensemble(config: Mapping[str, Any]) -> bool:
    return config.get("platform") == "ensemble"


def _on_gpu(config: Mapping[str, Any], pod_gpus: int) -> bool:
    """Whether Triton places the model's instances on a GPU: a KIND_GPU group, or (KIND_AUTO, or no
    group at all) a pod with GPUs (Triton's AUTO picks the GPUs it sees). Ensembles have no instances."""
    if _is_ensemble(config):
        return False
    groups = _instance_groups(config)
    if not groups:
        return pod_gpus > 0
    for group in groups:
        kind = group.get("kind", "KIND_AUTO")
        if kind == GPU_KIND or (kind == "KIND_AUTO" and pod_gpus > 0):
            return True
    return False


def _steps(config: Mapping[str, Any]) -> list[str]:
    scheduling = config.get("ensembleScheduling", config.get("ensemble_scheduling")) or {}
    steps = scheduling.get("step") or [] if isinstance(scheduling, Mapping) else []
    return [str(s.get("modelName", s.get("model_name", ""))) for s in steps if isinstance(s, Mapping)]


def _model_reasons(name: str, old: Mapping[str, Any], new: Mapping[str, Any], pod_gpus: int) -> list[str]:
    """Why a model present in both revisions, and changed, cannot be reloaded in place."""
    reasons: list[str] = []
    for key in ("backend", "platform"):
        if old.get(key) != new.get(key):
            # model_management.md: a backend is updated only after the model is unloaded completely.
            reasons.append(f"model {name}: {key} changed ({old.get(key) or '-'} -> {new.get(key) or '-'})")
    if _on_gpu(old, pod_gpus) or _on_gpu(new, pod_gpus):
        # ModelLifeCycle::AsyncLoad/OnLoadComplete: the old copy is released only once the new one is
        # READY, so both sit in GPU memory during the reload.
        reasons.append(
            f"model {name}: on a GPU, a reload holds the old and the new copy in GPU memory at once"
        )
    if old.get("sequenceBatching", old.get("sequence_batching")) is not None:
        reasons.append(
            f"model {name}: sequence batching, and a reload does not keep in-flight sequences"
            " on their instance"
        )
    return reasons


# ---------------------------------------------------------------- the manifest


def _entries_by_model(manifest: Manifest) -> dict[str, set[ManifestEntry]]:
    out: dict[str, set[ManifestEntry]] = {m.name: set() for m in manifest.models}
    for entry in manifest.entries:
        out.setdefault(entry.dest.split("/", 1)[0], set()).add(entry)
    return out


def _versions(manifest: Manifest) -> dict[str, tuple[str, ...]]:
    return {m.name: m.versions for m in manifest.models}


# ---------------------------------------------------------------- the decision


@dataclass(frozen=True)
class ModelDiff:
    """What differs between two revisions' models, from their pinned manifests and rendered configs
    alone: the models whose objects, versions or config.pbtxt changed, those added and removed, the
    objects the changed and added models need that the old revision did not have, and the objects of
    the changed and removed models that the new revision no longer names. rollout_kind judges it;
    core.pod.agent_plan turns it into the steps a pod's agent takes."""

    changed: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    objects_to_fetch: tuple[ManifestEntry, ...] = ()
    objects_to_remove: tuple[str, ...] = ()

    @property
    def bytes(self) -> int:
        return sum(e.size for e in self.objects_to_fetch)


def model_diff(
    old_manifest: Manifest,
    old_configs: Mapping[str, str],
    new_manifest: Manifest,
    new_configs: Mapping[str, str],
) -> ModelDiff:
    """The models' difference between two revisions (see ModelDiff); a model is one of the configs."""
    old_names, new_names = set(old_configs), set(new_configs)
    old_entries, new_entries = _entries_by_model(old_manifest), _entries_by_model(new_manifest)
    old_versions, new_versions = _versions(old_manifest), _versions(new_manifest)
    changed = [
        name
        for name in sorted(old_names & new_names)
        if old_entries.get(name, set()) != new_entries.get(name, set())
        or old_versions.get(name) != new_versions.get(name)
        or old_configs[name] != new_configs[name]
    ]
    added = sorted(new_names - old_names)
    removed = sorted(old_names - new_names)
    fetch = sorted(
        (
            e
            for name in set(changed) | set(added)
            for e in new_entries.get(name, set()) - old_entries.get(name, set())
        ),
        key=lambda e: e.dest,
    )
    keep = {e.dest for e in new_manifest.entries}
    remove = sorted(
        e.dest
        for name in set(changed) | set(removed)
        for e in old_entries.get(name, set())
        if e.dest not in keep
    )
    return ModelDiff(tuple(changed), tuple(added), tuple(removed), tuple(fetch), tuple(remove))


def rollout_kind(old: RevisionParts, new: RevisionParts) -> RolloutKind:
    """InPlace when every difference between ``old`` and ``new`` is one the running tritonservers can
    load through the model control API safely, else NewPods with every reason (see the module)."""
    reasons = _pod_reasons(old.pod, new.pod)
    if old.manifest is None or new.manifest is None or not (old.manifest.pinned and new.manifest.pinned):
        # pvc:// (or not listed yet): no list of objects to fetch and verify; the pod links folders.
        reasons.append("the repository is not pinned (pvc:// or not listed yet): no object list to apply")
        return NewPods(tuple(reasons))
    diff = model_diff(old.manifest, old.configs, new.manifest, new.configs)
    pod_gpus = max(_gpus(old.pod), _gpus(new.pod))
    for name in diff.changed:
        reasons += _model_reasons(
            name, old.model_configs.get(name, {}), new.model_configs.get(name, {}), pod_gpus
        )
    for name in diff.added:
        if _on_gpu(new.model_configs.get(name, {}), pod_gpus):
            # Not a second copy, but memory the running pod was never sized or tested for.
            reasons.append(f"model {name}: added on a GPU the running pods' memory was not planned for")
    reasons += _ensemble_reasons(old, new, set(diff.changed))
    if reasons:
        return NewPods(tuple(reasons))
    return InPlace(
        models_changed=diff.changed,
        models_added=diff.added,
        models_removed=diff.removed,
        objects_to_fetch=diff.objects_to_fetch,
        objects_to_remove=diff.objects_to_remove,
        bytes=diff.bytes,
        ensembles_affected=tuple(_ensembles_affected(new, set(diff.changed))),
    )


def _ensembles(parts: RevisionParts) -> dict[str, list[str]]:
    return {name: _steps(cfg) for name, cfg in parts.model_configs.items() if _is_ensemble(cfg)}


def _ensemble_reasons(old: RevisionParts, new: RevisionParts, changed: set[str]) -> list[str]:
    """An ensemble and one of its steps that change together: loaded one at a time, requests between
    the two loads meet a mix of old and new (an old ensemble over a new step, or the reverse)."""
    reasons: list[str] = []
    new_ensembles = _ensembles(new)
    for ensemble, steps in sorted(_ensembles(old).items()):
        if ensemble not in changed:
            continue
        for step in sorted(set(steps) | set(new_ensembles.get(ensemble, ()))):
            if step in changed:
                reasons.append(f"ensemble {ensemble} and its step {step} change together")
    return reasons


def _ensembles_affected(new: RevisionParts, changed: set[str]) -> list[str]:
    return sorted(
        name
        for name, steps in _ensembles(new).items()
        if name not in changed and any(step in changed for step in steps)
    )


def describe(kind: RolloutKind) -> str:
    """One line for status and Events: which kind of rollout, and why or what."""
    if isinstance(kind, NewPods):
        return "new pods: " + "; ".join(kind.reasons)
    parts: list[str] = []
    for label, names in (
        ("reload", kind.models_changed),
        ("load", kind.models_added),
        ("unload", kind.models_removed),
    ):
        if names:
            parts.append(f"{label} {', '.join(names)}")
    if not parts:
        return "in place: nothing to do"
    return f"in place: {'; '.join(parts)} ({len(kind.objects_to_fetch)} objects, {kind.bytes} bytes to fetch)"
