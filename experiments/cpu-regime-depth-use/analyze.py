"""One table and one figure per measure across every cell that run.sh finished, read from the runs themselves.

    python3 experiments/cpu-regime-depth-use/analyze.py /tmp/regime experiments/cpu-regime-depth-use

Reads every finished run (diagnostics/report.json present) under OUT/<invocation>/[cells/<cell>/]runs/<scheme>-seed<k>/,
so a grid stopped part-way is reported as far as it got; builds compare's rows (depthlab.compare.experiment.run_row,
the same numbers as compare's own tables) and aggregates them per cell and scheme (mean, sample std over seeds).
Writes results.json (every row), table.md (per cell and scheme, mean ± sample std over seeds; then LNS − Pre-LN and
CompleteP − Pre-LN per cell, paired by seed: the mean difference and each seed's own) and one figure per measure
(<measure>.png).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from depthlab.analysis.diagnostics.depthuse import effective_depth
from depthlab.analysis.plots.compare import across_cells
from depthlab.compare.experiment import aggregate, last_probe, run_row
from depthlab.compare.table import COLUMNS, format_cell
from depthlab.models.schemes import SchemeSpec

MEASURES = ("eval_loss", "deep_removal_drop", "deep_swap_drop", "deep_angular", "deep_contribution", "effective_depth",
            "effective_depth_0.1%")
#: effective depth at a tenth of diagnose's default threshold (0.1 % of the loss): at this scale few blocks pass 1 %.
#: compare's aggregate() and format_cell() read its COLUMNS: the extra column joins them for this script.
COLUMNS["effective_depth_0.1%"] = ("effective depth at 0.1 % (blocks)", "{:.1f}")
SCHEMES = ["pre", "lns", "completep"]
NAMES = {"lns": "LNS", "completep": "CompleteP"}


def cell_label(run_dir: Path) -> str:
    """``adamw seq 128 wd 0``: the optimiser and sequence length of the run's config, and its weight decay."""
    train = json.loads((run_dir / "config.json").read_text())["train"]
    return f"{train['optimizer']} seq {train['seq_len']} wd {train['weight_decay']:g}"


def collect(root: Path) -> dict[str, list[dict]]:
    """cell label -> the rows of its finished runs."""
    cells: dict[str, list[dict]] = {}
    for report in sorted(root.glob("**/runs/*/diagnostics/report.json")):
        run = report.parent.parent
        scheme, seed = run.name.rsplit("-seed", 1)
        rep = json.loads(report.read_text())
        row = run_row(SchemeSpec(scheme), int(seed), json.loads((run / "summary.json").read_text()), rep, last_probe(run))
        row["effective_depth_0.1%"] = float(effective_depth(rep["removal"], 0.001)["n"])
        cells.setdefault(cell_label(run), []).append(row)
    return cells


def paired(runs: list[dict], scheme: str, key: str) -> list[float]:
    """``scheme``'s ``key`` minus Pre-LN's, one difference per seed both ran (same seed: same data and start)."""
    pre = {r["seed"]: r.get(key) for r in runs if r["scheme"] == "pre"}
    return [r[key] - pre[r["seed"]] for r in sorted(runs, key=lambda r: r["seed"])
            if r["scheme"] == scheme and r.get(key) is not None and pre.get(r["seed"]) is not None]


def difference(values: list[float]) -> str:
    """``+0.1 (+0.09, +0.11)``: the mean difference, then each seed's when several ran."""
    if not values:
        return "–"
    mean = sum(values) / len(values)
    return f"{mean:+.3g}" + (" (" + ", ".join(f"{v:+.2g}" for v in values) + ")" if len(values) > 1 else "")


def tables(cells: dict[str, dict[str, dict]], raw: dict[str, list[dict]]) -> str:
    lines = ["Mean ± sample std over the seeds listed:", "",
             "| cell | scheme | seeds | " + " | ".join(COLUMNS[k][0] for k in MEASURES) + " |",
             "|---|---|---|" + "---:|" * len(MEASURES)]
    for cell, rows in cells.items():
        for s in SCHEMES:
            if s in rows:
                r = rows[s]
                lines.append(f"| {cell} | {s} | {','.join(map(str, r['seeds']))} | "
                             + " | ".join(format_cell(r, k) for k in MEASURES) + " |")
    for scheme in SCHEMES[1:]:
        lines += ["", f"{NAMES[scheme]} − Pre-LN per cell, paired by seed (the mean difference; in brackets each "
                  f"seed's, seed 0 first, when several ran). Negative loss: {NAMES[scheme]} better; positive depth "
                  f"measures: {NAMES[scheme]}'s deep third does more:", "",
                  "| cell | seeds | " + " | ".join(COLUMNS[k][0] for k in MEASURES) + " |",
                  "|---|---|" + "---:|" * len(MEASURES)]
        for cell, runs in raw.items():
            seeds = sorted({r["seed"] for r in runs if r["scheme"] == scheme} & {r["seed"] for r in runs
                                                                                    if r["scheme"] == "pre"})
            if seeds:
                lines.append(f"| {cell} | {','.join(map(str, seeds))} | "
                             + " | ".join(difference(paired(runs, scheme, k)) for k in MEASURES) + " |")
    return "\n".join(lines) + "\n"


def order(label: str) -> tuple:
    """Cells by optimiser, then sequence length as a number, then weight decay."""
    opt, _, seq, _, wd = label.split()
    return opt, int(seq), float(wd)


def main(root: str, out: str) -> None:
    raw = dict(sorted(collect(Path(root)).items(), key=lambda item: order(item[0])))
    out_dir = Path(out)
    cells = {c: {r["scheme"]: r for r in aggregate(rows, SCHEMES) if r["seeds"]} for c, rows in raw.items()}
    (out_dir / "results.json").write_text(json.dumps({"runs": raw, "cells": cells}, indent=1, default=str))
    (out_dir / "table.md").write_text(tables(cells, raw))
    labels = list(cells)
    for key in MEASURES:
        series = {s: [(cells[c].get(s, {}).get(key), cells[c].get(s, {}).get(key + "_std")) for c in labels]
                  for s in SCHEMES}
        across_cells(labels, series, COLUMNS[key][0], f"{COLUMNS[key][0]} per cell (mean over seeds, bar: std)",
                     out_dir / f"{key.replace('%', 'pct')}.png")
    print((out_dir / "table.md").read_text())


if __name__ == "__main__":
    main(*sys.argv[1:3])
