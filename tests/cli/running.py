"""Running the fsspec-shards command line in tests: in a fresh process, as users do, or in
this one where only argument parsing is at stake; and copies of a dataset to damage."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fsspec_shards.cli import main
from fsspec_shards.fleet.demo import DemoDataset

TIMEOUT = 300


def run_cli(
    *args: str, cache: Path, console_script: bool = False, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run the command in a fresh process (environment ``env``, else ours), with the default
    cache under ``cache``."""
    env = dict(os.environ if env is None else env, FSSPEC_SHARDS_CACHE=str(cache), COLUMNS="120")
    env.pop("WDS_CACHE", None)
    if console_script:
        command = [str(Path(sys.executable).parent / "fsspec-shards")]
    else:
        command = [sys.executable, "-m", "fsspec_shards"]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=TIMEOUT, env=env
    )


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


def run_in_process(args: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    """Run ``main`` in this process (argument parsing needs no fresh interpreter)."""
    try:
        code = main(args)
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_with_closed_stdout(*args: str, cache: Path) -> subprocess.CompletedProcess:
    """Run the command with standard output a pipe whose reader is gone before it starts,
    as ``fsspec-shards ... | head`` is once head has exited."""
    reader, writer = os.pipe()
    os.close(reader)
    env = dict(os.environ, FSSPEC_SHARDS_CACHE=str(cache))
    try:
        return subprocess.run(
            [sys.executable, "-m", "fsspec_shards", *args],
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            timeout=TIMEOUT,
            env=env,
        )
    finally:
        os.close(writer)


def corrupt_copy(dataset: DemoDataset, destination: Path) -> DemoDataset:
    """A copy of ``dataset`` whose shard 1 has one payload byte flipped (valid tar, bad hash)."""
    destination.mkdir()
    for path in [*dataset.shards, dataset.manifest]:
        shutil.copy(path, destination / path.name)
    shard = destination / dataset.shards[1].name
    data = bytearray(shard.read_bytes())
    data[512 + 20] ^= 0xFF
    shard.write_bytes(bytes(data))
    shards = [destination / path.name for path in dataset.shards]
    return DemoDataset(destination, shards, destination / dataset.manifest.name, 30)


def make_glob_copy(dataset: DemoDataset, destination: Path) -> DemoDataset:
    """A copy of ``dataset`` to delete from; its pattern is a glob."""
    destination.mkdir()
    for path in [*dataset.shards, dataset.manifest]:
        shutil.copy(path, destination / path.name)
    shards = [destination / path.name for path in dataset.shards]
    return DemoDataset(destination, shards, destination / dataset.manifest.name, 30)
