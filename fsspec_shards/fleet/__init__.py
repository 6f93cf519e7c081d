"""The fleet chores: work over every shard of a dataset, as library code.

The chores (:mod:`.checks`, :mod:`.manifest`, :mod:`.verify`, :mod:`.prefetch`,
:mod:`.stream`) take expanded shard URLs (:mod:`.shards`), storage options
``{protocol: {...}}`` and an executor, and return a report; the executors (:mod:`.executors`
for threads of this process, :mod:`.dask_executor` for a dask cluster) only decide where each
shard's work runs, so every executor gives the same report. The command line
(:mod:`fsspec_shards.cli`) parses arguments into these calls and prints the reports;
:mod:`fsspec_shards.distributed` runs them on a dask client.

Errors (:mod:`.errors`): :class:`InputError` when the request cannot be used,
:class:`ShardsFailed` when a chore will not finish with holes; a single shard's problem is a
row of the report.

Example::

    from fsspec_shards.fleet import ThreadExecutor, shard_urls, verify_shards

    report = verify_shards("s3://bucket/train-{0000..0099}.tar", {"wds": {"cache": False}},
                           ThreadExecutor(8), manifest="s3://bucket/SHA256SUMS")
    print(report.summary())
"""

from fsspec_shards.fleet.checks import ShardCheck, check_shards
from fsspec_shards.fleet.errors import InputError, ShardsFailed
from fsspec_shards.fleet.executors import Executor, ThreadExecutor
from fsspec_shards.fleet.manifest import build_manifest, make_manifest
from fsspec_shards.fleet.prefetch import PrefetchReport, prefetch_shards
from fsspec_shards.fleet.shards import shard_urls
from fsspec_shards.fleet.stream import PassReport, stream_pass
from fsspec_shards.fleet.verify import VerifyReport, verify_shards

__all__ = [
    "Executor",
    "InputError",
    "PassReport",
    "PrefetchReport",
    "ShardCheck",
    "ShardsFailed",
    "ThreadExecutor",
    "VerifyReport",
    "build_manifest",
    "check_shards",
    "make_manifest",
    "prefetch_shards",
    "shard_urls",
    "stream_pass",
    "verify_shards",
]
