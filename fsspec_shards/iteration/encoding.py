"""Turn a sample dict into tar members, as webdataset 1.0.2's writer does, checked both ways.

A sample is ``{"__key__": key, field: value, ...}``. Every field becomes the member
``f"{key}.{field}"``; fields whose names start with ``_`` (``__key__``, ``__url__``...) are not
written, and the rest are written in sorted order, as webdataset's ``TarWriter`` does.

Invariant: every member name splits back, by the reader's own rules
(:func:`~fsspec_shards.iteration.samples.split_key`, lower-cased extensions, skipped meta
members), into exactly the key and field it was made from. A sample that would read back
differently is refused with a ``ValueError`` naming the key and the field, before anything
is written; so is a value that cannot be encoded (a ``str`` with a lone surrogate) and a
member larger than the reader takes (``max_member_size``).

Values are encoded as webdataset's default encoder does (see :data:`ACCEPTED`): bytes as
they are, ``str`` as UTF-8, anything else by the field's extension; a field ending in
``.gz`` is gzip-compressed after encoding.
"""

from __future__ import annotations

import gzip
import io
import json
import operator
import pickle
from collections.abc import Callable, Mapping
from typing import Any

from fsspec_shards.iteration.samples import is_meta_member, split_key

ACCEPTED = (
    "bytes, bytearray or memoryview (any field): written as they are; "
    "str (any field): UTF-8; "
    "an integer (cls, cls2, class, count, index, inx, id): its decimal digits; "
    "any JSON value such as a dict or list (json, jsn): json.dumps in UTF-8; "
    "numpy array (npy): numpy's .npy format; dict of arrays (npz): compressed .npz; "
    "PIL image or uint8/float numpy image (jpg, jpeg, img, image, png, pbm, pgm, ppm, tif, "
    "tiff): that image format; any picklable object (pyd, pickle, pkl): pickle; "
    "a torch object (pth): torch.save"
)


def _digits(value: Any) -> bytes:
    """An integer's decimal digits (int, numpy or 0-d torch integers), as ``int()`` reads
    them back; TypeError for anything else (``str(7.9)`` would not read back as an int)."""
    return str(operator.index(value)).encode("ascii")


def _json(value: Any) -> bytes:
    return json.dumps(value).encode("utf-8")


def _npy(value: Any) -> bytes:
    import numpy.lib.format

    stream = io.BytesIO()
    numpy.lib.format.write_array(stream, value)
    return stream.getvalue()


def _npz(value: Any) -> bytes:
    import numpy

    if not isinstance(value, Mapping) or not all(
        isinstance(name, str) and isinstance(array, numpy.ndarray) for name, array in value.items()
    ):
        raise TypeError("npz takes a dict of str to numpy arrays")
    stream = io.BytesIO()
    numpy.savez_compressed(stream, **value)
    return stream.getvalue()


def _torch(value: Any) -> bytes:
    import torch

    stream = io.BytesIO()
    torch.save(value, stream)
    return stream.getvalue()


def _image(image_format: str) -> Callable[[Any], bytes]:
    """An encoder of PIL images or numpy images (uint8, or float in [0, 1]) as webdataset's."""

    def encode(value: Any) -> bytes:
        import numpy
        import PIL.Image

        if isinstance(value, numpy.ndarray):
            if value.dtype in (numpy.dtype("f"), numpy.dtype("d")):
                if numpy.amin(value) <= -0.001 or numpy.amax(value) >= 1.001:
                    raise ValueError("float image values must lie in [0, 1]")
                value = numpy.array(numpy.clip(value, 0.0, 1.0) * 255.0, "uint8")
            if value.ndim not in (2, 3) or (value.ndim == 3 and value.shape[2] not in (1, 3)):
                raise ValueError(f"an image array is HxW or HxWx1/3, not {value.shape}")
            value = PIL.Image.fromarray(value)
        if not isinstance(value, PIL.Image.Image):
            raise TypeError(f"expected a PIL image or a numpy array, not {type(value).__name__}")
        options = {"quality": 100} if image_format in ("JPEG", "tiff") else {}
        with io.BytesIO() as stream:
            value.save(stream, format=image_format, **options)
            return stream.getvalue()

    return encode


def _table(*entries: tuple[str, Callable[[Any], bytes]]) -> dict[str, Callable[[Any], bytes]]:
    return {extension: encoder for names, encoder in entries for extension in names.split()}


# webdataset 1.0.2's default handlers (writer.make_handlers), plus pkl as the reader decodes it.
ENCODERS = _table(
    ("cls cls2 class count index inx id", _digits),
    ("json jsn", _json),
    ("npy", _npy),
    ("npz", _npz),
    ("pyd pickle pkl", pickle.dumps),
    ("pth", _torch),
    ("jpg jpeg img image", _image("JPEG")),
    ("png", _image("PNG")),
    ("pbm", _image("PPM")),
    ("pgm", _image("PPM")),
    ("ppm", _image("PPM")),
    ("tiff tif", _image("tiff")),
)


def encode_value(key: str, field: str, value: Any, max_member_size: int | None = None) -> bytes:
    """The bytes of one field, or a ValueError naming the key, the field and what is accepted;
    a ``.gz`` field that decompresses past ``max_member_size`` (which ``decode()`` refuses)
    is one too."""
    compress = field.endswith(".gz")
    plain_field = field[:-3] if compress else field
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
    elif isinstance(value, str):
        try:
            data = value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"sample {key!r} field {field!r}: the str is not valid Unicode text "
                f"({exc.reason} at position {exc.start}); pass bytes to write it as it is"
            ) from None
    else:
        extension = plain_field.rsplit(".", 1)[-1]
        encoder = ENCODERS.get(extension)
        if encoder is None:
            raise ValueError(
                f"sample {key!r} field {field!r}: no encoding of {type(value).__name__} for the "
                f"extension {extension!r}; accepted: {ACCEPTED}"
            )
        try:
            data = encoder(value)
        except (TypeError, ValueError, AttributeError, pickle.PicklingError) as exc:
            raise ValueError(
                f"sample {key!r} field {field!r}: cannot encode {type(value).__name__} "
                f"as {extension!r}: {exc}"
            ) from None
    if compress and max_member_size is not None and len(data) > max_member_size:
        _too_large(key, field, f"it decompresses to {len(data)} bytes, more", max_member_size)
    return gzip.compress(data, mtime=0) if compress else data


def member_name(key: str, field: str) -> str:
    """The member name of one field, checked to read back as exactly this key and field."""
    name = f"{key}.{field}"
    if not field:
        raise ValueError(f"sample {key!r}: an empty field name")
    if "\0" in name:
        raise ValueError(f"sample {key!r} field {field!r}: a tar name cannot hold NUL")
    try:
        name.encode("utf-8", "surrogateescape")  # as the tar header is written
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"sample {key!r} field {field!r}: the name is not valid Unicode text "
            f"({exc.reason} at position {exc.start})"
        ) from None
    if field != field.lower():
        raise ValueError(
            f"sample {key!r} field {field!r}: readers lower-case extensions, so it would read "
            f"back as {field.lower()!r}; use lower-case field names"
        )
    read_key, read_field = split_key(name)
    if (read_key, read_field) != (key, field):
        raise ValueError(
            f"sample {key!r} field {field!r}: the member {name!r} reads back as key "
            f"{read_key!r}, field {read_field!r}; a key has no '.' after its last '/', and a "
            "field has no '/'"
        )
    if is_meta_member(name):
        raise ValueError(
            f"sample {key!r}: readers skip members named like {name!r} (webdataset's "
            f"'__name__' meta members); choose another key"
        )
    return name


def encode_sample(
    sample: Mapping[str, Any], max_member_size: int | None = None
) -> tuple[str, list[tuple[str, bytes]]]:
    """``(key, [(member name, bytes), ...])`` of a sample, fields in sorted order; a member
    over ``max_member_size`` bytes is refused naming its key and field."""
    key = sample.get("__key__")
    if not isinstance(key, str) or not key:
        raise ValueError(f"a sample needs a non-empty str '__key__', got {key!r}")
    if not all(isinstance(field, str) for field in sample):
        raise ValueError(f"sample {key!r}: field names must be str")
    fields = sorted(field for field in sample if not field.startswith("_"))
    if not fields:
        raise ValueError(f"sample {key!r} has no fields to write (names starting '_' are not)")
    members = []
    for field in fields:
        name = member_name(key, field)
        data = encode_value(key, field, sample[field], max_member_size)
        if max_member_size is not None and len(data) > max_member_size:
            _too_large(key, field, f"{len(data)} bytes, more", max_member_size)
        members.append((name, data))
    return key, members


def _too_large(key: str, field: str, size: str, max_member_size: int) -> None:
    raise ValueError(
        f"sample {key!r} field {field!r}: {size} than max_member_size ({max_member_size} "
        "bytes), which readers refuse; split the value, or give the writer and its readers a "
        "larger max_member_size"
    )
