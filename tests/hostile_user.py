"""Another local user, for real: a forked child that drops to uid/gid ``NOBODY`` and acts.

The child gets open directory descriptors made before it drops its rights (the test's
temp directories sit under root's private ``/tmp/pytest-of-root``), so what it may do
inside them is decided by their own owner and mode, as for a user of a shared filesystem.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable

import pytest

NOBODY = 65534


def as_other_user(action: Callable[[dict[str, int]], None], directories: dict[str, str]) -> None:
    """Run ``action(descriptors)`` as uid ``NOBODY`` in a child process, ``descriptors``
    naming an open descriptor per entry of ``directories``; fails the test if it raises."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    descriptors = {
        name: os.open(path, os.O_RDONLY | os.O_DIRECTORY) for name, path in directories.items()
    }
    try:
        read_end, write_end = os.pipe()
        child = os.fork()
        if child == 0:  # pragma: no cover - the child
            os.close(read_end)
            try:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                action(descriptors)
                code = 0
            except BaseException:
                os.write(write_end, traceback.format_exc().encode())
                code = 1
            os._exit(code)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as reader:
            failure = reader.read().decode()
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0, f"the other user's action failed:\n{failure}"
    finally:
        for descriptor in descriptors.values():
            os.close(descriptor)
