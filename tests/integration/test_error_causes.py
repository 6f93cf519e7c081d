"""Errors keep their cause, with the URL: TLS to a plain-HTTP server, a host name that does
not resolve (under ``.invalid``, which never leaves the machine) and a refused connection,
through S3 (moto) and HTTP (nginx), on both transports."""

from __future__ import annotations

import socket

import pytest

from tests.wds_filesystem import wds_filesystem


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _s3_at(backend, endpoint: str) -> dict:
    return {**backend.storage_options, "client_kwargs": {"endpoint_url": endpoint}}


def _cases(kind: str, s3_backend, http_backend) -> list[tuple[str, str, dict, str]]:
    """(protocol, url, options, where the message must point) for each backend."""
    s3_url = s3_backend.put("x.bin", b"data")
    http_url = http_backend.put("x.bin", b"data")
    s3_host = s3_backend.endpoint_url.split("://", 1)[1]
    http_host = http_url.split("://", 1)[1].split("/", 1)[0]
    if kind == "tls":
        return [
            ("s3", s3_url, _s3_at(s3_backend, f"https://{s3_host}"), s3_host),
            ("https", http_url.replace("http://", "https://"), {}, http_host),
        ]
    if kind == "dns":
        return [
            ("s3", s3_url, _s3_at(s3_backend, "http://no-such-host.invalid:9000"), "invalid"),
            ("http", "http://no-such-host.invalid/x.bin", {}, "no-such-host.invalid"),
        ]
    port = _free_port()
    return [
        ("s3", s3_url, _s3_at(s3_backend, f"http://127.0.0.1:{port}"), f"127.0.0.1:{port}"),
        ("http", f"http://127.0.0.1:{port}/x.bin", {}, f"127.0.0.1:{port}"),
    ]


EXPECTED = {
    "tls": "does not speak TLS",
    "dns": "does not resolve (DNS)",
    "refused": "connection refused",
}


@pytest.mark.parametrize("transport", ["fsspec", "obstore"])
@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_a_connection_failure_says_what_it_was_with_the_url(
    s3_backend, http_backend, tmp_path, kind, transport
):
    if transport == "obstore":
        pytest.importorskip("obstore")
    for protocol, url, options, where in _cases(kind, s3_backend, http_backend):
        fs = wds_filesystem(
            protocol,
            {**options, "skip_instance_cache": True},
            cache_dir=tmp_path / "cache",
            retries=2,
            backoff=0.01,
            transport=transport,
        )
        with pytest.raises(OSError) as raised:
            fs.cat_file(url)
        message = str(raised.value)
        assert EXPECTED[kind] in message and where in message, message
        assert url.split("://", 1)[1] in message, message
        assert not isinstance(raised.value, FileNotFoundError), message
        if kind == "tls":  # retrying cannot fix it: raised at once
            assert isinstance(raised.value, ConnectionError)
            assert fs.cache_stats()["retries"] == 0
