"""``patch_webdataset``: webdataset's own pipelines, reading through the ``wds`` layer.

webdataset opens every shard with ``webdataset.gopen.gopen``, which applies its own rules
(``GOPEN_REWRITE``, its ``enforce_security`` flag), then opens ``file:`` URLs itself and
dispatches the rest through its ``gopen_schemes`` table; ``WebDataset``'s opener stage
(1.0.x's ``StreamingOpen``) opens ``file:`` URLs itself too. After :func:`patch_webdataset`,
the schemes of :data:`SCHEMES` and ``file:`` URLs read with ``"rb"`` open through ``wds::``
(retries and resume, verification, the shared cache), after webdataset's own rules have
run, in every wrapper installed: a URL webdataset refuses is refused with webdataset's own
error, a rewritten URL is routed as rewritten, the handler's verdict ends the whole stream
as in webdataset, and ``__local_path__`` is passed on. The rest (pipeline stages, decoding,
shuffling, splitting, bare local paths, writing, ``pipe:`` URLs unless ``pipe_commands``)
stays webdataset's. webdataset's own cache (``cache_dir=``) is refused: it would hand out
bytes the layer never verified.

``%20`` in a ``file:`` URL: each opener follows webdataset's own reading of it (1.0.x's
``gopen`` decodes it to a space; 1.0.x's ``WebDataset`` opener stage and 0.2.x's ``gopen``
keep it as written).

This changes webdataset's module state for the whole process; it is the user's explicit
call, never done on import, and :func:`unpatch_webdataset` puts everything back. The
private parts of webdataset it relies on are in :mod:`fsspec_shards.deps.webdataset`.
"""

from __future__ import annotations

import functools
import shlex
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import urlparse

import fsspec

from fsspec_shards import option_shapes
from fsspec_shards.deps import webdataset as deps
from fsspec_shards.redact import redact_url

SCHEMES = ("s3", "gs", "gcs", "az", "abfs", "abfss", "http", "https")
"""The schemes whose webdataset handler is replaced; ``file`` is handled beside the table."""

CACHE_REFUSED = (
    "patch_webdataset: webdataset's own cache (WebDataset(cache_dir=...), or WDS_CACHE set "
    "for webdataset) is refused while the patch is on: it opens local files and its cached "
    "copies itself, handing out bytes the wds layer never verified. Leave cache_dir off and "
    "WDS_CACHE unset, and cache through the layer instead: "
    "patch_webdataset({'wds': {'cache_dir': ...}}) or FSSPEC_SHARDS_CACHE"
)

PIPE_FORMS = ("pipe:aws s3 cp URL -", "pipe:gsutil cat URL", "pipe:curl ... URL")
"""The ``pipe:`` commands ``pipe_commands=True`` reads through the layer instead of running."""

_ABSENT = object()
_LOCK = threading.Lock()


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


class _Replaced:
    """What the patch replaced, to put back: (owner, name, original) where the owner is a
    mapping (a key) or a module/class (an attribute); ``_ABSENT``: there was none."""

    def __init__(self) -> None:
        self.entries: list[tuple[Any, str, Any]] = []

    def replace(self, owner: Any, name: str, value: Any) -> None:
        if isinstance(owner, dict):
            self.entries.append((owner, name, owner.get(name, _ABSENT)))
            owner[name] = value
        else:
            self.entries.append((owner, name, vars(owner).get(name, _ABSENT)))
            setattr(owner, name, value)

    def restore(self) -> None:
        while self.entries:
            owner, name, original = self.entries.pop()
            if isinstance(owner, dict):
                if original is _ABSENT:
                    owner.pop(name, None)
                else:
                    owner[name] = original
            elif original is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, original)


_REPLACED = _Replaced()


class WebdatasetPatch:
    """What :func:`patch_webdataset` returns: a context manager whose exit unpatches."""

    def __enter__(self) -> WebdatasetPatch:
        return self

    def __exit__(self, *exc_info: object) -> None:
        unpatch_webdataset()


def patch_webdataset(
    storage_options: Mapping[str, Any] | None = None, *, pipe_commands: bool = False
) -> WebdatasetPatch:
    """Make webdataset read s3://, gs://, gcs://, az://, abfs(s)://, http(s):// and file://
    URLs through ``wds::`` with ``storage_options`` (``{"wds": {...}, "s3": {...}}``; flat
    options are the layer's), after webdataset's own rules. With ``pipe_commands=True``,
    ``pipe:aws s3 cp URL -``, ``pipe:gsutil cat URL`` and ``pipe:curl ... URL`` are read
    through the layer too (each form with a warning, once). Calling it again replaces the
    options (it never wraps twice); use it as a context manager, or undo it with
    :func:`unpatch_webdataset`.

    Supported on webdataset 0.2.86 and later 0.2.x, and 1.0.x; any other version raises
    ``ImportError`` with nothing changed. webdataset's own cache (``cache_dir=``) is
    refused while patched: the layer caches, verified and bounded.
    """
    loaded = deps.load()  # ImportError before anything changes
    options = dict(storage_options or {})
    if options and not option_shapes.is_sectioned(options):
        options = {option_shapes.LAYER: options}
    with _LOCK:
        _REPLACED.restore()
        plan = _plan(loaded, pipe_commands)  # every original looked up before any change
        try:
            for owner, name, value in plan:
                _REPLACED.replace(owner, name, value)
        except BaseException:
            _REPLACED.restore()  # all replaced or none
            raise
        _OPENER.storage_options = options
    return WebdatasetPatch()


def unpatch_webdataset() -> None:
    """Put back every webdataset handler :func:`patch_webdataset` replaced (a no-op when
    nothing is patched)."""
    with _LOCK:
        _REPLACED.restore()


def _plan(loaded: deps.Webdataset, pipe_commands: bool) -> list[tuple[Any, str, Any]]:
    """(owner, name, replacement) for everything the patch changes."""
    table = loaded.gopen.gopen_schemes
    plan: list[tuple[Any, str, Any]] = [(table, scheme, _OPENER) for scheme in SCHEMES]
    if pipe_commands:
        plan.append((table, "pipe", _PipeCommands(loaded, table["pipe"])))
    gopen = _routed_gopen(loaded, loaded.gopen.gopen)
    plan.append((loaded.gopen, "gopen", gopen))
    if loaded.package.gopen is loaded.gopen.gopen:
        plan.append((loaded.package, "gopen", gopen))  # its re-export
    if loaded.series == "1.0":
        streaming = loaded.cache.StreamingOpen
        plan.append((streaming, "__call__", _routed_streaming(loaded, streaming.__call__)))
        plan.append((loaded.cache.FileCache, "__init__", _refused_cache))
    else:
        loaded.cache.cached_url_opener  # noqa: B018 (looked up: present before any change)
        plan.append((loaded.cache, "cached_url_opener", _refused_cache))
    return plan


def _refused_cache(*args: Any, **kwargs: Any) -> Any:
    """webdataset's cached opener, refused (see :data:`CACHE_REFUSED`)."""
    raise ValueError(CACHE_REFUSED)


def _routed_gopen(loaded: deps.Webdataset, original: Callable[..., Any]) -> Callable[..., Any]:
    """webdataset's ``gopen``, with a ``file:`` URL read (``"rb"``) through ``wds::`` once
    webdataset's own rules allow it; everything else is webdataset's ``gopen`` itself."""

    @functools.wraps(original)
    def gopen(url: Any, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> Any:
        if mode == "rb" and isinstance(url, str) and url != "-":
            parsed = urlparse(deps.rewrite_url(loaded, url))  # its own ValueError if refused
            if parsed.scheme == "file" and not deps.security_enforced(loaded):
                return _OPENER(f"file://{deps.gopen_file_path(loaded, parsed)}")
        return original(url, mode, bufsize, **kw)  # refuses what webdataset refuses

    return gopen


def _routed_streaming(loaded: deps.Webdataset, original: Callable[..., Any]) -> Callable[..., Any]:
    """1.0.x's ``StreamingOpen.__call__`` as webdataset ships it (bare paths opened, the
    rest through ``gopen``, the handler's verdict ending the whole stream), with ``file:``
    URLs read through ``wds::`` and their ``local_path`` passed on."""

    @functools.wraps(original)
    def call(self: Any, urls: Any) -> Iterator[dict[str, Any]]:
        for item in urls:
            url = item["url"] if isinstance(item, dict) else item
            parsed = urlparse(url)
            try:
                if parsed.scheme == "file":
                    path = deps.streaming_file_path(parsed)
                    stream = _OPENER(f"file://{path}")
                    yield dict(url=url, stream=stream, local_path=path)
                elif parsed.scheme == "":
                    stream = open(parsed.path, "rb")  # noqa: SIM115 (the pipeline closes it)
                    yield dict(url=url, stream=stream, local_path=parsed.path)
                else:
                    yield dict(url=url, stream=loaded.gopen.gopen(url))
            except Exception as error:
                if self.handler(error):
                    continue
                break

    return call


class _PipeCommands:
    """webdataset's ``pipe:`` handler, with the commands of :data:`PIPE_FORMS` read through
    ``wds::`` instead of run (a warning per form, once); any other command, a write, and
    every command under webdataset's ``enforce_security`` go to webdataset's handler."""

    def __init__(self, loaded: deps.Webdataset, original: Callable[..., Any]) -> None:
        self.loaded = loaded
        self.original = original
        self.warned: set[str] = set()

    def __call__(self, url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> Any:
        found = pipe_source(url) if mode == "rb" else None
        if found is None or deps.security_enforced(self.loaded):
            return self.original(url, mode, bufsize, **kw)
        form, source = found
        if form not in self.warned:
            self.warned.add(form)
            warnings.warn(
                f"patch_webdataset(pipe_commands=True): {form!r} URLs are read through the "
                f"wds layer instead of running the command (first: {redact_url(source)})",
                stacklevel=2,
            )
        return _OPENER(source)


_CURL_FLAGS = {"--silent", "--location", "--fail", "--show-error"}
_AWS_FLAGS = {"--quiet", "--only-show-errors", "--no-progress"}


def pipe_source(url: str) -> tuple[str, str] | None:
    """(form, source URL) for a ``pipe:`` URL of :data:`PIPE_FORMS`, else None: only the
    plain forms (curl's -s/-L/-f/-S, aws's quiet flags, gsutil's -q), never a command with
    other options (headers, endpoints, credentials) or shell syntax, which stay the shell's."""
    if not url.startswith("pipe:"):
        return None
    try:
        words = shlex.split(url[len("pipe:") :])
    except ValueError:
        return None
    if words[:3] == ["aws", "s3", "cp"] and words[-1:] == ["-"]:
        form, rest, flags, schemes = PIPE_FORMS[0], words[3:-1], _AWS_FLAGS, ("s3",)
    elif words[:1] == ["gsutil"] and "cat" in words:
        at = words.index("cat")
        if any(word != "-q" for word in words[1:at]):
            return None
        form, rest, flags, schemes = PIPE_FORMS[1], words[at + 1 :], set(), ("gs",)
    elif words[:1] == ["curl"]:
        form, rest, schemes = PIPE_FORMS[2], words[1:], ("http", "https")
        flags = _CURL_FLAGS | {word for word in rest if _short_curl_flags(word)}
    else:
        return None
    sources = [word for word in rest if word not in flags]
    if len(sources) != 1 or urlparse(sources[0]).scheme not in schemes:
        return None
    return form, sources[0]


def _short_curl_flags(word: str) -> bool:
    """``-s``, ``-L``, ``-sSfL``...: curl's short flags that change nothing read."""
    return len(word) > 1 and word[0] == "-" and set(word[1:]) <= set("sLfS")
