"""obstore beyond its public API: its error text.

obstore raises a few exception classes (``GenericError`` for most HTTP failures) whose
status code, error kind and range mismatch are only in the message text (the Rust error's
``Display`` and ``Debug`` forms). Uses, each a pattern of that text:

- :data:`STATUS_RE`: ``status code: 503`` (a non-2xx response).
- :data:`KIND_RE`: ``kind: Connect`` (reqwest's error kind: Connect, Timeout, Request, ...).
- :data:`OTHER_RANGE_RE`: ``Requested 0..5, got 5..10`` (a 206 of another range).
"""

from __future__ import annotations

import re

STATUS_RE = re.compile(r"status code: (\d{3})")
KIND_RE = re.compile(r"kind: (\w+)")
OTHER_RANGE_RE = re.compile(r"Requested (\d+)\.\.(\d+), got (\d+)\.\.(\d+)")
