"""Kubernetes quantities of bytes, for the API models and the commands that take sizes (no other import)."""

from __future__ import annotations

import re
from decimal import Decimal

_BYTES_QUANTITY = re.compile(
    r"\s*([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:(Ki|Mi|Gi|Ti|Pi|Ei)|(n|u|m|k|M|G|T|P|E)|[eE]([+-]?[0-9]+))?\s*"
)
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def quantity_bytes(text: str) -> int:
    """A Kubernetes quantity of bytes -> bytes, rounded up as Kubernetes does.

    >>> quantity_bytes("20Gi"), quantity_bytes("1.5k"), quantity_bytes("1e3"), quantity_bytes("100m")
    (21474836480, 1500, 1000, 1)
    """
    match = _BYTES_QUANTITY.fullmatch(text)
    if not match:
        raise ValueError(f"{text!r} is not a quantity of bytes such as 20Gi, 500M or 1048576")
    sign, number, binary, decimal, exponent = match.groups()
    if sign == "-":
        raise ValueError(f"{text!r} is negative")
    value = Decimal(number)
    if binary:
        value *= 2 ** _BINARY[binary]
    else:
        value = value.scaleb(_DECIMAL[decimal] if decimal else int(exponent or 0))
    return int(value.to_integral_value(rounding="ROUND_CEILING"))
