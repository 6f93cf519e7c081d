"""Every backend's failure names (storage/backends/failure_names.py): each backend's
``errors`` is its entry, and the retry classification knows them all before any failure,
whichever backend modules are imported (``backend_for`` imports a backend's module on first
ask)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fsspec_shards.storage.backends import MODULES, OTHER, backend_for, failure_names
from fsspec_shards.storage.core.retry import http_status, is_transient

EVERY = (*dict.fromkeys(backend_for(protocol) for protocol in MODULES), OTHER)


@pytest.mark.parametrize("backend", EVERY, ids=lambda b: type(b).__name__)
def test_each_backends_names_are_in_the_whole(backend):
    whole = failure_names.EVERY
    assert backend.errors.transient <= whole.transient
    assert backend.errors.not_found <= whole.not_found
    assert backend.errors.denied <= whole.denied
    assert backend.errors.throttle_codes <= whole.throttle_codes
    assert backend.errors.status_code_types <= whole.status_code_types


@pytest.mark.parametrize("backend", EVERY, ids=lambda b: type(b).__name__)
def test_the_retry_classification_knows_each_backends_failure_names(backend):
    for name in backend.errors.transient:
        assert is_transient(type(name, (Exception,), {})("cut")), name
    for name in backend.errors.status_code_types:
        error = type(name, (Exception,), {})("failed")
        error.code = 503
        assert http_status(error) == 503 and is_transient(error)


def test_a_backend_module_is_imported_on_first_ask_and_failures_are_known_before():
    """Reading S3 imports no other backend's module, and the retry classification knows
    every backend's failure names already (gcsfs's status-carrying ``HttpError``, aiohttp's
    and azure-core's network failures), whichever backend modules are imported."""
    script = """
import sys
from fsspec_shards.storage.backends import backend_for
from fsspec_shards.storage.core.retry import http_status, is_transient

def loaded():
    prefix = "fsspec_shards.storage.backends."
    return {name[len(prefix):] for name in sys.modules if name.startswith(prefix)}

assert not loaded() & {"s3", "gcs", "azure", "http"}, loaded()
error = type("HttpError", (Exception,), {})("failed")
error.code = 503
assert http_status(error) == 503 and is_transient(error)
assert is_transient(type("ServerDisconnectedError", (Exception,), {})("cut"))
assert is_transient(type("ServiceRequestError", (Exception,), {})("cut"))
assert backend_for("s3") is backend_for("s3a")
assert not loaded() & {"gcs", "azure", "http"}, loaded()
assert "s3" in loaded()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
