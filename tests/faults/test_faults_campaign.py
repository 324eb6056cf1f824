"""The kill -9 campaign: real ``qkv pretrain``, ``qkv finetune``, ``qkv lab seq2seq`` and ``qkv ablate``
processes killed at random moments (seeded delays) and, for the engine's runs, at every fault point, then
resumed — every run must end bit-identical to an uninterrupted one, with the same metrics and an intact
``final_eval`` (``ablate``: the same results table). Figures go to ``$QKV_CAMPAIGN_REPORT`` (one JSON
object per job, keyed by job) if set; ``QKV_CAMPAIGN_KILLS=N`` sets the kills per job."""

from __future__ import annotations

import csv
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
from faults_support import (
    env,
    kill_after,
    kill_at_point,
    pretrain_cmd,
    resume_cmd,
    run,
    run_json,
    same_weights,
    seeded,
)

from qkv._faults import POINTS

QKV = [sys.executable, "-m", "qkv"]
TIMING = ("tokens_per_s", "elapsed_s", "seconds", "steps_per_s", "examples_per_s")


@dataclass(frozen=True)
class Job:
    """How to start, resume and judge one kind of run; ``points``: whether the fault points apply."""

    start: Callable[[Path, Path], list[str]]  # (out, shared) -> argv
    resume: Callable[[Path, Path], list[str]]
    judge: Callable[[Path, Path], tuple[bool, bool]]  # (ref, out) -> (identical, final_eval intact)
    kills: int
    points: bool = True


def _metrics(out: Path) -> list[dict]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def _engine_run(weights: str = "") -> Callable[[Path, Path], tuple[bool, bool]]:
    def judge(ref: Path, out: Path) -> tuple[bool, bool]:
        same = same_weights(ref / weights, out / weights) and _metrics(out) == _metrics(ref)
        return same, run_json(out).get("final_eval") == run_json(ref)["final_eval"] is not None
    return judge


def _results(out: Path) -> list[dict]:
    with open(out / "results.csv", newline="") as f:
        return [{k: v for k, v in row.items() if k not in TIMING} for row in csv.DictReader(f)]


def _ablate_judge(ref: Path, out: Path) -> tuple[bool, bool]:
    same = (out / "results.csv").is_file() and _results(out) == _results(ref)
    return same, same and (out / "results.md").read_text().split("\n## ")[0] != ""


def _finetune(out: Path, shared: Path) -> list[str]:
    return [*QKV, "finetune", str(shared / "model"), "--task", "sequence-classification", "--train",
            str(shared / "train.jsonl"), "--out", str(out), "--steps", "12", "--batch-size", "4", "--eval-every", "4",
            "--save-every", "3", "--no-progress"]


LAB = ["--task", "reverse", "--preset", "tiny", "--steps", "12", "--no-progress"]
ABLATE = ["--grid", "lab-heads", "--variants", "h1,h2", "--seeds", "1", "--steps", "12", "--quiet"]

JOBS = {
    "pretrain": Job(lambda out, s: pretrain_cmd(out), lambda out, s: resume_cmd(out), _engine_run(), 32),
    "finetune": Job(_finetune, lambda out, s: [*QKV, "finetune", str(s / "model"), "--out", str(out), "--resume",
                                               "--no-progress"], _engine_run(), 12),
    "lab seq2seq": Job(lambda out, s: [*QKV, "lab", "seq2seq", "--out", str(out), *LAB],
                       lambda out, s: [*QKV, "lab", "seq2seq", "--out", str(out), "--resume", "--no-progress"],
                       _engine_run("model"), 12),
    "ablate": Job(lambda out, s: [*QKV, "ablate", "--out", str(out), *ABLATE],
                  lambda out, s: [*QKV, "ablate", "--out", str(out), *ABLATE], _ablate_judge, 8, points=False),
}


def _shared(tmp: Path, e: dict) -> Path:
    """A tiny pretrained model and a labelled file for the fine-tuning runs."""
    shared = tmp / "shared"
    r = run(pretrain_cmd(shared / "model"), e)
    assert r.returncode == 0, r.stderr
    with open(shared / "train.jsonl", "w") as f:
        for i in range(60):
            topic = "cats and classes" if i % 2 else "dogs and functions"
            f.write(json.dumps({"text": f"sample {i} about {topic} here", "label": "ab"[i % 2]}) + "\n")
    return shared


def campaign(job: Job, tmp: Path, e: dict, shared: Path, kills_wanted: int) -> dict:
    """Kill runs of ``job`` one to three times each, resume them to the end and judge them against an
    uninterrupted run. Returns the figures (``failures`` lists what went wrong)."""
    rng = seeded(19)
    ref = tmp / "ref"
    t0 = time.time()
    r = run(job.start(ref, shared), e)
    assert r.returncode == 0, r.stderr
    full_s = time.time() - t0
    kills, chains, where, failures, identical, intact = 0, 0, {}, [], 0, 0
    while kills < kills_wanted:
        chains += 1
        out = tmp / f"run{chains}"
        for _ in range(rng.randint(1, 3)):
            cmd = job.resume(out, shared) if (out / "run.json").is_file() else job.start(out, shared)
            if job.points and rng.random() < 0.5:
                point = rng.choice(POINTS)
                killed = kill_at_point(cmd, e, point, tmp / "mark", pause=2.0)
            else:
                point = "random"
                killed = kill_after(cmd, e, rng.uniform(0.5, full_s))
            if killed:
                kills += 1
                where[point] = where.get(point, 0) + 1
        cmd = job.resume(out, shared) if (out / "run.json").is_file() else job.start(out, shared)
        r = run(cmd, e)
        same, ev_ok = job.judge(ref, out) if r.returncode == 0 else (False, False)
        identical, intact = identical + same, intact + ev_ok
        if not (same and ev_ok):
            failures.append(f"{out.name}: rc {r.returncode}, identical {same}, final_eval {ev_ok}: {r.stderr[-500:]}")
    return {"kills": kills, "runs": chains, "kills_by_point": where, "resumed_bit_identical": identical,
            "final_eval_intact": intact, "seconds": round(time.time() - t0), "failures": failures}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(JOBS))
def test_kill_9_campaign(name, tmp_path):
    e = env(tmp_path, QKV_CACHE_DIR=str(tmp_path / "cache"))
    shared = _shared(tmp_path, e) if name == "finetune" else tmp_path
    job = JOBS[name]
    wanted = int(os.environ.get("QKV_CAMPAIGN_KILLS", job.kills))
    report = campaign(job, tmp_path, e, shared, wanted)
    if os.environ.get("QKV_CAMPAIGN_REPORT"):
        path = Path(os.environ["QKV_CAMPAIGN_REPORT"])
        everything = json.loads(path.read_text()) if path.is_file() else {}
        path.write_text(json.dumps({**everything, name: report}, indent=1))
    print(name, report)
    assert not report["failures"], "\n".join(report["failures"])
    assert report["kills"] >= wanted
