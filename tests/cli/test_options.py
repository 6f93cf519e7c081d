"""Storage options from --option, --options-file and the cache flags."""

from __future__ import annotations

import json

import pytest

from fsspec_shards.cli import build_parser
from fsspec_shards.cli.errors import UsageError
from fsspec_shards.cli.options import parse_option, shared_options, storage_options_from
from fsspec_shards.fleet.report import format_bytes
from fsspec_shards.storage.core.options import OPTIONS
from tests.cli.running import run_cli


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


def test_help_shows_the_defaults_from_their_one_definition_in_binary_units(capsys):
    for command, expected in (("prefetch", "(default 20 GiB)"), ("verify", "(default 1 GiB)")):
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
        assert expected in " ".join(capsys.readouterr().out.split())


def test_the_storage_flags_name_wds_options_with_the_tables_defaults():
    shared = shared_options()
    flags = {
        action.dest: action
        for parser in (shared.storage, shared.cache)
        for action in parser._actions
        if action.dest in OPTIONS
    }
    assert sorted(flags) == ["cache_dir", "cache_size", "retries"]
    for name, action in flags.items():
        option = OPTIONS[name]
        built_in = option.default() if callable(option.default) else option.default
        shown = format_bytes(built_in) if option.bytes else str(built_in)
        assert action.help.startswith(option.doc) and f"(default {shown})" in action.help
        assert all(variable in action.help for variable in option.env)
    args = build_parser().parse_args(
        ["prefetch", "x", "--retries", "4", "--cache-dir", "/c", "--cache-size", "1KiB"]
    )
    assert set(storage_options_from(args)["wds"]) == set(flags)
    args = build_parser().parse_args(["prefetch", "x", "--no-cache"])
    assert storage_options_from(args)["wds"] == {"cache": False}  # --no-cache: cache=False
