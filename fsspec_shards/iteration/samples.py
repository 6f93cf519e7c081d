"""Group tar members into samples by the webdataset convention.

Consecutive members sharing a key form one sample. The key is the member path up to the
first dot of its file name; the rest is the extension, lower-cased (webdataset 1.0.2's
``base_plus_ext`` + ``group_by_keys``). Members without an extension and webdataset's
``__name__`` meta members are skipped, as webdataset does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from fsspec_shards.errors import ShardFormatError
from fsspec_shards.iteration.tar import TarMember

_KEY_AND_EXTENSION = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META_MEMBER = re.compile(r"__[^/]*__($|/)")
_RESERVED_FIELDS = frozenset(("__key__", "__url__"))


@dataclass(slots=True)
class RawSample:
    """One sample: its key, its shard URL, its fields and the byte range it covers."""

    key: str
    url: str
    fields: dict[str, bytes]
    offset: int
    end: int


def split_key(name: str) -> tuple[str | None, str | None]:
    """Split a member name into (key, extension) as webdataset does; (None, None) if no key.

    ``"a/b.c/d.seg.JPG"`` -> ``("a/b.c/d", "seg.JPG")``. The extension is not lower-cased
    here; :func:`group_samples` does that.
    """
    if "/" not in name:
        dot = name.find(".")
        if dot > 0:
            return name[:dot], name[dot + 1 :]
        return None, None
    match = _KEY_AND_EXTENSION.match(name)
    if match is None:
        return None, None
    return match.group(1), match.group(2)


def is_meta_member(name: str) -> bool:
    """True for webdataset's skipped meta members (``__index__``, ``__meta__/x.json``)."""
    return name.startswith("__") and (
        ("/" not in name and name.endswith("__")) or _META_MEMBER.match(name) is not None
    )


def group_samples(members: Iterable[TarMember], url: str) -> Iterator[RawSample]:
    """Yield the samples of one shard's members, in order.

    A repeated extension within one sample raises :class:`ShardFormatError` naming the
    shard, the key and the offset of the repeating member.
    """
    sample: RawSample | None = None
    fields: dict[str, bytes] = {}
    current_key = None
    for member in members:
        name = member.name
        if name.startswith("__") and is_meta_member(name):
            continue
        if "/" in name:
            key, extension = split_key(name)
            if key is None:
                continue
        else:
            dot = name.find(".")
            if dot <= 0:
                continue
            key = name[:dot]
            extension = name[dot + 1 :]
        extension = extension.lower()
        if key != current_key:
            if sample is not None:
                yield sample
            fields = {}
            sample = RawSample(key, url, fields, member.offset, member.end)
            current_key = key
        elif extension in fields:
            raise ShardFormatError(
                url, member.offset, f"sample {key!r} repeats the extension {extension!r}"
            )
        if extension in _RESERVED_FIELDS:
            raise ShardFormatError(
                url, member.offset, f"member {name!r} uses the reserved field {extension!r}"
            )
        fields[extension] = member.data
        sample.end = member.end
    if sample is not None:
        yield sample


def to_dict(sample: RawSample) -> dict:
    """The sample as webdataset forms it: ``{"__key__", "__url__", ext: bytes, ...}``."""
    result = {"__key__": sample.key, "__url__": sample.url}
    result.update(sample.fields)
    return result
