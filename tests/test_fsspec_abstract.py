"""fsspec's reusable filesystem test suites (imported from the installed
``fsspec.tests.abstract``), run on the wds filesystem over local files, each beside the same
suite on the plain local backend.

They check that the wrapper keeps the fsspec semantics of get/put/copy/open/pipe (path
expansion, globbing, recursion, directories, exclusive creation) that tools rely on; a test
that fails on both is fsspec's, one that fails through wds only is ours. Over S3 (moto):
tests/integration/test_fsspec_abstract_s3.py.
"""

from __future__ import annotations

import pytest
from fsspec.implementations.local import LocalFileSystem
from fsspec.tests import abstract

from fsspec_shards.storage.filesystem import WdsFileSystem


class WdsOverLocalFixtures(abstract.AbstractFixtures):
    @pytest.fixture(params=["plain", "wds"])
    def fs(self, request, tmp_path_factory):
        if request.param == "plain":
            return LocalFileSystem(auto_mkdir=True)
        return WdsFileSystem(
            target_protocol="file",
            target_options={"auto_mkdir": True},
            cache_dir=str(tmp_path_factory.mktemp("wds") / "cache"),
            skip_instance_cache=True,
        )

    @pytest.fixture
    def fs_path(self, tmpdir):
        return str(tmpdir)


class TestWdsGet(abstract.AbstractGetTests, WdsOverLocalFixtures):
    pass


class TestWdsPut(abstract.AbstractPutTests, WdsOverLocalFixtures):
    pass


class TestWdsCopy(abstract.AbstractCopyTests, WdsOverLocalFixtures):
    pass


class TestWdsOpen(abstract.AbstractOpenTests, WdsOverLocalFixtures):
    pass


class TestWdsPipe(abstract.AbstractPipeTests, WdsOverLocalFixtures):
    pass
