"""Depth over training, across the schemes of a ``compare``: the deepest-third mean of each tracked
quantity against step, and where each scheme's curve crosses the baseline's.

    series = tracked_series({"pre": metrics_pre, "lns": metrics_lns})   # from metrics.jsonl lines
    print(tracking_markdown(series, baseline="pre"))
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from depthlab.analysis.diagnostics.probes import TRACKED, deep_mean

Series = dict[str, dict[str, tuple[list[int], list[float]]]]  # quantity -> scheme -> (steps, deep means)


def run_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The lines of a run's metrics.jsonl ([] when it has none)."""
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def first_seed_runs(result: dict[str, Any], out: Path) -> dict[str, Path]:
    """scheme -> run dir of its first seed (curves are drawn for one seed, the table has all)."""
    runs: dict[str, Path] = {}
    for row in result["runs"]:
        runs.setdefault(row["scheme"], out / result["run_dirs"][f"{row['scheme']}-seed{row['seed']}"])
    return runs


def tracked_series(metrics: Mapping[str, Sequence[dict[str, Any]]]) -> Series:
    """quantity -> scheme -> (probe steps, deepest-third mean at each) from each run's metrics lines."""
    out: Series = {}
    for key in TRACKED:
        for scheme, lines in metrics.items():
            pts = [(r["step"], deep_mean(r[key])) for r in lines if key in r]
            pts = [(s, v) for s, v in pts if v is not None]
            if len(pts) > 1:
                out.setdefault(key, {})[scheme] = ([s for s, _ in pts], [v for _, v in pts])
    return out


def crossing(base: tuple[list[int], list[float]], other: tuple[list[int], list[float]]) -> int | None:
    """The first common probe step from which ``other - base`` keeps the sign it has at the last
    step, when that sign differs from the one at the first step (None: no lasting crossing)."""
    b, o = dict(zip(*base)), dict(zip(*other))
    steps = [s for s in base[0] if s in o]
    diff = [o[s] - b[s] for s in steps]
    if len(diff) < 2 or (diff[0] > 0) == (diff[-1] > 0):
        return None
    i = len(diff) - 1
    while i > 0 and (diff[i - 1] > 0) == (diff[-1] > 0):
        i -= 1
    return steps[i]


def tracking_markdown(series: Series, baseline: str) -> str:
    """A table per quantity: deepest-third mean at the first, middle and last probe, and the step at
    which each scheme's curve crosses the baseline's for good."""
    if not series:
        return ""
    lines = ["## Depth over training (deepest third, mean over blocks)", ""]
    lines += ["| quantity | scheme | first probe | middle | last | crosses " + baseline + " at step |",
              "|---|---|---:|---:|---:|---:|"]
    for key, per_scheme in series.items():
        for scheme, (steps, values) in per_scheme.items():
            cross = crossing(per_scheme[baseline], (steps, values)) if baseline in per_scheme and scheme != baseline \
                else None
            mid = len(values) // 2
            lines.append(f"| {key} | {scheme} | {values[0]:.4g} (step {steps[0]}) | {values[mid]:.4g} (step {steps[mid]}) "
                         f"| {values[-1]:.4g} (step {steps[-1]}) | {'–' if cross is None else cross} |")
    return "\n".join(lines) + "\n"


def compare_tracking_markdown(result: dict[str, Any], out: Path, baseline: str) -> str:
    """The depth-over-training tables of a compare directory (first seed of each scheme)."""
    runs = first_seed_runs(result, out)
    return tracking_markdown(tracked_series({s: run_metrics(d) for s, d in runs.items()}), baseline)
