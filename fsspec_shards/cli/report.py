"""What commands print: progress bars, result tables and JSON.

Invariants: results go to standard output, progress bars to standard error (hidden with
``--quiet`` or when standard error is no terminal), and every URL shown passes through
:func:`fsspec_shards.redact.redact_url` (the reports of :mod:`fsspec_shards.fleet` do it).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any


def progress(args: argparse.Namespace, **kwargs: Any):
    """A tqdm progress bar on stderr, hidden with --quiet and when stderr is no terminal."""
    from tqdm import tqdm

    return tqdm(disable=True if args.quiet else None, file=sys.stderr, dynamic_ncols=True, **kwargs)


def print_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """A table on stdout: columns padded to their widest cell, the last one left ragged."""
    rows = [tuple(header), *(tuple(row) for row in rows)]
    widths = [max(len(row[column]) for row in rows) for column in range(len(header) - 1)]
    for row in rows:
        cells = [f"{cell:<{width}}" for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]))


def print_json(report: dict[str, Any]) -> None:
    """A machine-readable report: one JSON object on one line of stdout."""
    print(json.dumps(report, sort_keys=True))
