"""``verify URL_PATTERN``: check every shard's checksum and tar structure."""

from __future__ import annotations

import argparse
import os
from typing import Any

from fsspec_shards.cli.checks import check_all
from fsspec_shards.cli.errors import EXIT_CHECK_FAILED, EXIT_OK, UsageError
from fsspec_shards.cli.options import SharedOptions, streaming_options
from fsspec_shards.cli.parallel import Outcome
from fsspec_shards.cli.report import print_failures
from fsspec_shards.cli.shards import comparable, plain_url, shard_urls
from fsspec_shards.errors import IntegrityError
from fsspec_shards.redact import redact_url

NAME = "verify"


def add_parser(commands: Any, shared: SharedOptions) -> None:
    """Register ``verify`` and its options."""
    parser = commands.add_parser(
        NAME,
        parents=[shared.output, shared.storage, shared.jobs],
        help="check every shard's checksum and tar structure",
        description="Read every shard straight from storage (not through the cache), check "
        "its SHA-256 against a manifest (else the backend's checksum) and parse its tar "
        "members. Exit code 1 if any shard is bad.",
    )
    parser.add_argument("url_pattern", metavar="URL_PATTERN")
    parser.add_argument(
        "--manifest", metavar="SHA256SUMS", help="sha256sum-format file (path or URL)"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    options = streaming_options(args)
    expected = read_manifest(args.manifest, options) if args.manifest else None
    urls = shard_urls(args.url_pattern, options)
    checks, failures = check_all(args, urls, options, "verify")
    for check in checks:
        if expected is None:
            continue
        digest = expected.get(comparable(check.url))
        if digest is None:
            failures.append(Outcome(check.url, error=LookupError("not in the manifest")))
        elif digest != check.sha256:
            failures.append(
                Outcome(
                    check.url,
                    error=IntegrityError(check.url, f"sha256:{digest}", f"sha256:{check.sha256}"),
                )
            )
    samples = sum(check.samples for check in checks)
    source = f"manifest {args.manifest}" if expected is not None else "backend checksums"
    print(
        f"verified {len(urls)} shards against {source}: {len(urls) - len(failures)} ok, "
        f"{len(failures)} bad ({samples} samples in the readable shards)"
    )
    if failures:
        print_failures((o.item, o.error) for o in failures)
        return EXIT_CHECK_FAILED
    return EXIT_OK


def read_manifest(location: str, options: dict[str, dict]) -> dict[str, str]:
    """``{plain URL: sha256 hex}`` from a ``sha256sum``-format file (names relative to it)."""
    import fsspec

    target = plain_url(location)
    if "://" not in target:
        target = os.path.abspath(os.path.expanduser(target))
    protocol = target.split("://", 1)[0] if "://" in target else "file"
    try:
        with fsspec.open(target, "rt", **options.get(protocol, {})) as handle:
            text = handle.read()
    except FileNotFoundError:
        raise UsageError(f"manifest not found: {redact_url(location)}") from None
    base = target.rsplit("/", 1)[0]
    digests = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        digest, _, name = line.partition(" ")
        name = name.lstrip(" *")
        if len(digest) != 64 or not name:
            raise UsageError(f"{redact_url(location)} line {number}: not 'SHA256  NAME'")
        url = name if "://" in name or name.startswith("/") else f"{base}/{name}"
        digests[comparable(url)] = digest.lower()
    return digests
