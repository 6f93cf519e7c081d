"""Units of size the package counts in, defined once.

Neutral (imports nothing of the package): any layer may use it.
"""

from __future__ import annotations

MiB = 1024 * 1024
"""A mebibyte: the unit of the package's sizes (buffers, plans, reports)."""
