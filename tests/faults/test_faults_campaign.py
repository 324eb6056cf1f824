"""The kill -9 campaign: real ``qkv pretrain`` processes killed at random moments (seeded delays)
and at every fault point, then resumed — every run must end bit-identical to an uninterrupted one,
with the same metrics and an intact ``final_eval``. Figures go to ``$QKV_CAMPAIGN_REPORT`` if set."""

from __future__ import annotations

import json
import os
import time

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

KILLS = int(os.environ.get("QKV_CAMPAIGN_KILLS", "32"))


def _metrics(out):
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("tokens_per_s", "elapsed_s")} for r in rows]


@pytest.mark.slow
def test_kill_9_campaign(tmp_path):
    rng = seeded(19)
    cache = tmp_path / "cache"
    e = env(tmp_path, QKV_CACHE_DIR=str(cache))
    ref = tmp_path / "ref"
    t0 = time.time()
    r = run(pretrain_cmd(ref), e)
    assert r.returncode == 0, r.stderr
    full_s = time.time() - t0
    kills, chains, where, failures, identical, intact = 0, 0, {}, [], 0, 0
    while kills < KILLS:
        chains += 1
        out = tmp_path / f"run{chains}"
        for _ in range(rng.randint(1, 3)):
            cmd = resume_cmd(out) if (out / "run.json").is_file() else pretrain_cmd(out)
            if rng.random() < 0.5:
                point = rng.choice(POINTS)
                killed = kill_at_point(cmd, e, point, tmp_path / "mark", pause=2.0)
            else:
                delay = rng.uniform(0.5, full_s)
                point = "random"
                killed = kill_after(cmd, e, delay)
            if killed:
                kills += 1
                where[point] = where.get(point, 0) + 1
        cmd = resume_cmd(out) if (out / "run.json").is_file() else pretrain_cmd(out)
        r = run(cmd, e)
        ok = r.returncode == 0 and same_weights(ref, out) and _metrics(out) == _metrics(ref)
        ev_ok = run_json(out).get("final_eval") == run_json(ref)["final_eval"] is not None
        identical, intact = identical + ok, intact + ev_ok
        if not (ok and ev_ok):
            failures.append(f"{out.name}: rc {r.returncode}, weights/metrics {ok}, final_eval {ev_ok}: "
                            f"{r.stderr[-500:]}")
    report = {"kills": kills, "runs": chains, "kills_by_point": where, "resumed_bit_identical": identical,
              "final_eval_intact": intact, "seconds": round(time.time() - t0)}
    if os.environ.get("QKV_CAMPAIGN_REPORT"):
        with open(os.environ["QKV_CAMPAIGN_REPORT"], "w") as fh:
            json.dump(report, fh, indent=1)
    print(report)
    assert not failures, "\n".join(failures)
    assert kills >= 30
