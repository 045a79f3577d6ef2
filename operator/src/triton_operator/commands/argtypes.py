"""Argument types the subcommands share: a bad value stops the command, naming the option."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def seconds(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a number of seconds from ``low`` to ``high`` (text that is no number is
    refused as one out of range)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = low - 1.0
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} must be a number of seconds from {low:g} to {high:g}")
        return value

    return parse


def port(text: str) -> int:
    """An argparse type: a TCP port, 1 to 65535."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} must be a port from 1 to 65535")
    return value
