"""Sample transforms: decoding, tuples, renaming, selection, batching, and their composition."""

from __future__ import annotations

import importlib.util
import io
import pickle

import pytest

from fsspec_shards.iteration import transforms as T

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
