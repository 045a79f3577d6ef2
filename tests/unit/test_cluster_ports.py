"""e2e/cluster.py's port picks: distinct, free, and outside the kernel's ephemeral range (no race)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import cluster


def test_every_component_gets_its_own_port_outside_the_ephemeral_range() -> None:
    low, _ = cluster._ephemeral_range()
    ports = cluster._pick_ports()
    assert set(ports) == set(cluster.CLUSTER_PORTS)
    assert len(set(ports.values())) == len(ports)
    # The kernel never hands these out to a bind(0) or an outgoing connection: nobody else can take
    # one between the pick and the component's bind, as a port picked by bind(0) could be.
    assert all(1024 <= p < low for p in ports.values())


def test_a_repeated_or_taken_port_is_skipped() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        assert not cluster._port_is_free(taken)
        # the random source offers the taken port, then one port twice, then others
        offers: Iterator[int] = iter([taken, 20001, 20001, 20002, 20003])
        ports = cluster._pick_ports(
            ("a", "b", "c"),
            ephemeral=(32768, 60999),
            randint=lambda lo, hi: next(offers),
            is_free=lambda p: p != taken,
        )
    assert ports == {"a": 20001, "b": 20002, "c": 20003}


def test_the_ephemeral_range_is_read_from_the_kernel(tmp_path: Path) -> None:
    path = tmp_path / "range"
    path.write_text("40000\t50000\n")
    assert cluster._ephemeral_range(path) == (40000, 50000)
    assert cluster._ephemeral_range(path / "missing") == (32768, 60999)
