"""fsspec's file interface on the files ``wds`` opens, on every real backend: ``size``,
``info()``, ``loc``, and ``read_block`` with a delimiter, as the plain backend gives them."""

from __future__ import annotations

import fsspec
import pytest

from tests.integration import servers

LINES = b"".join(b"record %d %s\n" % (i, b"y" * (i % 53)) for i in range(3000))
BLOCKS = [(0, 10_000), (10_000, 10_000), (54_321, 1), (len(LINES) - 200, 1000)]


@pytest.mark.parametrize("cache", [True, False], ids=["cached", "streamed"])
def test_read_block_through_wds_equals_the_backends_own(
    backend: servers.Backend, cache: bool, tmp_path
) -> None:
    url = backend.put("blocks/records.txt", LINES)
    fs = fsspec.filesystem(
        "wds",
        target_protocol=backend.protocol,
        target_options=backend.storage_options,
        cache_dir=str(tmp_path / "cache"),
        cache=cache,
        skip_instance_cache=True,
    )
    plain = backend.filesystem()
    with fs.open(url, "rb") as handle:
        assert handle.size == len(LINES) == handle.info()["size"]
        handle.seek(777)
        assert handle.read(3) == LINES[777:780] and handle.loc == 780
    for offset, length in BLOCKS:
        block = fs.read_block(url, offset, length, delimiter=b"\n")
        assert block == plain.read_block(url, offset, length, delimiter=b"\n")
