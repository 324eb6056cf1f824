"""The run lifecycle: a folder is created whole and locked, an error after the start is written to
run.json (never left "running"), a resume refused for its options or its data leaves the run as it was."""

from __future__ import annotations

import json

import pytest

from qkv.training.config import LoopConfig, TrainConfig
from qkv.training.lifecycle import check_resume_data, open_run
from qkv.training.lock import read_lock
from qkv.training.rundir import RunError

CFG = TrainConfig(corpus=("dataset:pydoc",), out="x", steps=5)


def _status(out) -> dict:
    return json.loads((out / "run.json").read_text())


def test_a_new_run_is_born_locked_and_released(tmp_path):
    out = tmp_path / "run"
    with open_run(out, resume=False) as run:
        assert not out.exists()  # checked, not made: a run that fails before its start leaves nothing
        run.create({"train_config": CFG.to_dict()}, write=lambda tmp: (tmp / "extra.txt").write_text("x"))
        assert read_lock(out)["pid"] and (out / "extra.txt").is_file()
        meta = _status(out)
        assert meta["status"] == "running" and meta["format"] == "qkv-run" and len(meta["run_id"]) == 32
    assert read_lock(out) is None
    with pytest.raises(RunError, match="already holds a run"):
        with open_run(out, resume=False):
            pass


@pytest.mark.parametrize("error, status", [(RuntimeError("boom\nsecond line"), "failed"),
                                           (KeyboardInterrupt(), "interrupted")])
def test_an_error_after_the_start_is_written_to_run_json(tmp_path, error, status):
    out = tmp_path / "run"
    with pytest.raises(type(error)):
        with open_run(out, resume=False) as run:
            run.create({"train_config": CFG.to_dict()})
            raise error
    meta = _status(out)
    assert meta["status"] == status and read_lock(out) is None
    assert meta.get("error") == ("RuntimeError: boom" if status == "failed" else None)


def test_a_refused_resume_leaves_the_run_as_it_was(tmp_path):
    out = tmp_path / "run"
    with open_run(out, resume=False) as run:
        run.create({"train_config": CFG.to_dict()})
        run.finish("interrupted", steps_done=2)
    before = (out / "run.json").read_text()
    with pytest.raises(RunError, match=r"started with a different configuration: steps: 5 → 6"):
        with open_run(out, resume=True) as run:
            run.check_config(CFG.replace(steps=6))
    assert (out / "run.json").read_text() == before and read_lock(out) is None
    with open_run(out, resume=True) as run:
        run.check_config(CFG.replace(progress=False))  # what a resumption may change
        assert run.finished(CFG) is None  # not final
        run.start()
        assert _status(out)["status"] == "running"
        run.finish("complete", final_eval={"accuracy": 1.0})
    with open_run(out, resume=True) as run:
        assert run.finished(CFG, files=()) is not None
        with pytest.raises(RunError, match="a complete run of a different configuration"):
            run.finished(CFG.replace(lr=0.5), files=())


def test_statuses_and_folders_are_checked(tmp_path):
    with open_run(tmp_path / "r", resume=False) as run:
        run.create({"train_config": {}})
        with pytest.raises(ValueError, match="status='done'; allowed: running, complete"):
            run.finish("done")
    with pytest.raises(ValueError, match="holds no run"):
        with open_run(tmp_path / "none", resume=True):
            pass
    assert LoopConfig.of(CFG).steps == 5 and LoopConfig.of(CFG, steps=None, time_budget=1.0).steps is None


def test_a_resume_on_other_data_is_refused_in_one_line(tmp_path):
    out = tmp_path / "run"
    with open_run(out, resume=False) as run:
        run.create({"train_config": CFG.to_dict(), "data_sha256": "a" * 64})
        run.finish("interrupted", steps_done=2)
    before = (out / "run.json").read_text()
    with open_run(out, resume=True) as run:
        check_resume_data(run, CFG, "a" * 64)  # the same options and data: nothing to say
        with pytest.raises(RunError, match=r"started with a different configuration: steps: 5 → 6"):
            check_resume_data(run, CFG.replace(steps=6), "a" * 64)  # the options are checked first
        with pytest.raises(RunError) as e:
            check_resume_data(run, CFG, "b" * 64)
        assert str(e.value) == (f"--resume: the data differ from those {out} was started with; "
                                "resume with the same data, or start a new run")
        with pytest.raises(LookupError) as e:  # the caller's words and error class (fine-tuning's, vision's)
            check_resume_data(run, CFG, "b" * 64, what="images", same="files",
                              detail=" (their sha256 does not match run.json)", error=LookupError)
        assert str(e.value) == (f"--resume: the images differ from those {out} was started with (their sha256 "
                                "does not match run.json); resume with the same files, or start a new run")
    assert (out / "run.json").read_text() == before and read_lock(out) is None
