"""``patch_webdataset``: webdataset's own pipelines, reading through the ``wds`` layer.

webdataset opens every shard with ``webdataset.gopen.gopen``, which dispatches on the URL
scheme through the ``gopen_schemes`` table (``curl`` for http(s), ``gsutil`` for gs) and
opens ``file:`` URLs itself. After :func:`patch_webdataset`, the schemes below open through
``wds::`` (retries and resume, verification, the shared cache) with the options given; the
rest of webdataset (its pipeline stages, decoding, shuffling, splitting, ``pipe:`` URLs,
bare local paths, writing to ``file:`` URLs) stays webdataset's. ``file:`` URLs are opened
in two places, both routed: ``gopen`` itself and ``WebDataset``'s ``StreamingOpen`` stage.

This changes webdataset's module state for the whole process; it is the user's explicit
call, never done on import. Calling it again replaces the options (it does not wrap twice).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

import fsspec

from fsspec_shards import option_shapes

SCHEMES = ("s3", "gs", "gcs", "az", "abfs", "abfss", "http", "https")
"""The schemes whose webdataset handler is replaced; ``file`` is handled beside the table."""
_MARK = "__fsspec_shards_original__"


class _Opener:
    """Opens a URL through ``wds::`` with the options of the last ``patch_webdataset`` call."""

    def __init__(self) -> None:
        self.storage_options: dict[str, Any] = {}

    def __call__(self, url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> Any:
        """webdataset's handler signature; ``bufsize`` and extra keywords are webdataset's
        own (its curl/pipe settings) and do not apply to fsspec."""
        chained, options = option_shapes.fsspec_arguments(url, self.storage_options)
        if not chained.startswith(f"{option_shapes.LAYER}::"):
            chained = f"{option_shapes.LAYER}::{chained}"
        fs, path = fsspec.core.url_to_fs(chained, **options)
        return fs.open(path, mode)


_OPENER = _Opener()


def patch_webdataset(storage_options: Mapping[str, Any] | None = None) -> None:
    """Make webdataset read s3://, gs://, gcs://, az://, abfs(s)://, http(s):// and file://
    URLs through ``wds::`` with ``storage_options`` (``{"wds": {...}, "s3": {...}}``; flat
    options are the ``wds`` layer's). Idempotent: a second call only replaces the options.

    Turn webdataset's own cache off (no ``cache_dir`` given to ``WebDataset``): the layer
    caches, verified and bounded, and a second copy would only cost disk.
    """
    try:
        gopen_module = importlib.import_module("webdataset.gopen")  # the module, not the function
    except ImportError:
        raise ImportError("patch_webdataset needs webdataset: pip install webdataset") from None
    options = dict(storage_options or {})
    if options and not option_shapes.is_sectioned(options):
        options = {option_shapes.LAYER: options}
    _OPENER.storage_options = options
    for scheme in SCHEMES:
        gopen_module.gopen_schemes[scheme] = _OPENER
    if not hasattr(gopen_module.gopen, _MARK):
        gopen_module.gopen = _with_file_urls(gopen_module.gopen)
        importlib.import_module("webdataset").gopen = gopen_module.gopen  # its re-export
    streaming = importlib.import_module("webdataset.cache").StreamingOpen
    if not hasattr(streaming.__call__, _MARK):
        streaming.__call__ = _streaming_file_urls(streaming.__call__)


def _with_file_urls(original: Callable[..., Any]) -> Callable[..., Any]:
    """webdataset's ``gopen``, with ``file:`` URLs read through ``wds::`` (webdataset opens
    them before consulting its table); writes and bare paths stay webdataset's."""

    @functools.wraps(original)
    def gopen(url: Any, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> Any:
        parsed = urlparse(url) if isinstance(url, str) else None
        if mode == "rb" and parsed is not None and parsed.scheme == "file":
            return _OPENER(f"file://{url2pathname(parsed.path)}", mode, bufsize, **kw)
        return original(url, mode, bufsize, **kw)

    setattr(gopen, _MARK, original)
    return gopen


def _streaming_file_urls(original: Callable[..., Any]) -> Callable[..., Any]:
    """``WebDataset``'s opener stage (``StreamingOpen``), which opens ``file:`` URLs itself,
    with them read through ``wds::``; other URLs and bare paths go on as before."""

    @functools.wraps(original)
    def call(self: Any, urls: Any) -> Any:
        for item in urls:
            url = item["url"] if isinstance(item, dict) else item
            parsed = urlparse(url) if isinstance(url, str) else None
            if parsed is None or parsed.scheme != "file":
                yield from original(self, [item])
                continue
            try:
                stream = _OPENER(f"file://{url2pathname(parsed.path)}")
            except Exception as error:
                if self.handler(error):
                    continue
                break
            yield dict(url=url, stream=stream)

    setattr(call, _MARK, original)
    return call
