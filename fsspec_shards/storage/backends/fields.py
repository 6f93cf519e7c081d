"""How the layer reads what a backend says of itself: its protocol name, the ``info()``
fields that name a version, base64 digests."""

from __future__ import annotations

import base64
import binascii
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import fsspec


def protocol_of(fs: fsspec.AbstractFileSystem) -> str:
    """The backend's main protocol name."""
    protocol = fs.protocol
    return protocol[0] if isinstance(protocol, tuple | list) else protocol


@dataclass(frozen=True)
class VersionFields:
    """The ``info()`` fields of one backend that name a version: each the first of its
    names present; a version id in ``no_version`` (or empty) means none."""

    etag: tuple[str, ...] = ()
    version: tuple[str, ...] = ()
    modified: tuple[str, ...] = ()
    no_version: tuple[str, ...] = ("",)

    def read(self, info: Mapping[str, Any]) -> tuple[Any, str | None, Any]:
        """``(etag, version id, modified)`` of ``info`` (None where absent)."""
        etag, version, modified = (
            next((info[name] for name in names if name in info), None)
            for names in (self.etag, self.version, self.modified)
        )
        if version is not None and str(version) in self.no_version:
            version = None
        return etag, None if version is None else str(version), modified


def parameters(function: Callable) -> set[str]:
    """The named parameters of ``function`` (not ``self``, ``*args`` or ``**kwargs``): the
    options a backend or its client takes."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {
        name
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.kind in kinds and name != "self"
    }


def from_base64(value: Any) -> str | None:
    """The hex digest of a base64 digest (or of raw digest bytes); None if it is neither."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    if not isinstance(value, str) or not value:
        return None
    try:
        return base64.b64decode(value, validate=True).hex()
    except (binascii.Error, ValueError):
        return None
