"""The node cache's start says when its node hands free memory back to its host (Linux's free page
reporting), read from a stand-in for /sys/module/page_reporting/parameters (sysfs is the node's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit import REPO
from triton_operator.commands.node_cache import free_page_reporting


def parameters(tmp_path: Path, order: str) -> Path:
    (tmp_path / "page_reporting_order").write_text(order)
    return tmp_path


@pytest.mark.parametrize("order", ["0\n", "9\n", "10"])
def test_a_node_that_reports_free_pages_is_named_with_its_order_and_where_to_read_more(
    tmp_path: Path, order: str
) -> None:
    said = free_page_reporting(parameters(tmp_path, order))
    assert said is not None
    assert f"page_reporting_order {order.strip()}" in said
    assert "A node that hands its free memory back" in said


@pytest.mark.parametrize("order", ["11\n", "64"])
def test_reporting_turned_off_above_the_largest_order_says_nothing(tmp_path: Path, order: str) -> None:
    assert free_page_reporting(parameters(tmp_path, order)) is None


def test_a_node_without_free_page_reporting_or_an_unreadable_value_says_nothing(tmp_path: Path) -> None:
    assert free_page_reporting(tmp_path / "absent") is None
    assert free_page_reporting(parameters(tmp_path, "nine")) is None


def test_the_heading_it_names_is_in_the_operations_guide() -> None:
    assert "### A node that hands its free memory back" in (REPO / "docs" / "operations.md").read_text()
