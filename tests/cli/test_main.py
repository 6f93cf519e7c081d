"""The program as a whole: the console script, help, exit codes, one line on stderr, closed
pipes, option errors (ours and a backend's) and secrets kept out of the output."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.cli.running import (
    corrupt_copy,
    error_lines,
    run_cli,
    run_in_process,
    run_with_closed_stdout,
)


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


def test_verbose_shows_the_traceback(dataset, cache):
    result = run_cli("stream", str(dataset.directory / "absent.tar"), "--verbose", cache=cache)
    assert result.returncode == 3
    assert "Traceback" in result.stderr


def test_unknown_protocol_is_a_usage_error_on_one_line(cache):
    result = run_cli("stream", "nosuchproto://bucket/x.tar", cache=cache)
    assert result.returncode == 2
    lines = error_lines(result)
    assert len(lines) == 1 and "nosuchproto" in lines[0], result.stderr


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


@pytest.mark.parametrize("command", ["stream", "verify"])
def test_a_closed_pipe_on_stdout_exits_141_and_prints_nothing(command, dataset, tmp_path, cache):
    bad = corrupt_copy(dataset, tmp_path / "bad")  # verify has a table and exit 1 to give
    args = [command, bad.pattern, "-q"]
    if command == "verify":
        args += ["--manifest", str(bad.manifest)]
    result = run_with_closed_stdout(*args, cache=cache)
    assert result.returncode == 141
    assert result.stderr == ""


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["stream", "x.tar", "--shuffle-buffer", "-5"], "--shuffle-buffer"),
        (["stream", "x.tar", "--prefetch", "-1"], "--prefetch"),
        (["stream", "x.tar", "--limit", "0"], "--limit"),
        (["verify", "x.tar", "--max-member-size", "huge"], "--max-member-size"),
        (["verify", "x.tar", "--retries", "-1"], "--retries"),
        (["stream", "x.tar", "--option", "wds.retries=lots"], "retries"),
        (["stream", "x.tar", "--option", "wds.no_such_option=1"], "no_such_option"),
    ],
)
def test_bad_options_are_exit_2_with_one_line_naming_the_option(args, option, tmp_path):
    result = run_cli(*args, cache=tmp_path / "cache")
    assert result.returncode == 2, result.stdout + result.stderr
    lines = error_lines(result)
    assert len(lines) == 1 and option in lines[0], result.stderr


def test_secrets_in_a_pattern_never_reach_the_output(dataset, cache):
    pattern = f"{dataset.directory}/absent-*.tar?token=SECRET-VALUE"
    result = run_cli("verify", pattern, cache=cache)
    assert result.returncode == 2
    assert "SECRET-VALUE" not in result.stdout + result.stderr
    assert "REDACTED" in result.stderr


@pytest.mark.parametrize(
    "option", ["s3.endpoint_urll=http://127.0.0.1:9", "s3.client_kwargs.endpoint=http://h"]
)
def test_a_backend_option_the_backend_does_not_take_is_exit_2_naming_it(option, tmp_path):
    # refused by the library when the filesystem is made: no request is sent
    result = run_cli("stream", "s3://bucket/x.tar", "--option", option, cache=tmp_path / "c")
    assert result.returncode == 2, result.stdout + result.stderr
    [line] = error_lines(result)
    assert f"invalid storage option {option.split('=')[0]}" in line, line
