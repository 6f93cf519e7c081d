"""fsspec's reusable filesystem test suites, run on the wds filesystem over local files.

They check that the wrapper keeps the fsspec semantics of get/put/copy/open/pipe (path
expansion, globbing, recursion, directories, exclusive creation) that tools rely on.
"""

from __future__ import annotations

import pytest
from fsspec.tests import abstract

from fsspec_shards.storage.filesystem import WdsFileSystem


class WdsOverLocalFixtures(abstract.AbstractFixtures):
    @pytest.fixture
    def fs(self, tmp_path_factory):
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
