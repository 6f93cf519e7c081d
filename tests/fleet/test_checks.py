"""The check chore: every shard read once, hashed and walked member by member."""

from __future__ import annotations

import hashlib
import io

import fsspec

from fsspec_shards.fleet.checks import HashingReader, check_shard, check_shards, storage_check
from fsspec_shards.fleet.executors import ThreadExecutor
from fsspec_shards.fleet.shards import shard_urls
from tests.fleet.conftest import streaming


def test_a_good_shard_gives_its_digests_size_and_samples(dataset):
    url = shard_urls(str(dataset.shards[0]), {})[0]
    check = check_shard(url, streaming(), ("sha256", "md5"), 1 << 20)
    data = dataset.shards[0].read_bytes()
    assert check.problem is None
    assert check.checksums == {
        "sha256": "sha256:" + hashlib.sha256(data).hexdigest(),
        "md5": "md5:" + hashlib.md5(data).hexdigest(),
    }
    assert (check.size, check.samples, check.storage_check) == (len(data), 30, "size only")


def test_the_digest_covers_the_bytes_after_the_last_member(dataset, tmp_path):
    padded = tmp_path / "padded.tar"
    padded.write_bytes(dataset.shards[0].read_bytes() + b"\0" * 10240)
    check = check_shard(shard_urls(str(padded), {})[0], streaming(), ("sha256",), 1 << 20)
    assert check.checksums["sha256"] == "sha256:" + hashlib.sha256(padded.read_bytes()).hexdigest()


def test_a_broken_shard_is_a_problem_of_its_check_not_an_exception(dataset, tmp_path):
    cut = tmp_path / "cut.tar"
    cut.write_bytes(dataset.shards[1].read_bytes()[:1000])
    missing = tmp_path / "missing.tar"
    urls = shard_urls([str(cut), str(missing)], {})
    cut_check, missing_check = (check_shard(u, streaming(), ("sha256",), 1 << 20) for u in urls)
    assert cut_check.problem.startswith("malformed tar") and cut_check.checksums == {}
    assert missing_check.problem.startswith("not found")


def test_members_over_the_limit_make_the_shard_malformed(dataset):
    url = shard_urls(str(dataset.shards[0]), {})[0]
    check = check_shard(url, streaming(), ("sha256",), 100)
    assert "exceeds limit 100" in check.problem


def test_checks_come_back_in_url_order_with_one_advance_per_shard(dataset):
    urls = shard_urls(dataset.pattern, {})
    advanced = []
    checks = check_shards(urls, streaming(), ThreadExecutor(3), advance=advanced.append)
    assert [check.url for check in checks] == urls and advanced == [1] * len(urls)
    assert all(check.problem is None for check in checks)


def test_the_storage_check_says_what_wds_verifies_without_a_manifest(dataset):
    path = str(dataset.shards[0])
    with_wds = fsspec.filesystem("wds", target_protocol="file", cache=False)
    no_verify = fsspec.filesystem("wds", target_protocol="file", cache=False, verify=False)
    assert storage_check(with_wds, path) == "size only"
    assert storage_check(no_verify, path) == "none (verify off)"
    assert storage_check(fsspec.filesystem("file"), path) == "none (not read through wds::)"


def test_the_hashing_reader_counts_and_hashes_every_byte_read_through_it():
    reader = HashingReader(io.BytesIO(b"x" * 5000), ["sha256"])
    assert io.BufferedReader(reader, 1024).read() == b"x" * 5000
    assert reader.size == 5000
    assert reader.digests() == {"sha256": "sha256:" + hashlib.sha256(b"x" * 5000).hexdigest()}
