"""The whole-file check of a block fill (storage/transfer/whole_file.py), and a fill that
starts before the object's info() is in: it ends only once info() is in, takes what the
whole file must match and the identity from it, and raises its failure. Against a real
server (the HEAD beside the first GETs, a HEAD of another version, a refused HEAD):
tests/integration/test_blocks.py.
"""

from __future__ import annotations

import hashlib
import threading
import time
from concurrent.futures import Future

import pytest

from fsspec_shards.errors import IntegrityError
from fsspec_shards.storage.transfer.block_progress import BlockProgress
from fsspec_shards.storage.transfer.blocks import fill_blocks
from tests.test_blocks import DATA, _blocks, _planned


def _fill_beside(tmp_path, answer, ranges_in_flight=1):
    """Fill the shard with its info() still to come: ``answer(target, progress)`` gives it
    (a dict, or an exception to raise) 0.2 s later, on a thread of its own. Returns what
    the fill returned or raised, and the filesystem."""
    fs, _, path = _planned(tmp_path)
    target = fs.fetcher.target(path)
    blocks = _blocks()
    progress = BlockProgress(blocks)
    info: Future = Future()

    def settle() -> None:
        time.sleep(0.2)
        given = answer(target, progress)
        if isinstance(given, BaseException):
            info.set_exception(given)
        else:
            info.set_result(given)

    settling = threading.Thread(target=settle)
    settling.start()
    try:
        with open(tmp_path / "out", "w+b") as out:
            result = fill_blocks(target, out, info, blocks, progress, ranges_in_flight)
            out.seek(0)
            assert out.read() == DATA
    except Exception as exc:
        result = exc
    settling.join()
    return result, fs


@pytest.mark.parametrize("ranges_in_flight", [1, 3])
def test_a_fill_ends_only_once_its_info_is_in_and_records_that(tmp_path, ranges_in_flight):
    seen: list[bool] = []

    def answer(target, progress):
        seen.append(progress.complete)  # every block is in by now: the last held back
        return target.stat()

    result, fs = _fill_beside(tmp_path, answer, ranges_in_flight)
    assert seen == [False]
    assert isinstance(result, dict), result
    assert result["size"] == len(DATA)
    assert result["identity"].startswith("ETag=v1;")  # the info()'s, recorded with the copy
    assert result["checksum"] == f"sha256:{hashlib.sha256(DATA).hexdigest()}"
    assert fs.cache_stats()["integrity_failures"] == 0


def test_a_failed_info_is_what_the_fill_raises(tmp_path):
    gone = FileNotFoundError("not there: the object")
    result, fs = _fill_beside(tmp_path, lambda target, progress: gone)
    assert result is gone
    assert fs.cache_stats()["integrity_failures"] == 0


def test_an_info_of_another_size_than_the_block_manifest_is_an_integrity_error(tmp_path):
    result, fs = _fill_beside(tmp_path, lambda target, progress: {**target.stat(), "size": 7})
    assert isinstance(result, IntegrityError), result
    assert "not the one the block manifest lists" in str(result)
    assert fs.cache_stats()["integrity_failures"] == 1
