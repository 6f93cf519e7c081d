"""``fsspec-shards stream``: iterating a dataset and reporting on it, as text or JSON."""

from __future__ import annotations

import inspect
import json

import pytest

from fsspec_shards.cli import build_parser
from fsspec_shards.cli.stream import dataset_arguments
from tests.cli.running import error_lines, run_cli


def test_stream_reports_samples_and_stops_at_the_limit(dataset, cache):
    result = run_cli(
        "stream",
        dataset.pattern,
        "--shuffle-shards",
        "--shuffle-buffer",
        "10",
        "--seed",
        "3",
        "--epoch",
        "2",
        "--limit",
        "45",
        "--cache-dir",
        str(cache),
        cache=cache,
    )
    assert result.returncode == 0, result.stderr
    assert "samples             45" in result.stdout
    assert "samples/s" in result.stdout and "MiB/s" in result.stdout
    assert any(cache.iterdir()), "streaming through wds:: fills the cache"


def test_stream_without_cache_keeps_nothing(dataset, tmp_path, cache):
    result = run_cli("stream", dataset.pattern, "--no-cache", "-q", cache=cache)
    assert result.returncode == 0, result.stderr
    assert "samples             120" in result.stdout
    assert not cache.exists() or not any(path.is_file() for path in cache.rglob("*.tar*"))


def test_stream_of_a_missing_shard_fails_with_one_line_and_code_3(dataset, cache):
    result = run_cli("stream", str(dataset.directory / "absent-{0..1}.tar"), "-q", cache=cache)
    assert result.returncode == 3
    lines = error_lines(result)
    assert len(lines) == 1, result.stderr
    assert "absent-0.tar" in lines[0] or "absent-1.tar" in lines[0], lines  # shuffled
    assert "Traceback" not in result.stderr


def test_stream_with_skip_handler_goes_on_past_a_missing_shard(dataset, cache):
    pattern = f"{dataset.directory}/{{demo-000000,absent,demo-000001}}.tar"
    result = run_cli("stream", pattern, "--handler", "skip", "-q", cache=cache)
    assert result.returncode == 0, result.stderr
    assert "samples             60" in result.stdout
    assert "failed shards       1" in result.stdout


def test_stream_and_cache_info_json_report_the_same_numbers_as_text(dataset, cache):
    streamed = run_cli("stream", dataset.pattern, "--json", "-q", cache=cache)
    assert streamed.returncode == 0, streamed.stderr
    report = json.loads(streamed.stdout)
    assert report["samples"] == 120 and report["shards"] == 4
    assert report["shard_hit_rate"] == 0.0 and report["storage"]["misses"] == 4
    info = run_cli("cache", "info", "--json", cache=cache)
    assert info.returncode == 0, info.stderr
    numbers = json.loads(info.stdout)
    assert numbers["directory"] == str(cache) and numbers["exists"] is True
    assert numbers["cached_files"] == 4
    assert numbers["cached_bytes"] == sum(path.stat().st_size for path in dataset.shards)
    empty = run_cli("cache", "info", "--json", "--cache-dir", str(cache / "none"), cache=cache)
    assert json.loads(empty.stdout)["exists"] is False
    assert not (cache / "none").exists()


def test_stream_max_member_size_makes_larger_members_malformed(dataset, cache):
    small = run_cli("stream", dataset.pattern, "--max-member-size", "1KiB", "-q", cache=cache)
    assert small.returncode != 0
    [line] = error_lines(small)
    assert "exceeds limit" in line
    enough = run_cli("stream", dataset.pattern, "--max-member-size", "1MiB", "-q", cache=cache)
    assert enough.returncode == 0, enough.stderr


def test_stream_prefetch_is_auto_or_an_int(capsys):
    def parsed(value):
        arguments = build_parser().parse_args(["stream", "x.tar", "--prefetch", value])
        return dataset_arguments(arguments)["prefetch"]

    assert (parsed("auto"), parsed("3"), parsed("0")) == ("auto", 3, 0)
    with pytest.raises(SystemExit):
        parsed("deep")
    assert "expected an integer" in capsys.readouterr().err


def test_stream_reads_with_shard_datasets_defaults():
    from fsspec_shards import ShardDataset

    arguments = dataset_arguments(build_parser().parse_args(["stream", "x.tar"]))
    defaults = inspect.signature(ShardDataset).parameters
    for name in ("shuffle_shards", "shuffle_buffer", "seed", "handler", "prefetch"):
        assert arguments[name] == defaults[name].default, name
    assert (
        dataset_arguments(build_parser().parse_args(["stream", "x.tar", "--no-shuffle-shards"]))[
            "shuffle_shards"
        ]
        is False
    )
