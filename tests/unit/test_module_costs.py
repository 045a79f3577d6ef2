"""The per-module costs printed at the end of a run (tests/support/module_costs.py)."""

from __future__ import annotations

from module_costs import Phase, costs_table, module_costs


def test_costs_add_every_phase_per_module_count_calls_and_sort_by_cost() -> None:
    phases = [
        Phase("tests/e2e/test_a.py::t1", "setup", 30.0),
        Phase("tests/e2e/test_a.py::t1", "call", 5.0),
        Phase("tests/e2e/test_a.py::t1", "teardown", 1.0),
        Phase("tests/e2e/test_a.py::t2", "call", 4.0),
        Phase("tests/e2e/test_b.py::t", "setup", 0.5),
        Phase("tests/e2e/test_b.py::t", "call", 60.0),
        Phase("tests/unit/test_c.py::t", "call", 99.0),
    ]
    rows = module_costs(phases, "tests/e2e/")
    assert rows == [("tests/e2e/test_b.py", 60.5, 1), ("tests/e2e/test_a.py", 40.0, 2)]
    table = costs_table(rows)
    assert table[2] == "| tests/e2e/test_b.py | 1 | 60 |"
    assert table[-1] == "| total | 3 | 100 |"


def test_a_module_whose_tests_all_skipped_in_setup_counts_no_test() -> None:
    rows = module_costs([Phase("tests/e2e/test_x.py::t", "setup", 0.1)], "tests/e2e/")
    assert rows == [("tests/e2e/test_x.py", 0.1, 0)]
