"""patch_webdataset: webdataset's pipelines read through the wds layer (local files here;
tests/integration/test_webdataset_patch.py does every remote backend).

Each rule of webdataset's is checked by running the same reads on unpatched webdataset and
then patched, in the same test, and comparing. The whole file runs on the installed
webdataset (1.0.x) and again, in a second environment, on webdataset 0.2.86."""

from __future__ import annotations

import hashlib
import importlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import fsspec
import pytest

import fsspec_shards
from fsspec_shards.webdataset_patch import PIPE_FORMS, pipe_source
from tests import webdataset_state
from tests.shardmaker import shard_tar, write_shards

wds = pytest.importorskip("webdataset")
NEW = not wds.__version__.startswith("0.")
"""1.0.x; else 0.2.x, whose WebDataset has no ``empty_check`` and no security flag."""


@pytest.fixture
def restored_webdataset():
    yield from webdataset_state.restored()


def _shards(directory, shards: int, samples: int) -> list[str]:
    directory.mkdir()
    return write_shards(directory, shards=shards, samples=samples)


def _dataset(urls, **options):
    """``WebDataset`` in order, on either series."""
    if NEW:
        options = {"shardshuffle": False, "empty_check": False, **options}
    return wds.WebDataset(urls, **options)


def _records(pipeline) -> list[tuple]:
    return [(s["__key__"], s["txt"], s.get("__local_path__"), s["__url__"]) for s in pipeline]


def _samples(urls: list[str]) -> list[tuple[str, bytes]]:
    return [(sample["__key__"], sample["txt"]) for sample in _dataset(urls)]


def _outcome(read: Callable[[], object]) -> object:
    """What ``read`` gives: its result, or the type and message of what it raised."""
    try:
        return read()
    except Exception as error:
        return type(error).__name__, str(error)


def _patch(tmp_path, **keywords):
    return fsspec_shards.patch_webdataset(
        {"wds": {"cache_dir": str(tmp_path / "cache")}}, **keywords
    )


def _cached_files(tmp_path) -> int:
    fs = fsspec.filesystem("wds", target_protocol="file", cache_dir=str(tmp_path / "cache"))
    return fs.cache_stats()["cached_files"]


def test_file_urls_read_through_the_layer_and_its_cache(tmp_path, restored_webdataset):
    paths = _shards(tmp_path / "shards", 2, 3)
    urls = [f"file://{path}" for path in paths]
    unpatched = _records(_dataset(urls))
    _patch(tmp_path)
    assert _records(_dataset(urls)) == unpatched  # __local_path__ passed on too
    assert _cached_files(tmp_path) == 2


def test_patching_twice_replaces_the_options_and_wraps_once(tmp_path, restored_webdataset):
    module = restored_webdataset
    original = module.gopen
    fsspec_shards.patch_webdataset({"cache_dir": str(tmp_path / "first")})  # flat: the layer's
    fsspec_shards.patch_webdataset({"wds": {"cache_dir": str(tmp_path / "second")}})
    assert module.gopen.__wrapped__ is original and wds.gopen is module.gopen
    [path] = _shards(tmp_path / "shards", 1, 2)
    assert len(_samples([f"file://{path}"])) == 2
    assert (tmp_path / "second").is_dir() and not (tmp_path / "first").exists()


def test_the_schemes_of_every_backend_are_routed(restored_webdataset):
    fsspec_shards.patch_webdataset()
    table = restored_webdataset.gopen_schemes
    handlers = {table[scheme] for scheme in ("s3", "gs", "gcs", "az", "abfs", "http", "https")}
    assert len(handlers) == 1 and handlers != {table["__default__"]}
    assert table["pipe"].__module__ == "webdataset.gopen"  # what is not storage stays


def test_importing_the_package_leaves_webdataset_alone():
    code = (
        "import importlib, fsspec_shards, fsspec_shards.webdataset_patch; "
        "g = importlib.import_module('webdataset.gopen'); "
        "print(g.gopen_schemes['s3'] if 's3' in g.gopen_schemes else 'none', "
        "hasattr(g.gopen, '__wrapped__'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["none", "False"]


# --- undoing it --------------------------------------------------------------------------


def test_unpatch_restores_every_handler_and_is_a_no_op_twice(tmp_path, restored_webdataset):
    before = webdataset_state.snapshot()
    fsspec_shards.unpatch_webdataset()  # nothing patched
    assert webdataset_state.snapshot() == before
    _patch(tmp_path, pipe_commands=True)
    assert webdataset_state.snapshot() != before
    _patch(tmp_path)  # a second call, then one unpatch undoes both
    fsspec_shards.unpatch_webdataset()
    assert webdataset_state.snapshot() == before
    fsspec_shards.unpatch_webdataset()
    assert webdataset_state.snapshot() == before


def test_patch_is_a_context_manager(tmp_path, restored_webdataset):
    before = webdataset_state.snapshot()
    [path] = _shards(tmp_path / "shards", 1, 2)
    with _patch(tmp_path) as patch:
        assert patch is not None and webdataset_state.snapshot() != before
        _samples([f"file://{path}"])
    assert webdataset_state.snapshot() == before
    assert _cached_files(tmp_path) == 1
    _samples([f"file://{path}"])  # unpatched again: webdataset's own open, not the layer's
    assert _cached_files(tmp_path) == 1


# --- versions: supported, or refused with nothing changed ---------------------------------


@pytest.mark.parametrize("version", ["0.2.85", "0.2.5", "0.3.0", "1.1.0", "2.0.0", "unknown"])
def test_an_unsupported_version_is_refused_before_anything_changes(
    restored_webdataset, monkeypatch, version
):
    monkeypatch.setattr(wds, "__version__", version)
    before = webdataset_state.snapshot()
    with pytest.raises(ImportError, match=r"0\.2\.86 or a later 0\.2\.x, or 1\.0\.x") as info:
        fsspec_shards.patch_webdataset()
    assert f"webdataset {version} is installed" in str(info.value)
    assert webdataset_state.snapshot() == before


def test_a_missing_part_of_webdataset_leaves_it_unpatched(restored_webdataset, monkeypatch):
    # what 0.2.86 did to the first patch: a part looked up after 8 handlers were replaced
    cache = importlib.import_module("webdataset.cache")
    monkeypatch.delattr(cache, "StreamingOpen" if NEW else "cached_url_opener")
    before = webdataset_state.snapshot()
    with pytest.raises(AttributeError):
        fsspec_shards.patch_webdataset()
    assert webdataset_state.snapshot() == before


# --- webdataset's own rules, before the routing --------------------------------------------


@pytest.mark.parametrize("read", ["gopen", "DataPipeline", "GOPEN_REWRITE"])
def test_enforce_security_refuses_as_webdataset_does(
    tmp_path, restored_webdataset, monkeypatch, read
):
    utils = importlib.import_module("webdataset.utils")
    if not hasattr(utils, "enforce_security"):
        pytest.skip(f"webdataset {wds.__version__} has no enforce_security")
    [path] = _shards(tmp_path / "shards", 1, 3)
    url = f"file://{path}"
    if read == "GOPEN_REWRITE":
        monkeypatch.setenv("GOPEN_REWRITE", "file:///nowhere/=file:///")

    def attempt():
        if read == "DataPipeline":
            return _records(wds.DataPipeline(wds.SimpleShardList(url), wds.tarfile_to_samples()))
        with wds.gopen(url) as stream:
            return stream.read()

    assert isinstance(attempt(), (list, bytes))  # allowed while the flag is off
    monkeypatch.setattr(utils, "enforce_security", True)
    unpatched = _outcome(attempt)
    _patch(tmp_path)
    patched = _outcome(attempt)
    assert unpatched[0] == "ValueError" and patched == unpatched
    assert _cached_files(tmp_path) == 0


@pytest.mark.parametrize("handler", ["ignore_and_stop", "ignore_and_continue"])
@pytest.mark.parametrize("bad", ["path", "file", "unknown scheme"])
@pytest.mark.parametrize("stage", ["WebDataset", "DataPipeline"])
def test_the_handler_verdict_is_webdatasets(tmp_path, restored_webdataset, handler, bad, stage):
    [path] = _shards(tmp_path / "shards", 1, 5)
    missing = tmp_path / "missing.tar"
    urls = {
        "path": [str(missing), path],
        "file": [f"file://{missing}", f"file://{path}"],
        "unknown scheme": ["nosuch://bucket/x.tar", f"file://{path}"],
    }[bad]
    verdict = getattr(wds, handler)

    def read():
        if stage == "WebDataset":
            return _records(_dataset(urls, handler=verdict))
        stages = (wds.SimpleShardList(urls), wds.tarfile_to_samples(handler=verdict))
        return _records(wds.DataPipeline(*stages))

    unpatched = _outcome(read)
    _patch(tmp_path)
    patched = _outcome(read)
    assert patched == unpatched
    assert len(unpatched) == (0 if handler == "ignore_and_stop" else 5)


@pytest.mark.parametrize("stage", ["gopen", "WebDataset", "DataPipeline"])
def test_gopen_rewrite_applies_before_the_routing(
    tmp_path, restored_webdataset, monkeypatch, stage
):
    paths = _shards(tmp_path / "shards", 2, 2)
    monkeypatch.setenv("GOPEN_REWRITE", f"file:///elsewhere/={Path(paths[0]).parent.as_uri()}/")
    urls = [f"file:///elsewhere/{Path(path).name}" for path in paths]

    def read():
        if stage == "gopen":
            return [wds.gopen(url).read() for url in urls]
        if stage == "WebDataset":  # 1.0.x's opener stage rewrites no file: URL
            return _records(_dataset(urls, handler=wds.ignore_and_continue))
        return _records(wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples()))

    unpatched = _outcome(read)
    _patch(tmp_path)
    patched = _outcome(read)
    assert patched == unpatched
    assert _cached_files(tmp_path) == (2 if unpatched else 0)  # read: through the layer


@pytest.mark.parametrize("stage", ["gopen", "WebDataset", "DataPipeline"])
def test_a_percent_encoded_space_is_read_as_webdataset_reads_it(
    tmp_path, restored_webdataset, stage
):
    for name, shard in (("a b", 0), ("a%20b", 1)):  # which one is read shows the decoding
        (tmp_path / name).mkdir()
        (tmp_path / name / "shard.tar").write_bytes(shard_tar(shard, samples=2))
    url = f"file://{tmp_path}/a%20b/shard.tar"

    def read():
        if stage == "gopen":
            return wds.gopen(url).read()
        if stage == "WebDataset":
            return _records(_dataset([url]))
        return _records(wds.DataPipeline(wds.SimpleShardList(url), wds.tarfile_to_samples()))

    unpatched = _outcome(read)
    _patch(tmp_path)
    patched = _outcome(read)
    assert patched == unpatched and _cached_files(tmp_path) == 1


# --- webdataset's own cache: refused ------------------------------------------------------


def test_webdatasets_cache_is_refused_as_it_hands_out_unverified_bytes(
    tmp_path, restored_webdataset
):
    [path] = _shards(tmp_path / "shards", 1, 3)
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    tampered = bytearray(Path(path).read_bytes())
    tampered[600] ^= 1  # a payload byte: the tar still parses
    Path(path).write_bytes(bytes(tampered))
    wds_cache = tmp_path / "wds-cache"
    wds_cache.mkdir()
    url = f"file://{path}"
    unpatched = _records(_dataset([url], cache_dir=str(wds_cache)))
    assert len(unpatched) == 3  # webdataset's cache hands out the tampered bytes
    options = {"cache_dir": str(tmp_path / "cache"), "checksums": {path: f"sha256:{digest}"}}
    fsspec_shards.patch_webdataset({"wds": options})
    with pytest.raises(fsspec_shards.IntegrityError):
        _records(_dataset([url]))  # the layer verifies
    with pytest.raises(ValueError, match=r"cache_dir.*never verified.*'wds'.*cache_dir"):
        _records(_dataset([url], cache_dir=str(wds_cache)))


# --- pipe: commands -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("pipe:aws s3 cp s3://b/k.tar -", (0, "s3://b/k.tar")),
        ("pipe:aws s3 cp --quiet s3://b/k.tar -", (0, "s3://b/k.tar")),
        ("pipe:gsutil cat gs://b/k.tar", (1, "gs://b/k.tar")),
        ("pipe:gsutil -q cat gs://b/k.tar", (1, "gs://b/k.tar")),
        ("pipe:curl -s -L https://h/k.tar", (2, "https://h/k.tar")),
        ("pipe:curl -fsSL 'http://h/a b.tar'", (2, "http://h/a b.tar")),
        ("pipe:curl --silent --location https://h/k.tar", (2, "https://h/k.tar")),
        ("pipe:aws s3 cp s3://b/k.tar /tmp/x", None),  # not to stdout
        ("pipe:aws s3 cp --endpoint-url http://e s3://b/k.tar -", None),  # its own endpoint
        ("pipe:curl -H 'Authorization: Bearer x' https://h/k.tar", None),  # its own headers
        ("pipe:curl -s https://h/k.tar || true", None),  # shell syntax
        ("pipe:curl -s https://h/k.tar | zcat", None),
        ("pipe:gsutil cat gs://b/a.tar gs://b/b.tar", None),
        ("pipe:gsutil cat s3://b/k.tar", None),
        ("pipe:cat /tmp/k.tar", None),
        ("pipe:curl 'unclosed", None),
        ("s3://b/k.tar", None),
    ],
)
def test_the_pipe_commands_recognised(url, expected):
    assert pipe_source(url) == (
        None if expected is None else (PIPE_FORMS[expected[0]], expected[1])
    )


def test_other_pipe_commands_stay_webdatasets(tmp_path, restored_webdataset):
    [path] = _shards(tmp_path / "shards", 1, 3)
    url = f"pipe:cat {path}"
    unpatched = _records(_dataset([url]))
    _patch(tmp_path, pipe_commands=True)
    assert _records(_dataset([url])) == unpatched
    assert _cached_files(tmp_path) == 0


def test_a_pipe_command_under_enforce_security_is_refused_as_webdataset_does(
    tmp_path, restored_webdataset, monkeypatch
):
    utils = importlib.import_module("webdataset.utils")
    if not hasattr(utils, "enforce_security"):
        pytest.skip(f"webdataset {wds.__version__} has no enforce_security")
    monkeypatch.setattr(utils, "enforce_security", True)
    url = "pipe:aws s3 cp s3://bucket/train-0000.tar -"
    unpatched = _outcome(lambda: wds.gopen(url).read())
    _patch(tmp_path, pipe_commands=True)
    assert _outcome(lambda: wds.gopen(url).read()) == unpatched
    assert unpatched[0] == "ValueError"


# --- the same tests on webdataset 0.2.86 ----------------------------------------------------


def test_the_webdataset_under_test_is_the_one_asked_for():
    expected = os.environ.get(webdataset_state.INSIDE)
    if expected is None:
        pytest.skip("run by test_the_patch_holds_on_webdataset_0_2_86 in its own environment")
    assert wds.__version__ == expected


@pytest.fixture
def other_webdataset_python(request, tmp_path_factory) -> Path:
    return webdataset_state.other_version_python(request, tmp_path_factory)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_patch_holds_on_webdataset_0_2_86(other_webdataset_python):
    tests = ["tests/test_webdataset_patch.py", "tests/deps/test_webdataset.py"]
    webdataset_state.run_tests(other_webdataset_python, tests)
