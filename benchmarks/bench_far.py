"""Benchmark cold fills from a far object store: loopback servers behind a pacing proxy.

Loopback carries one connection at GB/s and hides what a real object store is like: tens
of MB/s per connection and a round trip per connection and per request. Here nginx and
moto's S3 server (a process of its own) sit behind ``pacing_proxy.py`` (another process:
25 MB/s per connection, +20 ms per connection and per request by default), and every
reader reads every object cold, into a fresh directory on disk, in an order that rotates
from round to round. The table gives median MB/s, the median of the per-round ratios to
the hand-written 8-range download, and the CPU seconds per GB of this process (every
thread of it: ``time.process_time``; the servers and the proxy run elsewhere). The readers:

- ``one_get``: one ``urllib`` GET per object (presigned on S3), written to a file
- ``eight_ranges``: what a careful script does (~60 lines below): 8 ranged GETs in flight
  on threads, each ``readinto`` a buffer and ``os.pwrite`` at its place, then ``fsync``,
  then sha256 of the file read back, compared with the expected digest
- ``simplecache_cold``: fsspec's ``simplecache::`` into a fresh directory
- ``wds_default``: ``wds::`` with its defaults (``verify="auto"`` + SHA256SUMS,
  ``ranges_in_flight`` default)

``simplecache::`` and ``wds::`` files are read to the end as a streaming consumer reads
them (``bench_cold.read_through``: 1 MiB at a time into one buffer).
- ``wds_ranges_<N>``: the same with ``ranges_in_flight=N`` fixed
- ``<N>_ranges_tool_on_obstore`` (nginx): the same tool, each range received through
  obstore instead of urllib: what receiving through obstore costs before any cache work,
  hence the floor under any reader on the obstore transport

    python benchmarks/bench_far.py [--rounds 3] [--objects 2] [--mib 64] [--rate 25MB]
                                   [--latency 0.02] [--servers nginx moto] [--ranges 8]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for entry in (str(ROOT), str(HERE)):
    if entry not in sys.path:
        sys.path.insert(0, entry)

import bench_cold  # noqa: E402
import fsspec  # noqa: E402
from bench_cold import Setup  # noqa: E402
from pacing_proxy import DEFAULT_LATENCY, DEFAULT_RATE, paced, parse_rate  # noqa: E402

from tests.integration import servers  # noqa: E402

MiB = 1024 * 1024
PIECE = MiB
SERVERS = ("nginx", "moto")
Reader = Callable[[Setup], None]


# --------------------------------------------------------------------------- readers


def one_get(setup: Setup) -> None:
    """One GET per object, streamed into a file."""
    directory = setup.fresh_dir("get")
    buffer = bytearray(PIECE)
    try:
        for url in setup.plain_urls:
            with (
                urllib.request.urlopen(url, timeout=60) as response,
                open(os.path.join(directory, "part"), "wb") as out,
            ):
                while size := response.readinto(buffer):
                    out.write(memoryview(buffer)[:size])
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def ranges_download(
    url: str, size: int, path: str, ranges: int, expected: str, receive: Receive
) -> None:
    """The hand-written tool: ``ranges`` ranged GETs in flight, each received by
    ``receive(url, start, end, buffer, write)``, pwrite, fsync, then sha256 of the file."""
    failures: list[BaseException] = []
    step = -(-size // ranges)
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(descriptor, size)

        def fetch(start: int, end: int) -> None:
            position = start

            def write(data) -> None:
                nonlocal position
                written = 0
                while written < len(data):
                    written += os.pwrite(descriptor, data[written:], position + written)
                position += len(data)

            try:
                receive(url, start, end, memoryview(bytearray(PIECE)), write)
                if position != end:
                    raise OSError(f"short body at {position} of {url}")
            except BaseException as exc:  # reported by the caller
                failures.append(exc)

        threads = [
            threading.Thread(target=fetch, args=(start, min(size, start + step)))
            for start in range(0, size, step)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            raise failures[0]
        os.fsync(descriptor)
        digest = hashlib.sha256()
        buffer = bytearray(8 * MiB)
        position = 0
        while got := os.preadv(descriptor, [buffer], position):
            digest.update(memoryview(buffer)[:got])
            position += got
        if digest.hexdigest() != expected:
            raise RuntimeError(f"sha256 mismatch for {url}")
    finally:
        os.close(descriptor)


Receive = Callable[[str, int, int, memoryview, Callable[[object], None]], None]


def urllib_receive(url: str, start: int, end: int, view: memoryview, write) -> None:
    """Bytes ``[start, end)`` of ``url`` by urllib, ``readinto`` one reused buffer."""
    request = urllib.request.Request(url, headers={"Range": f"bytes={start}-{end - 1}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        if response.status != 206:
            raise OSError(f"status {response.status} for a range of {url}")
        while got := response.readinto(view[: min(PIECE, end - start)]):
            write(view[:got])
            start += got


_obstore_stores: dict[str, object] = {}


def obstore_receive(url: str, start: int, end: int, view: memoryview, write) -> None:
    """Bytes ``[start, end)`` of ``url`` by obstore (one ``HTTPStore`` per origin, as the
    ``wds`` transport keeps one), each piece written as it is handed over."""
    import obstore
    from obstore.store import HTTPStore

    origin, name = url.rsplit("/", 1)
    store = _obstore_stores.get(origin)
    if store is None:
        store = HTTPStore.from_url(origin, client_options={"allow_http": True})
        store = _obstore_stores.setdefault(origin, store)
    result = obstore.get(store, name, options={"range": (start, end)})
    for piece in result.stream(min_chunk_size=0):
        write(piece)


def ranges_tool(ranges: int, receive: Receive = urllib_receive) -> Reader:
    def read(setup: Setup) -> None:
        directory = setup.fresh_dir("ranges")
        try:
            for url, (_, _, size, digest) in zip(setup.plain_urls, setup.objects, strict=True):
                part = os.path.join(directory, "part")
                ranges_download(url, size, part, ranges, digest, receive)
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    return read


def wds_reader(**options: object) -> Reader:
    """``wds::`` cold into a fresh cache, verify auto + SHA256SUMS, ``options`` on top."""

    def read(setup: Setup) -> None:
        directory = setup.fresh_dir("wds")
        fs = fsspec.filesystem(
            "wds",
            target_protocol=setup.protocol,
            target_options=setup.options,
            cache_dir=directory,
            checksums=setup.sums_url,
            skip_instance_cache=True,
            **options,
        )
        try:
            for url in setup.urls:
                with fs.open(url, "rb") as handle:
                    bench_cold.read_through(handle)
            fs.shard_cache.flush()  # its background fsyncs count, as the tool's fsync does
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    return read


def readers(ranges: int, server: str) -> dict[str, Reader]:
    """The readers compared on ``server``: on nginx also the tool receiving through obstore
    (the floor of any reader on obstore; S3's presigned URLs are no path for its
    ``HTTPStore``)."""
    chosen = {
        "one_get": one_get,
        f"{ranges}_ranges_tool": ranges_tool(ranges),
        "simplecache_cold": bench_cold.simplecache_cold,
        "wds_default": wds_reader(),
        f"wds_ranges_in_flight_{ranges}": wds_reader(ranges_in_flight=ranges),
    }
    if server == "nginx":
        chosen[f"{ranges}_ranges_tool_on_obstore"] = ranges_tool(ranges, obstore_receive)
    return chosen


# --------------------------------------------------------------------------- servers


@contextlib.contextmanager
def far(server: str, objects: int, mib: int, workdir: str, rate, latency) -> Iterator[Setup]:
    """The objects on ``server``, seen through a pacing proxy in a process of its own."""
    if server == "moto":
        with bench_cold.moto_process(workdir) as endpoint:
            host, port = endpoint.rsplit("/", 1)[1].split(":")
            with paced((host, int(port)), rate, latency) as proxy:
                yield bench_cold.s3_setup(
                    f"http://{proxy.host}:{proxy.port}", objects, mib, workdir
                )
    else:
        with servers.running(servers.start_http, os.path.join(workdir, "nginx")) as service:
            backend = service.backend("far")
            with paced(backend.address(), rate, latency) as proxy:
                yield bench_cold.http_setup(backend.through(proxy), objects, mib, workdir)


def measure(setup: Setup, rounds: int, chosen: dict[str, Reader], reference: str):
    """Every reader, interleaved round by round in a rotating order: ``{reader: {mb_per_s,
    vs_<reference>, cpu_s_per_gb, cpu_vs_<reference>}}`` (medians; ``vs_``: above 1 is
    faster than the reference; ``cpu_vs_``: the reader's CPU over the reference's, above 1
    is more CPU)."""
    names = list(chosen)
    times: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    total = sum(setup.sizes.values())
    first = dataclasses.replace(
        setup, urls=setup.urls[:1], paths=setup.paths[:1], plain_urls=setup.plain_urls[:1]
    )
    for name in names:  # warm-up on one object: imports, connections, the servers' first answers
        chosen[name](first)
    for round_number in range(rounds):
        shift = round_number % len(names)
        for name in names[shift:] + names[:shift]:
            started, cpu_started = time.perf_counter(), time.process_time()
            chosen[name](setup)
            times[name].append(time.perf_counter() - started)
            cpu[name].append(time.process_time() - cpu_started)
    results = {}
    for name in names:
        results[name] = {
            "mb_per_s": total / 1e6 / statistics.median(times[name]),
            f"vs_{reference}": statistics.median(
                other / own for other, own in zip(times[reference], times[name], strict=True)
            ),
            "cpu_s_per_gb": statistics.median(cpu[name]) / (total / 1e9),
            f"cpu_vs_{reference}": statistics.median(
                own / other for other, own in zip(cpu[reference], cpu[name], strict=True)
            ),
        }
    return results


def run(
    rounds: int = 3,
    objects: int = 2,
    mib: int = 64,
    rate: float | None = DEFAULT_RATE,
    latency: float = DEFAULT_LATENCY,
    server_names: tuple[str, ...] = SERVERS,
    ranges: int = 8,
    directory: str | None = None,
) -> dict[str, dict[str, float]]:
    """``{"<server> <reader>": {mb_per_s, vs_<N>_ranges_tool, cpu_s_per_gb}}``."""
    reference = f"{ranges}_ranges_tool"
    results = {}
    for server in server_names:
        chosen = readers(ranges, server)
        with tempfile.TemporaryDirectory(prefix="bench-far-", dir=directory) as workdir:
            with far(server, objects, mib, workdir, rate, latency) as setup:
                for reader, values in measure(setup, rounds, chosen, reference).items():
                    results[f"{server} {reader}"] = values
    return results


def print_table(results: dict[str, dict[str, float]], title: str) -> None:
    print(f"\n{title}\n")
    print("| server | reader | MB/s | vs ranges tool | CPU s/GB | CPU vs ranges tool |")
    print("|---|---|---:|---:|---:|---:|")
    for case, values in results.items():
        server, reader = case.split(" ", 1)
        ratio = next(value for key, value in values.items() if key.startswith("vs_"))
        cpu_ratio = next(value for key, value in values.items() if key.startswith("cpu_vs_"))
        print(
            f"| {server} | {reader} | {values['mb_per_s']:,.1f} | {ratio:.2f}x "
            f"| {values['cpu_s_per_gb']:.2f} | {cpu_ratio:.2f}x |"
        )


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repeats (default 3)")
    parser.add_argument("--objects", type=int, default=2, help="objects (default 2)")
    parser.add_argument("--mib", type=int, default=64, help="MiB per object (default 64)")
    parser.add_argument("--rate", default="25MB", help="per connection (default 25MB; 0: none)")
    parser.add_argument("--latency", type=float, default=DEFAULT_LATENCY, help="s (default 0.02)")
    parser.add_argument("--ranges", type=int, default=8, help="ranges of the tool (default 8)")
    parser.add_argument("--servers", nargs="+", choices=SERVERS, default=list(SERVERS))
    parser.add_argument("--dir", default=None, help="where the caches go (default: TMPDIR)")
    arguments = parser.parse_args(argv)
    rate = parse_rate(arguments.rate) or None
    results = run(
        arguments.rounds,
        arguments.objects,
        arguments.mib,
        rate,
        arguments.latency,
        tuple(arguments.servers),
        arguments.ranges,
        arguments.dir,
    )
    shown_rate = "unlimited" if rate is None else f"{rate / 1e6:g} MB/s"
    print_table(
        results,
        f"cold fills of {arguments.objects} x {arguments.mib} MiB through a pacing proxy "
        f"({shown_rate} per connection, +{arguments.latency * 1000:g} ms per connection and "
        f"request), medians of {arguments.rounds} interleaved rounds",
    )
    return results


if __name__ == "__main__":
    main()
