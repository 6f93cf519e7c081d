"""An AWS configuration of the test's own: a config file, and no AWS_* variable of the
machine's (its endpoint, profile, region) leaking into botocore's resolution."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

RESOLVING = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
)
"""The variables botocore resolves a profile, region and endpoint from."""


class AwsConfig:
    """``aws_config(text)`` writes the config file; ``env`` sets variables for the test."""

    def __init__(self, path: Path, env: pytest.MonkeyPatch) -> None:
        self.path = path
        self.env = env

    def __call__(self, text: str) -> Path:
        self.path.write_text(text)
        return self.path


@pytest.fixture(name="aws_config")
def aws_config_fixture(tmp_path, monkeypatch) -> Callable[[str], Path]:
    for name in RESOLVING:
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "aws-config"
    config.write_text("")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never ask a metadata server
    return AwsConfig(config, monkeypatch)
