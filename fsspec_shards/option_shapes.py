"""The shapes storage options arrive in, and what each hop of an fsspec chain gets.

Options come flat (``{"endpoint_url": ...}``: by fsspec's rule they belong to the first hop
of the URL) or in sections per protocol (``{"wds": {...}, "s3": {...}}``: fsspec's rule for
chained URLs). Tools add shapes of their own: Hugging Face ``datasets`` 5.x prepares options
hop by hop, so the ``wds`` hop of ``wds::s3://...`` gets the section of protocol ``file``
(the ``wds`` section is dropped), and it repeats the last hop of a resolved data file
(``wds::s3://b/k::s3://b/k``), so the wds filesystem is handed its backend's options wrapped
in a second chain (``target_options={"target_protocol": "s3", "target_options": {...}}``).

This module tells those shapes apart, once, for the wds filesystem (storage), the dataset
and the writer (iteration) and the command line; it imports neither layer.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Mapping
from typing import Any

import fsspec
from fsspec.core import split_protocol
from fsspec.registry import known_implementations, registry

logger = logging.getLogger("fsspec_shards.option_shapes")

LAYER = "wds"
CHAIN_KEYS = ("target_protocol", "target_options", "fo")
"""The keys fsspec's ``url_to_fs`` adds for a chained hop: never options of a backend."""


@functools.lru_cache(maxsize=256)
def protocol_aliases(protocol: str) -> tuple[str, ...]:
    """Every name of ``protocol``'s filesystem (``gs`` -> ``("gs", "gcs")``), ``protocol``
    first; just the name when fsspec does not know it. Read from fsspec's registry without
    importing the backend: ``import s3fs`` alone takes 0.3-0.7 s, and a reader that goes
    through obstore never needs it."""
    loaded = registry.get(protocol)
    if loaded is not None:
        names = loaded.protocol
        names = (names,) if isinstance(names, str) else tuple(names)
    else:
        known = known_implementations
        target = known.get(protocol, {}).get("class")
        if target is None:
            return (protocol,)
        names = tuple(name for name, spec in known.items() if spec.get("class") == target)
    return (protocol, *(name for name in names if name != protocol))


def is_protocol(name: Any) -> bool:
    """Whether ``name`` names an fsspec protocol (and so, as a key, a section of options)."""
    return isinstance(name, str) and name in fsspec.available_protocols()


def is_sectioned(options: Mapping[str, Any]) -> bool:
    """Whether ``options`` is in sections: every key a protocol, every value a mapping."""
    return bool(options) and all(
        is_protocol(key) and isinstance(value, Mapping) for key, value in options.items()
    )


def url_protocols(url: str) -> list[str]:
    """The protocol of each hop of a (chained) URL, outermost first; ``file`` for a path."""
    protocols = []
    for hop in url.split("::"):
        protocol = hop if "://" not in hop and is_protocol(hop) else split_protocol(hop)[0]
        protocols.append(protocol or "file")
    return protocols


def cache_is_off(options: Mapping[str, Any]) -> bool:
    """Whether options in sections turn the layer's cache off (``{"wds": {"cache": False}}``)."""
    layer = options.get(LAYER)
    return isinstance(layer, Mapping) and layer.get("cache") is False


def section(options: Mapping[str, Any], protocol: str) -> dict[str, Any] | None:
    """The section of ``options`` for ``protocol`` under any of its names, or None."""
    for name in protocol_aliases(protocol):
        if isinstance(options.get(name), Mapping):
            return dict(options[name])
    return None


def fsspec_arguments(url: str, options: Mapping[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """The URL and keyword arguments to hand ``fsspec`` for reading or writing ``url``.

    With options in sections, a plain backend URL that comes with a ``wds`` section is read
    through the layer (``s3://b/k`` -> ``wds::s3://b/k``: the section says the user wants
    it), and sections of protocols the URL does not use are left out (an unused section is
    not an error). A section under another name of a hop's protocol (``gcs`` for ``gs://``)
    is given under the name in the URL. Flat options are fsspec's as given.
    """
    options = dict(options or {})
    if not is_sectioned(options):
        return url, options
    protocols = url_protocols(url)
    if LAYER in options and LAYER not in protocols:
        url = f"{LAYER}::{url}"
        protocols = [LAYER, *protocols]
    kept = {}
    for protocol in protocols:
        found = section(options, protocol)
        if found is not None:
            kept[protocol] = found
    unused = sorted(set(options) - {n for p in protocols for n in protocol_aliases(p)})
    if unused:
        logger.debug("options for %s not used by %s", ", ".join(unused), " -> ".join(protocols))
    if len(protocols) == 1:
        return url, kept.get(protocols[0], {})
    return url, kept


def layer_options(
    target_protocol: str | None, target_options: Mapping[str, Any] | None, given: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split what the ``wds`` filesystem was given into (its own options, its backend's).

    ``given`` are its keyword arguments other than ``target_protocol``/``target_options``.
    Sections among them (and in ``target_options``) are sorted out: ``wds`` is the layer's
    own; ``file`` is too when the backend is not local (``datasets`` labels the ``wds`` hop
    ``file``); the backend's own section joins its options; other protocols' sections are
    for other hops and are dropped. A second chain wrapped around the backend's options
    (``datasets``' repeated hop) is unwrapped, unless the backend itself takes a target.
    The options named directly win over the same option in a section.
    """
    own: dict[str, Any] = {}
    backend: dict[str, Any] = {}
    own_sections: dict[str, Any] = {}
    backend_sections: dict[str, Any] = {}
    backend_names = protocol_aliases(target_protocol) if target_protocol else ()
    for container, explicit in ((given, own), (dict(target_options or {}), backend)):
        for key, value in container.items():
            if not (is_protocol(key) and isinstance(value, Mapping)):
                explicit[key] = value
            elif key == LAYER or (key == "file" and "file" not in backend_names):
                own_sections.update(value)
            elif key in backend_names:
                backend_sections.update(value)
            else:
                logger.debug("options for %s dropped: the backend is %s", key, target_protocol)
    own = {**own_sections, **own}
    backend = {**backend_sections, **backend}
    # (only a chain's keys need the class's import: s3fs's costs 0.3-0.7 s)
    chained = any(key in backend for key in CHAIN_KEYS)
    if target_protocol and chained and not _takes_target(target_protocol):
        backend = _unwrapped(target_protocol, backend)
    return own, backend


def _unwrapped(protocol: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` without the chain keys a repeated hop wrapped around them."""
    while any(key in options for key in CHAIN_KEYS):
        inner_protocol = options.pop("target_protocol", None) or protocol
        inner = dict(options.pop("target_options", None) or {})
        options.pop("fo", None)
        if inner_protocol not in protocol_aliases(protocol):
            raise ValueError(
                f"the wds backend {protocol!r} was given options chained to another "
                f"filesystem ({inner_protocol!r}); give each protocol its own section, "
                f"e.g. storage_options={{'wds': {{...}}, {protocol!r}: {{...}}}}"
            )
        options = {**options, **inner}
    return options


@functools.lru_cache(maxsize=64)
def _takes_target(protocol: str) -> bool:
    """Whether ``protocol``'s filesystem takes a target of its own (a caching or reference
    filesystem): then ``target_options`` among its options are its, not a chain's."""
    try:
        cls = fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError):
        return False
    return any(
        "target_options" in inspect.signature(klass.__init__).parameters
        for klass in cls.__mro__
        if "__init__" in vars(klass)
    )
