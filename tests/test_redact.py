import logging
import traceback

import pytest

from fsspec_shards.redact import (
    clean_error,
    install_log_redaction,
    raising_clean,
    redact_text,
    redact_url,
    without_signing,
)
from tests.secrets import SECRET_PARAMETERS

SIGNED = (
    "https://user:hunter2@bucket.s3.amazonaws.com/train/0001.tar"
    "?X-Amz-Credential=AKIAEXAMPLE&X-Amz-Signature=deadbeef&versionId=7"
)
SAS = "https://acct.blob.core.windows.net/c/0001.tar?sv=2024&sig=c2VjcmV0&se=2030"


@pytest.mark.parametrize("url", [SIGNED, SAS, "wds::" + SIGNED])
def test_redacted_urls_keep_no_secret_but_names_and_paths(url):
    shown = redact_url(url)
    for secret in ("hunter2", "AKIAEXAMPLE", "deadbeef", "c2VjcmV0", "2030"):
        assert secret not in shown
    assert "0001.tar" in shown and "REDACTED" in shown


@pytest.mark.parametrize("name", SECRET_PARAMETERS)
def test_every_query_value_is_redacted_whatever_its_name(name):
    url = f"https://host.example/data/0001.tar?{name}=s3cr3tvalue&other=x"
    assert "s3cr3tvalue" not in redact_url(url)
    assert f"{name}=REDACTED" in redact_url(url)
    assert "s3cr3tvalue" not in redact_text(f"failed to read {url}: 403")
    assert "s3cr3tvalue" not in redact_text(f"path host.example/data/0001.tar?{name}=s3cr3tvalue")


def test_a_url_password_is_redacted_and_the_user_kept():
    assert redact_url("https://alice:PASSWORD@host/x") == "https://alice:REDACTED@host/x"
    assert "PASSWORD" not in redact_text("GET https://alice:PASSWORD@host/x failed")


def test_a_url_without_a_host_keeps_its_three_slashes():
    assert redact_url("memory:///data/x.tar?sig=1") == "memory:///data/x.tar?sig=REDACTED"


def test_plain_paths_and_urls_without_query_are_unchanged():
    for url in ("/data/shard-0001.tar", "s3://bucket/key.tar", "memory:///data/key.tar"):
        assert redact_url(url) == url


@pytest.mark.parametrize("punctuation", [":", ".", ",", ";", "!", "?"])
def test_punctuation_after_a_url_in_text_is_kept_and_redacted_text_stays_redacted(punctuation):
    text = f"failed for https://h/x.tar?sig=abc&se=1{punctuation} expected"
    shown = redact_text(text)
    assert shown == f"failed for https://h/x.tar?sig=REDACTED&se=REDACTED{punctuation} expected"
    assert redact_text(shown) == shown
    assert redact_text(f"path b/k.tar?sig=abc{punctuation} gone") == (
        f"path b/k.tar?sig=REDACTED{punctuation} gone"
    )


def test_text_quoting_a_known_url_in_pieces_hides_them():
    url = "https://h/x.tar?sig=abcdef123"
    assert "abcdef123" not in redact_text("query was 'sig=abcdef123'", url)


@pytest.mark.parametrize(
    "template",
    [
        "https://b.s3.amazonaws.com/0001.tar?X-Amz-Algorithm=AWS4-HMAC-SHA256"
        "&X-Amz-Credential=AKIAEXAMPLE%2F{day}%2Fus-east-1%2Fs3%2Faws4_request"
        "&X-Amz-Date={day}T{time}Z&X-Amz-Expires={ttl}&X-Amz-SignedHeaders=host"
        "&X-Amz-Signature={sig}&versionId=7",
        "https://storage.googleapis.com/b/0001.tar?X-Goog-Algorithm=GOOG4-RSA-SHA256"
        "&X-Goog-Credential=sa%2F{day}%2Fauto%2Fstorage%2Fgoog4_request"
        "&X-Goog-Date={day}T{time}Z&X-Goog-Expires={ttl}&X-Goog-SignedHeaders=host"
        "&X-Goog-Signature={sig}&versionId=7",
        "https://d111.cloudfront.net/0001.tar?Expires={ttl}&Policy=eyJ{time}"
        "&Signature={sig}&Key-Pair-Id=K2{day}&versionId=7",
        "https://b.s3.amazonaws.com/0001.tar?AWSAccessKeyId=AKIAEXAMPLE&Expires={ttl}"
        "&Signature={sig}&versionId=7",
        "https://acct.blob.core.windows.net/c/0001.tar?sv=2024-05-04&st={day}&se={ttl}"
        "&sr=b&sp=r&sig={sig}&versionId=7",
    ],
    ids=["s3-v4", "gcs-v4", "cloudfront", "s3-v2", "azure-sas"],
)
def test_one_object_signed_at_two_times_is_the_same_without_signing(template):
    first = template.format(day="20260101", time="000000", ttl=3600, sig="deadbeef")
    second = template.format(day="20260102", time="120000", ttl=900, sig="cafef00d")
    assert without_signing(first) == without_signing(second)
    assert without_signing(first).endswith("0001.tar?versionId=7")


@pytest.mark.parametrize("name", ["key", "id", "token", "sig", "policy", "expires", "sp"])
def test_a_selector_parameter_outside_a_signature_is_kept(name):
    one = without_signing(f"http://h/get?{name}=shard-0001.tar")
    two = without_signing(f"http://h/get?{name}=shard-0002.tar")
    assert one != two


def _raise_inside_except(url):
    try:
        raise FileNotFoundError(2, f"No such file: {url}")
    except FileNotFoundError:
        raise FileNotFoundError(2, f"not found: {redact_url(url)}")  # noqa: B904


def test_clean_error_cuts_a_chain_that_holds_a_signed_url():
    with pytest.raises(FileNotFoundError) as caught:
        _raise_inside_except(SIGNED)
    assert "deadbeef" in str(caught.value.__context__)  # what Python does on its own
    cleaned = clean_error(caught.value)
    assert isinstance(cleaned, FileNotFoundError)
    text = "".join(traceback.format_exception(cleaned))
    assert "deadbeef" not in text and "hunter2" not in text
    assert cleaned.__context__ is None and cleaned.__cause__ is None


def test_clean_error_cuts_a_context_hidden_by_from_none_too():
    # A traceback hides it, but it stays reachable as ``__context__`` (and leaves with the error).
    try:
        raise FileNotFoundError(2, f"No such file: {SIGNED}")
    except FileNotFoundError:
        try:
            raise FileNotFoundError(2, f"not found: {redact_url(SIGNED)}") from None
        except FileNotFoundError as outer:
            hidden = outer
    cleaned = clean_error(hidden)
    assert cleaned.__context__ is None and cleaned.__suppress_context__


def test_clean_error_cuts_a_context_behind_an_explicit_cause_too():
    # ``raise ... from cause`` while handling another: the handled one stays reachable
    try:
        raise FileNotFoundError(2, f"No such file: {SIGNED}")
    except FileNotFoundError:
        try:
            raise OSError(5, "read failed") from ConnectionError("reset")
        except OSError as outer:
            behind = outer
    assert "deadbeef" in str(behind.__context__)  # what Python does on its own
    cleaned = clean_error(behind)
    assert cleaned.__context__ is None and isinstance(cleaned.__cause__, ConnectionError)


def test_clean_error_redacts_an_error_whose_own_text_shows_a_secret():
    cleaned = clean_error(PermissionError(13, f"denied: {SAS}"))
    assert isinstance(cleaned, PermissionError) and cleaned.errno == 13
    assert "c2VjcmV0" not in str(cleaned) and "0001.tar" in str(cleaned)


def test_raising_clean_leaves_nothing_chained():
    @raising_clean
    def read():
        _raise_inside_except(SIGNED)

    with pytest.raises(FileNotFoundError) as caught:
        read()
    chain, link = [], caught.value
    while link is not None:
        chain.append(str(link))
        link = link.__cause__ or link.__context__
    assert not any("deadbeef" in text for text in chain)


def test_backend_log_records_are_redacted(caplog):
    backend = logging.getLogger("fsspec.http")  # made when its module is imported
    install_log_redaction()  # when a wds filesystem is made
    with caplog.at_level(logging.DEBUG, logger="fsspec.http"):
        backend.debug("Retrieve file size for %s", SIGNED)
    assert caplog.records and "deadbeef" not in caplog.text and "hunter2" not in caplog.text
    assert "0001.tar" in caplog.text


def test_log_text_hides_credential_headers_in_dumps_and_canonical_requests():
    from fsspec_shards.redact import redact_log_text

    dump = (
        "Sending http request: <AWSPreparedRequest method=GET, url=http://h/b/k, headers={"
        "'X-Amz-Date': b'20260101T000000Z', 'X-Amz-Security-Token': b'tok3n', "
        "'Authorization': b'AWS4-HMAC-SHA256 Credential=AKID/x, Signature=51gn', "
        "\"X-Api-Key\": \"k3y\", 'x-amz-server-side-encryption-customer-key': b'ss3c'}>"
    )
    canonical = (
        "CanonicalRequest:\nGET\n/b/k\nX-Amz-Credential=cr3d&X-Amz-Security-Token=tok3n\n"
        "host:h\nx-amz-date:20260101T000000Z\nx-amz-security-token:tok3n\n\n"
        "host;x-amz-date;x-amz-security-token\nUNSIGNED-PAYLOAD"
    )
    for text in (dump, canonical, "Signature:\n51gn"):
        shown = redact_log_text(text)
        assert not any(secret in shown for secret in ("tok3n", "51gn", "k3y", "ss3c", "cr3d"))
    assert "'X-Amz-Date': b'20260101T000000Z'" in redact_log_text(dump)
    assert "x-amz-date:20260101T000000Z" in redact_log_text(canonical)
    assert "host;x-amz-date;x-amz-security-token" in redact_log_text(canonical)
    assert (
        redact_log_text("cached s3://b/k (12 bytes, size=12)")
        == "cached s3://b/k (12 bytes, size=12)"
    )


def test_redaction_installs_no_record_factory_and_no_handler_only_logger_filters():
    from fsspec_shards.redact import RedactingFilter

    factory, root_handlers = logging.getLogRecordFactory(), list(logging.root.handlers)
    child = logging.getLogger("botocore.auth")
    import fsspec

    fsspec.filesystem("wds", target_protocol="memory", skip_instance_cache=True, cache=False)
    assert logging.getLogRecordFactory() is factory
    assert logging.root.handlers == root_handlers
    assert any(isinstance(f, RedactingFilter) for f in child.filters)  # each child: its own
    assert not any(isinstance(f, RedactingFilter) for f in logging.getLogger("app").filters)


def _formatted(caplog) -> str:
    return "\n".join(logging.Formatter().format(record) for record in caplog.records)


def test_a_record_whose_message_cannot_be_formatted_still_shows_no_secret(caplog, capsys):
    logger = logging.getLogger("botocore.endpoint")
    install_log_redaction()
    with caplog.at_level(logging.DEBUG, logger="botocore.endpoint"):
        logger.debug("Sending %s to %s", SIGNED)  # one argument for two placeholders
        logger.debug("headers %(missing)s", {"x-amz-security-token": "tok3n", "url": SAS})
    shown = _formatted(caplog) + capsys.readouterr().err
    assert len(caplog.records) == 2 and "0001.tar" in shown
    for secret in ("deadbeef", "hunter2", "c2VjcmV0", "tok3n"):
        assert secret not in shown


def test_an_exception_whose_cause_shows_a_secret_is_logged_redacted(caplog):
    logger = logging.getLogger("s3fs")
    install_log_redaction()
    try:
        _raise_inside_except(SIGNED)
    except FileNotFoundError:
        with caplog.at_level(logging.DEBUG, logger="s3fs"):
            logger.exception("the read failed")
    shown = _formatted(caplog)
    assert "the read failed" in shown and "deadbeef" not in shown and "hunter2" not in shown
