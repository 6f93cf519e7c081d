"""``fsspec-shards cache info|ls|clear`` in real subprocesses: they look at and empty the
cache, never create one, delete only what the cache made, and name a directory they will
not use."""

from __future__ import annotations

import os
from pathlib import Path

import fsspec
import pytest

from fsspec_shards.fleet.report import format_bytes
from tests.cli.running import run_cli
from tests.secrets import SECRET_PARAMETERS

OTHER_UID = 12345


def test_cache_info_ls_and_clear(dataset, cache):
    assert run_cli("prefetch", dataset.pattern, "-q", cache=cache).returncode == 0
    env = {k: v for k, v in os.environ.items() if not k.endswith("CACHE_SIZE")}
    info = run_cli("cache", "info", cache=cache, env=env)
    assert info.returncode == 0, info.stderr
    assert "cached files        4" in info.stdout and str(cache) in info.stdout
    total = format_bytes(sum(path.stat().st_size for path in dataset.shards))
    assert f"cached bytes        {total}" in info.stdout and total.endswith("KiB")
    assert "size limit          20 GiB" in info.stdout, "the default bound as documented"
    listing = run_cli("cache", "ls", "--cache-dir", str(cache), cache=cache)
    assert listing.returncode == 0, listing.stderr
    assert sorted(line.rsplit("/", 1)[1] for line in listing.stdout.splitlines()) == [
        path.name for path in dataset.shards
    ]
    cleared = run_cli("cache", "clear", cache=cache)
    assert cleared.returncode == 0 and "removed 4 files" in cleared.stdout
    assert run_cli("cache", "ls", cache=cache).stdout == ""


def tree(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


@pytest.fixture
def filled_cache(tmp_path: Path) -> Path:
    """A cache holding two files, read through ``wds``."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("a.bin", "b.bin"):
        (source / name).write_bytes(name.encode() * 1000)
    cache = tmp_path / "cache"
    fs = fsspec.filesystem(
        "wds", target_protocol="file", cache_dir=str(cache), skip_instance_cache=True
    )
    for name in ("a.bin", "b.bin"):
        fs.cat_file(str(source / name))
    fs.shard_cache.flush()
    return cache


@pytest.mark.parametrize("action", ["info", "ls", "clear"])
def test_on_a_directory_that_is_not_a_cache_it_says_so_and_touches_nothing(
    tmp_path: Path, action: str
) -> None:
    plain = tmp_path / "plain"
    (plain / "files").mkdir(parents=True)
    (plain / "files" / "report.pdf").write_bytes(b"%PDF")
    before = tree(tmp_path)
    result = run_cli("cache", action, "--cache-dir", str(plain), cache=tmp_path / "unused")
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert str(plain) in line and "not a fsspec-shards cache" in line
    assert tree(tmp_path) == before


@pytest.mark.parametrize("action", ["info", "ls", "clear"])
def test_on_a_missing_directory_it_reports_no_cache_and_creates_none(
    tmp_path: Path, action: str
) -> None:
    missing = tmp_path / "nowhere" / "cache"
    result = run_cli("cache", action, cache=missing)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "nowhere").exists()


def test_info_and_ls_read_a_cache_without_writing_to_it(filled_cache: Path) -> None:
    snapshot = {p: p.stat().st_mtime_ns for p in filled_cache.rglob("*")}
    info = run_cli("cache", "info", "--cache-dir", str(filled_cache), cache=filled_cache)
    listing = run_cli("cache", "ls", cache=filled_cache)
    assert info.returncode == 0 and listing.returncode == 0, info.stderr + listing.stderr
    assert "cached files        2" in info.stdout
    assert [line.split()[-1].rsplit("/", 1)[-1] for line in listing.stdout.splitlines()] == [
        "a.bin",
        "b.bin",
    ]
    assert {p: p.stat().st_mtime_ns for p in filled_cache.rglob("*")} == snapshot


def test_clear_removes_the_cached_files_and_leaves_files_it_did_not_make(
    filled_cache: Path,
) -> None:
    foreign = filled_cache / "files" / "keep-me.txt"
    foreign.write_bytes(b"mine")
    cached = [p for p in (filled_cache / "files").rglob("*.*") if p != foreign and p.is_file()]
    assert len(cached) == 2
    result = run_cli("cache", "clear", cache=filled_cache)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("removed 2 files")
    assert not any(p.exists() for p in cached)
    assert foreign.read_bytes() == b"mine"


def test_a_cache_owned_by_another_user_is_named_with_the_reason(filled_cache: Path) -> None:
    os.chown(filled_cache, OTHER_UID, OTHER_UID)
    result = run_cli("cache", "info", cache=filled_cache)
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert str(filled_cache) in line and f"owned by uid {OTHER_UID}" in line


def test_no_secret_of_any_signed_url_reaches_cache_ls_or_any_file_of_the_cache(
    tmp_path: Path,
) -> None:
    from fsspec_shards.storage.backends import object_id
    from fsspec_shards.storage.cache import ShardCache

    http = fsspec.filesystem("https")
    cache = ShardCache(str(tmp_path / "cache"), 10**6)
    secrets = []
    for number, name in enumerate(SECRET_PARAMETERS):
        secret = f"S3CR3T{number:02d}x"
        secrets.append(secret)
        url = f"https://user:PW{secret}@host.example/b/shard-{number}.tar?{name}={secret}"
        with cache.fetch(
            object_id(http, url), lambda f, url=url: f.write(b"x") and {"source": url}
        ):
            pass
    cache.flush()
    listing = run_cli("cache", "ls", "--cache-dir", cache.directory, cache=tmp_path / "x")
    info = run_cli("cache", "info", "--cache-dir", cache.directory, cache=tmp_path / "x")
    assert listing.returncode == 0 and len(listing.stdout.splitlines()) == len(SECRET_PARAMETERS)
    shown = listing.stdout + listing.stderr + info.stdout + info.stderr
    names = [str(p) for p in Path(cache.directory).rglob("*")]
    contents = b"".join(p.read_bytes() for p in Path(cache.directory).rglob("*") if p.is_file())
    for secret in secrets:
        assert secret not in shown, secret
        assert not any(secret in name for name in names), secret
        assert secret.encode() not in contents, secret


def test_info_shows_the_limit_the_cache_was_last_used_with_and_a_differing_given_one(
    tmp_path: Path,
) -> None:
    from fsspec_shards.storage.cache import ShardCache

    ShardCache(str(tmp_path / "cache"), 3 << 20)
    directory = str(tmp_path / "cache")
    info = run_cli("cache", "info", "--cache-dir", directory, cache=tmp_path / "x")
    assert info.returncode == 0, info.stderr
    assert "size limit          3 MiB" in info.stdout and "given" not in info.stdout
    given = run_cli(
        "cache", "info", "--cache-dir", directory, "--cache-size", "5MiB", cache=tmp_path / "x"
    )
    assert "size limit          3 MiB" in given.stdout
    assert "size limit given    5 MiB" in given.stdout
    same = run_cli(
        "cache", "info", "--cache-dir", directory, "--cache-size", "3MiB", cache=tmp_path / "x"
    )
    assert "given" not in same.stdout
