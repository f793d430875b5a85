"""A regime sweep: the whole comparison once per cell of a grid of training settings, one report across the cells.

    cfg = CompareConfig(schemes=["pre", "lns"], seeds=[0, 1], sweep={"weight_decay": [0, 0.1], "seq_len": [256, 1024]})
    result = compare(cfg, "cmp/regimes")     # every scheme x seed in each of the 4 cells; without a sweep: one compare

Layout of the output directory::

    compare.json                    the settings, the sweep included
    cells/<cell>/                   one whole compare per cell (compare.json, runs/, summary.*, report.html)
    summary.json, summary.md        a table per cell (compare's columns, seed spread); per measure, the cells side by side
    <measure>_across_cells.png      one figure per measure (held-out loss, the deepest third's removal Δloss, angular
    report.html                     distance and contribution), every cell and scheme on it

The runs of every cell share ``--jobs`` (workers across cells). Finished runs and cells are reused, so the same
command after a ``kill -9`` continues where it stopped. A cell that fails (a run that diverges, a worker that is
killed) is recorded with its one-line reason; the other cells finish and are reported, then one DepthlabError names
the failed ones (the same command again retries them).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Callable

from depthlab.base.errors import DepthlabError, first_line
from depthlab.base.fileio import write_json_atomic, write_text_atomic
from depthlab.base.progress import user_logging
from depthlab.compare import experiment as E
from depthlab.compare.config import Cell, CompareConfig
from depthlab.compare.parallel import run_in_parallel
from depthlab.compare.table import COLUMNS, format_cell, markdown_table, measure_rows

log = logging.getLogger(__name__)

#: The measures drawn across cells (COLUMNS keys), each one figure.
MEASURES = ("eval_loss", "deep_removal_drop", "deep_swap_drop", "deep_angular", "deep_contribution", "effective_share")


def compare(cfg: CompareConfig, out_dir: str | Path, *, quiet: bool = False, command: str | None = None,
            on_run: Callable[[str, int, dict], None] | None = None) -> dict[str, Any]:
    """Train + diagnose every (scheme, seed) of every cell of ``cfg.sweep`` under ``out_dir/cells`` and write the
    report across the cells; without a sweep, :func:`depthlab.compare.experiment.compare` (one cell, in ``out_dir``
    itself)."""
    if not cfg.sweep:
        return E.compare(cfg, out_dir, quiet=quiet, command=command, on_run=on_run)
    with user_logging(quiet):
        return _sweep(cfg, Path(out_dir), quiet, command, on_run)


def cell_run(cfg: CompareConfig, key: tuple[str, Any], seed: int, run_dir: Path, command: str | None) -> str:
    """What a ``--jobs`` worker does: one run of one cell (``key``: the cell's directory name and the scheme)."""
    name, scheme = key
    cell = next(c for c in cfg.cells() if c.dirname == name)
    return E.train_and_diagnose(cfg.cell_config(cell), scheme, seed, run_dir, command)


def _sweep(cfg: CompareConfig, out: Path, quiet: bool, command: str | None,
           on_run: Callable[[str, int, dict], None] | None) -> dict[str, Any]:
    cfg.validate()  # every cell's settings, before anything is written
    settings = E.open_compare_dir(cfg, out, command)
    cells = cfg.cells()
    for cell in cells:  # each cell is a compare directory before any of its runs trains: it resumes as one
        E.open_compare_dir(cfg.cell_config(cell), out / "cells" / cell.dirname, command)
    log.info("sweep: %d cells (%s) x %d schemes x %d seeds", len(cells), ", ".join(cfg.sweep), len(cfg.schemes),
             len(cfg.seeds))
    failed = _train_side_by_side(cfg, cells, out, command)
    entries = [_cell_entry(cfg, cell, out, failed.get(cell.dirname), quiet, command, on_run) for cell in cells]
    result = {"settings": settings, "command": command, "sweep": cfg.sweep, "cells": entries,
              "columns": {k: v[0] for k, v in COLUMNS.items()}}
    write_json_atomic(out / "summary.json", result)
    write_text_atomic(out / "summary.md", sweep_markdown(result, cfg))
    from depthlab.compare.page import write_sweep_report  # late: matplotlib only when drawing

    result["figures"] = write_sweep_report(result, out, MEASURES)
    write_json_atomic(out / "summary.json", result)
    bad = [e for e in entries if "error" in e]
    if bad:
        raise DepthlabError(f"{len(bad)} of {len(entries)} cells failed ({'; '.join(e['cell'] + ': ' + e['error'] for e in bad)}"
                            f"); the others are in {out / 'report.html'}; run the same command again to retry them")
    return result


def _train_side_by_side(cfg: CompareConfig, cells: list[Cell], out: Path, command: str | None) -> dict[str, str]:
    """With ``cfg.jobs`` > 1: every unfinished run of every cell in worker processes; returns cell directory name ->
    the first failure's line (a failed run fails its cell; the others go on)."""
    todo = [((cell.dirname, scheme), seed, out / "cells" / cell.dirname / "runs" / E.run_dirname(scheme, seed))
            for cell in cells for seed in cfg.seeds for scheme in cfg.schemes]
    todo = [t for t in todo if not (t[2] / "diagnostics" / "report.json").is_file()]
    failed: dict[str, str] = {}
    try:
        run_in_parallel(cell_run, cfg, todo, cfg.jobs, command, label=lambda key, seed: f"{key[0]}/{E.run_name(key[1], seed)}",
                        on_fail=lambda name, why: failed.setdefault(name.split("/", 1)[0], why))
    except DepthlabError:
        pass  # every failure is in `failed`, and fails its cell below
    return failed


def _cell_entry(cfg: CompareConfig, cell: Cell, out: Path, failure: str | None, quiet: bool, command: str | None,
                on_run: Callable[[str, int, dict], None] | None) -> dict[str, Any]:
    """The cell's compare (its runs trained now unless the workers did), as summary.json's entry; a failure is
    recorded in one line, the other cells go on."""
    entry: dict[str, Any] = {"cell": cell.label, "values": dict(cell.values), "dir": f"cells/{cell.dirname}"}
    if failure is None:
        log.info("sweep: cell %s", cell.label)
        try:
            said = None if on_run is None else lambda scheme, seed, row: on_run(f"{cell.label}: {scheme}", seed, row)
            res = E.compare(dataclasses.replace(cfg.cell_config(cell), jobs=1), out / entry["dir"], quiet=quiet,
                            command=command, on_run=said)
            return {**entry, "table": res["table"], "runs": res["runs"]}
        except Exception as err:  # noqa: BLE001 - a failed cell is reported in one line; the others go on
            failure = first_line(err) if isinstance(err, DepthlabError) else f"{type(err).__name__}: {first_line(err)}"
    log.warning("sweep: cell %s failed: %s", cell.label, failure)
    return {**entry, "error": failure[:300]}


def sweep_markdown(result: dict[str, Any], cfg: CompareConfig) -> str:
    """summary.md: per measure a table of cells x schemes (mean ± std over seeds), then every cell's own table."""
    lines = [f"# depthlab compare sweep: {', '.join(cfg.labels)} on {cfg.preset}", "",
             f"sweep {', '.join(f'{k} = {v}' for k, v in cfg.sweep.items())}; seeds {cfg.seeds}; every cell trains "
             "every scheme and seed with the same data order; deepest third = the last max(1, round(L/3)) blocks.", ""]
    for key in MEASURES:
        schemes, by_scheme = measure_rows(result)
        lines += [f"## {COLUMNS[key][0]}", "", "| cell | " + " | ".join(schemes) + " |", "|---|" + "---:|" * len(schemes)]
        for i, entry in enumerate(result["cells"]):
            cells = [format_cell(by_scheme[s][i], key) if "table" in entry else "failed" for s in schemes]
            lines.append(f"| {entry['cell']} | " + " | ".join(cells) + " |")
        lines.append("")
    for entry in result["cells"]:
        lines += [f"## cell {entry['cell']} (`{entry['dir']}`)", ""]
        lines += [markdown_table(entry["table"]) if "table" in entry else f"failed: {entry['error']}", ""]
    if result.get("command"):
        lines += [f"command: `{result['command']}`", ""]
    return "\n".join(lines)
