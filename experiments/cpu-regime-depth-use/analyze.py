"""One table and one figure per measure across every cell that run.sh finished, read from the runs themselves.

    python3 experiments/cpu-regime-depth-use/analyze.py /tmp/regime experiments/cpu-regime-depth-use

Reads every finished run (diagnostics/report.json present) under OUT/<invocation>/[cells/<cell>/]runs/<scheme>-seed<k>/,
so a grid stopped part-way is reported as far as it got; builds compare's rows (depthlab.compare.experiment.run_row,
the same numbers as compare's own tables) and aggregates them per cell and scheme (mean, sample std over seeds).
Writes results.json (every row), table.md (per cell and scheme, and LNS − Pre-LN per cell) and one figure per
measure (<measure>.png).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from depthlab.analysis.plots.compare import across_cells
from depthlab.compare.experiment import aggregate, last_probe, run_row
from depthlab.analysis.diagnostics.depthuse import effective_depth
from depthlab.compare.table import COLUMNS, format_cell
from depthlab.models.schemes import SchemeSpec

MEASURES = ("eval_loss", "deep_removal_drop", "deep_swap_drop", "deep_angular", "deep_contribution", "effective_depth",
            "effective_depth_0.1%")
#: effective depth at a tenth of diagnose's default threshold (0.1 % of the loss): at this scale few blocks pass 1 %.
#: compare's aggregate() and format_cell() read its COLUMNS: the extra column joins them for this script.
COLUMNS["effective_depth_0.1%"] = ("effective depth at 0.1 % (blocks)", "{:.1f}")
SCHEMES = ["pre", "lns"]


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


def tables(cells: dict[str, dict[str, dict]]) -> str:
    lines = ["| cell | scheme | seeds | " + " | ".join(COLUMNS[k][0] for k in MEASURES) + " |",
             "|---|---|---|" + "---:|" * len(MEASURES)]
    for cell, rows in cells.items():
        for s in SCHEMES:
            if s in rows:
                r = rows[s]
                lines.append(f"| {cell} | {s} | {','.join(map(str, r['seeds']))} | "
                             + " | ".join(format_cell(r, k) for k in MEASURES) + " |")
    lines += ["", "LNS − Pre-LN per cell (difference of the means over seeds; negative loss: LNS better; positive "
              "depth measures: LNS's deep third does more):", "",
              "| cell | " + " | ".join(COLUMNS[k][0] for k in MEASURES) + " |", "|---|" + "---:|" * len(MEASURES)]
    for cell, rows in cells.items():
        if all(s in rows for s in SCHEMES):
            d = [None if rows["lns"].get(k) is None or rows["pre"].get(k) is None
                 else rows["lns"][k] - rows["pre"][k] for k in MEASURES]
            lines.append(f"| {cell} | " + " | ".join("–" if v is None else f"{v:+.3g}" for v in d) + " |")
    return "\n".join(lines) + "\n"


def main(root: str, out: str) -> None:
    raw = collect(Path(root))
    out_dir = Path(out)
    cells = {c: {r["scheme"]: r for r in aggregate(rows, SCHEMES) if r["seeds"]} for c, rows in sorted(raw.items())}
    (out_dir / "results.json").write_text(json.dumps({"runs": raw, "cells": cells}, indent=1, default=str))
    (out_dir / "table.md").write_text(tables(cells))
    labels = list(cells)
    for key in MEASURES:
        series = {s: [(cells[c].get(s, {}).get(key), cells[c].get(s, {}).get(key + "_std")) for c in labels]
                  for s in SCHEMES}
        across_cells(labels, series, COLUMNS[key][0], f"{COLUMNS[key][0]} per cell (mean over seeds, bar: std)",
                     out_dir / f"{key.replace('%', 'pct')}.png")
    print((out_dir / "table.md").read_text())


if __name__ == "__main__":
    main(*sys.argv[1:3])
