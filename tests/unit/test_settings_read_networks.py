"""settings.may_read: which pod IPs the operator may read (Triton's and the model agent's endpoints)."""

from __future__ import annotations

import pytest

from triton_operator.settings import may_read, read_networks


@pytest.mark.parametrize(
    ("ip", "cidrs", "allowed"),
    [
        ("10.244.0.7", (), True),  # no network set: any pod IP
        (None, (), False),
        ("", ("10.0.0.0/8",), False),
        ("10.244.0.7", ("10.244.0.0/16",), True),
        ("10.245.0.7", ("10.244.0.0/16",), False),
        ("10.245.0.7", ("10.244.0.0/16", "10.245.0.0/24"), True),
        ("fd00::5", ("fd00::/64",), True),
        ("fd01::5", ("fd00::/64",), False),
        ("not-an-ip", ("10.0.0.0/8",), False),
        ("10.244.0.7", ("10.244.0.1/16",), True),  # a host address names its network (strict=False)
    ],
)
def test_a_pod_ip_is_read_only_inside_the_networks_set(
    ip: str | None, cidrs: tuple[str, ...], allowed: bool
) -> None:
    assert may_read(ip, read_networks(cidrs)) is allowed
