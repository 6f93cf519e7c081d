"""ShardWriter with a signed URL pattern: no error that leaves it, no link of that error's
cause/context chain and no printed traceback shows the signature (nginx refuses the upload)."""

from __future__ import annotations

import traceback

import pytest

from fsspec_shards import ShardWriter

SIGNATURE = "s1gn4tur3zz"


def _chain(error: BaseException) -> list[BaseException]:
    links, pending = [], [error]
    while pending:
        link = pending.pop()
        if link is not None and all(link is not seen for seen in links):
            links.append(link)
            pending += [link.__cause__, link.__context__]
    return links


def test_errors_of_a_signed_pattern_show_no_signature(http_backend):
    pattern = http_backend.url("w/x-%04d.tar") + f"?sv=2024&se=2030&sig={SIGNATURE}"
    with pytest.raises(OSError) as raised:  # noqa: PT012 - the upload on close fails
        with ShardWriter(pattern, storage_options=http_backend.storage_options) as writer:
            writer.write({"__key__": "a", "txt": "x"})
    assert "x-0000.tar" in str(raised.value)
    for link in _chain(raised.value):
        assert SIGNATURE not in f"{link!s} {link!r} {link.args!r}", type(link)
    assert SIGNATURE not in "".join(traceback.format_exception(raised.value))
