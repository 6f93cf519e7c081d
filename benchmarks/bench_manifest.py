"""Benchmark ``fsspec-shards manifest`` over 64 shards: local threads vs ``--dask local:2``.

The shards are on local disk, the fastest source, so the work is what a manifest costs in
CPU: reading, SHA-256 and walking every tar member (Python, under the GIL in threads; in two
processes with dask). Two views, interleaved round by round:

- the command end to end in a fresh process (``-j 8`` vs ``--dask local:2 -j 8``): what a
  user waits for, the dask run paying for starting its local cluster;
- the same work through :mod:`fsspec_shards.distributed` on a cluster already running
  (``ThreadExecutor(8)`` vs ``DaskExecutor``): the fan-out without the start-up.

    python benchmarks/bench_manifest.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from report import print_results  # noqa: E402

from fsspec_shards.fleet.demo import make_demo_dataset  # noqa: E402

SHARDS = 64
SAMPLES_PER_SHARD = 100
IMAGE_BYTES = 16_000
JOBS = 8


def cli_seconds(pattern: str, output: str, extra: list[str]) -> float:
    """Seconds for one ``fsspec-shards manifest`` in a fresh process."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    command = [sys.executable, "-m", "fsspec_shards", "manifest", pattern, "-o", output, "-q"]
    started = time.perf_counter()
    subprocess.run([*command, "-j", str(JOBS), *extra], check=True, env=env, capture_output=True)
    return time.perf_counter() - started


def api_seconds(pattern: str, output: str, executor) -> tuple[float, str]:
    """Seconds for the manifest through the Python function on ``executor``, and its text."""
    from fsspec_shards import distributed

    started = time.perf_counter()
    text = distributed.manifest(pattern, output, executor=executor)
    return time.perf_counter() - started, text


def run(rounds: int = 3, directory: str | None = None) -> dict[str, dict[str, float]]:
    """``{"manifest_64_shards": {threads_s, dask_local2_s, dask_vs_threads, ...}}``."""
    import distributed as dask_distributed

    from fsspec_shards.distributed import DaskExecutor
    from fsspec_shards.fleet.executors import ThreadExecutor

    with tempfile.TemporaryDirectory(dir=directory) as workdir:
        demo = make_demo_dataset(
            os.path.join(workdir, "shards"),
            shards=SHARDS,
            samples_per_shard=SAMPLES_PER_SHARD,
            image_bytes=IMAGE_BYTES,
        )
        output = os.path.join(workdir, "SHA256SUMS")
        times: dict[str, list[float]] = {
            name: [] for name in ("cli_threads", "cli_dask", "api_threads", "api_dask")
        }
        texts = set()
        with (
            dask_distributed.LocalCluster(
                n_workers=2,
                threads_per_worker=JOBS // 2,
                processes=True,
                dashboard_address=None,
                silence_logs=logging.ERROR,
            ) as cluster,
            dask_distributed.Client(cluster) as client,
        ):
            executors = {"api_threads": ThreadExecutor(JOBS), "api_dask": DaskExecutor(client)}
            for round_number in range(rounds):
                order = ["cli_threads", "cli_dask", "api_threads", "api_dask"]
                shift = round_number % len(order)
                for name in order[shift:] + order[:shift]:
                    if name.startswith("cli_"):
                        extra = ["--dask", "local:2"] if name == "cli_dask" else []
                        times[name].append(cli_seconds(demo.pattern, output, extra))
                        texts.add(Path(output).read_text())
                    else:
                        seconds, text = api_seconds(demo.pattern, output, executors[name])
                        times[name].append(seconds)
                        texts.add(text)
        if len(texts) != 1:
            raise RuntimeError("the runs wrote different manifests")
        medians = {name: statistics.median(values) for name, values in times.items()}
        megabytes = sum(path.stat().st_size for path in demo.shards) / 1e6
        return {
            f"manifest_{SHARDS}_shards_{megabytes:.0f}MB": {
                "cli_threads_s": medians["cli_threads"],
                "cli_dask_local2_s": medians["cli_dask"],
                "cli_dask_vs_threads": medians["cli_threads"] / medians["cli_dask"],
                "warm_threads_s": medians["api_threads"],
                "warm_dask_s": medians["api_dask"],
                "warm_dask_vs_threads": medians["api_threads"] / medians["api_dask"],
                "warm_threads_mb_per_s": megabytes / medians["api_threads"],
                "warm_dask_mb_per_s": megabytes / medians["api_dask"],
            }
        }


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repeats (default 3)")
    results = run(parser.parse_args(argv).rounds)
    print_results(results)
    return results


if __name__ == "__main__":
    main()
