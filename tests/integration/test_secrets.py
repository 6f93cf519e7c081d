"""No secret of a URL leaves the storage layer: not in exceptions or anywhere in their
cause/context chains, not in printed tracebacks, not in any log record (ours or the
backends', at DEBUG), not in the stats. Swept over many query parameter names and a
``user:password@`` URL, through the real wds filesystem against nginx."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import subprocess
import sys
import traceback

import fsspec
import pytest

from fsspec_shards.storage.core.retry import RetriesExhaustedError
from tests.faults import Reset, Status
from tests.integration import servers
from tests.secrets import SECRET_PARAMETERS

SECRETS = {name: f"s3cr3t{index:02d}q" for index, name in enumerate(SECRET_PARAMETERS)}
PASSWORD = "pa55w0rdzz"
DATA = b"x" * 50_000


def _signed(url: str) -> str:
    """``url`` with a password and every parameter of the sweep carrying a secret."""
    scheme, rest = url.split("://", 1)
    query = "&".join(f"{name}={value}" for name, value in SECRETS.items())
    return f"{scheme}://alice:{PASSWORD}@{rest}?{query}"


def _leaks(text: str) -> list[str]:
    return [value for value in [*SECRETS.values(), PASSWORD] if value in text]


def _chain(error: BaseException) -> list[BaseException]:
    links, seen, pending = [], set(), [error]
    while pending:
        link = pending.pop()
        if link is None or id(link) in seen:
            continue
        seen.add(id(link))
        links.append(link)
        pending += [link.__cause__, link.__context__]
    return links


def _assert_clean(error: BaseException) -> None:
    for link in _chain(error):
        assert not _leaks(f"{link!s} {link!r} {link.args!r}"), (type(link), link)
    assert not _leaks("".join(traceback.format_exception(error)))


@pytest.mark.parametrize("cache", [True, False])
def test_no_secret_of_a_signed_url_reaches_errors_tracebacks_logs_or_stats(
    http_backend, fault_proxy, tmp_path, caplog, cache
):
    present = _signed(http_backend.put("secret/present.bin", DATA))
    missing = _signed(http_backend.url("secret/absent.bin"))
    proxy, proxied = fault_proxy(http_backend)
    http_backend.put("secret/unavailable.bin", DATA)
    unavailable = _signed(proxied.url("secret/unavailable.bin"))
    fs = fsspec.filesystem(
        "wds",
        target_protocol="http",
        skip_instance_cache=True,
        cache=cache,
        cache_dir=str(tmp_path / "cache"),
        retries=2,
        backoff=0.01,
    )
    errors: list[BaseException] = []
    with caplog.at_level(logging.DEBUG):
        assert fs.cat_file(present) == DATA
        assert fs.cat_file(present, 10, 20) == DATA[10:20]
        with fs.open(present) as handle:
            assert handle.read() == DATA
        assert fs.info(present)["size"] == len(DATA)
        for read in (
            lambda: fs.cat_file(missing),
            lambda: fs.open(missing),
            lambda: fs.info(missing),
            lambda: fs.cat_file(missing, 0, 10),
        ):
            with pytest.raises(FileNotFoundError) as raised:
                read()
            errors.append(raised.value)
        errors += fs.cat_ranges([missing], [0], [10])
        proxy.add(Status(503), times=None)
        with pytest.raises(RetriesExhaustedError) as raised:
            fs.cat_file(unavailable)
        errors.append(raised.value)
    assert len(errors) == 6
    for error in errors:
        assert "absent.bin" in str(error) or "unavailable.bin" in str(error)
        _assert_clean(error)
    assert any("Retrieve file size" in record.getMessage() for record in caplog.records)
    for record in caplog.records:
        assert not _leaks(logging.Formatter().format(record)), record.name
    assert not _leaks(repr(fs.cache_stats()))


S3_SECRET = "s3cr3t-0bst0re-k3y-zz"  # moto checks no signature: any secret is accepted


@pytest.mark.parametrize("name", ["s3", "az"])
def test_no_key_given_to_obstore_reaches_errors_tracebacks_or_logs(
    request, name, fault_proxy, tmp_path, caplog
):
    """Failures raised inside obstore (a refusal, a server that stays unavailable, a reset)
    come out without the account key or secret the store was built with."""
    pytest.importorskip("obstore")
    backend = request.getfixturevalue(f"{name}_backend")
    backend.put("secret/present.bin", DATA)
    if name == "s3":
        backend, secret = dataclasses.replace(backend, secret=S3_SECRET), S3_SECRET
    else:
        secret = servers.AZURITE_KEY
    proxy, proxied = fault_proxy(backend)
    fs = fsspec.filesystem(
        "wds",
        target_protocol=proxied.protocol,
        target_options=proxied.storage_options,
        transport="obstore",
        skip_instance_cache=True,
        cache_dir=str(tmp_path / "cache"),
        retries=2,
        backoff=0.01,
    )
    url = proxied.url("secret/present.bin")
    errors: list[BaseException] = []
    with caplog.at_level(logging.DEBUG):
        assert fs.cat_file(url) == DATA
        fs.clear_cache()
        for fault, kind in ((Status(403), PermissionError), (Status(503), RetriesExhaustedError)):
            proxy.add(fault, method="GET", path="present.bin", times=None)
            with pytest.raises(kind) as raised:
                fs.cat_file(url)
            errors.append(raised.value)
            proxy.set_plan([])
        proxy.add(Reset(), method="GET", path="present.bin", times=None)
        with pytest.raises(RetriesExhaustedError) as raised:
            fs.cat_file(url, 10, 20)
        errors.append(raised.value)
    gets = proxy.requests(method="GET", path="present.bin")
    assert {str(e.headers.get("user-agent")).startswith("object_store/") for e in gets} == {True}
    for error in errors:
        assert "present.bin" in str(error)
        for link in _chain(error):
            assert secret not in f"{link!s} {link!r} {link.args!r}", (type(link), link)
        assert secret not in "".join(traceback.format_exception(error))
    for record in caplog.records:
        assert secret not in logging.Formatter().format(record), record.name


def test_a_signed_url_that_obstore_cannot_address_is_refused_without_its_secrets(
    http_backend, tmp_path
):
    """``transport="obstore"`` reads no URL with a query: the refusal names it, redacted."""
    pytest.importorskip("obstore")
    signed = _signed(http_backend.put("secret/signed.bin", DATA))
    fs = fsspec.filesystem(
        "wds",
        target_protocol="http",
        transport="obstore",
        skip_instance_cache=True,
        cache_dir=str(tmp_path / "cache"),
    )
    with pytest.raises(OSError, match="obstore") as raised:
        fs.cat_file(signed)
    assert "signed.bin" in str(raised.value)
    _assert_clean(raised.value)


SESSION_TOKEN = "s3ss10n-t0k3n-zz"  # moto accepts any session token
SSE_KEY_MARKER = "x-amz-security-token"


@pytest.mark.parametrize("transport", ["fsspec", "obstore"])
def test_no_session_token_reaches_the_backend_header_logs(s3_backend, tmp_path, caplog, transport):
    """botocore logs each request's headers and its canonical request at DEBUG
    (``x-amz-security-token:<token>``, ``Authorization: ... Signature=``): redacted."""
    if transport == "obstore":
        pytest.importorskip("obstore")
    url = s3_backend.put("secret/headers.bin", DATA)
    options = {**s3_backend.storage_options, "token": SESSION_TOKEN}
    fs = fsspec.filesystem(
        "wds",
        target_protocol="s3",
        target_options=options,
        transport=transport,
        skip_instance_cache=True,
        cache_dir=str(tmp_path / "cache"),
    )
    with caplog.at_level(logging.DEBUG):
        assert fs.cat_file(url) == DATA
        assert fs.info(url)["size"] == len(DATA)
    shown = [logging.Formatter().format(record) for record in caplog.records]
    signed = [text for text in shown if SSE_KEY_MARKER in text.lower()]
    assert signed, "botocore logged no signed request: the test would prove nothing"
    assert any("Signature" in text for text in shown)
    for text in shown:
        assert SESSION_TOKEN not in text, text
    for record in caplog.records:
        if record.name == "botocore.auth" and record.getMessage().startswith("Signature:"):
            assert re.search(r"[0-9a-f]{64}", record.getMessage()) is None


FRESH_PROCESS = """
import json, logging, sys, fsspec
url, options, cache, transport = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
shown = []
class Keep(logging.Handler):
    def emit(self, record):
        shown.append(self.format(record))
logging.root.addHandler(Keep())
logging.root.setLevel(logging.DEBUG)
fs = fsspec.filesystem("wds", target_protocol="s3", target_options=options,
                       transport=transport, skip_instance_cache=True, cache_dir=cache)
fs.cat_file(url)
fs.info(url)  # metadata goes through the backend's client on either transport
print(json.dumps(shown))
"""


@pytest.mark.parametrize("transport", ["fsspec", "obstore"])
def test_no_session_token_reaches_the_header_logs_of_a_fresh_process(
    s3_backend, tmp_path, transport
):
    """Redaction is a filter on the backends' loggers, attached when a wds filesystem is
    made: in a process that imports the backend only then, its loggers still get it."""
    if transport == "obstore":
        pytest.importorskip("obstore")
    url = s3_backend.put("secret/fresh.bin", DATA)
    options = json.dumps({**s3_backend.storage_options, "token": SESSION_TOKEN})
    result = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, url, options, str(tmp_path / "c"), transport],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    shown = json.loads(result.stdout)
    assert any(SSE_KEY_MARKER in text.lower() for text in shown), "nothing to prove"
    assert not [text for text in shown if SESSION_TOKEN in text]
