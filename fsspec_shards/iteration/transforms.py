"""Small composable sample transforms, as webdataset users know them.

Per-sample steps (:func:`map`, :func:`decode`, :func:`rename`, :func:`select`,
:func:`to_tuple`) are :class:`SampleStep` objects: pure functions of one sample that return
the new sample, or ``None`` to drop it. They hold no state across samples, so a dataset can
apply them after its resumable position bookkeeping and lose nothing on resume.
:func:`batched` is the one step that spans samples; it works on an iterator.
:func:`apply` runs a list of steps over any iterable of samples.
"""

from __future__ import annotations

import importlib
import io
import json
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from fsspec_shards.config import DEFAULT_MAX_MEMBER_SIZE, parse_max_member_size
from fsspec_shards.redact import redact_url

TEXT_EXTENSIONS = frozenset(("txt", "text", "transcript"))
INT_EXTENSIONS = frozenset(("cls", "cls2", "class", "count", "index", "inx", "id"))
JSON_EXTENSIONS = frozenset(("json", "jsn"))
PICKLE_EXTENSIONS = frozenset(("pyd", "pkl", "pickle"))
IMAGE_EXTENSIONS = frozenset(
    ("jpg", "jpeg", "img", "image", "png", "ppm", "pgm", "pbm", "pnm", "bmp", "gif", "tif")
    + ("tiff", "webp")
)
IMAGE_MODES = ("pil", "numpy")


class SampleStep:
    """A pure function of one sample; returns the new sample or ``None`` to drop it."""

    def __init__(self, function: Callable[[Any], Any], description: str) -> None:
        self.function = function
        self.description = description

    def __call__(self, sample: Any) -> Any:
        return self.function(sample)

    def __repr__(self) -> str:
        return f"<{self.description}>"


class Batched:
    """Groups consecutive samples into lists of ``size`` (then ``collate`` if given)."""

    def __init__(self, size: int, collate: Callable[[list], Any] | None, partial: bool) -> None:
        if size < 1:
            raise ValueError(f"batch size must be at least 1, not {size}")
        self.size = size
        self.collate = collate
        self.partial = partial

    def __call__(self, samples: Iterable[Any]) -> Iterator[Any]:
        batch: list = []
        for sample in samples:
            batch.append(sample)
            if len(batch) == self.size:
                yield self.collate(batch) if self.collate else batch
                batch = []
        if batch and self.partial:
            yield self.collate(batch) if self.collate else batch

    def __repr__(self) -> str:
        return f"<batched {self.size}>"


def map(function: Callable[[Any], Any]) -> SampleStep:
    """Apply ``function`` to every sample."""
    return SampleStep(function, f"map {getattr(function, '__name__', function)!r}")


def select(predicate: Callable[[Any], bool]) -> SampleStep:
    """Keep only the samples for which ``predicate`` is true."""
    return SampleStep(
        lambda sample: sample if predicate(sample) else None,
        f"select {getattr(predicate, '__name__', predicate)!r}",
    )


def _field_names(spec: str) -> list[str]:
    return [name for name in spec.split(";") if name]


def _first_present(sample: Mapping[str, Any], spec: str) -> Any:
    for name in _field_names(spec):
        if name in sample:
            return sample[name]
    raise KeyError(
        f"sample {sample.get('__key__')!r} has none of the fields {spec!r} "
        f"(it has {sorted(k for k in sample if not k.startswith('__'))})"
    )


def to_tuple(*specs: str) -> SampleStep:
    """Turn a sample into a tuple of fields; ``"jpg;png"`` takes the first one present.

    A sample with none of a spec's fields raises KeyError naming the sample's key.
    """
    if not specs:
        raise ValueError("to_tuple needs at least one field")
    return SampleStep(
        lambda sample: tuple(_first_present(sample, spec) for spec in specs),
        f"to_tuple {specs}",
    )


def rename(keep: bool = True, **new_names: str) -> SampleStep:
    """Rename fields: ``rename(image="jpg;png", label="cls")``.

    Each new name takes the first present of its ``;``-separated old names (KeyError if
    none is); the old fields are dropped. Fields not mentioned are kept unless ``keep``
    is False (``__key__`` and ``__url__`` always stay).
    """
    old_names = {name for spec in new_names.values() for name in _field_names(spec)}

    def rename_fields(sample: dict) -> dict:
        renamed = {new: _first_present(sample, spec) for new, spec in new_names.items()}
        result = {
            name: value
            for name, value in sample.items()
            if name not in old_names and (keep or name.startswith("__"))
        }
        result.update(renamed)
        return result

    return SampleStep(rename_fields, f"rename {new_names}")


def _decode_int(data: bytes) -> int:
    return int(data)


def _decode_text(data: bytes) -> str:
    return data.decode("utf-8")


def _decode_json(data: bytes) -> Any:
    return json.loads(data)


def _decode_pickle(data: bytes) -> Any:
    import pickle

    return pickle.loads(data)


def _require(module: str, purpose: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"{purpose} needs the {module!r} package; install it") from None


def _decode_npy(data: bytes) -> Any:
    numpy = _require("numpy", "decoding .npy fields")
    return numpy.load(io.BytesIO(data), allow_pickle=False)


def _decode_npz(data: bytes) -> dict[str, Any]:
    numpy = _require("numpy", "decoding .npz fields")
    with numpy.load(io.BytesIO(data), allow_pickle=False) as arrays:
        return dict(arrays)


def _decode_torch(data: bytes) -> Any:
    torch = _require("torch", "decoding .pth fields")
    return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")


def _gunzip(data: bytes, limit: int) -> bytes:
    """``data`` decompressed (every gzip member of it), refused beyond ``limit`` bytes."""
    parts: list[bytes] = []
    room = limit
    while data:
        inflater = zlib.decompressobj(wbits=31)
        part = inflater.decompress(data, room + 1)
        if len(part) > room:
            raise ValueError(f"it decompresses to more than max_member_size ({limit} bytes)")
        if not inflater.eof:
            raise ValueError("the gzip stream is truncated")
        parts.append(part)
        room -= len(part)
        data = inflater.unused_data
    return b"".join(parts)


def _image_decoder(mode: str) -> Callable[[bytes], Any]:
    if mode not in IMAGE_MODES:
        raise ValueError(f"images must be one of {IMAGE_MODES} or None, not {mode!r}")
    image_module = _require("PIL.Image", "decoding images")
    numpy = _require("numpy", "decoding images to arrays") if mode == "numpy" else None

    def decode_image(data: bytes) -> Any:
        image = image_module.open(io.BytesIO(data))
        image.load()
        return image if numpy is None else numpy.asarray(image)

    return decode_image


def decode(
    images: str | None = None,
    *,
    npy: bool = True,
    pth: bool = True,
    pickle: bool = False,
    handlers: Mapping[str, Callable[[bytes], Any]] | None = None,
    max_member_size: int | str = DEFAULT_MAX_MEMBER_SIZE,
) -> SampleStep:
    """Decode fields by their last extension (``"seg.png"`` counts as ``png``), as the
    writer (:mod:`~fsspec_shards.iteration.encoding`) encodes them.

    txt/text/transcript -> str, cls/cls2/class/count/index/inx/id -> int, json/jsn ->
    object; with ``npy`` (numpy imported at the first such field): npy -> array, npz -> dict
    of arrays, both with ``allow_pickle=False``; with ``pth``: pth -> ``torch.load(...,
    weights_only=True, map_location="cpu")`` (torch imported at the first pth field).
    A field ending in ``.gz`` (``"json.gz"``) is decompressed, refused past
    ``max_member_size`` (a bound on gzip bombs), then decoded by the rest of its name
    (decompressed bytes if nothing decodes that). ``images="pil"`` or ``"numpy"`` decodes
    jpg/img/png/ppm/... with Pillow. Pickles (pyd/pkl/pickle) are decoded only with
    ``pickle=True``. ``handlers`` maps more extensions to functions and wins over these.
    Fields with no decoder stay bytes; ``__key__``-style fields are left alone.
    """
    limit = parse_max_member_size(max_member_size)
    decoders: dict[str, Callable[[bytes], Any]] = {}
    decoders.update(dict.fromkeys(TEXT_EXTENSIONS, _decode_text))
    decoders.update(dict.fromkeys(INT_EXTENSIONS, _decode_int))
    decoders.update(dict.fromkeys(JSON_EXTENSIONS, _decode_json))
    if npy:
        decoders.update(npy=_decode_npy, npz=_decode_npz)
    if pth:
        decoders["pth"] = _decode_torch
    if pickle:
        decoders.update(dict.fromkeys(PICKLE_EXTENSIONS, _decode_pickle))
    if images is not None:
        decoders.update(dict.fromkeys(IMAGE_EXTENSIONS, _image_decoder(images)))
    decoders.update(handlers or {})

    def decode_value(name: str, value: bytes) -> Any:
        decoder = decoders.get(name.rsplit(".", 1)[-1])
        if decoder is not None:
            return decoder(value)
        if name == "gz" or name.endswith(".gz"):
            data = _gunzip(value, limit)
            inner = decoders.get(name[:-3].rsplit(".", 1)[-1])
            return data if inner is None else inner(data)
        return value

    def decode_fields(sample: dict) -> dict:
        result = {}
        for name, value in sample.items():
            if name.startswith("__") or not isinstance(value, (bytes, bytearray)):
                result[name] = value
                continue
            try:
                result[name] = decode_value(name, value)
            except ImportError:
                raise
            except Exception as exc:
                raise ValueError(
                    f"cannot decode field {name!r} of sample {sample.get('__key__')!r} "
                    f"from {redact_url(sample.get('__url__', ''))!r}: {exc}"
                ) from exc
        return result

    return SampleStep(decode_fields, f"decode images={images!r} pickle={pickle}")


def batched(
    size: int, collate: Callable[[list], Any] | None = None, partial: bool = True
) -> Batched:
    """Group samples into lists of ``size``; ``collate`` turns each list into a batch;
    ``partial=False`` drops a last, short batch."""
    return Batched(size, collate, partial)


def apply(samples: Iterable[Any], steps: Sequence[SampleStep | Batched]) -> Iterator[Any]:
    """Run ``steps`` in order over ``samples``; a step returning ``None`` drops the sample."""
    stream: Iterable[Any] = samples
    for step in steps:
        stream = step(stream) if isinstance(step, Batched) else _per_sample(stream, step)
    return iter(stream)


def _per_sample(samples: Iterable[Any], step: SampleStep) -> Iterator[Any]:
    for sample in samples:
        result = step(sample)
        if result is not None:
            yield result


__all__ = [
    "Batched",
    "SampleStep",
    "apply",
    "batched",
    "decode",
    "map",
    "rename",
    "select",
    "to_tuple",
]
