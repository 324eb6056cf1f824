"""Sharded ``qkv embed`` / ``qkv index`` (torchrun): shards merged into what one process writes, a
killed rank's shard redone on rerun while finished shards are kept, shards of another job refused.

The processes of a sharded run meet only in the file system, so most tests play the ranks one after
the other in this process (``RANK``/``WORLD_SIZE`` set as torchrun sets them); one test runs torchrun
itself and kills a rank with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from qkv.cli import main


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory, pydoc_texts) -> Path:
    """41 documents (one empty: left out with --empty skip), ids in the text's order."""
    docs = [t[:300] for t in pydoc_texts[:40]]
    docs.insert(7, "   ")
    path = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(docs)))
    return path


def _as_rank(monkeypatch, rank: int, world: int = 2) -> None:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("LOCAL_RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))


def _jsonl(path: Path) -> tuple[list, np.ndarray]:
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    return [r["id"] for r in rows], np.array([r["vector"] for r in rows], dtype=np.float32)


@pytest.mark.parametrize("suffix", [".npy", ".jsonl"])
def test_two_shards_merge_into_what_one_process_writes(tmp_path, monkeypatch, tiny_model, corpus_file, suffix, capsys):
    base = ["embed", str(tiny_model), str(corpus_file), "--max-len", "16", "--no-progress"]
    one = tmp_path / f"one{suffix}"
    assert main([*base, "--out", str(one)]) == 0
    two = tmp_path / f"two{suffix}"
    for rank in (1, 0):  # rank 0 merges once every shard is there
        _as_rank(monkeypatch, rank)
        assert main([*base, "--out", str(two)]) == 0
    out = capsys.readouterr().out
    assert "rank 1/2: shard of 19 documents written" in out
    assert f"wrote 40 × 24 vectors to {two} from 2 shards: 40 documents" in out and "(ids d7)" in out
    if suffix == ".npy":
        np.testing.assert_allclose(np.load(two), np.load(one), atol=1e-5, rtol=0)
    else:
        (ids1, v1), (ids2, v2) = _jsonl(one), _jsonl(two)
        assert ids2 == ids1 and len(ids1) == 40 and "d7" not in ids1
        np.testing.assert_allclose(v2, v1, atol=1e-5, rtol=0)
    assert not (tmp_path / f"two{suffix}.shards").exists()  # removed once merged


def test_a_sharded_index_is_the_index_one_process_builds(tmp_path, monkeypatch, tiny_model, corpus_file):
    base = ["index", str(tiny_model), str(corpus_file), "--max-len", "16", "--no-progress"]
    assert main([*base, "--out", str(tmp_path / "one")]) == 0
    for rank in (1, 0):
        _as_rank(monkeypatch, rank)
        assert main([*base, "--out", str(tmp_path / "two")]) == 0
    for name in ("texts.jsonl", "offsets.npy"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    np.testing.assert_allclose(np.load(tmp_path / "two" / "vectors.npy"), np.load(tmp_path / "one" / "vectors.npy"),
                               atol=1e-5, rtol=0)
    a, b = (json.loads((tmp_path / d / "index.json").read_text()) for d in ("one", "two"))
    for key in ("count", "dim", "embedding", "empty_skipped", "long_documents", "index", "source"):
        assert a[key] == b[key], key


def test_a_missing_shard_is_redone_and_finished_shards_are_kept(tmp_path, monkeypatch, tiny_model, corpus_file,
                                                               capsys):
    out = tmp_path / "v.npy"
    argv = ["embed", str(tiny_model), str(corpus_file), "--out", str(out), "--max-len", "16", "--no-progress"]
    _as_rank(monkeypatch, 1)
    assert main(argv) == 0  # rank 1's shard is written; rank 0 was "killed": no shard 0
    shard1 = tmp_path / "v.npy.shards" / "shard-00001-of-00002"
    before = (shard1 / "vectors.npy").stat().st_mtime_ns
    stale = tmp_path / "v.npy.shards" / f".shard-00000-of-00002.tmp-{_dead_pid()}-{socket.gethostname().replace('-', '_')}-0a1b2c3d"
    stale.mkdir()  # what a killed rank 0 leaves
    assert main(argv) == 0  # rank 1 again: its shard is kept
    assert "rank 1/2: shard of 19 documents kept from an earlier attempt" in capsys.readouterr().out
    assert (shard1 / "vectors.npy").stat().st_mtime_ns == before
    _as_rank(monkeypatch, 0)
    assert main(argv) == 0
    assert np.load(out).shape == (40, 24) and not stale.exists()


def test_shards_of_another_job_are_refused(tmp_path, monkeypatch, tiny_model, corpus_file, capsys):
    out = tmp_path / "v.npy"
    argv = ["embed", str(tiny_model), str(corpus_file), "--out", str(out), "--no-progress"]
    _as_rank(monkeypatch, 1)
    assert main([*argv, "--max-len", "16"]) == 0
    assert main([*argv, "--max-len", "20"]) == 2
    err = capsys.readouterr().err
    assert "shard-00001-of-00002 is a shard of another job (options differ); remove" in err
    assert f"remove {tmp_path / 'v.npy.shards'} to start over, or choose another --out" in err


def test_standard_input_is_not_split(monkeypatch, tiny_model, tmp_path, capsys):
    _as_rank(monkeypatch, 0)
    assert main(["embed", str(tiny_model), "-", "--out", str(tmp_path / "v.npy")]) == 2
    assert "standard input cannot be split over torchrun's processes" in capsys.readouterr().err


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _rank_pid(agent: int, rank: int) -> int | None:
    """The process of ``rank`` among ``agent``'s children (torchrun starts them in sessions of their own)."""
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) != agent:
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if f"RANK={rank}".encode() in environ:
            return int(entry.name)
    return None


def test_torchrun_embedding_survives_a_killed_rank(tmp_path, tiny_model, corpus_file):
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", QKV_FAULT_MARK=str(tmp_path / "mark"))
    base = ["embed", str(tiny_model), str(corpus_file), "--max-len", "16", "--no-progress"]
    one, two = tmp_path / "one.npy", tmp_path / "two.npy"
    subprocess.run([sys.executable, "-m", "qkv", *base, "--out", str(one)], env=env, check=True, capture_output=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(port), "-m", "qkv", *base, "--out", str(two)]
    # rank 1 stops with its shard written but not in place; rank 0 finishes its own shard and waits
    agent = subprocess.Popen(run, env=dict(env, QKV_FAULT_PAUSE="embed.shard.1:60"), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    shards, deadline = tmp_path / "two.npy.shards", time.time() + 120
    try:
        while not ((shards / "shard-00000-of-00002").is_dir() and (tmp_path / "mark").exists()):
            assert agent.poll() is None and time.time() < deadline, "the run ended before rank 1's shard"
            time.sleep(0.05)
        os.kill(_rank_pid(agent.pid, 1), signal.SIGKILL)  # one rank dies; torchrun stops the other
        assert agent.wait(timeout=60) != 0
    finally:
        if agent.poll() is None:
            agent.kill()
    assert not two.exists() and not (shards / "shard-00001-of-00002").exists()
    r = subprocess.run(run, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rank 1/2: shard of 19 documents written" in r.stdout
    np.testing.assert_allclose(np.load(two), np.load(one), atol=1e-5, rtol=0)
    assert not shards.exists()
