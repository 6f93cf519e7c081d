"""The command line over signed HTTP URLs (nginx ignores the query): every URL it prints,
in tables, JSON, summaries and errors, shows the query values as REDACTED."""

from __future__ import annotations

import json

import pytest

from fsspec_shards.fleet.demo import make_demo_dataset
from tests.cli.running import run_cli

SECRET = "s3cr3t-SIGNATURE-value"
QUERY = f"?X-Amz-Signature={SECRET}&X-Amz-Expires=60&token={SECRET}"
EXIT_IF_ABSENT = {"verify": 1, "stream": 3}


@pytest.fixture
def signed(http_backend, tmp_path) -> list[str]:
    """Two good shards and one absent, as signed URLs."""
    demo = make_demo_dataset(tmp_path / "local", shards=2, samples_per_shard=5)
    for path in demo.shards:
        http_backend.put(path.name, path.read_bytes())
    names = [path.name for path in demo.shards] + ["absent.tar"]
    return [http_backend.url(name) + QUERY for name in names]


def test_verify_and_stream_of_signed_urls_never_show_the_signature(signed, tmp_path):
    cache = tmp_path / "cache"
    outputs = []
    for url in signed:
        for args in (["verify", url], ["verify", url, "--json"], ["stream", url, "--json"]):
            result = run_cli(*args, "-q", cache=cache)
            failed = EXIT_IF_ABSENT[args[0]] if "absent" in url else 0
            assert result.returncode == failed, result.stdout + result.stderr
            outputs.append(result.stdout + result.stderr)
            if "--json" in args and result.stdout:
                json.loads(result.stdout)
    joined = "\n".join(outputs)
    assert SECRET not in joined
    assert "X-Amz-Signature=REDACTED" in joined and "absent.tar" in joined
    listing = run_cli("cache", "ls", cache=cache)
    assert listing.returncode == 0 and SECRET not in listing.stdout
