"""The ``fsspec-shards`` command line: demo, stream, prefetch, verify, manifest and cache.

This is the one module that uses both towers: the storage layer (the ``wds`` filesystem
and its cache) and the iteration module (shard patterns, the tar reader, ``ShardDataset``).

Exit codes: 0 success; 1 a check failed (``verify`` found a bad shard); 2 usage error (bad
argument, option or URL pattern); 3 storage or data error (not found, denied, integrity,
malformed shard); 4 unexpected internal error; 130 interrupted (Ctrl-C); 141 the reader of
standard output went away (``| head``).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

from fsspec_shards import __version__
from fsspec_shards.config import default_cache_dir, default_cache_size, parse_size
from fsspec_shards.errors import IntegrityError, ShardFormatError
from fsspec_shards.redact import redact_url

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_STORAGE = 3
EXIT_INTERNAL = 4
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141

PROGRAM = "fsspec-shards"
DEFAULT_DEMO_DIR = "fsspec-shards-demo"
HASH_BLOCK_SIZE = 1 << 20
GLOB_CHARACTERS = frozenset("*?[")

logger = logging.getLogger("fsspec_shards.cli")


class UsageError(Exception):
    """The arguments, options or URL pattern given cannot be used (exit code 2)."""


class StorageFailure(Exception):
    """Work on some shards failed for storage reasons (exit code 3)."""


class CommandParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line on stderr, exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


# ---------------------------------------------------------------------------------------
# Storage options: --option PROTOCOL.KEY=VALUE, --options-file, and the cache flags.


def parse_option(text: str) -> tuple[list[str], Any]:
    """Split ``s3.endpoint_url=http://host`` into (["s3", "endpoint_url"], value).

    The value is parsed as JSON when it parses (numbers, true/false, objects), else kept as a
    string. Dots after the protocol nest: ``s3.client_kwargs.region_name=eu-west-1``.
    """
    key, separator, raw = text.partition("=")
    path = key.strip().split(".")
    if not separator or len(path) < 2 or not all(path):
        raise UsageError(
            f"invalid --option {key.strip()!r}: expected PROTOCOL.KEY=VALUE, "
            "e.g. s3.endpoint_url=http://localhost:9000"
        )
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return path, value


def load_options_file(path: str) -> dict[str, dict]:
    """Read ``{protocol: {key: value}}`` from a ``.json`` or ``.toml`` file."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read options file {path}: {exc.strerror or exc}") from None
    try:
        options = _load_toml(data) if path.endswith(".toml") else json.loads(data)
    except ValueError as exc:
        raise UsageError(f"options file {path} is not valid: {exc}") from None
    if not isinstance(options, dict) or not all(isinstance(v, dict) for v in options.values()):
        raise UsageError(
            f"options file {path} must map each protocol to a table of options, "
            'e.g. {"s3": {"endpoint_url": "..."}, "wds": {"retries": 5}}'
        )
    return options


def _load_toml(data: bytes) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise UsageError("TOML options files need Python 3.11+ or the tomli package") from None
    return tomllib.loads(data.decode())


def storage_options_from(args: argparse.Namespace) -> dict[str, dict]:
    """The per-protocol storage options of a command: file, then --option, then flags."""
    options: dict[str, dict] = {}
    if getattr(args, "options_file", None):
        options = load_options_file(args.options_file)
    for text in getattr(args, "option", None) or []:
        path, value = parse_option(text)
        table = options
        for name in path[:-1]:
            table = table.setdefault(name, {})
            if not isinstance(table, dict):
                raise UsageError(f"--option {'.'.join(path)} nests under a non-table value")
        table[path[-1]] = value
    wds = options.setdefault("wds", {})
    if getattr(args, "retries", None) is not None:
        wds["retries"] = args.retries
    if getattr(args, "cache_dir", None):
        wds["cache_dir"] = os.path.abspath(os.path.expanduser(args.cache_dir))
    if getattr(args, "cache_size", None):
        wds["cache_size"] = size_argument(args.cache_size)
    if getattr(args, "no_cache", False):
        wds["cache"] = False
    return options


def size_argument(text: str) -> int:
    """A byte count from the command line, as a usage error when malformed."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


# ---------------------------------------------------------------------------------------
# URLs: patterns to wds:: URLs of shards.


def plain_url(url: str) -> str:
    """The backend URL of a possibly chained URL: ``wds::s3://b/k`` -> ``s3://b/k``."""
    return url.rsplit("::", 1)[-1]


def wds_url(url: str) -> str:
    """Read ``url`` through ``wds::`` unless it already is a chained URL.

    Local paths become absolute ``file://`` URLs so they do not depend on the cache's
    working directory.
    """
    if "::" in url:
        return url
    if "://" not in url:
        url = "file://" + os.path.abspath(os.path.expanduser(url))
    return "wds::" + url


def has_glob(url: str) -> bool:
    """True when ``url`` holds glob characters to expand (never for http(s) query strings)."""
    target = plain_url(url)
    if target.startswith(("http://", "https://")):
        return False
    return any(character in GLOB_CHARACTERS for character in target)


def shard_urls(pattern: str, options: dict[str, dict]) -> list[str]:
    """Expand braces and globs in ``pattern`` into the ``wds::`` URLs of the shards."""
    from fsspec_shards.iteration.urls import expand_urls

    try:
        urls = expand_urls(pattern)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    expanded: list[str] = []
    for url in urls:
        expanded.extend(glob_url(url, options) if has_glob(url) else [wds_url(url)])
    if not expanded:
        raise UsageError(f"no shards match {redact_url(pattern)!r}")
    return expanded


def glob_url(url: str, options: dict[str, dict]) -> list[str]:
    """The ``wds::`` URLs of the files matching a glob, listed on the backend."""
    import fsspec

    target = plain_url(wds_url(url))
    prefix = url[: len(url) - len(plain_url(url))] or "wds::"
    protocol = target.split("://", 1)[0]
    try:
        fs, path = fsspec.core.url_to_fs(target, **options.get(protocol, {}))
    except (ValueError, ImportError) as exc:
        raise UsageError(f"cannot list {redact_url(target)}: {exc}") from None
    return [prefix + fs.unstrip_protocol(match) for match in sorted(fs.glob(path))]


def open_filesystem(url: str, options: dict[str, dict]) -> tuple[Any, str]:
    """The filesystem and path of a (chained) URL, with a bad protocol as a usage error."""
    import fsspec

    try:
        return fsspec.core.url_to_fs(url, **options)
    except (ValueError, ImportError) as exc:
        raise UsageError(f"cannot open {redact_url(url)}: {exc}") from None


# ---------------------------------------------------------------------------------------
# Progress, parallel work and reports.


def progress(args: argparse.Namespace, **kwargs: Any):
    """A tqdm progress bar on stderr, hidden with --quiet and when stderr is no terminal."""
    from tqdm import tqdm

    return tqdm(disable=True if args.quiet else None, file=sys.stderr, dynamic_ncols=True, **kwargs)


@dataclass
class Outcome:
    """What one item of parallel work gave: a result, or the exception it raised."""

    item: Any
    result: Any = None
    error: Exception | None = None


def run_parallel(function: Callable[[Any], Any], items: list, jobs: int) -> Iterator[Outcome]:
    """Yield ``function(item)`` outcomes as they finish, from ``jobs`` daemon threads.

    Daemon threads let Ctrl-C end the command at once instead of waiting for downloads in
    flight; the cache is safe against that by design (entries are whole or absent).
    """
    tasks: queue.Queue = queue.Queue()
    outcomes: queue.Queue = queue.Queue()
    for item in items:
        tasks.put(item)

    def work() -> None:
        while True:
            try:
                item = tasks.get_nowait()
            except queue.Empty:
                return
            try:
                outcomes.put(Outcome(item, result=function(item)))
            except Exception as exc:
                outcomes.put(Outcome(item, error=exc))

    for _ in range(max(1, min(jobs, len(items)))):
        threading.Thread(target=work, daemon=True, name="fsspec-shards-cli").start()
    for _ in items:
        yield outcomes.get()


def describe_error(error: BaseException) -> str:
    """A short, secret-free description of why a shard failed."""
    if isinstance(error, FileNotFoundError):
        kind = "not found"
    elif isinstance(error, PermissionError):
        kind = "permission denied"
    elif isinstance(error, IntegrityError):
        kind = "integrity"
    elif isinstance(error, ShardFormatError):
        kind = "malformed tar"
    elif isinstance(error, LookupError):
        kind = "not in the manifest"
    else:
        kind = type(error).__name__
    if isinstance(error, OSError) and error.strerror:
        message = error.strerror + (f": {error.filename}" if error.filename else "")
    else:
        message = str(error)
    if message.startswith(kind):
        return message
    return f"{kind}: {message}" if message else kind


def format_bytes(count: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(count) < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} TB"


STAT_KEYS = ("hits", "misses", "bytes_downloaded", "retries", "integrity_failures")


def storage_stats(fs: Any) -> dict[str, int]:
    """The counters of a wds filesystem (zeros for any other filesystem)."""
    stats = fs.cache_stats() if hasattr(fs, "cache_stats") else {}
    return {key: int(stats.get(key, 0)) for key in STAT_KEYS}


@dataclass
class PassReport:
    """The numbers printed after streaming a dataset once."""

    title: str
    cache_enabled: bool = True
    samples: int = 0
    payload_bytes: int = 0
    seconds: float = 0.0
    shards: int = 0
    failed_shards: int = 0
    storage: dict[str, int] = field(default_factory=dict)
    failures: list[tuple[str, str]] = field(default_factory=list)

    def shard_hit_rate(self) -> str:
        """The share of shards read that were in the cache already (not downloaded)."""
        if not self.cache_enabled:
            return "cache off"
        if not self.shards:
            return "n/a"
        downloaded = min(self.storage.get("misses", 0), self.shards)
        return f"{100 * (self.shards - downloaded) / self.shards:.0f}% of shards"

    def lines(self) -> list[str]:
        seconds = max(self.seconds, 1e-9)
        rows = [
            ("samples", f"{self.samples}"),
            ("time", f"{self.seconds:.2f} s"),
            ("samples/s", f"{self.samples / seconds:,.0f}"),
            ("MB/s", f"{self.payload_bytes / seconds / 1e6:,.1f}"),
            ("cache hit rate", self.shard_hit_rate()),
            ("cache hits/misses", f"{self.storage['hits']} / {self.storage['misses']}"),
            ("downloaded", format_bytes(self.storage["bytes_downloaded"])),
            ("retries", f"{self.storage['retries']}"),
            ("integrity failures", f"{self.storage['integrity_failures']}"),
            ("failed shards", f"{self.failed_shards}"),
        ]
        lines = [self.title] + [f"  {name:<19} {value}" for name, value in rows]
        lines += [f"  failed: {redact_url(comparable(url))}: {why}" for url, why in self.failures]
        return lines


# ---------------------------------------------------------------------------------------
# Streaming: demo and stream.


def stream_pass(
    args: argparse.Namespace,
    title: str,
    urls: list[str],
    options: dict[str, dict],
    dataset_kwargs: dict[str, Any],
    limit: int | None = None,
    epoch: int = 0,
) -> PassReport:
    """Iterate a ShardDataset over ``urls`` once, with a progress bar, and report on it."""
    fs, _ = open_filesystem(urls[0], options)
    keep_torch_out()
    from fsspec_shards.iteration.dataset import ShardDataset

    before = storage_stats(fs)
    dataset = ShardDataset(urls, storage_options=options, **dataset_kwargs)
    dataset.set_epoch(epoch)
    report = PassReport(title, cache_enabled=options.get("wds", {}).get("cache") is not False)
    started = time.perf_counter()
    with progress(args, desc=title, unit=" samples", total=limit) as bar:
        for sample in dataset:
            report.samples += 1
            report.payload_bytes += sum(
                len(value) for key, value in sample.items() if not key.startswith("__")
            )
            bar.update()
            if limit is not None and report.samples >= limit:
                break
    report.seconds = time.perf_counter() - started
    after = storage_stats(fs)
    report.storage = {key: after[key] - before[key] for key in STAT_KEYS}
    stats = dataset.stats()
    report.failed_shards = int(stats.get("shards_failed", 0))
    report.shards = int(stats.get("shards_done", 0)) + report.failed_shards
    report.failures = [(url, describe_error(error)) for url, error in stats.get("failures", [])]
    return report


def keep_torch_out() -> None:
    """Make ``import torch`` fail in this process unless it already happened.

    The command line iterates in one process, with no DataLoader, so ShardDataset needs no
    torch base class; importing torch would add seconds to every ``demo`` and ``stream``.
    """
    sys.modules.setdefault("torch", None)


def dataset_arguments(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "shuffle_shards": args.shuffle_shards,
        "shuffle_buffer": args.shuffle_buffer,
        "seed": args.seed,
        "handler": args.handler,
        "prefetch": args.prefetch,
        "split_by_node": False,
        "split_by_worker": False,
    }


def cmd_demo(args: argparse.Namespace) -> int:
    from fsspec_shards.demo import make_demo_dataset

    directory = Path(args.directory or DEFAULT_DEMO_DIR).expanduser().resolve()
    started = time.perf_counter()
    demo = make_demo_dataset(directory, shards=args.shards, samples_per_shard=args.samples)
    print(
        f"wrote {len(demo.shards)} shards x {demo.samples_per_shard} samples "
        f"({format_bytes(sum(p.stat().st_size for p in demo.shards))}) and "
        f"{demo.manifest.name} to {directory} in {time.perf_counter() - started:.2f} s"
    )
    cache_dir = directory / "cache"
    options = {"wds": {"cache_dir": str(cache_dir), "checksums": str(demo.manifest)}}
    urls = shard_urls(demo.pattern, {})
    fs, _ = open_filesystem(urls[0], options)
    fs.clear_cache()  # a cold first pass; removes only the cache's own files
    kwargs = {"shuffle_shards": False, "split_by_node": False, "split_by_worker": False}
    for title in ("pass 1: cold cache", "pass 2: from cache"):
        report = stream_pass(args, title, urls, options, kwargs)
        print("\n".join(report.lines()))
        if report.samples != demo.total_samples:
            raise RuntimeError(f"expected {demo.total_samples} samples, got {report.samples}")
    print(
        "\nnext: fsspec-shards verify '"
        + demo.pattern
        + f"' --manifest {demo.manifest}\n      fsspec-shards cache info --cache-dir {cache_dir}"
    )
    return EXIT_OK


def cmd_stream(args: argparse.Namespace) -> int:
    options = storage_options_from(args)
    urls = shard_urls(args.url_pattern, options)
    if args.limit is not None and args.limit < 1:
        raise UsageError("--limit must be at least 1")
    report = stream_pass(
        args, f"{len(urls)} shards", urls, options, dataset_arguments(args), args.limit, args.epoch
    )
    print("\n".join(report.lines()))
    return EXIT_OK


# ---------------------------------------------------------------------------------------
# prefetch


def cmd_prefetch(args: argparse.Namespace) -> int:
    options = storage_options_from(args)
    if options["wds"].get("cache") is False:
        raise UsageError("prefetch fills the cache: it cannot run with --no-cache")
    urls = shard_urls(args.url_pattern, options)
    fs, _ = open_filesystem(urls[0], options)
    if not hasattr(fs, "prefetch"):
        raise UsageError(f"prefetch needs wds:: URLs, not {redact_url(urls[0])}")
    before = storage_stats(fs)

    def fetch(url: str) -> int:
        shard_fs, path = open_filesystem(url, options)
        local = shard_fs.prefetch(path)
        if local is None:
            raise StorageFailure(f"{redact_url(url)} does not fit in the cache")
        return os.path.getsize(local)

    failures: list[Outcome] = []
    done = 0
    try:
        with progress(args, desc="prefetch", unit="B", unit_scale=True, unit_divisor=1024) as bar:
            bar.set_postfix_str(f"0/{len(urls)} shards")
            for outcome in run_parallel(fetch, urls, args.jobs):
                done += 1
                if outcome.error is not None:
                    failures.append(outcome)
                    logger.debug("prefetch of %s failed", redact_url(outcome.item))
                else:
                    bar.update(outcome.result)
                bar.set_postfix_str(f"{done}/{len(urls)} shards")
    except KeyboardInterrupt:
        print(
            f"{PROGRAM} prefetch: interrupted after {done} of {len(urls)} shards; "
            "run the same command again to fetch the rest",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    stats = {key: value - before[key] for key, value in storage_stats(fs).items()}
    fetched = len(urls) - len(failures)
    print(
        f"prefetched {fetched} of {len(urls)} shards: "
        f"{stats['misses']} downloaded ({format_bytes(stats['bytes_downloaded'])}), "
        f"{max(fetched - stats['misses'], 0)} already cached, {stats['retries']} retries"
    )
    if failures:
        print_failures(failures)
        first = failures[0]
        raise StorageFailure(
            f"{len(failures)} shards could not be fetched, first "
            f"{redact_url(first.item)}: {describe_error(first.error)}"
        )
    return EXIT_OK


def print_failures(failures: list[Outcome]) -> None:
    """A table of failed shards on stdout: shard, then why."""
    rows = [(redact_url(comparable(o.item)), describe_error(o.error)) for o in failures]
    width = max(len("shard"), *(len(shard) for shard, _ in rows))
    print(f"{'shard':<{width}}  problem")
    for shard, problem in sorted(rows):
        print(f"{shard:<{width}}  {problem}")


# ---------------------------------------------------------------------------------------
# verify and manifest: read every shard once, hashing it and walking its tar members.


class HashingReader(io.RawIOBase):
    """A raw stream over ``source`` that hashes and counts every byte read through it."""

    def __init__(self, source: BinaryIO) -> None:
        self.source = source
        self.digest = hashlib.sha256()
        self.size = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.source.read(len(buffer))
        count = len(data)
        buffer[:count] = data
        self.digest.update(data)
        self.size += count
        return count


@dataclass
class ShardCheck:
    """What reading one shard found: its SHA-256, size and number of samples."""

    url: str
    sha256: str
    size: int
    samples: int


def check_shard(url: str, options: dict[str, dict]) -> ShardCheck:
    """Read one shard through the wds filesystem, hashing it and parsing every tar member."""
    from fsspec_shards.iteration.samples import group_samples
    from fsspec_shards.iteration.tar import iter_members, open_shard_stream

    fs, path = open_filesystem(url, options)
    with fs.open(path, "rb") as source:
        raw = HashingReader(source)
        stream = open_shard_stream(io.BufferedReader(raw, HASH_BLOCK_SIZE), url)
        samples = sum(1 for _ in group_samples(iter_members(stream, url), url))
        while stream.read(HASH_BLOCK_SIZE):
            pass
        while raw.read(HASH_BLOCK_SIZE):
            pass
    return ShardCheck(url, raw.digest.hexdigest(), raw.size, samples)


def streaming_options(args: argparse.Namespace) -> dict[str, dict]:
    """Storage options for reading each shard once: straight from storage, no cache."""
    options = storage_options_from(args)
    options["wds"]["cache"] = False
    return options


def check_all(
    args: argparse.Namespace, urls: list[str], options: dict[str, dict], title: str
) -> tuple[list[ShardCheck], list[Outcome]]:
    """Check every shard in parallel with a progress bar; (checks in URL order, failures)."""
    checks: dict[str, ShardCheck] = {}
    failures: list[Outcome] = []
    with progress(args, desc=title, unit=" shards", total=len(urls)) as bar:
        for outcome in run_parallel(lambda url: check_shard(url, options), urls, args.jobs):
            if outcome.error is None:
                checks[outcome.item] = outcome.result
            else:
                failures.append(outcome)
            bar.update()
    return [checks[url] for url in urls if url in checks], failures


def read_manifest(location: str, options: dict[str, dict]) -> dict[str, str]:
    """``{plain URL: sha256 hex}`` from a ``sha256sum``-format file (names relative to it)."""
    import fsspec

    target = plain_url(location)
    if "://" not in target:
        target = os.path.abspath(os.path.expanduser(target))
    protocol = target.split("://", 1)[0] if "://" in target else "file"
    try:
        with fsspec.open(target, "rt", **options.get(protocol, {})) as handle:
            text = handle.read()
    except FileNotFoundError:
        raise UsageError(f"manifest not found: {redact_url(location)}") from None
    base = target.rsplit("/", 1)[0]
    digests = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        digest, _, name = line.partition(" ")
        name = name.lstrip(" *")
        if len(digest) != 64 or not name:
            raise UsageError(f"{redact_url(location)} line {number}: not 'SHA256  NAME'")
        url = name if "://" in name or name.startswith("/") else f"{base}/{name}"
        digests[comparable(url)] = digest.lower()
    return digests


def comparable(url: str) -> str:
    """A shard URL in the form manifests name it: plain, local paths without ``file://``."""
    target = plain_url(url)
    return target[len("file://") :] if target.startswith("file://") else target


def cmd_verify(args: argparse.Namespace) -> int:
    options = streaming_options(args)
    expected = read_manifest(args.manifest, options) if args.manifest else None
    urls = shard_urls(args.url_pattern, options)
    checks, failures = check_all(args, urls, options, "verify")
    for check in checks:
        if expected is None:
            continue
        digest = expected.get(comparable(check.url))
        if digest is None:
            failures.append(Outcome(check.url, error=LookupError("not in the manifest")))
        elif digest != check.sha256:
            failures.append(
                Outcome(
                    check.url,
                    error=IntegrityError(check.url, f"sha256:{digest}", f"sha256:{check.sha256}"),
                )
            )
    samples = sum(check.samples for check in checks)
    source = f"manifest {args.manifest}" if expected is not None else "backend checksums"
    print(
        f"verified {len(urls)} shards against {source}: {len(urls) - len(failures)} ok, "
        f"{len(failures)} bad ({samples} samples in the readable shards)"
    )
    if failures:
        print_failures(failures)
        return EXIT_CHECK_FAILED
    return EXIT_OK


def manifest_name(url: str, manifest_dir: str) -> str:
    """The name of a shard in a manifest in ``manifest_dir``: relative when below it."""
    name = comparable(url)
    if name.startswith(manifest_dir.rstrip("/") + "/"):
        return name[len(manifest_dir.rstrip("/")) + 1 :]
    return name


def count_keys(names: list[str]) -> list[str]:
    """Keys of the sample-counts sidecar, in shard order: file names when they are unique
    (ShardDataset's ``samples_per_shard`` finds shards by file name), else manifest names."""
    basenames = [name.rsplit("/", 1)[-1] for name in names]
    return basenames if len(set(basenames)) == len(basenames) else names


def write_text(location: str, text: str, options: dict[str, dict]) -> None:
    """Write ``text`` to a local path or an fsspec URL (straight to the backend)."""
    import fsspec

    if "://" not in location:
        Path(location).write_text(text)
        return
    protocol = location.split("://", 1)[0]
    with fsspec.open(location, "wt", **options.get(protocol, {})) as handle:
        handle.write(text)


def cmd_manifest(args: argparse.Namespace) -> int:
    options = streaming_options(args)
    urls = shard_urls(args.url_pattern, options)
    output = args.output if "://" in args.output else os.path.abspath(args.output)
    manifest_dir = comparable(output).rsplit("/", 1)[0]
    checks, failures = check_all(args, urls, options, "manifest")
    if failures:
        print_failures(failures)
        raise StorageFailure(f"{len(failures)} shards could not be read; no manifest written")
    names = [manifest_name(check.url, manifest_dir) for check in checks]
    bad_names = [name for name in names if "\n" in name or "\\" in name]
    if bad_names:
        raise UsageError(f"shard name {bad_names[0]!r} cannot be written in sha256sum format")
    lines = [f"{check.sha256}  {name}\n" for check, name in zip(checks, names, strict=True)]
    write_text(output, "".join(lines), options)
    print(f"wrote {len(checks)} checksums to {redact_url(output)}")
    if args.sample_counts:
        keys = count_keys(names)
        counts = {key: check.samples for key, check in zip(keys, checks, strict=True)}
        write_text(args.sample_counts, json.dumps(counts, indent=1) + "\n", options)
        print(f"wrote {sum(counts.values())} samples in counts to {args.sample_counts}")
    return EXIT_OK


# ---------------------------------------------------------------------------------------
# cache info | ls | clear


def cache_directory(args: argparse.Namespace) -> str:
    return os.path.abspath(os.path.expanduser(args.cache_dir or default_cache_dir()))


def open_cache(args: argparse.Namespace):
    """The ShardCache of --cache-dir (or the default), or None when there is none yet."""
    from fsspec_shards.storage.cache import ShardCache

    directory = cache_directory(args)
    if not os.path.isdir(directory):
        return None
    size = size_argument(args.cache_size) if args.cache_size else default_cache_size()
    return ShardCache(directory, size)


def cmd_cache_info(args: argparse.Namespace) -> int:
    cache = open_cache(args)
    print(f"{'directory':<19} {cache_directory(args)}")
    if cache is None:
        print(f"{'cached files':<19} 0 (no cache yet)")
        return EXIT_OK
    stats = cache.stats()
    for key in ("cached_files", "cached_bytes", "size_limit", *STAT_KEYS, "evictions"):
        value = stats.get(key, 0)
        shown = format_bytes(value) if key.endswith(("_bytes", "_limit", "_downloaded")) else value
        print(f"{key.replace('_', ' '):<19} {shown}")
    return EXIT_OK


def cmd_cache_ls(args: argparse.Namespace) -> int:
    cache = open_cache(args)
    if cache is None:
        return EXIT_OK
    for entry in cache.entries():
        print(f"{format_bytes(entry['size']):>10}  {redact_url(entry['url'])}")
    return EXIT_OK


def cmd_cache_clear(args: argparse.Namespace) -> int:
    cache = open_cache(args)
    before = cache.stats() if cache is not None else {}
    if cache is not None:
        cache.clear()
    print(
        f"removed {before.get('cached_files', 0)} files "
        f"({format_bytes(before.get('cached_bytes', 0))}) from {cache_directory(args)}"
    )
    return EXIT_OK


# ---------------------------------------------------------------------------------------
# The parser and main.


def build_parser() -> CommandParser:
    """The argparse parser of ``fsspec-shards`` and its subcommands."""
    output = CommandParser(add_help=False)
    loudness = output.add_mutually_exclusive_group()
    loudness.add_argument(
        "-v", "--verbose", action="store_true", help="log details; show tracebacks on errors"
    )
    loudness.add_argument(
        "-q", "--quiet", action="store_true", help="no progress bars, only results and errors"
    )

    storage = CommandParser(add_help=False)
    group = storage.add_argument_group("storage")
    group.add_argument(
        "--option",
        action="append",
        metavar="PROTOCOL.KEY=VALUE",
        help="a storage option, repeatable, e.g. s3.endpoint_url=http://localhost:9000 or "
        "wds.verify=false (values parse as JSON when they can)",
    )
    group.add_argument(
        "--options-file",
        metavar="FILE",
        help='storage options from a .json or .toml file: {"s3": {...}, "wds": {...}}',
    )
    group.add_argument(
        "--retries", type=int, metavar="N", help="most attempts for a transient failure"
    )

    cache = CommandParser(add_help=False)
    group = cache.add_argument_group("cache")
    group.add_argument(
        "--cache-dir", metavar="DIR", help="cache directory (default: FSSPEC_SHARDS_CACHE, ...)"
    )
    group.add_argument(
        "--cache-size", metavar="SIZE", help='cache bound, e.g. "50GB" (default 20 GiB)'
    )
    group.add_argument(
        "--no-cache", action="store_true", help="stream with retries and checks, keep nothing"
    )

    jobs = CommandParser(add_help=False)
    jobs.add_argument(
        "-j", "--jobs", type=int, default=8, metavar="N", help="shards in parallel (default 8)"
    )

    parser = CommandParser(
        prog=PROGRAM,
        description="Stream, cache and check webdataset-format shards on any fsspec storage.",
        epilog="exit codes: 0 ok, 1 check failed, 2 usage error, 3 storage or data error, "
        "4 internal error, 130 interrupted",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = commands.add_parser(
        "demo",
        parents=[output],
        help="make a small dataset on local disk and stream it through the cache",
        description="Write a seeded sample dataset (tar shards of .jpg/.cls/.json samples "
        "and a SHA256SUMS manifest) into DIR, then stream it through wds:: twice: with a "
        "cold cache, then from the cache. Needs no network.",
    )
    demo.add_argument(
        "directory", nargs="?", metavar="DIR", help=f"where to write (default ./{DEFAULT_DEMO_DIR})"
    )
    demo.add_argument("--shards", type=positive_int, default=8, help="number of shards")
    demo.add_argument("--samples", type=positive_int, default=250, help="samples per shard")
    demo.set_defaults(run=cmd_demo)

    stream = commands.add_parser(
        "stream",
        parents=[output, storage, cache],
        help="iterate a dataset and report samples/s, MB/s, cache hit rate, retries",
        description="Iterate the samples of URL_PATTERN (braces and globs expand; plain "
        "URLs and paths are read through wds::) and report on the throughput.",
    )
    stream.add_argument("url_pattern", metavar="URL_PATTERN")
    stream.add_argument(
        "--shuffle-shards",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="shuffle shard order by (seed, epoch) (default off)",
    )
    stream.add_argument(
        "--shuffle-buffer", type=int, default=0, metavar="N", help="sample shuffle buffer"
    )
    stream.add_argument("--seed", type=int, default=0)
    stream.add_argument("--epoch", type=int, default=0)
    stream.add_argument(
        "--handler",
        choices=("raise", "warn", "skip"),
        default="raise",
        help="what a broken shard does (default raise)",
    )
    stream.add_argument(
        "--prefetch", type=int, default=2, metavar="N", help="shards fetched ahead (default 2)"
    )
    stream.add_argument("--limit", type=int, metavar="N", help="stop after N samples")
    stream.set_defaults(run=cmd_stream)

    prefetch = commands.add_parser(
        "prefetch",
        parents=[output, storage, cache, jobs],
        help="fill the cache with every shard, in parallel",
        description="Download every shard of URL_PATTERN into the cache, verified. "
        "Interrupt with Ctrl-C and run again to resume: cached shards are skipped.",
    )
    prefetch.add_argument("url_pattern", metavar="URL_PATTERN")
    prefetch.set_defaults(run=cmd_prefetch)

    verify = commands.add_parser(
        "verify",
        parents=[output, storage, jobs],
        help="check every shard's checksum and tar structure",
        description="Read every shard straight from storage (not through the cache), check "
        "its SHA-256 against a manifest (else the backend's checksum) and parse its tar "
        "members. Exit code 1 if any shard is bad.",
    )
    verify.add_argument("url_pattern", metavar="URL_PATTERN")
    verify.add_argument(
        "--manifest", metavar="SHA256SUMS", help="sha256sum-format file (path or URL)"
    )
    verify.set_defaults(run=cmd_verify)

    manifest = commands.add_parser(
        "manifest",
        parents=[output, storage, jobs],
        help="write a sha256sum-format checksum manifest",
        description="Hash every shard of URL_PATTERN and write a manifest that "
        "`sha256sum -c` accepts; names are relative to the manifest's directory when the "
        "shards lie below it, else full URLs.",
    )
    manifest.add_argument("url_pattern", metavar="URL_PATTERN")
    manifest.add_argument(
        "-o", "--output", required=True, metavar="SHA256SUMS", help="manifest path or URL"
    )
    manifest.add_argument(
        "--sample-counts",
        metavar="JSON",
        help="also write {shard name: sample count} to this file",
    )
    manifest.set_defaults(run=cmd_manifest)

    cache_command = commands.add_parser(
        "cache",
        help="look at or empty the cache",
        description="Look at or empty a shard cache directory.",
    )
    actions = cache_command.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, run, text in (
        ("info", cmd_cache_info, "directory, files, bytes and counters"),
        ("ls", cmd_cache_ls, "one line per cached file: size and URL"),
        ("clear", cmd_cache_clear, "remove every cached file"),
    ):
        action = actions.add_parser(name, parents=[output], help=text, description=text)
        action.add_argument(
            "--cache-dir", metavar="DIR", help="cache directory (default: FSSPEC_SHARDS_CACHE, ...)"
        )
        action.add_argument("--cache-size", metavar="SIZE", help=argparse.SUPPRESS)
        action.set_defaults(run=run)
    return parser


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def configure_logging(args: argparse.Namespace) -> None:
    level = logging.DEBUG if args.verbose else logging.WARNING
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("fsspec_shards").setLevel(level)


def fail(args: argparse.Namespace, code: int, message: str) -> int:
    """Print one line on stderr (and the traceback with --verbose); return ``code``."""
    if getattr(args, "verbose", False):
        logger.exception("%s failed", args.command)
    print(f"{PROGRAM} {args.command}: error: {message}", file=sys.stderr)
    return code


def main(argv: Iterable[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(None if argv is None else list(argv))
    if getattr(args, "jobs", 1) < 1:
        parser.error("--jobs must be at least 1")
    if getattr(args, "retries", None) is not None and args.retries < 0:
        parser.error("--retries must not be negative")
    configure_logging(args)
    try:
        return args.run(args)
    except UsageError as exc:
        return fail(args, EXIT_USAGE, str(exc))
    except StorageFailure as exc:
        return fail(args, EXIT_STORAGE, str(exc))
    except (OSError, ShardFormatError) as exc:
        return fail(args, EXIT_STORAGE, describe_error(exc))
    except KeyboardInterrupt:
        return fail(args, EXIT_INTERRUPTED, "interrupted")
    except BrokenPipeError:
        # The reader of our output went away (e.g. `| head`): stop quietly, as shells expect.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except Exception as exc:
        hint = "" if args.verbose else " (run with --verbose for the traceback)"
        return fail(args, EXIT_INTERNAL, f"{describe_error(exc)}{hint}")
