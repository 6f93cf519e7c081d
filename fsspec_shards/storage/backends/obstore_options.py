"""fsspec backend options -> obstore store configuration.

The user configures a backend with fsspec options (s3fs, gcsfs, adlfs, fsspec's http).
:func:`map_options` turns them into a :class:`StoreSpec` (how to build obstore stores for
that configuration), or an :class:`Unmappable` naming the option it cannot carry over and
why. Each backend's mapping is in its module (``backends/<backend>.py``: a table of where
each setting comes from, and one credential function; ``Backend.obstore_store``);
``obstore_transport.py`` builds the stores and makes the requests.

Invariants:

- The store goes where the fsspec backend would go, with the same credentials: every
  setting that decides the endpoint, the account and the signing is set explicitly, so that
  obstore's own reading of environment variables (``AWS_ENDPOINT``, ``AZURE_STORAGE_*``,
  ...) cannot send requests elsewhere. An option that cannot be carried over exactly is
  refused, never dropped.
- Options that do not change which bytes a GET returns or how it is authorised are ignored
  by name (each backend's ``OBSTORE_IGNORED``); any other option left over after mapping
  is refused.
- Nothing here shows a secret: ``StoreSpec.shown`` and every refusal reason are redacted,
  and ``StoreSpec.secrets`` lists the values the transport masks in its own messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fsspec_shards.storage.backends import backend_for
from fsspec_shards.storage.backends.base import Options, Refused, StoreSpec

__all__ = ["StoreSpec", "Unmappable", "map_options"]


@dataclass(frozen=True)
class Unmappable:
    """Why obstore cannot serve a backend configuration: the option and the reason."""

    option: str
    reason: str

    def __str__(self) -> str:
        return f"option {self.option!r}: {self.reason}"


def map_options(protocol: str, options: Mapping[str, Any] | None = None) -> StoreSpec | Unmappable:
    """The obstore store for a backend given by fsspec ``protocol`` and its ``options``, or
    why there is none (the first option that cannot be carried over exactly)."""
    try:
        spec = backend_for(protocol).obstore_store(Options(options or {}))
    except Refused as refusal:
        return Unmappable(refusal.option, refusal.reason)
    if spec is None:
        return Unmappable("target_protocol", f"obstore has no store for protocol {protocol!r}")
    return spec
