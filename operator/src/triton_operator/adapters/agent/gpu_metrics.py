"""tritonserver's GPU memory gauges, read from its metrics endpoint (core.pool.gpu_memory parses them)."""

from __future__ import annotations

import http.client
import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

from triton_operator.core.pool.gpu_memory import GpuMemory, MetricsError, parse_gpu_memory

logger = logging.getLogger("triton_operator.agent")

MAX_METRICS_BYTES = 8 * 1024 * 1024
"""The most of a metrics page read (thousands of models' per-model lines fit)."""
DEFAULT_URL = "http://127.0.0.1:8002/metrics"
DEFAULT_INTERVAL = 2.0
"""tritonserver's default --metrics-interval-ms, in seconds: how often it reads its GPUs' gauges."""


def check_url(url: str) -> str:
    """``url`` when it is http://HOST[:PORT]/PATH; ValueError naming what is wrong otherwise."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"expected http://HOST:PORT/metrics, not {url!r}")
    return url


@dataclass(frozen=True)
class GpuMetrics:
    """tritonserver's metrics endpoint (``url``), its GPU memory gauges read within ``timeout``.
    ``interval``: how often tritonserver refreshes them (its --metrics-interval-ms): a reading is
    that old at most, so a load's growth is read once two intervals have passed since the load."""

    url: str = DEFAULT_URL
    timeout: float = 2.0
    interval: float = DEFAULT_INTERVAL

    @property
    def settle_seconds(self) -> float:
        """How long after a load or unload answered a reading is sure to include it."""
        return 2 * self.interval

    def read(self) -> dict[str, GpuMemory] | None:
        """Each of the pod's GPUs' used and total memory (empty: tritonserver reports no GPU); None
        when tritonserver's metrics do not answer, or do not read as Prometheus text (said in the log)."""
        parts = urlsplit(check_url(self.url))
        path = parts.path or "/metrics"
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=self.timeout)
        try:
            connection.request("GET", path + (f"?{parts.query}" if parts.query else ""))
            response = connection.getresponse()
            body = response.read(MAX_METRICS_BYTES + 1)
        except (OSError, http.client.HTTPException) as exc:
            logger.info("pool: no GPU reading: tritonserver's metrics at %s: %s", self.url, exc)
            return None
        finally:
            connection.close()
        problem = (
            f"HTTP {response.status}"
            if response.status != 200
            else f"over {MAX_METRICS_BYTES} bytes"
            if len(body) > MAX_METRICS_BYTES
            else ""
        )
        if not problem:
            try:
                return parse_gpu_memory(body.decode("utf-8", "replace"))
            except MetricsError as exc:
                problem = str(exc)
        logger.warning("pool: no GPU reading: tritonserver's metrics at %s: %s", self.url, problem)
        return None
