"""Take trained runs from other harness folders instead of training them again (``--reuse DIR``).

Grids share variants: the ``mini`` defaults are ``qkv`` in ``projections``, ``scaled-256`` in
``scaling``, ``h4`` in ``heads``, ``scaled_dot`` in ``similarity``, ``learned`` in ``positions`` and
``post`` in ``norm``; ``dot`` (similarity) is ``unscaled-256`` (scaling). A run's numbers depend only
on its configuration, its seed, the tokenizer, the text and the thread count (see
:mod:`qkv.experiments.runner`), so a run of another folder is *the* run this folder would train when

- both folders hold the same shared data: equal ``shared.json`` inputs and held-out split, and
  byte-identical files in ``tokenizer/`` and ``data/`` (the harness's copies of the training and
  held-out text, when the corpus has no named test split);
- its stored TrainConfig equals the planned one, seed included, once the fields that name the
  folders' own paths (``out``, ``corpus``, ``eval_corpus``, ``tokenizer``) are swapped;
- it finished training (``run.json`` status ``complete`` and ``model.safetensors``);
- it recorded the early statistics this grid asks for (``saturation``: steps 1…``early_steps`` in
  ``early_stats.json``) — those can only be measured while training.

Such a run folder is copied (into a temporary folder, then renamed: never half a run) without its
``result.json``; the harness then measures it like a run it trained itself, with this grid's
statistics. ``run.json`` and ``result.json`` record ``reused_from``, and ``results.md`` lists the
reused runs. The thread count is not stored with a run: reuse runs trained with the same
``--threads``.
"""

from __future__ import annotations

import filecmp
import json
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from qkv._fs import write_folder
from qkv.experiments.plan import Job
from qkv.training.config import TrainConfig

__all__ = ["check_sources", "find_reusable", "reuse_runs", "same_shared_data", "REUSED_KEY"]

#: The key of ``run.json`` and ``result.json`` naming the run folder a run was copied from.
REUSED_KEY = "reused_from"
#: TrainConfig fields that name paths inside the harness folder (the contents: same_shared_data).
_PATH_FIELDS = ("out", "corpus", "eval_corpus", "tokenizer")


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def same_shared_data(ours: Path, theirs: Path) -> bool:
    """Whether two harness folders hold the same tokenizer and the same training and held-out text."""
    a, b = _read_json(ours / "shared.json"), _read_json(theirs / "shared.json")
    if not a or not b or a.get("inputs") != b.get("inputs") or a.get("how") != b.get("how"):
        return False
    for sub in ("tokenizer", "data"):
        if not _same_files(ours / sub, theirs / sub):
            return False
    return (ours / "tokenizer").is_dir()


def _same_files(a: Path, b: Path) -> bool:
    """Both folders missing, or holding the same file names with the same bytes."""
    if not a.is_dir() or not b.is_dir():
        return a.is_dir() == b.is_dir()
    names = sorted(p.name for p in a.iterdir() if p.is_file())
    if names != sorted(p.name for p in b.iterdir() if p.is_file()):
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    return not mismatch and not errors


def _same_run(job: Job, run_dir: Path) -> bool:
    meta = _read_json(run_dir / "run.json")
    if not meta or meta.get("status") != "complete" or not (run_dir / "model.safetensors").is_file():
        return False
    planned = job.config()
    stored = dict(meta.get("train_config", {}))
    stored.update({k: job.train_config[k] for k in _PATH_FIELDS})
    try:
        if TrainConfig.from_dict(stored).diff(planned):
            return False
    except (TypeError, ValueError):
        return False
    if "saturation" in job.stats:
        early = _read_json(run_dir / "early_stats.json") or {}
        if set(early) != {str(s) for s in range(1, job.early_steps + 1)}:
            return False
    return True


def find_reusable(job: Job, sources: Iterable[Path]) -> Path | None:
    """The first trained run folder of ``sources`` (harness folders holding the same shared data as
    the job's) that is the run ``job`` plans, or None."""
    for source in sources:
        for candidate in sorted((Path(source) / "runs").glob(f"*/seed{job.seed}")):
            if candidate.resolve() != Path(job.run_dir).resolve() and _same_run(job, candidate):
                return candidate
    return None


def _copy_run(source: Path, job: Job) -> None:
    target = Path(job.run_dir)
    with write_folder(target, how="new") as tmp:
        shutil.copytree(source, tmp, ignore=shutil.ignore_patterns("result.json"), dirs_exist_ok=True)
        meta = json.loads((tmp / "run.json").read_text(encoding="utf-8"))
        meta["train_config"].update({k: job.train_config[k] for k in _PATH_FIELDS})
        meta[REUSED_KEY] = str(source)
        (tmp / "run.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")


def check_sources(sources: Iterable[str | Path]) -> None:
    """Raise ValueError unless every source is a harness folder (one holding ``shared.json``)."""
    for source in sources:
        if not (Path(source) / "shared.json").is_file():
            raise ValueError(f"--reuse {source}: not a harness folder (no shared.json); give the --out "
                             "folder of an earlier qkv ablate run")


def reuse_runs(jobs: list[Job], out: Path, sources: Iterable[str | Path], *,
               lock: Callable[[Job], int | None], unlock: Callable[[Job], None],
               log: Callable[[str], None] = print) -> list[str]:
    """Copy, for every job not started yet, the same run from ``sources`` when one exists; returns
    the labels of the jobs copied. Folders without the same shared data are skipped with a note."""
    sources = [Path(s) for s in sources]
    check_sources(sources)
    usable = []
    for source in sources:
        if source.resolve() == Path(out).resolve():
            continue
        if same_shared_data(Path(out), source):
            usable.append(source)
        else:
            log(f"reuse: {source} has another tokenizer or text than {out}; none of its runs can be reused")
    copied = []
    for job in jobs:
        if not usable or Path(job.run_dir).exists():
            continue
        found = find_reusable(job, usable)
        if found is None or lock(job) is not None:
            continue
        try:
            if not Path(job.run_dir).exists():
                _copy_run(found, job)
                copied.append(job.label)
                log(f"reuse {job.label}: the same run as {found} (copied, not retrained)")
        finally:
            unlock(job)
    return copied
