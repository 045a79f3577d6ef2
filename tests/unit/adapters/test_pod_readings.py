"""adapters.triton_reader.TritonReader's bookkeeping without a network: what it keeps of the pods it
is handed (the reads themselves: tests/triton/test_triton_reader.py)."""

from __future__ import annotations

from triton_operator.adapters.triton_reader import PodReading, PodTarget, TritonReader

OWNER = ("ml", "svc")


class Answering(TritonReader):
    """The operator's reader, each pod answering at once (no request is sent)."""

    async def read_pod(self, target: PodTarget, *, metrics: bool, previous: PodReading | None) -> PodReading:
        self.requests += 1
        return PodReading(target.uid, target.revision, target.restarts, read_at=self.clock(), index=())


def pods(first: int, count: int) -> list[PodTarget]:
    return [PodTarget(f"uid-{i}", f"10.0.0.{i % 250}", "rev") for i in range(first, first + count)]


async def read(reader: TritonReader, targets: list[PodTarget]) -> None:
    """Hand the pods over (as a reconcile does) and let the reads due finish."""
    reader.watch(OWNER, targets)
    reader.tick()
    await reader.wait_reads()


async def test_readings_of_pods_no_longer_watched_are_forgotten() -> None:
    reader = Answering()
    try:
        for wave in range(20):  # pods come and go: a rolling restart, a canary, an autoscaler
            await read(reader, pods(wave * 5, 5))
            assert set(reader.readings(OWNER)) == {t.uid for t in pods(wave * 5, 5)}
        # a pod handed over again is read again: what it said before it went is not served as new
        reader.watch(OWNER, pods(0, 1))
        assert reader.readings(OWNER) == {}
        # the reader holds the pods watched now, not every pod it ever saw
        assert reader.held == 0
        await read(reader, pods(0, 1))
        assert reader.held == 1
    finally:
        await reader.close()
