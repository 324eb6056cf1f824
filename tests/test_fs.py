"""qkv._fs: atomic writes, temp names of dead processes cleaned, whole-folder replacement."""

from __future__ import annotations

import os
import socket

from qkv._fs import atomic_write_text, clean_stale_temps, make_temp_dir, replace_dir, temp_path


def _host() -> str:
    return socket.gethostname().replace("-", "_")


def test_atomic_write_leaves_only_the_file(tmp_path):
    f = tmp_path / "a.json"
    atomic_write_text(f, "one")
    atomic_write_text(f, "two")
    assert f.read_text() == "two" and sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_only_temps_of_dead_processes_are_removed(tmp_path):
    dest = tmp_path / "x.npy"
    dead = tmp_path / f".x.npy.tmp-999999999-{_host()}-0000aaaa"
    alive = tmp_path / f".x.npy.tmp-{os.getpid()}-{_host()}-0000bbbb"
    other_host = tmp_path / ".x.npy.tmp-999999999-elsewhere-0000cccc"
    unrelated = tmp_path / ".y.npy.tmp-999999999-" f"{_host()}-0000dddd"
    for p in (dead, alive, other_host, unrelated):
        p.write_text("x")
    assert clean_stale_temps(dest) == [dead]
    assert alive.exists() and other_host.exists() and unrelated.exists()


def test_replace_dir_swaps_the_whole_folder(tmp_path):
    dest = tmp_path / "m"
    dest.mkdir()
    (dest / "old.txt").write_text("old")
    tmp = make_temp_dir(dest)
    (tmp / "new.txt").write_text("new")
    replace_dir(tmp, dest)
    assert sorted(p.name for p in dest.iterdir()) == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
    assert temp_path(dest).name.startswith(f".m.tmp-{os.getpid()}-")
