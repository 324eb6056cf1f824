"""The lab grid's report: ``results.csv`` (one row per run), ``results.md`` (the table, the paired
comparisons with Holm-corrected p-values and the verdicts), ``accuracy.png`` (every seed's score per
variant) and ``attention.png`` (:mod:`qkv.lab.maps`).

A variant's value in a seed is its cell's :attr:`~qkv.lab.grid.LabGrid.metric`; for a variant with a
learning-rate sweep, the value of the rate with the best mean over seeds (each rate's mean is
listed too). Every figure depends only on the configuration and the seeds, except seconds and steps/s.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from qkv._fs import atomic_write_text
from qkv.lab.grid import DECISION_GAP, LabGrid, parse_metric
from qkv.lab.verdict import MIN_SEEDS, Comparison, best_rate, compare, mean_std, with_holm
from qkv.lab.maps import plot_attention_maps, plot_scores

__all__ = ["write_report", "run_row", "metric_of", "mean_pm", "CSV_COLUMNS"]

CSV_COLUMNS = ["cell", "variant", "seed", "lr", "steps", "steps_done", "diverged", "metric", "accuracy",
               "sequence_accuracy", "chance", "final_loss", "entropy_mean", "entropy_min", "uniform_entropy", "init_entropy",
               "init_q_grad", "init_k_grad", "init_grad_first", "init_grad_last", "params", "seconds",
               "steps_per_s"]


def metric_of(result: dict, metric: str) -> float:
    """The value of ``metric`` (``accuracy``, ``sequence_accuracy``, ``…@N``) in a run's result dict."""
    kind, length = parse_metric(metric)
    key = "token_accuracy" if kind == "accuracy" else "sequence_accuracy"
    if length is None:
        return float(result["train_eval"][key])
    for score in result["length_evals"]:
        if score["length"] == length:
            return float(score[key])
    raise ValueError(f"the run has no evaluation at length {length}")


def _mean(values) -> float:
    vals = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return sum(vals) / len(vals) if vals else float("nan")


def run_row(grid: LabGrid, cell: str, variant: str, seed: int, r: dict) -> dict:
    """One CSV row of a run's result dict."""
    entropy = [h for row in r["attention_entropy"] for h in row]
    layers = r["init_layer_grad_norms"]
    row = {"cell": cell, "variant": variant, "seed": seed, "lr": r["config"]["lr"], "steps": r["config"]["steps"],
           "steps_done": r["steps_done"], "diverged": bool(r["diverged"]), "metric": metric_of(r, grid.metric),
           "accuracy": r["train_eval"]["token_accuracy"], "sequence_accuracy": r["train_eval"]["sequence_accuracy"],
           "chance": r["chance"], "final_loss": r["final_loss"], "entropy_mean": _mean(entropy),
           "entropy_min": min(entropy) if entropy else float("nan"), "uniform_entropy": r["uniform_entropy"],
           "init_entropy": _mean(h for row in r.get("init_attention_entropy", ()) for h in row),
           "init_q_grad": _mean(r["init_q_grad_norms"]), "init_k_grad": _mean(r["init_k_grad_norms"]),
           "init_grad_first": layers[0] if layers else float("nan"),
           "init_grad_last": layers[-1] if layers else float("nan"), "params": r["n_parameters"],
           "seconds": r["seconds"], "steps_per_s": r["steps_per_s"]}
    for score in r["length_evals"]:
        row[f"accuracy@{score['length']}"] = score["token_accuracy"]
    return row


def _fmt(x: float, d: int = 3) -> str:
    return "–" if not isinstance(x, (int, float)) or not math.isfinite(x) else f"{x:.{d}f}"


def mean_pm(values: list[float], d: int = 3) -> str:
    """``mean ± std`` of ``values`` to ``d`` decimals; one value: the value alone (no spread to show)."""
    m, s = mean_std(values)
    return f"{_fmt(m, d)} ± {_fmt(s, d)}" if len(values) > 1 else _fmt(m, d)


def _variant_values(grid: LabGrid, rows: list[dict]) -> tuple[dict, dict, dict]:
    """``(variant → seed → metric, variant → seed → diverged, variant → chosen cell)``."""
    values, diverged, chosen = {}, {}, {}
    for variant in grid.variants:
        cells: dict[str, dict[int, float]] = {}
        for r in rows:
            if r["variant"] == variant:
                cells.setdefault(r["cell"], {})[r["seed"]] = r["metric"]
        if not cells:
            continue
        cell = best_rate(cells) if len(cells) > 1 else next(iter(cells))
        chosen[variant] = cell
        values[variant] = cells[cell]
        diverged[variant] = {r["seed"]: r["diverged"] for r in rows if r["cell"] == cell}
    return values, diverged, chosen


def _comparisons(grid: LabGrid, values: dict, diverged: dict) -> list[Comparison]:
    pairs = [p for p in grid.comparisons if p[0] in values and p[1] in values]
    if not grid.comparisons and len(values) > 1:  # every variant against the best
        best = max(values, key=lambda v: mean_std(list(values[v].values()))[0])
        pairs = [(best, v) for v in values if v != best]
    out = []
    for a, b in pairs:
        try:
            out.append(compare(a, b, values, diverged))
        except ValueError:
            continue  # no shared seed yet
    return with_holm(out)


def _table(grid: LabGrid, rows: list[dict], values: dict, chosen: dict) -> str:
    lengths = sorted({int(k.split("@")[1]) for r in rows for k in r if k.startswith("accuracy@")})
    sweep = any(c != v for v, c in chosen.items())
    head = ["variant"] + (["lr (best)"] if sweep else []) + [f"{grid.metric} (mean ± std)", "every seed"]
    extra = [k for k in (["accuracy"] + [f"accuracy@{n}" for n in lengths]) if k != grid.metric]
    head += extra + ["diverged", "attention entropy: at init / trained mean / lowest head",
                     "‖∇Q‖, ‖∇K‖ at init", "‖∇‖ first / last layer at init", "parameters", "steps/s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for variant, cell in chosen.items():
        rs = sorted((r for r in rows if r["cell"] == cell), key=lambda r: r["seed"])
        seeds = ", ".join(_fmt(values[variant][r["seed"]]) for r in rs)
        cols = [f"`{variant}`"] + ([f"{rs[0]['lr']:g}"] if sweep else [])
        cols += [mean_pm([r["metric"] for r in rs]), seeds]
        cols += [mean_pm([r[k] for r in rs if k in r]) for k in extra]
        cols += [f"{sum(r['diverged'] for r in rs)}/{len(rs)}",
                 f"{_fmt(_mean(r['init_entropy'] for r in rs), 2)} / {_fmt(_mean(r['entropy_mean'] for r in rs), 2)} / "
                 f"{_fmt(_mean(r['entropy_min'] for r in rs), 2)} (uniform {_fmt(rs[0]['uniform_entropy'], 2)})",
                 f"{_fmt(_mean(r['init_q_grad'] for r in rs), 4)}, {_fmt(_mean(r['init_k_grad'] for r in rs), 4)}",
                 f"{_fmt(_mean(r['init_grad_first'] for r in rs), 4)} / {_fmt(_mean(r['init_grad_last'] for r in rs), 4)}",
                 f"{rs[0]['params']:,}", _fmt(_mean(r["steps_per_s"] for r in rs), 1)]
        lines.append("| " + " | ".join(cols) + " |")
    return "\n".join(lines)


def _comparison_lines(comparisons: list[Comparison]) -> list[str]:
    if not comparisons:
        return []
    lines = ["| a − b | mean ± std | every seed | p (paired t) | p (Holm) | verdict |", "|---|---|---|---|---|---|"]
    for c in comparisons:
        seeds = ", ".join(f"{d:+.3f}" for _, d in sorted(c.diffs.items()))
        lines.append(f"| `{c.a}` − `{c.b}` | {c.mean:+.3f} ± {_fmt(c.std)} | {seeds} | {_fmt(c.p, 4)} | "
                     f"{_fmt(c.p_holm, 4)} | {c.sentence()} |")
    return lines


def _sweep_lines(grid: LabGrid, rows: list[dict], chosen: dict) -> list[str]:
    out = []
    for variant, cell in chosen.items():
        cells = sorted({r["cell"] for r in rows if r["variant"] == variant})
        if len(cells) < 2:
            continue
        parts = []
        for c in cells:
            vals = [r["metric"] for r in rows if r["cell"] == c]
            div = sum(r["diverged"] for r in rows if r["cell"] == c)
            parts.append(f"lr {c.split('@lr=')[1]}: {mean_pm(vals)}" + (f" ({div} diverged)" if div else ""))
        out.append(f"- `{variant}`: " + "; ".join(parts) + f" → best {cell.split('@lr=')[1]}")
    return out


def _csv(rows: list[dict]) -> str:
    extra = sorted({k for r in rows for k in r if k not in CSV_COLUMNS}, key=lambda k: int(k.split("@")[1]))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS + extra, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow(r)
    return buf.getvalue()


def write_report(grid: LabGrid, config, out: Path, done: dict) -> tuple[str, list[Comparison]]:
    """Write the report of the finished runs ``done`` ((cell, seed) → result dict) into ``out``;
    returns the Markdown table and the comparisons."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cells = {c.name: c for c in grid.cells(config.overrides)}
    rows = [run_row(grid, name, cells[name].variant, seed, r)
            for (name, seed), r in sorted(done.items(), key=lambda kv: (list(cells).index(kv[0][0]), kv[0][1]))
            if name in cells]
    atomic_write_text(out / "results.csv", _csv(rows))
    values, diverged, chosen = _variant_values(grid, rows)
    comparisons = _comparisons(grid, values, diverged)
    table = _table(grid, rows, values, chosen) if rows else "(no finished runs yet)"
    chance = rows[0]["chance"] if rows else float("nan")
    md = [f"# Lab grid `{grid.name}`", "", grid.question, ""]
    if grid.claim:
        md += [f"**The claim:** {grid.claim}", ""]
    opts = ", ".join(f"{k}={v}" for k, v in grid.task_options.items())
    md += [f"- task: `{grid.task}`" + (f" ({opts})" if opts else "") + f"; chance level {_fmt(chance)}; "
           f"metric `{grid.metric}` (held-out exact match)",
           f"- shared settings: `{json.dumps(grid.base, sort_keys=True)}`"
           + (f"; overridden for this run: `{json.dumps(config.overrides, sort_keys=True)}`" if config.overrides else ""),
           f"- seeds: {config.seeds} (0 … {config.seeds - 1}); decided = every seed's difference has one sign and "
           f"is ≥ {DECISION_GAP:.2f}, or one variant diverges in every seed and the other in none (at least "
           f"{MIN_SEEDS} seeds)"]
    if config.command:
        md.append(f"- reproduce: `{config.command}`")
    md += ["", table, ""]
    sweeps = _sweep_lines(grid, rows, chosen)
    if sweeps:
        md += ["Learning-rate sweeps (the best rate's runs are in the table):", ""] + sweeps + [""]
    if comparisons:
        md += ["## Comparisons", ""] + _comparison_lines(comparisons) + [""]
    md += ["Variants (overrides of the shared settings):", ""]
    md += [f"- `{name}`: `{json.dumps(over, sort_keys=True)}`" for name, over in grid.variants.items()]
    if grid.notes:
        md += ["", grid.notes]
    missing = [f"{c}/seed{s}" for c in cells for s in range(config.seeds) if (c, s) not in done]
    if missing:
        md += ["", f"Not finished yet: {', '.join(missing)}."]
    pngs = []
    if rows and plot_scores(grid, rows, values, chosen, out / "accuracy.png"):
        pngs.append(("every seed's score per variant", "accuracy.png"))
    pair = grid.maps
    if pair is None and len(values) > 1:
        ranked = sorted(values, key=lambda v: mean_std(list(values[v].values()))[0])
        pair = (ranked[-1], ranked[0])
    if pair and all(p in chosen for p in pair) and plot_attention_maps(grid, out, [chosen[p] for p in pair],
                                                                        list(pair), out / "attention.png"):
        pngs.append((f"attention of `{pair[0]}` and `{pair[1]}` on one held-out row", "attention.png"))
    for caption, name in pngs:
        md += ["", f"![{caption}]({name})"]
    atomic_write_text(out / "results.md", "\n".join(md) + "\n")
    return table, comparisons

