"""How storage options arrive, and what each hop of a chain gets (option_shapes)."""

from __future__ import annotations

import pytest

from fsspec_shards import option_shapes
from fsspec_shards.option_shapes import fsspec_arguments, layer_options

S3 = {"key": "k", "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}}


def test_a_plain_url_with_a_wds_section_reads_through_the_layer():
    url, options = fsspec_arguments("s3://b/k.tar", {"wds": {"retries": 2}, "s3": S3})
    assert url == "wds::s3://b/k.tar"
    assert options == {"wds": {"retries": 2}, "s3": S3}


def test_a_plain_url_without_a_wds_section_gets_its_own_section_flat():
    url, options = fsspec_arguments("s3://b/k.tar", {"s3": S3, "gcs": {"token": "anon"}})
    assert (url, options) == ("s3://b/k.tar", S3)


def test_sections_of_protocols_the_chain_does_not_use_are_left_out():
    url, options = fsspec_arguments("wds::file:///data/a.tar", {"wds": {"retries": 2}, "s3": S3})
    assert (url, options) == ("wds::file:///data/a.tar", {"wds": {"retries": 2}})


def test_a_section_under_another_name_of_the_protocol_is_given_under_the_urls_name():
    url, options = fsspec_arguments("wds::gs://b/k", {"wds": {}, "gcs": {"token": "anon"}})
    assert options == {"wds": {}, "gs": {"token": "anon"}}


def test_flat_options_are_fsspecs_as_given():
    assert fsspec_arguments("s3://b/k", S3) == ("s3://b/k", S3)
    assert fsspec_arguments("wds::s3://b/k", {"retries": 2}) == ("wds::s3://b/k", {"retries": 2})
    assert fsspec_arguments("s3://b/k", None) == ("s3://b/k", {})


def test_a_local_path_with_a_wds_section_reads_through_the_layer():
    url, options = fsspec_arguments("/data/a.tar", {"wds": {"retries": 2}})
    assert url == "wds::/data/a.tar"
    assert option_shapes.url_protocols(url) == ["wds", "file"]


def test_the_layer_takes_its_section_and_datasets_file_label_and_drops_others():
    own, backend = layer_options(
        "s3",
        {"key": "k"},
        {"retries": 3, "wds": {"retries": 9, "verify": "size"}, "gcs": {"token": "anon"}},
    )
    assert own == {"retries": 3, "verify": "size"}  # named directly wins over the section
    assert backend == {"key": "k"}
    own, _ = layer_options("s3", {}, {"file": {"cache_dir": "/c"}})
    assert own == {"cache_dir": "/c"}


def test_a_file_section_is_the_local_backends_when_the_backend_is_local():
    own, backend = layer_options("file", {}, {"file": {"auto_mkdir": True}})
    assert (own, backend) == ({}, {"auto_mkdir": True})


def test_the_backends_own_section_joins_its_options():
    own, backend = layer_options("s3", {"key": "given"}, {"s3": {"key": "x", "secret": "s"}})
    assert backend == {"key": "given", "secret": "s"}


def test_a_repeated_hop_wrapped_around_the_backends_options_is_unwrapped():
    # datasets 5.2 resolves wds::s3://b/k to wds::s3://b/k::s3://b/k
    nested = {"target_protocol": "s3", "target_options": S3, "fo": "b/k"}
    own, backend = layer_options("s3", nested, {})
    assert backend == S3


def test_a_backend_chained_to_another_protocol_is_refused_naming_the_shape():
    nested = {"target_protocol": "gcs", "target_options": {}, "fo": "b/k"}
    with pytest.raises(ValueError, match="own section"):
        layer_options("s3", nested, {})


def test_a_backend_that_takes_a_target_keeps_its_target_options():
    nested = {"target_protocol": "s3", "target_options": S3}
    _, backend = layer_options("simplecache", nested, {})
    assert backend == nested


def test_aliases_come_from_the_registry_without_importing_the_backend():
    """``import s3fs`` costs 0.3-0.7 s, in every DataLoader worker: naming the sections of
    an ``s3://`` URL must not pay it."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from fsspec_shards.option_shapes import fsspec_arguments, protocol_aliases\n"
        "assert protocol_aliases('s3') == ('s3', 's3a'), protocol_aliases('s3')\n"
        "assert protocol_aliases('gcs') == ('gcs', 'gs'), protocol_aliases('gcs')\n"
        "fsspec_arguments('s3://b/k.tar', {'wds': {}, 's3a': {'anon': True}})\n"
        "print(sorted({'s3fs', 'gcsfs'} & set(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_cache_is_off_only_where_the_layer_section_says_so():
    assert option_shapes.cache_is_off({"wds": {"cache": False}, "s3": S3})
    assert not option_shapes.cache_is_off({"wds": {"cache": True}})
    assert not option_shapes.cache_is_off({"wds": {}})
    assert not option_shapes.cache_is_off({"s3": {"cache": False}})
    assert not option_shapes.cache_is_off({})
