"""A connection to a Service's ClusterIP made before kube-proxy has the Service's rules does not spoil
later connections from the same source port, on the real node (e2e/node.py add_services_guard).

Without the node's guard the first SYN left for the ClusterIP itself (routed onto the pod bridge),
failed 'No route to host' after ARP's 3 s, and left a conntrack entry without NAT (SYN_SENT, 120 s)
that sent every later connection from that source port to the same ClusterIP past kube-proxy's rules,
to the same failure: the pool bench's lost requests (docs/benchmarks.md, "A pool on the real node").
With it the first SYN is dropped (kube-proxy's nftables mode does the same) and leaves no entry.

The Service here has no selector: its EndpointSlice names this machine's bridge address, where the
test listens, so no pod is needed.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import random
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import cluster as local_cluster  # e2e/cluster.py

pytestmark = [pytest.mark.cluster]


@contextlib.contextmanager
def greeter(ip: str) -> Iterator[int]:
    """A TCP server on ``ip`` answering b"ok" to each connection; its port."""
    server = socket.create_server((ip, 0))
    server.settimeout(0.5)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(b"ok")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        server.close()


def hello(source: tuple[str, int], ip: str, port: int, timeout: float) -> bytes | OSError:
    """What ``ip:port`` says to a connection from ``source`` (port 0: any), or the error."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(source)
        sock.settimeout(timeout)
        try:
            sock.connect((ip, port))
            return sock.recv(16)
        except OSError as exc:
            return exc


def free_cluster_ip(kube: Any) -> str:
    """An address of the Service range that no Service has (kube-proxy has no rule for it)."""
    from lightkube.resources.core_v1 import Service  # noqa: PLC0415

    taken = {ip for s in kube.list(Service, namespace="*") for ip in (s.spec.clusterIPs or [])}
    network = ipaddress.ip_network(local_cluster.SERVICE_CIDR)
    while True:
        ip = str(network[random.randrange(1 << 12, network.num_addresses - 1)])
        if ip not in taken:
            return ip


def conntrack_to(ip: str) -> str:
    """The node's conntrack entries to ``ip`` (said, not asserted: for the reader)."""
    tool = shutil.which("conntrack")
    if tool is None:
        return "(no conntrack tool here)"
    proc = subprocess.run([tool, "-L", "-d", ip], capture_output=True, text=True, timeout=10, check=False)
    return proc.stdout.strip() or "none"


def test_a_connection_before_kube_proxy_has_the_service_does_not_spoil_its_source_port(
    node: dict[str, Any], kube: Any, namespace: str
) -> None:
    from lightkube.resources.core_v1 import Service  # noqa: PLC0415
    from lightkube.resources.discovery_v1 import EndpointSlice  # noqa: PLC0415

    here = node["ip"]  # this machine's address on the pod bridge: the source of its Service traffic
    cluster_ip = free_cluster_ip(kube)
    with greeter(here) as port:
        source_port = 0
        for candidate in random.sample(range(20000, 32000), 50):  # below the ephemeral range
            with socket.socket() as probe, contextlib.suppress(OSError):
                probe.bind((here, candidate))
                source_port = candidate
                break
        assert source_port, "no free source port below the ephemeral range"

        # 1. kube-proxy has no rule for the address yet: the SYN must not leave without NAT
        started = time.monotonic()
        before = hello((here, source_port), cluster_ip, 8000, timeout=4)
        took = time.monotonic() - started
        entries = conntrack_to(cluster_ip)
        print(f"\nbefore the Service: {before!r} after {took:.1f} s; conntrack entries to it: {entries}")
        assert not (isinstance(before, OSError) and before.errno == errno.EHOSTUNREACH), (
            f"a SYN to {cluster_ip} left without NAT and came back 'No route to host' after {took:.1f} s "
            f"(conntrack: {entries})"
        )
        assert isinstance(before, TimeoutError), before

        # 2. the Service takes that address; its endpoint is this machine's greeter
        kube.create(
            Service.from_dict(
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": "late", "namespace": namespace},
                    "spec": {"clusterIP": cluster_ip, "ports": [{"port": 8000, "targetPort": port}]},
                }
            )
        )
        kube.create(
            EndpointSlice.from_dict(
                {
                    "apiVersion": "discovery.k8s.io/v1",
                    "kind": "EndpointSlice",
                    "metadata": {
                        "name": "late-1",
                        "namespace": namespace,
                        "labels": {"kubernetes.io/service-name": "late"},
                    },
                    "addressType": "IPv4",
                    "endpoints": [{"addresses": [here], "conditions": {"ready": True}}],
                    "ports": [{"port": port, "protocol": "TCP"}],
                }
            )
        )
        deadline = time.monotonic() + 60
        while hello((here, 0), cluster_ip, 8000, timeout=2) != b"ok":
            assert time.monotonic() < deadline, f"the Service at {cluster_ip} never answered"
            time.sleep(0.2)

        # 3. kube-proxy has the Service: a connection from the first one's source port reaches it too
        after = hello((here, source_port), cluster_ip, 8000, timeout=6)
        assert after == b"ok", (
            f"from source port {source_port}: {after!r}, though the Service answers from other ports "
            f"(conntrack: {conntrack_to(cluster_ip)})"
        )
