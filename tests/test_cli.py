"""The fsspec-shards command line, driven in a subprocess against local shards."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fsspec_shards.cli import build_parser, main
from fsspec_shards.cli.errors import UsageError
from fsspec_shards.cli.options import parse_option, storage_options_from
from fsspec_shards.demo import DemoDataset, make_demo_dataset
from fsspec_shards.iteration.lengths import load_sample_counts, shard_sizes

TIMEOUT = 180


def run_cli(*args: str, cache: Path, console_script: bool = False) -> subprocess.CompletedProcess:
    """Run the command in a fresh process, with the default cache under ``cache``."""
    env = dict(os.environ, FSSPEC_SHARDS_CACHE=str(cache), COLUMNS="120")
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


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> DemoDataset:
    return make_demo_dataset(tmp_path_factory.mktemp("shards"), shards=4, samples_per_shard=30)


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


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


def test_demo_writes_a_dataset_and_streams_it_cold_then_from_cache(tmp_path, cache):
    result = run_cli("demo", str(tmp_path / "demo"), "--quiet", cache=cache)
    assert result.returncode == 0, result.stderr
    passes = result.stdout.split("pass 2: from cache")
    assert "pass 1: cold cache" in passes[0]
    assert "samples             2000" in passes[0] and "samples             2000" in passes[1]
    assert "cache hit rate      0% of shards" in passes[0]
    assert "downloaded          13.8 MB" in passes[0]
    assert "cache hit rate      100% of shards" in passes[1]
    assert "downloaded          0 B" in passes[1]
    assert "integrity failures  0" in passes[1]
    assert len(list((tmp_path / "demo").glob("demo-*.tar"))) == 8
    assert (tmp_path / "demo" / "SHA256SUMS").read_text().count("\n") == 8


def test_console_script_runs_the_same_command(cache):
    script = Path(sys.executable).parent / "fsspec-shards"
    if not script.exists():
        pytest.skip("the fsspec-shards console script is not installed next to this python")
    result = run_cli("--version", cache=cache, console_script=True)
    assert result.returncode == 0
    assert result.stdout.startswith("fsspec-shards ")


def test_console_script_streams_a_dataset(dataset, cache):
    if not (Path(sys.executable).parent / "fsspec-shards").exists():
        pytest.skip("the fsspec-shards console script is not installed next to this python")
    result = run_cli("stream", dataset.pattern, "-q", cache=cache, console_script=True)
    assert result.returncode == 0, result.stderr
    assert "samples             120" in result.stdout


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
    assert "samples/s" in result.stdout and "MB/s" in result.stdout
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
    assert "absent-0.tar" in lines[0] and "Traceback" not in result.stderr


def test_stream_with_skip_handler_goes_on_past_a_missing_shard(dataset, cache):
    pattern = f"{dataset.directory}/{{demo-000000,absent,demo-000001}}.tar"
    result = run_cli("stream", pattern, "--handler", "skip", "-q", cache=cache)
    assert result.returncode == 0, result.stderr
    assert "samples             60" in result.stdout
    assert "failed shards       1" in result.stdout


def test_verbose_shows_the_traceback(dataset, cache):
    result = run_cli("stream", str(dataset.directory / "absent.tar"), "--verbose", cache=cache)
    assert result.returncode == 3
    assert "Traceback" in result.stderr


def test_unknown_protocol_is_a_usage_error_on_one_line(cache):
    result = run_cli("stream", "nosuchproto://bucket/x.tar", cache=cache)
    assert result.returncode == 2
    lines = error_lines(result)
    assert len(lines) == 1 and "nosuchproto" in lines[0], result.stderr


def run_in_process(args: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    """Run ``main`` in this process (argument parsing needs no fresh interpreter)."""
    try:
        code = main(args)
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    "args",
    [
        ["stream", "x.tar", "--option", "no-equals-sign"],
        ["stream", "x.tar", "--cache-size", "lots"],
        ["stream", "x.tar", "--handler", "ignore"],
        ["verify", "x.tar", "--jobs", "0"],
        ["stream", "demo-{0..1.tar"],
        ["stream", "x.tar", "--options-file", "/nonexistent/opts.json"],
        ["manifest", "x.tar"],
        ["frobnicate"],
    ],
)
def test_bad_arguments_are_usage_errors_on_one_line(args, capsys):
    code, _, err = run_in_process(args, capsys)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "error:" in lines[0], err


@pytest.mark.parametrize(
    "command",
    [["demo"], ["stream"], ["prefetch"], ["verify"], ["manifest"], ["cache"], ["cache", "info"],
     ["cache", "ls"], ["cache", "clear"]],
)  # fmt: skip
def test_every_subcommand_has_help(command, capsys):
    code, out, _ = run_in_process([*command, "--help"], capsys)
    assert code == 0 and out.startswith("usage: fsspec-shards")


def test_manifest_matches_sha256sum_and_counts_samples(dataset, tmp_path, cache):
    output = dataset.directory / "SHA256SUMS.cli"
    counts = tmp_path / "counts.json"
    result = run_cli(
        "manifest",
        dataset.pattern,
        "-o",
        str(output),
        "--sample-counts",
        str(counts),
        "-q",
        cache=cache,
    )
    assert result.returncode == 0, result.stderr
    assert output.read_text() == dataset.manifest.read_text()
    assert json.loads(counts.read_text()) == {path.name: 30 for path in dataset.shards}
    urls = ["wds::file://" + str(path) for path in dataset.shards]
    assert shard_sizes(urls, load_sample_counts(str(counts))) == [30] * len(urls)
    if shutil.which("sha256sum"):
        check = subprocess.run(
            ["sha256sum", "-c", output.name], cwd=dataset.directory, capture_output=True
        )
        assert check.returncode == 0, check.stdout


def test_manifest_outside_the_shards_directory_names_full_paths(dataset, tmp_path, cache):
    output = tmp_path / "elsewhere" / "SHA256SUMS"
    output.parent.mkdir()
    result = run_cli("manifest", dataset.pattern, "-o", str(output), "-q", cache=cache)
    assert result.returncode == 0, result.stderr
    names = [line.split("  ", 1)[1] for line in output.read_text().splitlines()]
    assert names == [str(path) for path in dataset.shards]


def test_verify_passes_a_good_dataset_against_its_manifest(dataset, cache):
    result = run_cli(
        "verify", dataset.pattern, "--manifest", str(dataset.manifest), "-q", cache=cache
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 ok, 0 bad" in result.stdout


def test_verify_catches_a_corrupted_shard_with_exit_code_1(dataset, tmp_path, cache):
    bad = corrupt_copy(dataset, tmp_path / "bad")
    result = run_cli("verify", bad.pattern, "--manifest", str(bad.manifest), "-q", cache=cache)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "3 ok, 1 bad" in result.stdout
    failure_rows = [line for line in result.stdout.splitlines() if "demo-000001.tar" in line]
    assert len(failure_rows) == 1 and "integrity" in failure_rows[0]


def test_verify_catches_a_truncated_tar_without_a_manifest(dataset, tmp_path, cache):
    bad = corrupt_copy(dataset, tmp_path / "bad")
    shard = bad.shards[2]
    shard.write_bytes(shard.read_bytes()[:1000])
    result = run_cli("verify", bad.pattern, "-q", cache=cache)
    assert result.returncode == 1, result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines() if "demo-000002.tar" in line]
    assert len(rows) == 1 and "malformed tar" in rows[0]


def test_prefetch_fills_the_cache_and_skips_cached_shards_on_rerun(dataset, cache):
    first = run_cli("prefetch", dataset.pattern, "--cache-dir", str(cache), "-j", "3", cache=cache)
    assert first.returncode == 0, first.stderr
    assert "prefetched 4 of 4 shards: 4 downloaded" in first.stdout
    second = run_cli("prefetch", dataset.pattern, "--cache-dir", str(cache), "-q", cache=cache)
    assert second.returncode == 0, second.stderr
    assert "0 downloaded" in second.stdout and "4 already cached" in second.stdout


def test_cache_info_ls_and_clear(dataset, cache):
    assert run_cli("prefetch", dataset.pattern, "-q", cache=cache).returncode == 0
    info = run_cli("cache", "info", cache=cache)
    assert info.returncode == 0, info.stderr
    assert "cached files" in info.stdout and str(cache) in info.stdout
    listing = run_cli("cache", "ls", "--cache-dir", str(cache), cache=cache)
    assert listing.returncode == 0, listing.stderr
    assert sorted(line.rsplit("/", 1)[1] for line in listing.stdout.splitlines()) == [
        path.name for path in dataset.shards
    ]
    cleared = run_cli("cache", "clear", cache=cache)
    assert cleared.returncode == 0 and "removed 4 files" in cleared.stdout
    assert run_cli("cache", "ls", cache=cache).stdout == ""


def test_options_file_in_json_and_toml_sets_storage_options(dataset, tmp_path, cache):
    for name, text in (
        ("opts.json", json.dumps({"wds": {"cache_dir": str(tmp_path / "from-json")}})),
        ("opts.toml", f'[wds]\ncache_dir = "{tmp_path / "from-toml"}"\n'),
    ):
        (tmp_path / name).write_text(text)
        result = run_cli(
            "prefetch", dataset.pattern, "--options-file", str(tmp_path / name), "-q", cache=cache
        )
        assert result.returncode == 0, result.stderr
        target = tmp_path / ("from-json" if name.endswith("json") else "from-toml")
        assert target.is_dir() and any(target.iterdir())
    assert not cache.exists()


def test_option_values_parse_as_json_else_stay_strings():
    assert parse_option("s3.endpoint_url=http://localhost:9000") == (
        ["s3", "endpoint_url"],
        "http://localhost:9000",
    )
    assert parse_option("wds.retries=5") == (["wds", "retries"], 5)
    assert parse_option("wds.verify=false") == (["wds", "verify"], False)
    assert parse_option("s3.client_kwargs.region_name=eu-west-1") == (
        ["s3", "client_kwargs", "region_name"],
        "eu-west-1",
    )
    with pytest.raises(UsageError, match="PROTOCOL.KEY=VALUE"):
        parse_option("retries=5")


def test_cache_flags_override_option_and_file_values(tmp_path):
    args = build_parser().parse_args(
        [
            "stream",
            "x.tar",
            "--option",
            "wds.retries=9",
            "--option",
            "s3.anon=true",
            "--retries",
            "4",
            "--cache-size",
            "1GiB",
            "--no-cache",
        ]
    )
    options = storage_options_from(args)
    assert options == {
        "wds": {"retries": 4, "cache_size": 1024**3, "cache": False},
        "s3": {"anon": True},
    }


def test_verify_reports_a_shard_missing_from_the_manifest(dataset, tmp_path, cache):
    partial = tmp_path / "SHA256SUMS"
    lines = dataset.manifest.read_text().splitlines(keepends=True)
    partial.write_text("".join(line.replace("  ", f"  {dataset.directory}/") for line in lines[1:]))
    result = run_cli("verify", dataset.pattern, "--manifest", str(partial), "-q", cache=cache)
    assert result.returncode == 1, result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines() if "demo-000000.tar" in line]
    assert len(rows) == 1 and "not in the manifest" in rows[0]
