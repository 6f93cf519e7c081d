"""webdataset's opener state: taken, compared and put back around a test that patches it;
and a second environment with webdataset 0.2.86, where the patch tests run again."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def _places() -> list[tuple[Any, str]]:
    """Every (owner, attribute) that ``patch_webdataset`` may replace, on either series."""
    webdataset = importlib.import_module("webdataset")
    gopen = importlib.import_module("webdataset.gopen")
    cache = importlib.import_module("webdataset.cache")
    places = [(webdataset, "gopen"), (gopen, "gopen"), (cache, "cached_url_opener")]
    for name in ("StreamingOpen", "FileCache"):
        if hasattr(cache, name):
            places += [(getattr(cache, name), "__call__"), (getattr(cache, name), "__init__")]
    return places


def snapshot() -> dict[str, Any]:
    """webdataset's opener state: the scheme table (a copy) and every patchable attribute."""
    table = importlib.import_module("webdataset.gopen").gopen_schemes
    state: dict[str, Any] = {"gopen_schemes": dict(table)}
    for owner, name in _places():
        state[f"{getattr(owner, '__name__', owner)}.{name}"] = vars(owner).get(name)
    return state


def restored() -> Iterator[object]:
    """For a fixture: yields webdataset's ``gopen`` module, and afterwards unpatches and
    puts back whatever still differs (so one failing test cannot leak into the next)."""
    pytest.importorskip("webdataset")
    import fsspec_shards

    module = importlib.import_module("webdataset.gopen")
    table = dict(module.gopen_schemes)
    saved = [(owner, name, vars(owner).get(name)) for owner, name in _places()]
    yield module
    fsspec_shards.unpatch_webdataset()
    for owner, name, value in saved:
        if value is not None and vars(owner).get(name) is not value:
            setattr(owner, name, value)
    module.gopen_schemes.clear()
    module.gopen_schemes.update(table)


ROOT = Path(__file__).resolve().parent.parent
OTHER_VERSION = "0.2.86"
INSIDE = "FSSPEC_SHARDS_WEBDATASET_UNDER_TEST"
"""Set in the second environment's run: the webdataset version it must have."""


def other_version_python(request: Any, tmp_path_factory: Any) -> Path:
    """For a fixture: a Python with webdataset 0.2.86 over this environment's packages, a
    venv kept in pytest's cache (made once); skipped naming why when pip cannot install it,
    or when this already is that environment."""
    if os.environ.get(INSIDE):
        pytest.skip("already the second environment")
    try:
        directory = request.config.cache.mkdir(f"webdataset-{OTHER_VERSION}")
    except AttributeError:  # pytest's cache is off
        directory = tmp_path_factory.mktemp(f"webdataset-{OTHER_VERSION}")
    python = directory / "bin" / "python"
    probe = [str(python), "-c", "import webdataset; print(webdataset.__version__)"]
    if python.exists() and _output(probe) == OTHER_VERSION:
        return python
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--clear", str(directory)],
        check=True,
        timeout=300,
    )
    pip = [str(python), "-m", "pip", "install", "--no-deps", "-q", "--retries", "1"]
    pip += ["--timeout", "30", f"webdataset=={OTHER_VERSION}"]
    try:
        installed = subprocess.run(pip, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.skip(f"pip could not reach a registry for webdataset=={OTHER_VERSION} in 300 s")
    if installed.returncode != 0:
        lines = (installed.stderr or installed.stdout).strip().splitlines() or ["no output"]
        pytest.skip(f"pip cannot install webdataset=={OTHER_VERSION}: {lines[-1]}")
    assert _output(probe) == OTHER_VERSION
    return python


def _output(command: list[str]) -> str | None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    return done.stdout.strip() if done.returncode == 0 else None


def run_tests(python: Path, tests: list[str]) -> None:
    """Run pytest on ``tests`` with ``python`` (this checkout's code first on the path) and
    assert they pass, the version check among them."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), INSIDE: OTHER_VERSION}
    command = [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-v", *tests]
    check = "tests/test_webdataset_patch.py::test_the_webdataset_under_test_is_the_one_asked_for"
    if check not in tests:
        command.append(check)
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=850)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "test_the_webdataset_under_test_is_the_one_asked_for PASSED" in run.stdout
