"""``compare --finetune DATA --eval TASKS``: the paper's Table 2 on the compared runs.

After each (scheme, seed) run is pre-trained and diagnosed, it is fine-tuned on the same SFT data
with the same steps, hyper-parameters and seed (:func:`depthlab.train.finetune.finetune`), and the
fine-tuned model (the pre-trained one when no ``--finetune`` is given) is scored on the tasks with
:func:`depthlab.analysis.evaluate.evaluate` (lm-eval-style zero-shot ``acc``). Layout inside each run::

    runs/<scheme>-seed<k>/finetune/     the fine-tuning run (config, metrics, checkpoint, summary)
    runs/<scheme>-seed<k>/downstream/   eval.json + eval.md of the evaluated model

Both are reused when present, so an interrupted compare resumes. The table (summary.md, report.html):
per-task accuracy in %, their average, Δ average vs :data:`depthlab.models.schemes.BASELINE_SCHEME` (per
seed), and the fine-tuning held-out (response-only) loss; mean ± sample std over seeds.
"""

from __future__ import annotations

import json
import logging
import shutil
import statistics
from pathlib import Path
from typing import Any

from depthlab.compare.config import Downstream
from depthlab.models.schemes import BASELINE_SCHEME

log = logging.getLogger(__name__)

FINETUNE_DIR, EVAL_DIR = "finetune", "downstream"


def run_downstream(ds: Downstream, run_dir: Path, seed: int, device: str | None, quiet: bool,
                   command: str | None) -> dict[str, Any]:
    """Fine-tune (when asked) and evaluate one compared run; ``{"sft_eval_loss", "acc": {task: acc}}``."""
    from depthlab.train import list_checkpoints

    row: dict[str, Any] = {}
    target = run_dir
    if ds.finetune:
        from depthlab.train.finetune import finetune

        ft = run_dir / FINETUNE_DIR
        if (ft / "summary.json").is_file():
            summary = json.loads((ft / "summary.json").read_text())
        else:
            resume = (ft / "config.json").is_file() and bool(list_checkpoints(ft))
            if ft.exists() and not resume:
                shutil.rmtree(ft)
            summary = finetune(run_dir, ds.train_config(device, seed), ft, resume=resume, quiet=quiet,
                               command=command)
        row["sft_eval_loss"], target = summary["eval_loss"], ft
    ev = run_dir / EVAL_DIR
    if not (ev / "eval.json").is_file():
        from depthlab.analysis.evaluate import evaluate

        shutil.rmtree(ev, ignore_errors=True)
        evaluate(str(target), ds.tasks, out=ev, limit=ds.limit, batch_size=ds.eval_batch_size, progress=False,
                 command=command)
    results = json.loads((ev / "eval.json").read_text())["results"]
    row["acc"] = {t: r["acc"] for t, r in results.items()}
    row["acc_n"] = {t: r["n"] for t, r in results.items()}
    return row


# ------------------------------------------------------------------------------------- the table
def _mean_std(values: list[float]) -> list[float | None]:
    """``[mean, sample std]`` (a list, as JSON gives it back); None where undefined."""
    if not values:
        return [None, None]
    return [statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None]


def downstream_table(rows: list[dict[str, Any]], schemes: list[str]) -> list[dict[str, Any]]:
    """Per scheme: accuracy per task and their average (in %), Δ average vs the baseline (per seed),
    the SFT held-out loss; each a ``[mean, std]`` pair over seeds (std None for one seed)."""
    rows = [r for r in rows if "downstream" in r]
    if not rows:
        return []
    tasks = list(rows[0]["downstream"]["acc"])
    avg = {(r["scheme"], r["seed"]): 100 * statistics.fmean(r["downstream"]["acc"].values()) for r in rows}
    table = []
    for scheme in schemes:
        mine = [r for r in rows if r["scheme"] == scheme]
        if not mine:
            continue
        entry: dict[str, Any] = {"scheme": scheme, "seeds": [r["seed"] for r in mine]}
        entry["tasks"] = {t: _mean_std([100 * r["downstream"]["acc"][t] for r in mine]) for t in tasks}
        entry["avg"] = _mean_std([avg[(scheme, r["seed"])] for r in mine])
        deltas = [avg[(scheme, r["seed"])] - avg[(BASELINE_SCHEME, r["seed"])] for r in mine
                  if (BASELINE_SCHEME, r["seed"]) in avg]
        entry["delta_avg_vs_baseline"] = _mean_std(deltas)
        entry["sft_eval_loss"] = _mean_std([r["downstream"]["sft_eval_loss"] for r in mine
                                            if "sft_eval_loss" in r["downstream"]])
        table.append(entry)
    return table


def _cell(pair: list[float | None], fmt: str) -> str:
    mean, std = pair
    if mean is None:
        return "–"
    return fmt.format(mean) + ("" if std is None else " ± " + fmt.format(std).lstrip("+"))


def table_rows(table: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """(headers, cells) of the downstream table, shared by summary.md and report.html."""
    tasks = list(table[0]["tasks"])
    has_sft = any(e["sft_eval_loss"][0] is not None for e in table)
    headers = ["scheme", *(["SFT held-out loss"] if has_sft else []), *tasks, "avg", f"Δ avg vs {BASELINE_SCHEME}"]
    cells = [[e["scheme"], *([_cell(e["sft_eval_loss"], "{:.4f}")] if has_sft else []),
              *(_cell(e["tasks"][t], "{:.2f}") for t in tasks), _cell(e["avg"], "{:.2f}"),
              _cell(e["delta_avg_vs_baseline"], "{:+.2f}")] for e in table]
    return headers, cells


def describe(settings: dict[str, Any]) -> str:
    ds = settings.get("downstream") or {}
    what = f"fine-tuned on `{ds['finetune']}` (same steps, lr, seed for every scheme), then " if ds.get("finetune") \
        else ""
    limit = f", first {ds['limit']} items per task" if ds.get("limit") else ""
    return (f"{what}zero-shot accuracy (%, lm-eval-style `acc`) on `{ds.get('tasks')}`{limit}; "
            f"Δ avg is per seed against `{BASELINE_SCHEME}`; mean ± sample std over seeds.")


def downstream_markdown(result: dict[str, Any]) -> str:
    """The "Downstream" section of summary.md ('' when the compare has none)."""
    table = result.get("downstream")
    if not table:
        return ""
    headers, cells = table_rows(table)
    lines = ["", "## Downstream (the paper's Table 2 shape)", "", describe(result["settings"]), "",
             "| " + " | ".join(headers) + " |", "|---|" + "---:|" * (len(headers) - 1)]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines) + "\n"


def downstream_html(result: dict[str, Any]) -> list[str]:
    """The report.html section ([] when the compare has none)."""
    from depthlab.base import htmlpage as H

    table = result.get("downstream")
    if not table:
        return []
    headers, cells = table_rows(table)
    return ["<h2>Downstream (Table 2 shape)</h2>", H.table(headers, cells),
            f'<p class="muted">{H.esc(describe(result["settings"]))}</p>']
