"""The S3 endpoint a cache key names is the one the requests go to (issue 22), through
both transports: endpoints from an AWS config file, a profile's, and ones ignored by
``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS``. Two moto processes; every read in a network
namespace with only loopback (``unshare -n``), so an endpoint that is not a local server
fails instead of reaching a real cloud."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("obstore")
pytest.importorskip("moto")
ROOT = Path(__file__).resolve().parents[2]


def _loopback_only_reason() -> str | None:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs unshare(1) and ip(8) to run in a network namespace with only loopback"
    probe = subprocess.run(["unshare", "-n", "ip", "link", "set", "lo", "up"], capture_output=True)
    if probe.returncode:
        return f"cannot make a network namespace (unshare -n: {probe.stderr.decode().strip()})"
    return None


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    reason = _loopback_only_reason()
    if reason:
        pytest.skip(reason)
    workdir = tmp_path_factory.mktemp("s3-endpoints")
    child = f"{sys.executable} -m tests.integration.s3_netns run {workdir}"
    command = f"ip link set lo up && exec {child}"
    done = subprocess.run(
        ["unshare", "-n", "sh", "-c", command],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("transport", ["fsspec", "obstore"])
def test_a_config_file_pointing_at_b_reads_bs_bytes_from_the_same_cache(results, transport):
    first, second = results[f"config file A then B, {transport}"]
    a, b = results["endpoints"]["A"], results["endpoints"]["B"]
    assert (first["data"], first["location"]) == ("bytes of endpoint A", f"endpoint={a}")
    assert (second["data"], second["location"]) == ("bytes of endpoint B, longer", f"endpoint={b}")
    assert second["stats"]["hits"] == 0  # not A's entry
    if transport == "obstore":
        assert second["obstore"]["endpoint"] == b


@pytest.mark.parametrize("transport", ["fsspec", "obstore"])
def test_an_ignored_endpoint_is_neither_in_the_key_nor_served_from_the_cache(results, transport):
    first, second = results[f"ignored endpoint, {transport}"]
    assert first["data"] == "bytes of endpoint A"
    assert second["location"] == "endpoint=aws;profile=;region=eu-west-3"
    assert "data" not in second  # AWS itself is out of reach here: not A's cached bytes
    if transport == "obstore":
        assert second["obstore"]["endpoint"] == "https://s3.eu-west-3.amazonaws.com"


@pytest.mark.parametrize("transport", ["fsspec", "obstore"])
def test_a_profiles_endpoint_is_its_own_entry(results, transport):
    default, profile_b = results[f"profile endpoint, {transport}"]
    assert default["data"] == "bytes of endpoint A"
    assert profile_b["data"] == "bytes of endpoint B, longer"
    assert profile_b["location"] == f"endpoint={results['endpoints']['B']}"


def test_obstore_goes_to_the_config_files_endpoint_signing_for_its_region(results):
    (read,) = results["config region signs obstore"]
    assert read["data"] == "bytes of endpoint A"
    assert read["obstore"] == {"endpoint": results["endpoints"]["A"], "region": "eu-west-3"}
