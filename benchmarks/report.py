"""Printing shared by the benchmark scripts when each is run on its own."""

from __future__ import annotations


def print_results(results: dict[str, dict[str, float]]) -> None:
    """One block per case: each metric's median or ratio, aligned."""
    for case, values in results.items():
        print(case)
        for name, value in values.items():
            print(f"  {name:28s} {value:12.1f}" if value >= 100 else f"  {name:28s} {value:12.2f}")
