"""The tar block (tar_blocks.py): member data padded to whole 512-byte blocks, as tarfile
writes it."""

import io
import tarfile

import pytest

from fsspec_shards.tar_blocks import BLOCK_SIZE, padded


@pytest.mark.parametrize("size", [0, 1, 511, 512, 513, 1024, 10_000])
def test_member_data_takes_whole_blocks_as_tarfile_writes_them(size):
    output = io.BytesIO()
    with tarfile.open(fileobj=output, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("a")
        info.size = size
        tar.addfile(info, io.BytesIO(b"x" * size))
        tar.addfile(tarfile.TarInfo("b"), io.BytesIO())
    with tarfile.open(fileobj=io.BytesIO(output.getvalue())) as tar:
        first, second = tar.getmembers()
    assert second.offset == first.offset + BLOCK_SIZE + padded(size)
    assert padded(size) % BLOCK_SIZE == 0 and 0 <= padded(size) - size < BLOCK_SIZE
