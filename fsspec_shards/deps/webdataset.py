"""webdataset beyond its public API, for :mod:`fsspec_shards.webdataset_patch`.

Uses (webdataset 0.2.86 and later 0.2.x, and 1.0.x; :func:`load` refuses any other):

- ``webdataset.gopen``: its ``gopen`` function (re-exported as ``webdataset.gopen``), its
  ``gopen_schemes`` table, ``gopen_pipe``, ``rewrite_url`` (``GOPEN_REWRITE``) and, in
  1.0.x, ``webdataset.utils.enforce_security`` (``WDS_SECURE``).
- ``webdataset.cache``: 1.0.x's ``StreamingOpen.__call__`` (``WebDataset``'s opener stage,
  which opens ``file:`` URLs itself) and ``FileCache`` (``cache_dir=``); 0.2.x's
  ``cached_url_opener`` (``cache_dir=``).
- How each opener turns a ``file:`` URL into a path: 1.0.x's ``gopen`` decodes it
  (``url2pathname``, so ``%20`` is a space), 1.0.x's ``StreamingOpen`` and 0.2.x's ``gopen``
  take the URL's path as written (``%20`` stays). :func:`gopen_file_path` and
  :func:`streaming_file_path` follow each.

:data:`GUARDS` records every check (``if``/``assert`` condition, ``raise`` and call) of the
openers the patch wraps or re-implements, as the supported versions ship them;
``tests/deps/test_webdataset.py`` compares it with the installed webdataset, so a check a
later webdataset adds, which the patch would not run, fails that test instead of being
bypassed silently.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap
from dataclasses import dataclass
from types import ModuleType
from typing import Any
from urllib.parse import ParseResult
from urllib.request import url2pathname

SUPPORTED = "webdataset 0.2.86 or a later 0.2.x, or 1.0.x"


@dataclass(frozen=True)
class Webdataset:
    """The loaded webdataset: its package, the modules the patch changes, its series."""

    package: ModuleType
    gopen: ModuleType
    cache: ModuleType
    version: str
    series: str  # "0.2" or "1.0"


def series(version: str) -> str | None:
    """``"0.2"`` or ``"1.0"`` for a supported webdataset version, else None."""
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    if match is None:
        return None
    major, minor, micro = map(int, match.groups())
    if (major, minor) == (0, 2) and micro >= 86:
        return "0.2"
    if (major, minor) == (1, 0):
        return "1.0"
    return None


def load() -> Webdataset:
    """Import webdataset and check its version; ``ImportError`` naming the supported
    versions when it is missing or another version (nothing is changed by this)."""
    try:
        package = importlib.import_module("webdataset")
    except ImportError:
        raise ImportError(f"patch_webdataset needs {SUPPORTED}: pip install webdataset") from None
    version = str(getattr(package, "__version__", "unknown"))
    found = series(version)
    if found is None:
        raise ImportError(
            f"patch_webdataset supports {SUPPORTED}; webdataset {version} is installed "
            "(nothing was patched)"
        )
    return Webdataset(
        package=package,
        gopen=importlib.import_module("webdataset.gopen"),
        cache=importlib.import_module("webdataset.cache"),
        version=version,
        series=found,
    )


def security_enforced(loaded: Webdataset) -> bool:
    """webdataset's ``enforce_security`` (``WDS_SECURE``; 0.2.x has none)."""
    utils = importlib.import_module("webdataset.utils")
    return bool(getattr(utils, "enforce_security", False))


def rewrite_url(loaded: Webdataset, url: str) -> str:
    """``GOPEN_REWRITE`` applied by webdataset's own ``rewrite_url`` (which raises its own
    ``ValueError`` where its security flag forbids rewriting)."""
    return loaded.gopen.rewrite_url(url)


def gopen_file_path(loaded: Webdataset, parsed: ParseResult) -> str:
    """The local path webdataset's ``gopen`` opens for a ``file:`` URL."""
    return url2pathname(parsed.path) if loaded.series == "1.0" else parsed.path


def streaming_file_path(parsed: ParseResult) -> str:
    """The local path 1.0.x's ``StreamingOpen`` opens for a ``file:`` URL (not decoded)."""
    return parsed.path


def openers(loaded: Webdataset) -> dict[str, Any]:
    """The functions whose checks the patch runs itself, by name (see :data:`GUARDS`); when
    patched, the functions its wrappers wrap."""
    found = {"gopen": loaded.gopen.gopen, "gopen_pipe": loaded.gopen.gopen_pipe}
    if loaded.series == "1.0":
        found["StreamingOpen.__call__"] = loaded.cache.StreamingOpen.__call__
    return {name: getattr(function, "__wrapped__", function) for name, function in found.items()}


def guards(function: Any) -> list[str]:
    """Every check of ``function``'s body, in order: each ``if``/``while``/``assert``
    condition, each ``raise`` and each function called (a check may be a call), as text."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    found = []
    for node in sorted(ast.walk(tree), key=lambda node: getattr(node, "lineno", 0)):
        if isinstance(node, (ast.If, ast.While, ast.Assert, ast.IfExp)):
            found.append(f"test {ast.unparse(node.test)}")
        elif isinstance(node, ast.Raise) and node.exc is not None:
            found.append(f"raise {ast.unparse(node.exc)}")
        elif isinstance(node, ast.Call):
            found.append(f"call {ast.unparse(node.func)}")
    return found


GUARDS: dict[str, dict[str, list[str]]] = {
    # How the patch honours them: webdataset's own gopen runs for every URL but a file: URL
    # read with "rb"; for that one the patch calls webdataset's rewrite_url, and under
    # enforce_security hands the URL to webdataset's gopen, which refuses it. The
    # pipe_commands opener hands every URL to gopen_pipe under enforce_security, and every
    # command it does not recognise. StreamingOpen's loop is re-implemented as shipped,
    # with file: URLs opened through the layer and the handler's verdict ending the stream.
    "1.0": {
        "gopen": [
            "call int",
            "call os.environ.get",
            "test verbose",
            "call print",
            "test mode in ['rb', 'wb']",
            "test url == '-'",
            "test mode == 'rb'",
            "test mode == 'wb'",
            "raise ValueError(f'unknown mode {mode}')",
            "call ValueError",
            "call rewrite_url",
            "call urlparse",
            "test pr.scheme == ''",
            "test utils.enforce_security",
            "raise ValueError('gopen: unsafe_gopen is False, cannot open local files')",
            "call ValueError",
            "call int",
            "call os.environ.get",
            "call open",
            "test pr.scheme == 'file'",
            "test utils.enforce_security",
            "raise ValueError('gopen: unsafe_gopen is False, cannot open local files')",
            "call ValueError",
            "call int",
            "call os.environ.get",
            "call open",
            "call url2pathname",
            "call gopen_schemes.get",
            "call handler",
        ],
        "gopen_pipe": [
            "test url.startswith('pipe:')",
            "call url.startswith",
            "test utils.enforce_security",
            "raise ValueError('gopen_pipe: unsafe_gopen is False, cannot open pipe URLs')",
            "call ValueError",
            "test mode[0] in ['r', 'w']",
            "call Pipe",
            "raise ValueError(f'{mode}: unknown mode')",
            "call ValueError",
        ],
        "StreamingOpen.__call__": [
            "test isinstance(url, dict)",
            "call isinstance",
            "call urlparse",
            "test parsed.scheme in ['', 'file']",
            "call open",
            "call dict",
            "call gopen.gopen",
            "call dict",
            "test self.handler(exn)",
            "call self.handler",
        ],
    },
    "0.2": {
        "gopen": [
            "call int",
            "call os.environ.get",
            "test verbose",
            "call print",
            "test mode in ['rb', 'wb']",
            "test url == '-'",
            "test mode == 'rb'",
            "test mode == 'wb'",
            "raise ValueError(f'unknown mode {mode}')",
            "call ValueError",
            "call rewrite_url",
            "call urlparse",
            "test pr.scheme == ''",
            "call int",
            "call os.environ.get",
            "call open",
            "test pr.scheme == 'file'",
            "call int",
            "call os.environ.get",
            "call open",
            "call gopen_schemes.get",
            "call handler",
        ],
        "gopen_pipe": [
            "test url.startswith('pipe:')",
            "call url.startswith",
            "test mode[0] in ['r', 'w']",
            "call Pipe",
            "raise ValueError(f'{mode}: unknown mode')",
            "call ValueError",
        ],
    },
}
