"""A memory filesystem whose ranged reads fail by plan, for download and filesystem tests.

Each ``cat_file`` call takes the next action of the plan (then serves normally):
an exception to raise, ``Short(n)`` (hand back only n bytes), ``Flip(offset)`` (flip one
byte of the object, if it lies in the range), ``WholeBody()`` (ignore the range, as a server
that does not support Range), or ``Replace(data)`` (the object is replaced before serving).
"""

from __future__ import annotations

from fsspec.implementations.memory import MemoryFileSystem

from tests.faults import Flip, Replace, Short, WholeBody


class PlannedFaultFileSystem(MemoryFileSystem):
    """Memory files with an ETag that changes on every write, and a plan of read faults."""

    protocol = "planned"
    cachable = False

    def __init__(self, plan: list | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.plan = list(plan or [])
        self.reads: list[tuple[int, int, int]] = []  # (start, end, bytes returned)
        self.versions: dict[str, int] = {}

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        path = self._strip_protocol(path)
        super().pipe_file(path, value, mode=mode, **kwargs)
        self.versions[path] = self.versions.get(path, 0) + 1

    def info(self, path, **kwargs):
        info = super().info(path, **kwargs)
        info["ETag"] = f'"v{self.versions.get(self._strip_protocol(path), 0)}"'
        return info

    def cat_file(self, path, start=None, end=None, **kwargs):
        path = self._strip_protocol(path)
        action = self.plan.pop(0) if self.plan else None
        if isinstance(action, BaseException):
            self.reads.append((start or 0, end or -1, 0))
            raise action
        if isinstance(action, Replace):
            self.pipe_file(path, action.data)
        whole = super().cat_file(path)
        first = start or 0
        last = len(whole) if end is None else min(end, len(whole))
        data = whole if isinstance(action, WholeBody) else whole[first:last]
        if isinstance(action, Short):
            data = data[: action.length]
        if isinstance(action, Flip) and first <= action.offset < first + len(data):
            index = action.offset - first
            data = data[:index] + bytes([data[index] ^ 0xFF]) + data[index + 1 :]
        self.reads.append((first, last, len(data)))
        return data


class RangeNotSatisfiable(OSError):
    """What an HTTP client raises for 416 (carries ``.status`` like aiohttp's errors)."""

    status = 416


class UnknownSizeFileSystem(PlannedFaultFileSystem):
    """Like an HTTP server that sends no Content-Length: no size in ``info()``, and 416 for
    a range that starts at or past the end."""

    protocol = "unknownsize"

    def info(self, path, **kwargs):
        return {**super().info(path, **kwargs), "size": None}

    def cat_file(self, path, start=None, end=None, **kwargs):
        path = self._strip_protocol(path)
        if start is not None and start >= len(MemoryFileSystem.cat_file(self, path)):
            raise RangeNotSatisfiable(22, "range not satisfiable")
        return super().cat_file(path, start, end, **kwargs)
