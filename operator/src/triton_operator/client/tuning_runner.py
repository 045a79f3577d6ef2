"""A sweep on the cluster: each candidate's tuning pod, its perf_analyzer Job, the record, cleanup always.

`kubectl triton tune` and Python callers alike:

    from triton_operator.client import Sweep, tune
    record = tune("tiny", "demo", Sweep(model="add_sub", queue_delays_us=(0, 500)))

Candidates run one after the other (``Sweep.parallel`` pods start ahead; one is measured at a
time, so that candidates do not share the node's CPUs while measured). Every object a sweep makes
carries its run's labels and is deleted when the sweep ends, however it ends: finished, failed,
out of time, Ctrl-C or SIGTERM (the CLI turns SIGTERM into KeyboardInterrupt): by deleting their
owners (Deployments, Jobs, ConfigMaps), whose pods the garbage collector takes. A delete that fails is
reported (on the log and in the record), never stops the cleanup or the record's last save. The record
stays, in ConfigMap `<name>-tune-<run>-results`, owned by the TritonService. Every object carries the
run's deadline (core.tuning.run_deadline): should the client die (SIGKILL, its machine gone), the
operator deletes what it left once that has passed and marks the record Abandoned.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from triton_operator.core import tuning as core
from triton_operator.core.rollout.clock import format_time, utcnow
from triton_operator.models import TritonService

if TYPE_CHECKING:
    from triton_operator.adapters.tuning_cluster import TuningCluster


def _cluster(cluster: TuningCluster | None) -> TuningCluster:
    if cluster is not None:
        return cluster
    from triton_operator.adapters.tuning_cluster import KubeTuning  # noqa: PLC0415 - lightkube only when needed

    return KubeTuning()


def run_id(now: datetime) -> str:
    """A run's id: its start in UTC to the second (sorts in the order runs were made)."""
    return now.strftime("%y%m%d-%H%M%S")


class Sweeper:
    """One sweep's state: what it planned, what it measured, and its record."""

    def __init__(
        self,
        cluster: TuningCluster,
        ts_body: Mapping[str, Any],
        sweep: core.Sweep,
        *,
        run: str,
        now: Callable[[], datetime],
        clock: Callable[[], float],
        log: Callable[[str], None],
    ) -> None:
        self.cluster = cluster
        self.body = ts_body
        self.sweep = sweep
        self.run = run
        self.now = now
        self.clock = clock
        self.log = log
        metadata = ts_body.get("metadata") or {}
        self.name = str(metadata.get("name", ""))
        self.namespace = str(metadata.get("namespace", "default"))
        status = ts_body.get("status") or {}
        self.stable = str(status.get("stableRevision") or "")
        if not self.stable:
            raise core.TuningError(f"tritonservice {self.namespace}/{self.name} has no stable revision yet")
        self.configmaps = cluster.revision_configmaps(self.name, self.namespace, self.stable)
        if not self.configmaps:
            raise core.TuningError(f"the ConfigMaps of stable revision {self.stable} are gone")
        self.spec = core.stable_spec(self.configmaps)
        self.settings = core.stable_settings(self.configmaps)
        live_spec = ts_body.get("spec") or {}
        held = core.held_pods(*cluster.gpu_holders(self.name, self.namespace))
        problem = core.gpu_budget_problem(live_spec, status, held, sweep.parallel)
        if problem:
            raise core.TuningError(problem)
        self.plan = core.plan_sweep(ts_body, self.spec, sweep)
        self.results: list[core.CandidateResult] = []
        start = now()
        self.started = format_time(start)
        self.deadline = core.run_deadline(start, sweep)
        self.cleanup: list[str] = []
        self.state = core.RUNNING
        self.message = ""
        self.input_configmap: str | None = None

    def record(self, finished: bool = False) -> dict[str, Any]:
        return core.record(
            service=self.name,
            run=self.run,
            sweep=self.sweep,
            plan=self.plan,
            results=self.results,
            state=self.state,
            message=self.message,
            started_at=self.started,
            finished_at=format_time(self.now()) if finished else None,
            spec=self.body.get("spec") or {},
            cleanup=self.cleanup,
        )

    def save(self, finished: bool = False) -> dict[str, Any]:
        data = self.record(finished)
        (configmap,) = core.with_deadline([core.results_configmap(self.body, self.run, data)], self.deadline)
        self.cluster.save(configmap)
        return data

    def create(self, objects: list[dict[str, Any]]) -> None:
        """Create ``objects``, each carrying the run's deadline."""
        self.cluster.create(core.with_deadline(objects, self.deadline))

    def delete(self, labels: Mapping[str, str]) -> None:
        """Delete the objects of ``labels`` (by their owners); what failed is logged and recorded,
        never raised (the record is saved whatever cleanup does; the run's deadline ends the rest)."""
        try:
            problems = self.cluster.delete(self.namespace, labels)
        except Exception as exc:  # the API server gone: as a refused delete
            problems = [
                f"could not delete the objects of {','.join(f'{k}={v}' for k, v in labels.items())}: {exc}"
            ]
        for problem in problems:
            if problem not in self.cleanup:  # the run's last cleanup tries its candidates' again
                self.log(f"cleanup: {problem}")
                self.cleanup.append(problem)

    def _start(self, candidate: core.Candidate) -> None:
        objects = core.tuning_objects(
            self.body, self.configmaps, self.stable, self.sweep, candidate, self.run, self.settings
        )
        if core.service_selects_tuning_pods(TritonService.model_validate(dict(self.body)), objects):
            raise core.TuningError("a tuning pod would be selected by the service's Service")  # never
        self.create(objects)

    def _measure(self, candidate: core.Candidate, image: str, deadline: float) -> core.CandidateResult:
        from triton_operator.adapters.tuning_cluster import TuningPodError  # noqa: PLC0415 - lightkube only when needed

        labels = core.candidate_labels(self.name, self.run, candidate)
        try:
            left = min(deadline, self.clock() + self.sweep.candidate_seconds) - self.clock()
            ip = self.cluster.pod_ip(self.namespace, labels, left)
            self.log(
                f"{candidate.name}: pod Ready at {ip}; perf_analyzer at {list(self.sweep.concurrencies)}"
            )
            job = core.perf_job(
                self.body,
                self.run,
                candidate,
                self.sweep,
                ip,
                image,
                spec=self.spec,
                input_configmap=self.input_configmap,
            )
            self.create([job])
            left = min(deadline, self.clock() + self.sweep.candidate_seconds) - self.clock()
            text = self.cluster.job_log(self.namespace, job["metadata"]["name"], max(left, 1.0))
            rows = core.parse_perf_csv(core.job_output_csv(text))
            return core.CandidateResult(candidate, tuple(rows))
        except (TuningPodError, ValueError) as exc:
            return core.CandidateResult(candidate, (), str(exc))
        finally:
            self.delete(labels)

    def measure_all(self, image: str) -> None:
        began = self.clock()
        deadline = began + self.sweep.max_seconds
        candidates = list(self.plan.candidates)
        for start in range(0, len(candidates), self.sweep.parallel):
            chunk = candidates[start : start + self.sweep.parallel]
            if self.clock() >= deadline:
                self.message = (
                    f"--max-seconds {self.sweep.max_seconds} reached: {len(candidates) - start} not run"
                )
                return
            for candidate in chunk:
                self._start(candidate)
            for candidate in chunk:
                if self.clock() >= deadline:
                    self.delete(core.candidate_labels(self.name, self.run, candidate))
                    continue
                done = progress(len(self.results), len(candidates), self.clock() - began)
                self.log(f"{candidate.name} ({done}): {core.describe_knobs(candidate.config)}")
                result = self._measure(candidate, image, deadline)
                self.results.append(result)
                best = max((m.throughput for m in result.measurements), default=0.0)
                self.log(f"{candidate.name}: {result.error or f'{best:.1f} infer/s at best'}")
                self.save()
            if self.clock() >= deadline and start + len(chunk) < len(candidates):
                left = len(candidates) - start - len(chunk)
                self.message = f"--max-seconds {self.sweep.max_seconds} reached: {left} not run"
                return


def duration(seconds: float) -> str:
    """A duration for people: 42s, 3m05s, 1h02m."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def progress(done: int, total: int, elapsed: float) -> str:
    """Where a sweep is as a candidate starts: `candidate k of N, elapsed, about T left` (the mean
    time of the candidates measured so far, times those left, this one included)."""
    text = f"candidate {done + 1} of {total}, {duration(elapsed)} elapsed"
    if done == 0:
        return f"{text}, no estimate before the first is measured"
    return f"{text}, about {duration(elapsed / done * (total - done))} left"


def tune(
    name: str,
    namespace: str,
    sweep: core.Sweep,
    *,
    perf_image: str | None = None,
    input_data: str | None = None,
    apply: bool = False,
    keep: int = core.KEEP_RUNS,
    cluster: TuningCluster | None = None,
    now: Callable[[], datetime] = utcnow,
    clock: Callable[[], float] = time.monotonic,
    log: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """Run ``sweep`` for a model of TritonService ``namespace/name``; its record (core.tuning.record).

    ``input_data``: perf_analyzer's --input-data JSON (default: random data of the model's
    signature, as perf_analyzer makes it). ``apply``: patch the winner into the spec (a normal
    spec change: the spec's rollout, canary analysis included, carries it out). ``keep``: the
    records of the latest runs kept (older ones are deleted at the end of this one).
    Raises core.TuningError before anything is created for a sweep that cannot run; KeyboardInterrupt
    goes on up once the sweep's objects are deleted and the record says Interrupted.
    """
    kube = _cluster(cluster)
    ts_body = kube.service(name, namespace)
    sweeper = Sweeper(kube, ts_body, sweep, run=run_id(now()), now=now, clock=clock, log=log)
    image = perf_image or core.default_perf_image(core.serving_image(sweeper.configmaps))
    for refused in sweeper.plan.refused:
        log(f"refused {dict(refused.settings)}: {'; '.join(refused.problems)}")
    log(f"run {sweeper.run}: {len(sweeper.plan.candidates)} candidates, perf_analyzer from {image}")
    sweeper.save()
    try:
        if input_data is not None:
            configmap = core.input_configmap(ts_body, sweeper.run, input_data)
            sweeper.create([configmap])
            sweeper.input_configmap = configmap["metadata"]["name"]
        sweeper.measure_all(image)
        measured = any(r.error is None for r in sweeper.results)
        sweeper.state = core.SUCCEEDED if measured else core.FAILED
        if not measured:
            sweeper.message = sweeper.message or "no candidate could be measured"
    except KeyboardInterrupt:
        sweeper.state, sweeper.message = core.INTERRUPTED, "interrupted"
        raise
    except Exception as exc:
        sweeper.state, sweeper.message = core.FAILED, str(exc)
        raise
    finally:
        sweeper.delete(core.run_labels(name, sweeper.run))
        data = sweeper.save(finished=True)
        try:
            for old in core.expired_runs(kube.runs(name, namespace), keep):
                kube.forget(name, namespace, old)
        except Exception as exc:  # older records stay; this run's is saved
            log(f"cleanup: could not delete older records: {exc}")
    choice = data.get("choice") or {}
    patch: Sequence[Mapping[str, Any]] | None = choice.get("patch")
    if apply and patch:
        kube.patch_spec(name, namespace, patch)
        sweeper.message = f"applied {choice.get('candidate')} to the spec"
        data = sweeper.save(finished=True)
    return data
