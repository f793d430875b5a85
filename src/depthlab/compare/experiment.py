"""``compare``: train every scheme the same way, diagnose each, and put them side by side.

    from depthlab.compare import CompareConfig, compare
    result = compare(CompareConfig(schemes=["pre", "lns"], preset="tiny"), "cmp/")

Layout of the output directory::

    compare.json              the resolved settings (provenance; a resumed compare must match them, but for
                              which schemes and seeds it holds)
    runs/<scheme>-seed<k>/    one training run each (config, metrics, checkpoint) + diagnostics/
    summary.json, summary.md  the table (paper Table 1/6/7 shape), per seed and aggregated
    *.png, report.html        figures and one self-contained page

Every scheme gets the same seed, data order, token budget and hyper-parameters: only
``ModelConfig.scheme`` differs. Finished runs and diagnoses are reused, so an interrupted compare
picks up where it stopped.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import statistics
import time
from pathlib import Path
from typing import Any, Callable

from depthlab.analysis.diagnostics import diagnose, load_target, write_report
from depthlab.analysis.diagnostics.depthuse import depth_use_columns
from depthlab.analysis.diagnostics.probes import deepest_third
from depthlab.analysis.monitor.trackers import compare_group, log_compare
from depthlab.base.devices import resolve_device
from depthlab.base.errors import DepthlabError
from depthlab.base.fileio import publish_dir, write_json_atomic, write_text_atomic
from depthlab.base.progress import duration, progress, user_logging
from depthlab.base.store.checkpoint import list_checkpoints
from depthlab.compare.config import CompareConfig
from depthlab.compare.curves import compare_tracking_markdown, run_metrics
from depthlab.compare.downstream import downstream_markdown, downstream_table, run_downstream
from depthlab.compare.parallel import run_in_parallel
from depthlab.compare.table import COLUMNS, markdown_table, resolved_run_config
from depthlab.models.schemes import BASELINE_SCHEME, SchemeSpec
from depthlab.train import train

log = logging.getLogger(__name__)


def run_name(scheme: SchemeSpec, seed: int) -> str:
    """The run's key in summary.json (``lns:position=after-branch-seed0``; labels as in the table)."""
    return f"{scheme.label}-seed{seed}"


def run_dirname(scheme: SchemeSpec, seed: int) -> str:
    """The run's directory under runs/: a safe name (``lns-position-after-branch-seed0``)."""
    return f"{scheme.dirname}-seed{seed}"


# ------------------------------------------------------------------------------------- running
def _train_run(cfg: CompareConfig, scheme: SchemeSpec, seed: int, run_dir: Path, quiet: bool, command: str | None,
               earlier: bool = True) -> dict:
    """The run's summary: trained now, or read back (``earlier``: a run an earlier compare trained, said so)."""
    if (run_dir / "summary.json").is_file():
        if earlier:
            log.info("%s: trained by an earlier compare, reusing %s", run_name(scheme, seed), run_dir)
        return json.loads((run_dir / "summary.json").read_text())
    resume = (run_dir / "config.json").is_file() and bool(list_checkpoints(run_dir))
    if run_dir.exists() and not resume:
        shutil.rmtree(run_dir)  # a run that died before its first checkpoint: nothing to keep
    group = compare_group(cfg.train, run_dir.parent.parent)  # trackers: the runs of a compare in one group
    return train(cfg.model_config(scheme), cfg.train.replace(seed=seed, **({"run_group": group} if group else {})),
                 run_dir, resume=resume, quiet=quiet, command=command)


def _diagnose_run(cfg: CompareConfig, run_dir: Path, command: str | None) -> dict:
    out = run_dir / "diagnostics"
    if (out / "report.json").is_file():
        return json.loads((out / "report.json").read_text())
    t0 = time.perf_counter()
    tokens = f"{cfg.diagnose.tokens:,}" if cfg.diagnose.tokens else "the default number of"
    log.info("%s: diagnosing (%s held-out tokens)", run_dir.name, tokens)
    target = load_target(str(run_dir), device=resolve_device(cfg.train.device))  # where it trained (fp32 weights)
    report = diagnose(target, cfg.diagnose, command=command)
    shutil.rmtree(out, ignore_errors=True)  # a report cut short, as an older depthlab wrote them in place
    with publish_dir(out) as tmp:  # whole or not at all: a report.json here means a whole report
        write_report(report, tmp)
    log.info("%s: diagnosed in %s", run_dir.name, duration(time.perf_counter() - t0))
    return json.loads((out / "report.json").read_text())


def train_and_diagnose(cfg: CompareConfig, scheme: SchemeSpec, seed: int, run_dir: Path, command: str | None) -> str:
    """One run, trained then diagnosed (what a ``--jobs`` worker does); returns its name."""
    _train_run(cfg, scheme, seed, run_dir, False, command, earlier=False)
    _diagnose_run(cfg, run_dir, command)
    return run_name(scheme, seed)


def deep_mean_of(values: list[float | None] | None, deep: list[int]) -> float | None:
    """Mean of ``values`` (per block, 1-based ``deep``) over the deep blocks that were measured (None entries: not
    measurable, e.g. a removal a scheme cannot make); None when none was."""
    got = [values[l - 1] for l in deep if values is not None and l <= len(values) and values[l - 1] is not None]
    return statistics.fmean(got) if got else None


def run_row(scheme: SchemeSpec, seed: int, summary: dict, report: dict,
            probe: dict[str, Any] | None = None) -> dict[str, Any]:
    """One table row, straight from a run's summary.json, its diagnostics report.json and (``probe``) its last
    depth probe in metrics.jsonl (the deepest third's contribution ‖x^{l+1} − x^l‖ / ‖x^l‖)."""
    adjacent = report["angular"]["adjacent"]
    deep = deepest_third(len(adjacent))
    row = {
        "scheme": scheme.label, "seed": seed,
        "eval_loss": summary["eval_loss"],
        **{k: summary[k] for k in ("eval_ppl", "eval_acc") if k in summary},  # LM: perplexity; ViT: accuracy
        "last_layer_variance": summary["layer_variance"][-1],
        "deep_angular": statistics.fmean(adjacent[l - 1] for l in deep),
        "deep_blocks": deep,
        "tokens": summary["tokens"], "wall_s": summary["wall_s"],
    }
    if "removal" in report:
        row["deep_removal_drop"] = deep_mean_of(report["removal"]["delta_loss"], deep)
        if "delta_accuracy" in report["removal"]:
            row["deep_removal_acc_drop"] = deep_mean_of(report["removal"]["delta_accuracy"], deep)
    row.update(depth_use_columns(report, deep))  # swap Δloss of the deepest third's pairs, effective depth
    contribution = deep_mean_of((probe or {}).get("layer_contribution"), deep)
    if contribution is not None:
        row["deep_contribution"] = contribution
    return row


def last_probe(run_dir: Path) -> dict[str, Any] | None:
    """The run's last depth probe with per-block contributions (a metrics.jsonl line), None without one."""
    lines = [r for r in run_metrics(run_dir) if "layer_contribution" in r]
    return lines[-1] if lines else None


def aggregate(rows: list[dict[str, Any]], schemes: list[str]) -> list[dict[str, Any]]:
    """Mean (and sample std when several seeds ran) per scheme; deltas vs BASELINE_SCHEME per seed
    (kept under the keys ``delta_*_vs_pre``)."""
    baseline = {r["seed"]: r for r in rows if r["scheme"] == BASELINE_SCHEME}
    for r in rows:
        if r["seed"] in baseline:
            for key in ("eval_ppl", "eval_acc", "eval_loss"):
                if key in r:
                    r[f"delta_{key[5:]}_vs_pre"] = r[key] - baseline[r["seed"]][key]
    table = []
    for scheme in schemes:
        mine = [r for r in rows if r["scheme"] == scheme]
        agg: dict[str, Any] = {"scheme": scheme, "seeds": [r["seed"] for r in mine]}
        for key in [*COLUMNS, "delta_loss_vs_pre", "tokens", "wall_s"]:
            values = [r[key] for r in mine if r.get(key) is not None]
            if not values:
                continue
            agg[key] = statistics.fmean(values)
            if len(values) > 1:
                agg[key + "_std"] = statistics.stdev(values)
        table.append(agg)
    return table


def field_defaults(obj: Any) -> dict[str, Any]:
    """The default of every field of a dataclass instance, nested dataclasses as dicts of theirs (JSON-normalised
    like compare.json): what a setting added since a compare was saved means when that compare did not record it."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out[f.name] = field_defaults(value)
        elif f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return json.loads(json.dumps(out, default=str))


def _changed_settings(saved: dict[str, Any], now: dict[str, Any], defaults: dict[str, Any] | None = None,
                      prefix: str = "") -> list[str]:
    """``key: saved -> now`` for every setting that differs (dotted into sections), so the refusal to
    resume names what to change back. A setting the saved compare lacks is no change when it is now at its default
    (``defaults``) or None: the saved compare predates it and ran as that default."""
    defaults = defaults or {}
    changed = []
    for key in sorted(set(saved) | set(now)):
        if key not in saved and (now[key] is None or (key in defaults and now[key] == defaults[key])):
            continue
        old, new = saved.get(key, "<absent>"), now.get(key, "<absent>")
        if isinstance(old, dict) and isinstance(new, dict):
            sub = defaults.get(key) if isinstance(defaults.get(key), dict) else None
            changed += _changed_settings(old, new, sub, f"{prefix}{key}.")
        elif old != new:
            changed.append(f"{prefix}{key}: {old!r} -> {new!r}")
    return changed


RUN_SET = ("schemes", "seeds", "sweep")  # which runs a compare holds, not how each is trained


def check_compare_dir(cfg: CompareConfig, out: str | Path) -> None:
    """Refuse an ``out`` that holds something else than this compare (another compare, other settings, other
    files), before anything is written there (the CLI calls it before it locks the directory). Other schemes
    or seeds are not other settings: rerunning with ``--seeds 0,1`` where seed 0 ran trains seed 1 only."""
    out = Path(out)
    saved_path = out / "compare.json"
    if saved_path.is_file():
        saved = dict(json.loads(saved_path.read_text()).get("settings") or {})
        now = json.loads(json.dumps(cfg.to_dict()))
        if bool(saved.get("sweep")) != bool(now.get("sweep")):
            held = "a sweep (--sweep)" if saved.get("sweep") else "a compare without --sweep"
            raise DepthlabError(f"{str(out)!r} holds {held}; give another --out or the same kind of compare to resume it")
        for key in RUN_SET:  # each run is the shared settings + its scheme + its seed: the set may grow or shrink
            saved.pop(key, None), now.pop(key, None)
        changed = _changed_settings(saved, now, field_defaults(cfg))
        if changed:
            raise DepthlabError(f"{str(out)!r} holds a compare with other settings ({', '.join(changed)}); "
                                f"give another --out or the same settings to resume it")
    elif out.exists() and any(p.name != ".lock" for p in out.iterdir()):  # .lock: the CLI's run lock
        raise DepthlabError(f"output directory {str(out)!r} exists and is not a compare; give a new --out")


def open_compare_dir(cfg: CompareConfig, out: Path, command: str | None) -> dict[str, Any]:
    """Check ``out`` (:func:`check_compare_dir`), create it and write compare.json; returns the settings written."""
    settings = cfg.to_dict()
    check_compare_dir(cfg, out)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "compare.json", {"settings": settings, "command": command})
    return settings


def compare(cfg: CompareConfig, out_dir: str | Path, *, quiet: bool = False, command: str | None = None,
            on_run: Callable[[str, int, dict], None] | None = None) -> dict[str, Any]:
    """Train + diagnose every (scheme, seed) into ``out_dir`` and write the side-by-side report;
    ``cfg.jobs`` runs at a time (``depthlab.compare.parallel``).

    Reuses every run a previous call with the same settings finished (interrupted, or with fewer schemes
    or seeds); the summary covers this call's schemes and seeds. Progress: each run's training, and a line per
    finished run with the ETA of the rest (``depthlab.base.progress``; ``quiet``: none)."""
    with user_logging(quiet):
        return _compare(cfg, out_dir, quiet, command, on_run)


def _compare(cfg: CompareConfig, out_dir: str | Path, quiet: bool, command: str | None,
             on_run: Callable[[str, int, dict], None] | None) -> dict[str, Any]:
    cfg.validate()
    out = Path(out_dir)
    settings = open_compare_dir(cfg, out, command)

    every = [(sc, seed, out / "runs" / run_dirname(sc, seed)) for seed in cfg.seeds for sc in cfg.schemes]
    todo = [run for run in every if not (run[2] / "diagnostics" / "report.json").is_file()]
    fresh: set[str] = set()  # the runs this call trains
    # a line per finished run (never a bar: the runs' own progress shows between these lines)
    with progress(len(every), "compare", "run", not quiet, initial=len(every) - len(todo), every_s=0.0,
                  lines=True) as tally:

        def finished(name: str) -> None:
            fresh.add(name)
            tally.postfix(finished=name)
            tally.update(1)
            tally.postfix(finished=None)

        run_in_parallel(train_and_diagnose, cfg, todo, cfg.jobs, command, label=run_name, on_done=finished)
        rows, runs = [], {}
        for scheme, seed, run_dir in every:
            name = run_name(scheme, seed)
            summary = _train_run(cfg, scheme, seed, run_dir, quiet, command, earlier=(scheme, seed, run_dir) not in todo)
            report = _diagnose_run(cfg, run_dir, command)
            if name not in fresh and (scheme, seed, run_dir) in todo:
                finished(name)
            row = run_row(scheme, seed, summary, report, last_probe(run_dir))
            if cfg.downstream.active:
                row["downstream"] = run_downstream(cfg.downstream, run_dir, seed, cfg.train.device, quiet, command)
            rows.append(row)
            runs[name] = str(run_dir.relative_to(out))
            if on_run is not None:
                on_run(row["scheme"], seed, row)

    labels = cfg.labels
    table = aggregate(rows, labels)
    result = {"settings": settings, "command": command, "table": table, "runs": rows, "run_dirs": runs,
              "columns": {k: v[0] for k, v in COLUMNS.items()}}
    if cfg.downstream.active:
        result["downstream"] = downstream_table(rows, labels)
    write_json_atomic(out / "summary.json", result)
    md = _summary_md(cfg, table, command, resolved_run_config(result, out)["train"]) + \
        compare_tracking_markdown(result, out, BASELINE_SCHEME)
    write_text_atomic(out / "summary.md", md + downstream_markdown(result))
    from depthlab.compare.page import write_compare_report  # late: matplotlib only when drawing

    result["figures"] = write_compare_report(result, out)
    write_json_atomic(out / "summary.json", result)
    log_compare(cfg.train, out, result)  # W&B / trackio / TensorBoard, when the settings name one
    return result


def _summary_md(cfg: CompareConfig, table: list[dict[str, Any]], command: str | None, t: dict[str, Any]) -> str:
    """summary.md's head and table; ``t``: the resolved training settings every run used."""
    return "\n".join([
        f"# depthlab compare: {', '.join(cfg.labels)} on {cfg.preset}",
        "",
        f"data `{t['data']}`, tokenizer `{t.get('tokenizer')}`, {t['steps']} steps of {t['batch_size']} × "
        f"{t['seq_len']} tokens, lr {t['lr']:g}, seeds {cfg.seeds}; deepest third = the last max(1, round(L/3)) blocks.",
        "",
        markdown_table(table),
        "",
        f"command: `{command}`" if command else "",
        "",
    ])
