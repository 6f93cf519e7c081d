"""The writer's spool directory: a dead run is removed, a live one never, a foreign one refused."""

from __future__ import annotations

import os

import pytest

from fsspec_shards.iteration.spool import Spool, remove_dead_runs


def test_a_live_run_is_kept_and_a_closed_one_leaves_nothing(tmp_path):
    live = Spool(str(tmp_path), "spool_dir")
    with open(live.path("x.tar"), "wb") as file:
        file.write(b"x")
    assert remove_dead_runs(live.area) == []  # its lock is held, here by another descriptor
    other = Spool(str(tmp_path), "spool_dir")
    assert os.path.isdir(live.run) and os.listdir(live.run)
    other.close()
    live.close()
    assert os.listdir(tmp_path) == []


def test_a_run_whose_lock_is_free_is_removed(tmp_path):
    dead = Spool(str(tmp_path), "spool_dir")
    open(dead.path("x.tar"), "wb").close()  # noqa: SIM115
    os.close(dead._lock)  # what the kernel does when its process dies
    dead._lock = None
    assert remove_dead_runs(dead.area) == [dead.token]
    assert os.listdir(dead.area) == []


@pytest.mark.parametrize("kind", ["symlink", "open", "another uid"])
def test_a_spool_directory_not_private_to_this_user_is_refused_naming_the_option(tmp_path, kind):
    area = tmp_path / f".fsspec-shards-spool-{os.geteuid()}"
    if kind == "symlink":
        (tmp_path / "elsewhere").mkdir()
        area.symlink_to(tmp_path / "elsewhere")
    elif kind == "open":
        area.mkdir(mode=0o777)
        os.chmod(area, 0o777)
    else:
        if os.geteuid() != 0:
            pytest.skip("making a directory another uid owns needs root")
        area.mkdir(mode=0o700)
        os.chown(area, 4242, 4242)
    with pytest.raises(PermissionError, match="not a private directory.*spool_dir"):
        Spool(str(tmp_path), "spool_dir")
