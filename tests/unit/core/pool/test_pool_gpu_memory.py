"""A pooled GPU model's memory from tritonserver's GPU metrics: the page parsed, the growth across a load.

No GPU runs here: the metrics pages below are stand-ins for what tritonserver serves on a GPU node,
written in its documented format (triton-inference-server/server docs/user_guide/metrics.md, "GPU
Metrics": the gauges ``nv_gpu_memory_used_bytes`` and ``nv_gpu_memory_total_bytes``, per GPU, labelled
``gpu_uuid``, beside the per-model counters and the CPU gauges of the same page)."""

from __future__ import annotations

import pytest

from triton_operator.core.pool.gpu_memory import (
    GPU,
    HOST,
    GpuMemory,
    MetricsError,
    gpu_growth,
    load_figure,
    measured_kinds,
    parse_gpu_memory,
)

MiB = 1 << 20
UUID0 = "GPU-c06bbf33-c250-ca45-579b-19134b518844"
UUID1 = "GPU-5d2a7f10-8e3b-4c1e-9a4f-0b6e2d7c9a11"


def page(used0: int, used1: int | None = None, *, total: int = 42949672960) -> str:
    """tritonserver's metrics page (stand-in, as documented): per-model counters, the GPU gauges of one
    or two GPUs (values printed as prometheus-cpp prints them), the CPU gauges."""
    gpus = [(UUID0, used0)] + ([(UUID1, used1)] if used1 is not None else [])
    lines = [
        "# HELP nv_inference_request_success Number of successful inference requests, all batch sizes",
        "# TYPE nv_inference_request_success counter",
        'nv_inference_request_success{model="resnet50",version="1"} 161',
        "# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)",
        "# TYPE nv_gpu_utilization gauge",
        *(f'nv_gpu_utilization{{gpu_uuid="{u}"}} 0.000000' for u, _ in gpus),
        "# HELP nv_gpu_memory_total_bytes GPU total memory, in bytes",
        "# TYPE nv_gpu_memory_total_bytes gauge",
        *(f'nv_gpu_memory_total_bytes{{gpu_uuid="{u}"}} {total}.000000' for u, _ in gpus),
        "# HELP nv_gpu_memory_used_bytes GPU used memory, in bytes",
        "# TYPE nv_gpu_memory_used_bytes gauge",
        *(f'nv_gpu_memory_used_bytes{{gpu_uuid="{u}"}} {used}' for u, used in gpus),
        "# HELP nv_cpu_memory_used_bytes CPU used memory (RAM), in bytes",
        "# TYPE nv_cpu_memory_used_bytes gauge",
        "nv_cpu_memory_used_bytes 8123456512",
    ]
    return "\n".join(lines) + "\n"


def test_each_gpus_used_and_total_memory_is_read_and_the_rest_of_the_page_left_out() -> None:
    assert parse_gpu_memory(page(1024 * MiB, 2048 * MiB)) == {
        UUID0: GpuMemory(used=1024 * MiB, total=42949672960),
        UUID1: GpuMemory(used=2048 * MiB, total=42949672960),
    }
    # Scientific notation and a timestamp are Prometheus text too; other labels beside gpu_uuid stay out.
    text = (
        'nv_gpu_memory_total_bytes{gpu_uuid="GPU-x",pod="p"} 4.294967296e+10 1700000000000\n'
        'nv_gpu_memory_used_bytes{pod="p", gpu_uuid="GPU-x"} 1.048576e+06\n'
    )
    assert parse_gpu_memory(text) == {"GPU-x": GpuMemory(used=MiB, total=42949672960)}


def test_a_page_without_gpu_metrics_reads_as_no_gpu() -> None:
    # A CPU-only pod, or tritonserver started with --allow-gpu-metrics=false: only the other lines.
    cpu_only = "\n".join(line for line in page(MiB).splitlines() if "nv_gpu" not in line)
    assert parse_gpu_memory(cpu_only) == {}
    # A GPU with its used gauge only (a page cut short) is no reading of that GPU.
    assert parse_gpu_memory(f'nv_gpu_memory_used_bytes{{gpu_uuid="{UUID0}"}} 5\n') == {}


@pytest.mark.parametrize(
    ("line", "what"),
    [
        ('nv_gpu_memory_used_bytes{gpu_uuid="GPU-x"} lots', "not a number"),
        ('nv_gpu_memory_used_bytes{gpu_uuid="GPU-x"} -1', "finite number of bytes"),
        ('nv_gpu_memory_used_bytes{gpu_uuid="GPU-x"} NaN', "finite number of bytes"),
        ('nv_gpu_memory_used_bytes{model="m"} 5', "no gpu_uuid label"),
        ("nv_gpu_memory_used_bytes{gpu_uuid=GPU-x} 5", "labels"),
        ("nv_gpu_memory_used_bytes", "not a Prometheus sample"),
    ],
)
def test_a_gpu_memory_line_that_is_not_prometheus_text_is_refused_naming_it(line: str, what: str) -> None:
    with pytest.raises(MetricsError, match=what) as raised:
        parse_gpu_memory(page(MiB) + line + "\n")
    assert line in str(raised.value)


def test_the_growth_is_the_used_memory_of_the_pods_gpus_summed_across_the_load() -> None:
    before = parse_gpu_memory(page(1000 * MiB, 500 * MiB))
    after = parse_gpu_memory(page(1300 * MiB, 700 * MiB))  # a model with an instance on each GPU
    assert gpu_growth(before, after) == 500 * MiB
    assert gpu_growth(after, before) == 0  # memory freed meanwhile: no negative figure
    assert gpu_growth(before, before) == 0


def test_no_growth_is_measured_without_the_same_gpus_read_both_times() -> None:
    one, two = parse_gpu_memory(page(MiB)), parse_gpu_memory(page(MiB, MiB))
    assert gpu_growth({}, {}) is None  # no GPU metrics
    assert gpu_growth(one, {}) is None and gpu_growth({}, one) is None
    assert gpu_growth(one, two) is None  # a GPU seen only after: not the same pod's GPUs
    # Where DCGM cannot read a GPU, tritonserver sets its used and total gauges to 0: not a reading.
    unread = parse_gpu_memory(page(0, total=0))
    assert gpu_growth(unread, one) is None and gpu_growth(one, unread) is None


def test_a_model_is_measured_in_the_memory_its_instances_take() -> None:
    assert measured_kinds(["KIND_CPU", "KIND_CPU"]) == {HOST}
    assert measured_kinds(["KIND_GPU"]) == {GPU}
    assert measured_kinds(["KIND_GPU", "KIND_CPU"]) == {HOST, GPU}
    assert measured_kinds(["KIND_GPU", "KIND_AUTO"]) == frozenset()  # where it runs: unknown
    assert measured_kinds(["KIND_MODEL"]) == frozenset()
    assert measured_kinds([]) == frozenset()  # no instance group: Triton picks the device


def test_the_figure_needs_every_kind_the_model_takes_and_sums_them() -> None:
    assert load_figure(frozenset({HOST}), 100 * MiB, None) == 100 * MiB
    assert (
        load_figure(frozenset({GPU}), 100 * MiB, 300 * MiB) == 300 * MiB
    )  # a GPU model's host growth: not counted
    assert load_figure(frozenset({HOST, GPU}), 100 * MiB, 300 * MiB) == 400 * MiB
    assert load_figure(frozenset({HOST, GPU}), 100 * MiB, None) is None  # its GPU part was not read
    assert load_figure(frozenset({GPU}), None, 0) == 0
    assert load_figure(frozenset(), 100 * MiB, 300 * MiB) is None
