"""Sample transforms: decoding, tuples, renaming, selection, batching, and their composition."""

from __future__ import annotations

import gzip
import importlib.util
import io
import pickle
import sys

import pytest

from fsspec_shards import ShardDataset, ShardWriter
from fsspec_shards.iteration import transforms as T
from fsspec_shards.iteration.encoding import ENCODERS, encode_value

HAS_PIL = importlib.util.find_spec("PIL") is not None


def sample(**fields) -> dict:
    return {"__key__": "k1", "__url__": "s3://b/s.tar", **fields}


def test_decode_turns_common_extensions_into_python_values():
    decoded = T.decode()(
        sample(txt=b"hello", cls=b"3\n", **{"seg.json": b'{"a": [1]}', "id": b"12", "bin": b"\x00"})
    )
    assert decoded == sample(
        txt="hello", cls=3, **{"seg.json": {"a": [1]}, "id": 12, "bin": b"\x00"}
    )


def test_decode_reads_npy_without_allowing_pickles():
    numpy = pytest.importorskip("numpy")
    buffer = io.BytesIO()
    numpy.save(buffer, numpy.arange(6).reshape(2, 3))
    decoded = T.decode()(sample(npy=buffer.getvalue()))
    assert decoded["npy"].tolist() == [[0, 1, 2], [3, 4, 5]]
    objects = io.BytesIO()
    numpy.save(objects, numpy.array([{"x": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="npy"):
        T.decode()(sample(npy=objects.getvalue()))


def test_pickles_stay_bytes_unless_explicitly_allowed():
    payload = pickle.dumps({"x": 1})
    assert T.decode()(sample(pyd=payload))["pyd"] == payload
    assert T.decode(pickle=True)(sample(pyd=payload))["pyd"] == {"x": 1}


def test_decode_errors_name_the_field_and_the_sample():
    with pytest.raises(ValueError, match="'cls' of sample 'k1'"):
        T.decode()(sample(cls=b"not a number"))


def test_extra_handlers_win_over_builtin_decoders():
    step = T.decode(handlers={"txt": bytes.upper, "raw": len})
    assert step(sample(txt=b"a", raw=b"xyz")) == sample(txt=b"A", raw=3)


@pytest.mark.skipif(HAS_PIL, reason="checks the error when Pillow is missing")
def test_image_decoding_without_pillow_raises_a_clear_import_error():
    with pytest.raises(ImportError, match="PIL"):
        T.decode("pil")


@pytest.mark.skipif(not HAS_PIL, reason="needs Pillow")
def test_image_decoding_with_pillow_gives_images_and_arrays():
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (3, 2), (255, 0, 0)).save(buffer, format="PNG")
    assert T.decode("pil")(sample(png=buffer.getvalue()))["png"].size == (3, 2)
    assert T.decode("numpy")(sample(png=buffer.getvalue()))["png"].shape == (2, 3, 3)


def test_unknown_image_mode_raises_value_error():
    with pytest.raises(ValueError, match="bgr16"):
        T.decode("bgr16")


def test_to_tuple_takes_the_first_present_alternative():
    step = T.to_tuple("jpg;png", "cls")
    assert step(sample(png=b"P", cls=b"1")) == (b"P", b"1")
    assert step(sample(jpg=b"J", png=b"P", cls=b"1")) == (b"J", b"1")


def test_to_tuple_missing_field_raises_key_error_naming_the_key():
    with pytest.raises(KeyError, match="k1"):
        T.to_tuple("jpg;png")(sample(cls=b"1"))


def test_rename_moves_fields_and_keeps_or_drops_the_rest():
    renamed = T.rename(image="jpg;png", label="cls")(sample(png=b"P", cls=b"1", txt=b"t"))
    assert renamed == sample(txt=b"t", image=b"P", label=b"1")
    only = T.rename(keep=False, image="png")(sample(png=b"P", txt=b"t"))
    assert only == sample(image=b"P")


def test_select_and_map_compose_with_apply():
    samples = [sample(cls=str(index).encode()) for index in range(6)]
    steps = [T.decode(), T.select(lambda s: s["cls"] % 2 == 0), T.map(lambda s: s["cls"] * 10)]
    assert list(T.apply(samples, steps)) == [0, 20, 40]


def test_batched_groups_and_handles_the_partial_last_batch():
    assert list(T.batched(2)(range(5))) == [[0, 1], [2, 3], [4]]
    assert list(T.batched(2, partial=False)(range(5))) == [[0, 1], [2, 3]]
    assert list(T.batched(3, collate=sum)(range(6))) == [3, 12]
    with pytest.raises(ValueError):
        T.batched(0)


def test_batched_inside_apply_sees_the_transformed_samples():
    samples = [sample(cls=b"%d" % index) for index in range(5)]
    steps = [T.decode(), T.to_tuple("cls"), T.batched(2)]
    assert list(T.apply(samples, steps)) == [[(0,), (1,)], [(2,), (3,)], [(4,)]]


def test_per_sample_steps_are_pure():
    step = T.decode()
    original = sample(txt=b"x")
    assert step(original) == step(original)
    assert original == sample(txt=b"x")


def test_gz_fields_are_decompressed_then_decoded_by_the_inner_extension():
    decoded = T.decode()(
        sample(
            **{
                "json.gz": gzip.compress(b'{"a": 1}'),
                "cls.gz": gzip.compress(b"7"),
                "bin.gz": gzip.compress(b"\x00\x01"),
                "gz": gzip.compress(b"x") + gzip.compress(b"y"),  # two gzip members
            }
        )
    )
    assert decoded == sample(
        **{"json.gz": {"a": 1}, "cls.gz": 7, "bin.gz": b"\x00\x01", "gz": b"xy"}
    )


def test_a_gz_field_past_max_member_size_or_truncated_is_refused():
    bomb = gzip.compress(bytes(10_000))
    with pytest.raises(ValueError, match="'npy.gz' of sample 'k1'.*max_member_size"):
        T.decode(max_member_size=9_999)(sample(**{"npy.gz": bomb}))
    assert T.decode(max_member_size=10_000)(sample(gz=bomb))["gz"] == bytes(10_000)
    with pytest.raises(ValueError, match="'txt.gz' of sample 'k1'.*truncated"):
        T.decode()(sample(**{"txt.gz": gzip.compress(b"hello")[:-12]}))


def test_a_gz_handler_replaces_decompression():
    assert T.decode(handlers={"gz": len})(sample(**{"json.gz": b"abc"}))["json.gz"] == 3


def test_npz_and_pth_are_decoded_unless_turned_off():
    numpy = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    arrays, tensor = io.BytesIO(), io.BytesIO()
    numpy.savez(arrays, a=numpy.arange(3))
    torch.save({"w": torch.ones(2)}, tensor)
    raw = sample(npz=arrays.getvalue(), pth=tensor.getvalue())
    decoded = T.decode()(raw)
    assert list(decoded["npz"]) == ["a"] and decoded["npz"]["a"].tolist() == [0, 1, 2]
    assert decoded["pth"]["w"].tolist() == [1.0, 1.0]
    assert T.decode(npy=False, pth=False)(raw) == raw


def test_pth_loads_weights_only():
    torch = pytest.importorskip("torch")
    stream = io.BytesIO()
    torch.save(Unpicklable(), stream)
    with pytest.raises(ValueError, match="'pth' of sample 'k1'.*[Ww]eights"):
        T.decode()(sample(pth=stream.getvalue()))


class Unpicklable:
    """An object that ``torch.load(weights_only=True)`` must refuse to build."""


def test_a_missing_package_is_an_import_error_not_a_bad_sample(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match="'torch' package"):
        T.decode()(sample(pth=b"anything"))


def written_sample(numpy, torch) -> dict:
    """One value for every extension the writer encodes but images, plus gzip and str."""
    return {
        "__key__": "k1",
        **dict.fromkeys(("cls", "cls2", "class", "count", "index", "inx", "id"), 3),
        "json": {"a": [1, 2]},
        "jsn": [None, "x"],
        "json.gz": {"b": 2},
        "txt.gz": "compressed",
        "txt": "text",
        "npy": numpy.arange(6, dtype="int16").reshape(2, 3),
        "npz": {"x": numpy.ones(2), "y": numpy.zeros((1, 2))},
        "pth": {"weight": torch.arange(4.0), "step": torch.tensor(7)},
        "pyd": {"p": 1},
        "pickle": (1, 2),
        "pkl": [3],
    }


def assert_equal_values(got, expected, numpy, torch):
    if isinstance(expected, dict):
        assert isinstance(got, dict) and got.keys() == expected.keys()
        for name in expected:
            assert_equal_values(got[name], expected[name], numpy, torch)
    elif isinstance(expected, numpy.ndarray):
        assert isinstance(got, numpy.ndarray) and got.dtype == expected.dtype
        assert numpy.array_equal(got, expected)
    elif isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor) and torch.equal(got, expected)
    else:
        assert (type(got), got) == (type(expected), expected)


def test_what_shard_writer_writes_decode_reads_back(tmp_path):
    numpy = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    written = written_sample(numpy, torch)
    with ShardWriter(str(tmp_path / "s-%04d.tar")) as writer:
        writer.write(written)
    (read,) = ShardDataset(
        str(tmp_path / "s-0000.tar"), transforms=[T.decode(pickle=True)], raw_urls=True
    )
    assert read.pop("__url__") == str(tmp_path / "s-0000.tar")
    assert_equal_values(read, written, numpy, torch)


@pytest.mark.skipif(not HAS_PIL, reason="needs Pillow")
def test_images_shard_writer_writes_decode_reads_back(tmp_path):
    numpy = pytest.importorskip("numpy")
    image = numpy.arange(24, dtype="uint8").reshape(2, 4, 3) * 10
    image_fields = [name for name in ENCODERS if name in T.IMAGE_EXTENSIONS]
    assert len(image_fields) == 10  # every image extension the writer encodes
    with ShardWriter(str(tmp_path / "s-%04d.tar")) as writer:
        writer.write({"__key__": "k1", **dict.fromkeys(image_fields, image)})
    (read,) = ShardDataset(str(tmp_path / "s-0000.tar"), transforms=[T.decode(images="numpy")])
    for name in image_fields:
        if name in ("jpg", "jpeg", "img", "image"):  # lossy
            assert read[name].shape == image.shape
            assert numpy.abs(read[name].astype(int) - image).max() < 40, name
        else:
            assert numpy.array_equal(read[name], image), name


def test_the_round_trip_sample_holds_every_extension_the_writer_encodes_but_images():
    written = written_sample(pytest.importorskip("numpy"), pytest.importorskip("torch"))
    assert set(ENCODERS) - T.IMAGE_EXTENSIONS <= {name.removesuffix(".gz") for name in written}


def test_decode_gives_webdatasets_results_where_webdataset_decodes():
    numpy = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    autodecode = pytest.importorskip("webdataset.autodecode")
    written = written_sample(numpy, torch)
    raw = {
        "__key__": "k1",
        **{f: encode_value("k1", f, v) for f, v in written.items() if f != "__key__"},
    }
    ours = T.decode(pickle=True)(raw)
    theirs = autodecode.Decoder([])(raw)
    for field in ("class", "count"):  # written as ints; webdataset leaves them bytes
        assert (ours.pop(field), theirs.pop(field)) == (3, b"3")
    assert_equal_values(ours, theirs, numpy, torch)
