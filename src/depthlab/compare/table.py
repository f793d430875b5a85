"""The compare table's columns and cell format, shared by ``compare`` (summary.md) and
``compare.page`` (report.html); it imports neither, so neither imports the other.

    COLUMNS["eval_ppl"] == ("perplexity", "{:.2f}")
    format_cell({"eval_ppl": 19.0, "eval_ppl_std": 1.4}, "eval_ppl") == "19.00 ± 1.40"
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from depthlab.models.schemes import BASELINE_SCHEME

#: Columns of the table: key -> (header, format). Deltas are per seed against BASELINE_SCHEME.
COLUMNS: dict[str, tuple[str, str]] = {
    "eval_loss": ("held-out loss", "{:.4f}"),
    "eval_ppl": ("perplexity", "{:.2f}"),
    "delta_ppl_vs_pre": (f"Δ ppl vs {BASELINE_SCHEME}", "{:+.2f}"),
    "eval_acc": ("held-out top-1 accuracy (%)", "{:.2f}"),  # ViTs (classifiers) instead of perplexity
    "delta_acc_vs_pre": (f"Δ acc vs {BASELINE_SCHEME} (points)", "{:+.2f}"),
    "last_layer_variance": ("last-block output variance", "{:.3g}"),
    "deep_angular": ("angular dist. deepest third", "{:.3f}"),
    "deep_removal_drop": ("removal Δloss deepest third", "{:.4f}"),
    "deep_swap_drop": ("swap Δloss deepest third", "{:.2g}"),  # often 1e-5 where removal is 1e-3
    "effective_depth": ("effective depth (blocks)", "{:.1f}"),
    "effective_share": ("effective depth / L", "{:.2f}"),
    "deep_contribution": ("contribution deepest third", "{:.3f}"),
    "deep_removal_acc_drop": ("removal Δacc deepest third (points)", "{:+.2f}"),
}
#: Columns stored as fractions (summary.json) and shown as percentages / points: one unit wherever a person reads
#: an accuracy (tables, report.html, the command line's lines), as the training log shows it.
PERCENT = ("eval_acc", "delta_acc_vs_pre", "deep_removal_acc_drop")

#: Cell of a missing (or NaN) value.
MISSING = "–"


def shown_columns(table: list[dict[str, Any]]) -> list[str]:
    """The COLUMNS keys that at least one row of ``table`` has, in COLUMNS order."""
    return [k for k in COLUMNS if any(k in row for row in table)]


def format_cell(row: dict[str, Any], key: str) -> str:
    """``row[key]`` in its column's format, ``± std`` appended when ``row`` has ``key + "_std"``;
    :data:`MISSING` when the value is absent, None or NaN."""
    value = row.get(key)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    fmt, scale = COLUMNS[key][1], 100 if key in PERCENT else 1
    cell = fmt.format(scale * value)
    if key + "_std" in row:
        cell += " ± " + fmt.format(scale * row[key + "_std"]).lstrip("+")
    return cell


def markdown_table(table: list[dict[str, Any]]) -> str:
    """The aggregated table as GitHub markdown: one row per scheme, one column per shown key."""
    keys = shown_columns(table)
    lines = ["| scheme | " + " | ".join(COLUMNS[k][0] for k in keys) + " |",
             "|---|" + "---:|" * len(keys)]
    lines += [f"| {row['scheme']} | " + " | ".join(format_cell(row, k) for k in keys) + " |" for row in table]
    return "\n".join(lines)


def resolved_run_config(result: dict[str, Any], out: Path) -> dict[str, Any]:
    """The config.json of a compare's first run: the settings every run used, resolved (the learning rate, steps,
    sequence length and tokenizer the compare left to their defaults, filled); the compare's own settings when the
    run has none yet."""
    dirs = list(result.get("run_dirs", {}).values())
    path = Path(out) / dirs[0] / "config.json" if dirs else None
    if path is not None and path.is_file():
        return json.loads(path.read_text())
    return {"train": result["settings"]["train"], "model": {}}


def measure_rows(result: dict[str, Any]) -> tuple[list[str], dict[str, list[dict[str, Any]]]]:
    """A regime sweep's result (``depthlab.compare.sweep``) as (schemes, scheme -> its aggregated row in each cell,
    ``{}`` where the cell failed): what each measure's table and figure across the cells read."""
    schemes = result["settings"]["schemes"]
    by_scheme: dict[str, list[dict[str, Any]]] = {s: [] for s in schemes}
    for entry in result["cells"]:
        rows = {r["scheme"]: r for r in entry.get("table", [])}
        for s in schemes:
            by_scheme[s].append(rows.get(s, {}))
    return schemes, by_scheme
