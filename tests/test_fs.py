"""qkv._fs: atomic writes, temp names of dead processes cleaned, whole-folder replacement."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import stat

import pytest

from qkv._fs import (atomic_file, atomic_write_bytes, atomic_write_text, clean_stale_temps,
                     clean_stale_temps_in, make_temp_dir, make_temp_file, publish_dir, publish_file,
                     replace_dir, temp_path, write_folder)


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


class Boom(Exception):
    pass


def _names(folder):
    return sorted(p.name for p in folder.iterdir())


def test_atomic_file_publishes_with_normal_permissions(tmp_path):
    f = tmp_path / "curve.png"
    with atomic_file(f) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".curve.png.tmp-")
        tmp.write_bytes(b"png")
    mask = os.umask(0)
    os.umask(mask)
    assert f.read_bytes() == b"png" and _names(tmp_path) == ["curve.png"]
    assert stat.S_IMODE(f.stat().st_mode) == 0o666 & ~mask


def test_a_failure_mid_write_leaves_the_old_file_and_no_temp(tmp_path, monkeypatch):
    f = tmp_path / "a.jsonl"
    f.write_text("old\n")
    with pytest.raises(Boom), atomic_file(f) as tmp, open(tmp, "w") as fh:
        fh.write("half")
        raise Boom
    assert f.read_text() == "old\n" and _names(tmp_path) == ["a.jsonl"]

    def full(fd):  # the disk fills up when the written bytes are flushed
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space"):
        atomic_write_bytes(f, b"new\n")
    assert f.read_text() == "old\n" and _names(tmp_path) == ["a.jsonl"]


def test_publish_file_renames_a_finished_temp(tmp_path):
    dest = tmp_path / "v.npy"
    fd, tmp = make_temp_file(dest)
    os.write(fd, b"rows")
    os.close(fd)
    publish_file(tmp, dest)
    assert dest.read_bytes() == b"rows" and _names(tmp_path) == ["v.npy"]


def test_write_folder_replace_swaps_the_whole_folder(tmp_path):
    dest = tmp_path / "m"
    dest.mkdir()
    (dest / "old.txt").write_text("old")
    with write_folder(dest) as tmp:
        (tmp / "new.txt").write_text("new")
        assert _names(dest) == ["old.txt"]  # nothing is visible before the block ends
    assert _names(dest) == ["new.txt"] and _names(tmp_path) == ["m"]


def test_a_failure_mid_folder_leaves_the_old_folder_and_no_temp(tmp_path):
    dest = tmp_path / "sub" / "m"
    for how in ("replace", "new", "merge"):
        with pytest.raises(Boom), write_folder(dest, how=how) as tmp:
            (tmp / "half.bin").write_bytes(b"x")
            raise Boom
        assert _names(tmp_path / "sub") == []
    dest.mkdir()
    (dest / "keep.txt").write_text("old")
    for how in ("replace", "merge"):
        with pytest.raises(Boom), write_folder(dest, how=how) as tmp:
            (tmp / "keep.txt").write_text("new")
            raise Boom
        assert _names(tmp_path / "sub") == ["m"] and (dest / "keep.txt").read_text() == "old"


def test_write_folder_new_refuses_a_folder_in_use(tmp_path):
    dest = tmp_path / "run"
    dest.mkdir()
    with write_folder(dest, how="new") as tmp:  # an empty folder is taken over
        (tmp / "run.json").write_text("{}")
    assert _names(dest) == ["run.json"]
    with pytest.raises(OSError), write_folder(dest, how="new") as tmp:
        (tmp / "run.json").write_text('{"other": 1}')
    assert (dest / "run.json").read_text() == "{}" and _names(tmp_path) == ["run"]
    seen = []
    with write_folder(dest, how="new", on_conflict=lambda e: seen.append(e) or True) as tmp:
        (tmp / "run.json").write_text("{}")
    assert isinstance(seen[0], OSError) and _names(tmp_path) == ["run"]
    with pytest.raises(ValueError, match="taken"):
        with write_folder(dest, how="new", on_conflict=_refuse) as tmp:
            pass
    assert _names(tmp_path) == ["run"]


def _refuse(e: OSError) -> bool:
    raise ValueError("taken")


def test_write_folder_merge_keeps_other_files_and_drops_old_owned_ones(tmp_path):
    dest = tmp_path / "run"
    dest.mkdir()
    for name, text in (("run.json", "mine"), ("config.json", "old hf"), ("vocab.txt", "old")):
        (dest / name).write_text(text)
    with write_folder(dest, how="merge", last="qkv.json",
                      owned={"qkv.json", "config.json", "vocab.txt", "model.safetensors"}) as tmp:
        (tmp / "qkv.json").write_text("new")
        (tmp / "model.safetensors").write_text("w")
    assert _names(dest) == ["model.safetensors", "qkv.json", "run.json"]
    assert (dest / "run.json").read_text() == "mine" and _names(tmp_path) == ["run"]
    with pytest.raises(ValueError, match="allowed: replace, new, merge"):
        publish_dir(tmp_path / "x", dest, how="swap")


def test_stale_temps_of_every_destination_in_a_folder_are_removed(tmp_path):
    dead_a = tmp_path / f".a.tmp-999999999-{_host()}-0000aaaa"
    dead_b = tmp_path / f".b-c.d.tmp-999999999-{_host()}-0000bbbb"
    alive = tmp_path / f".e.tmp-{os.getpid()}-{_host()}-0000cccc"
    other_host = tmp_path / ".f.tmp-999999999-elsewhere-0000dddd"
    dead_a.mkdir()
    for p in (dead_b, alive, other_host):
        p.write_text("x")
    assert sorted(clean_stale_temps_in(tmp_path)) == sorted([dead_a, dead_b])
    assert alive.exists() and other_host.exists()


# --- a full disk is named as a full disk, whatever the writer's own words -----------------------------


def _usage(free):
    return lambda path: shutil._ntuple_diskusage(10 << 30, (10 << 30) - free, free)


def test_disk_full_reads_the_writers_errors(tmp_path, monkeypatch):
    from qkv._disk import disk_full

    zip_error = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    monkeypatch.setattr(shutil, "disk_usage", _usage(1 << 20))  # 1 MiB free: nearly full
    e = disk_full(zip_error, tmp_path / "new" / "x.pt")
    assert e.errno == errno.ENOSPC and e.filename == str(tmp_path / "new" / "x.pt")
    assert e.strerror == "No space left on device (1.0 MiB free there)"
    assert disk_full(OSError(errno.ENOSPC, "No space left on device"), tmp_path).errno == errno.ENOSPC
    monkeypatch.setattr(shutil, "disk_usage", _usage(50 << 30))  # plenty free: the error is something else
    assert disk_full(zip_error, tmp_path) is None
    said = type("SafetensorError", (Exception,), {})("Error while serializing: I/O error: No space left on "
                                                     "device (os error 28)")
    assert disk_full(said, tmp_path).errno == errno.ENOSPC  # the library said so: whatever is free now
    assert disk_full(OSError(errno.EACCES, "Permission denied"), tmp_path) is None
    assert disk_full(ValueError("bad"), tmp_path) is None


def test_write_folder_and_atomic_file_raise_enospc_and_leave_nothing(tmp_path, monkeypatch):
    from qkv._fs import atomic_file, write_folder

    monkeypatch.setattr(shutil, "disk_usage", _usage(0))
    (tmp_path / "kept").write_text("old")
    with pytest.raises(OSError, match="No space left on device") as e:
        with atomic_file(tmp_path / "kept") as tmp:
            tmp.write_text("half")
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    assert e.value.errno == errno.ENOSPC and (tmp_path / "kept").read_text() == "old"
    with pytest.raises(OSError, match="No space left on device"):
        with write_folder(tmp_path / "folder") as tmp:
            (tmp / "a").write_text("x")
            raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]


def test_the_command_line_says_disk_full_for_a_checkpoint_torch_could_not_write(tmp_path, monkeypatch, capsys):
    import qkv.training.checkpoint as ck
    from qkv.cli import main

    def full(*a, **k):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")

    monkeypatch.setattr(ck.torch, "save", full)
    monkeypatch.setattr(shutil, "disk_usage", _usage(3 << 20))
    code = main(["pretrain", "--corpus", "dataset:pydoc", "--preset", "tiny", "--model", '{"max_len": 40}',
                 "--max-len", "24", "--vocab-size", "300", "--steps", "2", "--out", str(tmp_path / "r"),
                 "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "No space left on device (3.0 MiB free there)" in err and "--resume" in err, err
    assert "inline_container" not in err and "unexpected" not in err


def _zombie():
    """A child that has exited and that nobody has reaped yet (its Popen, to reap it with ``wait``)."""
    import subprocess
    import sys
    import time

    from qkv._fs import process_state

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.time() + 30
    while process_state(child.pid) != "Z":
        assert time.time() < deadline, "the child did not exit"
        time.sleep(0.01)
    return child


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_a_zombie_is_not_alive_and_its_temps_are_stale(tmp_path):
    from qkv._fs import pid_alive

    assert pid_alive(os.getpid())
    child = _zombie()
    try:
        os.kill(child.pid, 0)  # the kernel still knows it ...
        assert not pid_alive(child.pid)  # ... but it runs no more
        dest = tmp_path / "x.npy"
        left = dest.parent / f".x.npy.tmp-{child.pid}-{_host()}-abcd1234"
        left.write_bytes(b"half")
        assert clean_stale_temps(dest) == [left] and not left.exists()
    finally:
        child.wait()
    assert not pid_alive(child.pid)
