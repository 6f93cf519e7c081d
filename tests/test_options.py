"""The ``wds`` options table (storage/core/options.py): defaults, parsers, environment,
errors, and docs/configuration.md's table held to it."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from pathlib import Path

import pytest

from fsspec_shards import config
from fsspec_shards.errors import OptionError
from fsspec_shards.storage.core.options import (
    OPTIONS,
    StorageOptions,
    default_of,
    parse_ranges_in_flight,
    parse_verify,
)
from fsspec_shards.storage.filesystem import WdsFileSystem
from fsspec_shards.storage.transfer.target import Target

DOCS = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
ENVIRONMENT = [name for option in OPTIONS.values() for name in option.env]


@pytest.fixture
def no_environment(monkeypatch):
    for name in [*ENVIRONMENT, "XDG_CACHE_HOME"]:
        monkeypatch.delenv(name, raising=False)


def test_one_field_per_option_in_the_table_order():
    assert [field.name for field in dataclasses.fields(StorageOptions)] == list(OPTIONS)


def test_the_defaults_are_the_tables(no_environment):
    options = StorageOptions.parse()
    assert (options.retries, options.timeout, options.deadline) == (5, 30.0, 300.0)
    assert (options.cache, options.verify, options.transport) == (True, "auto", "auto")
    assert (options.ranged_reads, options.ranges_in_flight) == ("cache", "auto")
    assert (options.min_rate, options.min_rate_window) == (16 * 1024, 30.0)
    assert (options.cache_size, options.shared_cache_dir) == (config.DEFAULT_CACHE_SIZE, None)
    assert options.cache_dir == str(config.user_cache_dir())
    assert (options.checksums, options.stale_ttl, options.check_stale) == (None, None, False)


def test_the_retry_policy_is_made_of_the_options():
    policy = StorageOptions.parse(retries="3", backoff=1, max_backoff=2, deadline=9, timeout=4)
    assert dataclasses.astuple(policy.retry_policy) == (3, 1.0, 2.0, 9.0, 4.0)


def test_a_download_target_defaults_to_the_tables_values():
    fields = {field.name: field.default for field in dataclasses.fields(Target)}
    assert fields["verify"] == default_of("verify")
    assert fields["ranges_in_flight"] == default_of("ranges_in_flight")
    assert (fields["min_rate"], fields["rate_window"]) == (
        default_of("min_rate"),
        default_of("min_rate_window"),
    )


def test_strings_parse_as_from_the_environment():
    options = StorageOptions.parse(cache="false", retries="8", min_rate="1KiB", block_size="0")
    assert (options.cache, options.retries, options.min_rate) == (False, 8, 1024)
    assert options.block_size == default_of("block_size")  # 0: fsspec's "no read-ahead"
    assert options.ranged_reads == "direct"


def test_an_unknown_name_is_an_option_error_naming_it():
    with pytest.raises(OptionError, match="unknown option.*: cache_sise, retrys; backend") as e:
        StorageOptions.parse(retrys=3, cache_sise=1)
    assert e.value.option == "wds.cache_sise"


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"retries": 0}, "'retries': must be >= 1"),
        ({"cache_size": "lots"}, "invalid value for option 'cache_size': invalid size"),
        ({"transport": "curl"}, "invalid value 'curl' for option 'transport'"),
        ({"ranged_reads": "some"}, "option 'ranged_reads': expected one of cache, direct"),
        ({"ranged_reads": "cache", "cache": False}, "with cache=False ranges can only"),
        ({"checksums": 3}, "'checksums': expected a mapping or a path, got int"),
        ({"timeout": 0}, "'timeout': must be >= 0.001"),
    ],
)
def test_a_bad_value_is_a_value_error_naming_the_option(given, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        StorageOptions.parse(**given)


def test_cache_dir_prefers_fsspec_shards_over_webdataset_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("WDS_CACHE", str(tmp_path / "wds"))
    assert StorageOptions.parse().cache_dir == str(tmp_path / "wds")
    monkeypatch.setenv("FSSPEC_SHARDS_CACHE", str(tmp_path / "ours"))
    assert StorageOptions.parse().cache_dir == str(tmp_path / "ours")
    assert StorageOptions.parse(cache_dir="").cache_dir == str(tmp_path / "ours")
    assert StorageOptions.parse(cache_dir=str(tmp_path)).cache_dir == str(tmp_path)


def test_cache_dir_defaults_to_the_user_cache_directory(no_environment, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_of("cache_dir") == str(tmp_path / "fsspec-shards")


def test_cache_size_is_bounded_by_default_and_read_from_the_environment(
    no_environment, monkeypatch
):
    assert default_of("cache_size") == config.DEFAULT_CACHE_SIZE
    monkeypatch.setenv("WDS_CACHE_SIZE", "1GiB")
    assert default_of("cache_size") == 1024**3
    monkeypatch.setenv("FSSPEC_SHARDS_CACHE_SIZE", "2GB")
    assert StorageOptions.parse().cache_size == 2 * 1000**3
    assert StorageOptions.parse(cache_size=5).cache_size == 5


def test_the_shared_tier_comes_from_the_environment(no_environment, monkeypatch, tmp_path):
    monkeypatch.setenv("FSSPEC_SHARDS_SHARED_CACHE", str(tmp_path))
    monkeypatch.setenv("FSSPEC_SHARDS_SHARED_CACHE_SIZE", "1MB")
    options = StorageOptions.parse()
    assert (options.shared_cache_dir, options.shared_cache_size) == (str(tmp_path), 10**6)


def test_bad_cache_size_in_the_environment_names_the_variable(monkeypatch):
    monkeypatch.setenv("FSSPEC_SHARDS_CACHE_SIZE", "lots")
    with pytest.raises(ValueError, match="environment variable FSSPEC_SHARDS_CACHE_SIZE"):
        StorageOptions.parse()


@pytest.mark.parametrize(
    ("value", "mode"),
    [("auto", "auto"), (True, "auto"), ("size", "size"), (False, False), ("false", False)],
)
def test_verify_option_accepts_modes_and_environment_strings(value, mode):
    assert parse_verify(value) == mode


def test_verify_option_rejects_unknown_modes():
    with pytest.raises(ValueError, match="verify"):
        parse_verify("sha256")


@pytest.mark.parametrize(
    ("value", "parsed"), [("auto", "auto"), (" AUTO ", "auto"), (4, 4), ("8", 8)]
)
def test_ranges_in_flight_is_auto_or_a_positive_int(value, parsed):
    assert parse_ranges_in_flight(value) == parsed


@pytest.mark.parametrize("value", [0, -1, "many", True, 2.5, None])
def test_other_ranges_in_flight_are_refused_naming_the_option(value):
    with pytest.raises(ValueError, match="ranges_in_flight"):
        parse_ranges_in_flight(value)


# -- docs/configuration.md's table --------------------------------------------------------


def _documented() -> dict[str, str]:
    """The options table of the docs: each option's name -> its default cell."""
    section = DOCS.read_text().split("## Options", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            names = re.findall(r"`(\w+)`", cells[0])
            defaults = re.findall(r"`[^`]+`", cells[1]) if len(names) > 1 else [cells[1]]
            rows.update(zip(names, defaults, strict=True))
    return rows


def _literal(cell: str) -> object:
    """The built-in default a docs cell names: a bold value, else the first code span that
    is not a variable, else None ("none")."""
    bold = re.findall(r"\*\*(.+?)\*\*", cell)
    spans = [s for s in re.findall(r"`([^`]+)`", cell) if not re.match(r"[A-Z_]+$", s)]
    if not bold and not spans:
        assert "none" in cell, cell
        return None
    text = (bold or spans)[0].strip("`")
    try:
        return json.loads(text)
    except ValueError:
        return text


def test_the_docs_table_names_exactly_the_options_and_the_backend():
    backend = [p for p in inspect.signature(WdsFileSystem.__init__).parameters][1:-1]
    assert backend == ["target_protocol", "target_options", "fs"]
    assert list(_documented()) == [*backend, *OPTIONS]


def test_the_docs_table_gives_the_tables_defaults_and_variables(no_environment):
    defaults = StorageOptions.parse()
    for name, cell in _documented().items():
        if name not in OPTIONS:
            continue
        literal = _literal(cell)
        shown = None if literal is None else getattr(StorageOptions.parse(**{name: literal}), name)
        assert shown == getattr(defaults, name), name
        variables = set(re.findall(r"\b(?:FSSPEC_SHARDS|WDS)_[A-Z_]+", cell))
        assert variables == set(OPTIONS[name].env), name
