"""The harness's report: ``results.csv`` (one row per run), ``results.md`` (one row per variant,
mean ± standard deviation over seeds, then the ranking over seeds of :mod:`~qkv.experiments.ranking`)
and ``loss_curves.png`` (held-out loss against step, mean over seeds per variant).

Every column but ``tokens/s`` (the table's last) depends only on the configuration and the seeds,
so two runs of the same command give the same table up to that column.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from pathlib import Path

from qkv.experiments.grid import Grid
from qkv.experiments.plan import Job
from qkv.experiments.ranking import ranking_section
from qkv.experiments.reuse import REUSED_KEY
from qkv._fs import atomic_file, atomic_write_text

__all__ = ["write_report", "format_table", "table_columns", "CSV_COLUMNS"]

CSV_COLUMNS = ["variant", "seed", "status", "params", "steps", "batch_size", "max_len", "lr", "tokens_seen",
               "eval_loss", "accuracy", "perplexity", "most_frequent_accuracy", "masked_tokens",
               "self_share", "self_top1", "chance", "max_weight_early", "entropy_early", "grad_norm_early",
               "qk_grad_norm_early", "early_steps", "max_weight_final", "entropy_final", "max_prev_share",
               "max_next_share", "specialised_heads", "head_entropy", "uniform_entropy", "long_len",
               "long_eval_loss", "long_accuracy", "long_note", "tokens_per_s", "reused_from", "error"]


def table_columns(grid: Grid) -> list[tuple[str, str, int]]:
    """``(result key, header, decimals)`` of the Markdown table, after ``variant`` and ``seeds``."""
    cols = [("params", "parameters", -1), ("eval_loss", "held-out loss", 4), ("accuracy", "accuracy", 4)]
    if "self_attention_share" in grid.stats:
        cols += [("self_share", "self share", 3), ("self_top1", "self top-1", 3), ("chance", "chance 1/n", 3)]
    if "saturation" in grid.stats:
        n = grid.early_steps
        cols += [("max_weight_early", f"max weight, steps 1–{n}", 3),
                 ("max_weight_final", "max weight, end", 3),
                 ("entropy_final", "entropy, end", 3), ("grad_norm_early", f"‖∇‖, steps 1–{n}", 3),
                 ("qk_grad_norm_early", f"‖∇Q,K‖, steps 1–{n}", 4)]
    if "heads" in grid.stats:
        cols += [("max_prev_share", "max prev", 2), ("max_next_share", "max next", 2),
                 ("specialised_heads", "heads ≥ 0.3", 1), ("head_entropy", "head entropy", 2),
                 ("uniform_entropy", "uniform entropy", 2)]
    if grid.length_factor:
        k = grid.length_factor
        cols += [("long_eval_loss", f"loss at {k}× length", 4), ("long_accuracy", f"accuracy at {k}×", 4)]
    return cols + [("tokens_per_s", "tokens/s", 0)]


def _values(rows: list[dict], key: str) -> list[float]:
    out = []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out.append(float(v))
    return out


def _cell(values: list[float], decimals: int) -> str:
    if not values:
        return "—"
    if decimals < 0:  # parameter counts: the same for every seed
        return f"{int(values[0]):,}"
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:,.{decimals}f}"
    return f"{mean:,.{decimals}f} ± {statistics.stdev(values):,.{decimals}f}"


def format_table(grid: Grid, rows: list[dict], n_seeds: int) -> str:
    """The Markdown table: one line per variant, mean ± std (sample, n−1) over its finished seeds."""
    cols = table_columns(grid)
    lines = ["| variant | seeds | " + " | ".join(h for _, h, _ in cols) + " |",
             "|---|---|" + "---:|" * len(cols)]
    for variant in grid.variants:
        mine = [r for r in rows if r["variant"] == variant]
        ok = [r for r in mine if r.get("status") == "ok"]
        failed = len(mine) - len(ok)
        seeds = f"{len(ok)}/{n_seeds}" + (f" ({failed} diverged)" if failed else "")
        cells = [_cell(_values(ok, key), d) for key, _, d in cols]
        if not ok and failed:
            cells[1] = "diverged"
        lines.append(f"| {variant} | {seeds} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _csv(grid: Grid, rows: list[dict]) -> str:
    order = {v: i for i, v in enumerate(grid.variants)}
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in sorted(rows, key=lambda r: (r["seed"], order.get(r["variant"], len(order)), r["variant"])):
        writer.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_COLUMNS})
    return buf.getvalue()


def _setup(job: Job) -> str:
    c = job.train_config
    tokens = c["steps"] * c["batch_size"] * c["grad_accum"] * c["max_len"]
    return (f"preset `{c['preset']}`, {c['steps']} steps × {c['batch_size'] * c['grad_accum']} blocks × "
            f"{c['max_len']} tokens ({tokens:,} tokens per run), AdamW lr {c['lr']:g} (warm-up "
            f"{c['warmup_steps']}, then {c['schedule']}), weight decay {c['weight_decay']:g}, clip "
            f"{c['clip_norm']:g}; held-out evaluation every {c['eval_every']} steps on ≤ "
            f"{c['eval_batches']} × {c['eval_batch_size']} blocks")


def _reused_lines(grid: Grid, rows: list[dict]) -> list[str]:
    """``- `variant` seeds 0, 1 from runs/<variant>`` per variant and source folder."""
    by: dict[tuple[str, str], list[int]] = {}
    for r in rows:
        if r.get(REUSED_KEY):
            src = Path(r[REUSED_KEY])
            by.setdefault((r["variant"], str(src.parent)), []).append(r["seed"])
    order = {v: i for i, v in enumerate(grid.variants)}
    return [f"- `{v}` seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, sorted(seeds)))} from `{src}`"
            for (v, src), seeds in sorted(by.items(), key=lambda kv: (order.get(kv[0][0], 0), kv[0][1]))]


def plot_curves(grid: Grid, rows: list[dict], path: Path) -> Path | None:
    """Held-out loss against step, mean over seeds (band: ± std) per variant."""
    import matplotlib  # lazy: matplotlib takes 0.4–0.6 s to import (python -X importtime); only plotting needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=110)
    drawn = False
    for variant in grid.variants:
        curves = [dict((s, l) for s, l, *_ in r.get("curve", [])) for r in rows
                  if r["variant"] == variant and r.get("status") == "ok"]
        if not curves:
            continue
        steps = sorted(set.intersection(*(set(c) for c in curves)))
        if not steps:
            continue
        means = [statistics.fmean(c[s] for c in curves) for s in steps]
        (line,) = ax.plot(steps, means, "o-", ms=3, label=f"{variant} (n={len(curves)})")
        if len(curves) > 1:
            stds = [statistics.stdev([c[s] for c in curves]) for s in steps]
            ax.fill_between(steps, [m - d for m, d in zip(means, stds)], [m + d for m, d in zip(means, stds)],
                            color=line.get_color(), alpha=0.15)
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("step")
    ax.set_ylabel("held-out MLM loss")
    ax.set_title(f"ablation grid '{grid.name}': held-out loss (mean over seeds)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return path


def write_report(out: Path, grid: Grid, jobs: list[Job], rows: list[dict], *, how: str = "",
                 command: str = "") -> str:
    """Write ``results.csv``, ``results.md`` and ``loss_curves.png`` into ``out``; returns the table."""
    out = Path(out)
    n_seeds = len({j.seed for j in jobs})
    table = format_table(grid, rows, n_seeds)
    atomic_write_text(out / "results.csv", _csv(grid, rows))
    png = plot_curves(grid, rows, out / "loss_curves.png")
    md = [f"# Ablation grid `{grid.name}`", "", grid.question, ""]
    if jobs:
        seeds = ", ".join(str(s) for s in sorted({j.seed for j in jobs}))
        md.append(f"- setup: {_setup(jobs[0])}; seeds {seeds}; "
                  "the same data order, masks, tokenizer and held-out text for every variant")
    if how:
        md.append(f"- held-out text: {how}")
    if command:
        md.append(f"- reproduce: `{command}`")
    md += ["- figures: mean ± standard deviation over seeds; loss and accuracy on masked held-out tokens "
           "at the last step", ""]
    md += [table, "", "Variants (overrides of the shared settings):", ""]
    md += [f"- `{name}`: `{json.dumps(over, sort_keys=True)}`" for name, over in grid.variants.items()]
    ranking = ranking_section(rows, list(grid.variants))
    if ranking:
        md += [""] + ranking
    notes = sorted({f"`{r['variant']}`: {r['long_note']}" for r in rows if r.get("long_note")})
    failures = [f"`{r['variant']}` seed {r['seed']}: {r.get('error', '')}" for r in rows
                if r.get("status") == "failed"]
    if notes:
        md += ["", f"At {grid.length_factor}× length:", ""] + [f"- {n}" for n in notes]
    if failures:
        md += ["", "Diverged runs:", ""] + [f"- {f}" for f in failures]
    reused = _reused_lines(grid, rows)
    if reused:
        md += ["", "Runs copied from other harness folders (the same configuration, seed, tokenizer and "
               "text; `--reuse`), measured here:", ""] + reused
    done = {(r["variant"], r["seed"]) for r in rows}
    missing = [j.label for j in jobs if (j.variant, j.seed) not in done]
    if missing:
        md += ["", f"Not finished yet: {', '.join(missing)}."]
    if png is not None:
        md += ["", f"![held-out loss per variant]({png.name})"]
    atomic_write_text(out / "results.md", "\n".join(md) + "\n")
    return table
