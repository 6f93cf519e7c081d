"""The names of a cache directory and its publication sequence
(:mod:`fsspec_shards.storage.cache.layout`)."""

from __future__ import annotations

import os
import stat

import pytest

from fsspec_shards.storage.cache import layout

KEY = "ab" + "0" * 62
OTHER = "cd" + "1" * 62


@pytest.mark.parametrize("bad", ["AB" + "0" * 62, "0" * 63, "0" * 65, "../x", None, 7])
def test_only_64_lowercase_hex_digits_are_a_key(bad):
    with pytest.raises(ValueError, match="not a cache key"):
        layout.check_key(bad)
    assert layout.check_key(KEY) == KEY


def test_a_new_data_file_is_a_name_the_cache_recognises_as_its_own(tmp_path):
    relative = layout.new_data_file(KEY)
    assert relative.startswith(f"files/ab/{KEY}.")
    assert layout.data_file_path(str(tmp_path), KEY, relative) == os.path.join(tmp_path, relative)
    shard, name = relative.split("/")[1:]
    assert layout.is_data_name(name, shard) and not layout.is_data_name(name, "cd")
    assert layout.new_data_file(KEY) != relative  # a fresh token each time


@pytest.mark.parametrize(
    "recorded",
    [
        f"files/cd/{OTHER}.00000000",  # another key's file
        f"files/ab/../../{KEY}.00000000",
        f"/etc/{KEY}.00000000",
        f"files/cd/{KEY}.00000000",  # the key in the wrong subdirectory
        f"files/ab/{KEY}",
        None,
    ],
)
def test_an_index_row_cannot_name_a_file_outside_the_keys_own(tmp_path, recorded):
    assert layout.data_file_path(str(tmp_path), KEY, recorded) is None


def test_temp_and_progress_names_carry_their_key_and_reservation():
    name = layout.new_temp_name(KEY, 1234)
    assert layout.parse_temp_name(name) == (KEY, 1234)
    assert layout.parse_temp_name(name + "x") is None
    assert layout.parse_progress_name(layout.progress_name(KEY)) == KEY
    assert layout.parse_progress_name(layout.new_progress_name(KEY)) == KEY
    assert layout.parse_progress_name(name) is None


def test_remove_file_never_removes_a_directory_or_what_a_link_points_to(tmp_path):
    target = tmp_path / "target"
    target.write_bytes(b"kept")
    link = tmp_path / "link"
    link.symlink_to(target)
    (tmp_path / "directory").mkdir()
    assert layout.remove_file(str(link)) and target.read_bytes() == b"kept"
    assert not layout.remove_file(str(tmp_path / "directory"))
    assert (tmp_path / "directory").is_dir()
    assert not layout.remove_file(str(tmp_path / "absent"))


@pytest.mark.parametrize(("read_only", "mode"), [(True, 0o400), (False, 0o600)])
def test_a_new_file_is_owner_only_and_read_only_when_asked(tmp_path, read_only, mode):
    path = tmp_path / "new"
    layout.write_new_file(str(path), lambda fd: os.write(fd, b"bytes"), read_only=read_only)
    assert path.read_bytes() == b"bytes"
    assert stat.S_IMODE(path.stat().st_mode) == mode


def test_a_new_file_never_overwrites_nor_follows_a_symlink(tmp_path):
    existing = tmp_path / "existing"
    existing.write_bytes(b"theirs")
    with pytest.raises(FileExistsError):
        layout.write_new_file(str(existing), lambda fd: os.write(fd, b"ours"), read_only=False)
    assert existing.read_bytes() == b"theirs"
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):
        layout.write_new_file(str(link), lambda fd: os.write(fd, b"ours"), read_only=False)
    assert not (tmp_path / "elsewhere").exists()


def test_a_failed_write_raises_and_leaves_the_file_unfinished(tmp_path):
    def fail(descriptor):
        raise OSError(28, "disk full (planned)")

    with pytest.raises(OSError, match="planned"):
        layout.write_new_file(str(tmp_path / "new"), fail, read_only=True)
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o600  # not finished


def test_rename_into_place_moves_the_finished_file_to_its_name(tmp_path):
    (tmp_path / "tmp").mkdir()
    (tmp_path / "files").mkdir()
    temp, final = tmp_path / "tmp" / "t", tmp_path / "files" / "f"
    layout.write_new_file(str(temp), lambda fd: os.write(fd, b"whole"), read_only=True)
    layout.rename_into_place(str(temp), str(final))
    assert final.read_bytes() == b"whole" and not temp.exists()
    with pytest.raises(FileNotFoundError):  # nothing to rename: raised, not ignored
        layout.rename_into_place(str(temp), str(final))
