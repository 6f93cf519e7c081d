import pytest

from fsspec_shards import config
from fsspec_shards.storage.core.options import parse_verify


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (1234, 1234),
        ("1234", 1234),
        ("50GB", 50 * 1000**3),
        ("50 gb", 50 * 1000**3),
        ("1GiB", 1024**3),
        ("1.5MiB", int(1.5 * 1024**2)),
        ("10k", 10_000),
        ("2TiB", 2 * 1024**4),
    ],
)
def test_parse_size_accepts_decimal_and_binary_units(text, expected):
    assert config.parse_size(text) == expected


@pytest.mark.parametrize(
    "bad", ["", "GB", "10 parsecs", "-5", -1, True, "1e9", float("inf"), float("nan")]
)
def test_parse_size_rejects_garbage_with_a_clear_message(bad):
    with pytest.raises(ValueError, match="invalid size"):
        config.parse_size(bad)


@pytest.mark.parametrize(
    ("text", "expected"), [("1", True), ("yes", True), ("0", False), ("off", False)]
)
def test_parse_bool_reads_environment_style_values(text, expected):
    assert config.parse_bool(text, "x") is expected


def test_parse_bool_and_int_reject_garbage_naming_the_option():
    with pytest.raises(ValueError, match="'verify'"):
        config.parse_bool("maybe", "verify")
    for garbage in ("many", 2.5, True):
        with pytest.raises(ValueError, match="'retries'"):
            config.parse_int(garbage, "retries")
    assert config.parse_int(3.0, "retries") == 3
    with pytest.raises(ValueError, match=">= 1"):
        config.parse_int("0", "retries", minimum=1)
    with pytest.raises(ValueError, match="'timeout'"):
        config.parse_float("soon", "timeout")
    for nan in (float("nan"), "nan"):  # compares false with any minimum: a check passed
        with pytest.raises(ValueError, match="'min_rate_window'"):
            config.parse_float(nan, "min_rate_window", 0.001)


def test_true_and_false_words_are_one_set_for_every_boolean_option():
    assert [config.bool_word(w) for w in ("YES", " on ", "1", "off", "", "No")] == [
        True, True, True, False, False, False
    ]  # fmt: skip
    assert config.bool_word("maybe") is None and config.bool_word(1) is None
    assert parse_verify("ON") == "auto" and parse_verify("off") is False
    assert parse_verify("none") is False


def test_a_bool_is_never_a_count():
    assert config.is_int(3) and not config.is_int(True) and not config.is_int(3.0)
    assert config.is_number(2.5) and config.is_number(2) and not config.is_number(False)


def test_max_member_size_has_one_default_and_one_parse():
    assert config.DEFAULT_MAX_MEMBER_SIZE == 1 << 30 == config.parse_max_member_size("1GiB")
    assert config.parse_max_member_size(4096) == 4096
    with pytest.raises(ValueError, match="^max_member_size: invalid size"):
        config.parse_max_member_size("huge")
