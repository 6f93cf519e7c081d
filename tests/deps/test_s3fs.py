"""s3fs's private parts we use (``storage/deps/s3fs.py``): these fail when s3fs changes
them. The streaming GET through it runs against moto in tests/integration."""

from __future__ import annotations

import inspect

import s3fs


def test_call_s3_is_a_coroutine_taking_the_method_and_its_keywords():
    assert inspect.iscoroutinefunction(s3fs.S3FileSystem._call_s3)
    parameters = inspect.signature(s3fs.S3FileSystem._call_s3).parameters
    assert list(parameters)[:2] == ["self", "method"]
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
