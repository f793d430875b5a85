"""Figures and the HTML page of a ``compare`` directory (numbers come from its runs' own files)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from depthlab.analysis.plots import compare as P
from depthlab.base import htmlpage as H
from depthlab.base.fileio import write_text_atomic
from depthlab.compare.curves import first_seed_runs, run_metrics, tracked_series
from depthlab.compare.downstream import downstream_html
from depthlab.compare.table import COLUMNS, format_cell, measure_rows, resolved_run_config, shown_columns
from depthlab.models.schemes import BASELINE_SCHEME


def write_compare_report(result: dict[str, Any], out: str | Path) -> dict[str, str]:
    """Draw every figure into ``out`` and write ``out/report.html``; returns {figure: file name}."""
    out = Path(out)
    runs = first_seed_runs(result, out)
    metrics = {s: run_metrics(d) for s, d in runs.items()}
    reports = {s: json.loads((d / "diagnostics" / "report.json").read_text()) for s, d in runs.items()}
    figs: dict[str, str] = {}

    train = {s: ([r["step"] for r in m if "loss" in r], [r["loss"] for r in m if "loss" in r]) for s, m in metrics.items()}
    evals = {s: ([r["step"] for r in m if "eval_loss" in r], [r["eval_loss"] for r in m if "eval_loss" in r])
             for s, m in metrics.items()}
    figs["loss_curves"] = P.loss_curves(train, evals, out / "loss_curves.png").name
    final_var = {s: json.loads((d / "summary.json").read_text())["layer_variance"] for s, d in runs.items()}
    figs["variance_by_depth"] = P.variance_by_depth(final_var, out / "variance_by_depth.png").name
    series = {s: ([r["step"] for r in m if "layer_variance" in r], [r["layer_variance"] for r in m if "layer_variance" in r])
              for s, m in metrics.items()}
    if all(len(steps) for steps, _ in series.values()):
        figs["variance_over_training"] = P.variance_over_training(series, out / "variance_over_training.png").name
    figs["angular_heatmaps"] = P.angular_heatmaps({s: r["angular"]["matrix"] for s, r in reports.items()},
                                                  out / "angular_heatmaps.png").name
    tracked = tracked_series(metrics)
    if tracked:
        from depthlab.analysis.plots.training import TRACKED_LABELS

        figs["tracking_curves"] = P.tracking_curves(tracked, TRACKED_LABELS, out / "tracking_curves.png").name
    drops = {s: r["removal"]["delta_loss"] for s, r in reports.items() if "removal" in r}
    if drops:
        figs["removal_drops"] = P.removal_drops(drops, out / "removal_drops.png").name
    write_text_atomic(out / "report.html", render(result, out, figs))
    return figs


def render(result: dict[str, Any], out: Path, figs: dict[str, str]) -> str:
    s = result["settings"]
    keys = shown_columns(result["table"])
    table = H.table(["scheme", *(COLUMNS[k][0] for k in keys)],
                    [[row["scheme"], *(format_cell(row, k) for k in keys)] for row in result["table"]])
    acc = any("eval_acc" in r for r in result["runs"])  # ViT compares: accuracy and images, not ppl and tokens
    per_run = H.table(["run", "held-out loss", "top-1 accuracy (%)" if acc else "ppl", "images" if acc else "tokens",
                       "train wall (s)", "diagnosis summary"],
                      [[f"{r['scheme']} seed {r['seed']}", f"{r['eval_loss']:.4f}",
                        f"{100 * r['eval_acc']:.2f}" if acc else f"{r['eval_ppl']:.2f}", f"{r['tokens']:,}",
                        f"{r['wall_s']:.0f}",
                        _summary_of(out / result["run_dirs"][f"{r['scheme']}-seed{r['seed']}"])] for r in result["runs"]])
    setup = H.kv_table(setup_rows(result, out))
    deep = result["runs"][0].get("deep_blocks")
    body = [
        f"<h1>depthlab compare — {H.esc(', '.join(s['schemes']))} on {H.esc(s['preset'])}</h1>",
        "<p>Every scheme trained with the same seed, data order, token budget and hyper-parameters; "
        "then diagnosed on the same held-out text.</p>",
        "<h2>Results</h2>", table,
        f'<p class="muted">Deepest third = blocks {H.esc(deep)}. '
        f"Δ ppl is per seed against <code>{H.esc(BASELINE_SCHEME)}</code>. "
        "Last-block variance is the training probe's at the final step.</p>",
        *downstream_html(result),
        "<h2>Loss</h2>", H.img(out / figs["loss_curves"], "loss curves"),
        "<h2>Layerwise output variance</h2>", H.img(out / figs["variance_by_depth"], "variance by depth"),
        H.img(out / figs["variance_over_training"], "variance during training") if "variance_over_training" in figs else "",
        "<h2>Angular distance</h2>", H.img(out / figs["angular_heatmaps"], "angular distance heatmaps"),
        *(["<h2>Depth over training</h2>", "<p>Deepest-third mean of each tracked quantity at every probe step "
           "(first seed): where the curves cross is when one scheme's deep blocks start doing more.</p>",
           H.img(out / figs["tracking_curves"], "depth over training")] if "tracking_curves" in figs else []),
    ]
    if "removal_drops" in figs:
        body += ["<h2>Layer removal</h2>", H.img(out / figs["removal_drops"], "removal drop per block")]
    body += ["<h2>Runs</h2>", per_run, "<h2>Set-up</h2>", setup,
             "<h2>Reproduce</h2>", f"<pre>{H.esc(result.get('command') or '(library call)')}</pre>",
             '<p class="muted">Each run directory holds its own config.json, metrics.jsonl, summary.json and '
             "diagnostics/report.html.</p>"]
    return H.page(f"depthlab compare — {', '.join(s['schemes'])}", body)


def setup_rows(result: dict[str, Any], out: Path) -> list[tuple[str, Any]]:
    """The set-up table: the values every run actually used (the first run's resolved config.json: learning rate,
    steps, sequence length, batch, tokenizer, schedules), each marked "(default)" when the compare left it unset."""
    s = result["settings"]
    given = s["train"]
    run = resolved_run_config(result, out)
    t, m = run["train"], run.get("model", {})

    def shown(key: str, text: Any = None) -> str:
        value = t.get(key) if text is None else text
        return f"{value} (default)" if given.get(key) is None else str(value)

    warm = t.get("warmup") or 0
    warmup = f"{warm:g} of the steps" if 0 < warm < 1 else f"{int(warm)} steps"
    tokens = t.get("eval_tokens") or 0
    evaluation = (f"{tokens:,} tokens" if tokens > 1 else "every held-out image") + ", " + \
        (f"every {t['eval_every']} steps and at the end" if t.get("eval_every") else "at the end")
    probes = (f"every {t['variance_every']} steps" if t.get("variance_every") else "none") + \
        (", removal sweep " + ("on" if t.get("track_removal") else "off") if t.get("variance_every") else "")
    return [("schemes", ", ".join(s["schemes"])), ("preset", s["preset"]),
            ("model", f"{m['n_layers']} blocks, width {m['d_model']}" if "n_layers" in m else None),
            ("model overrides", s["model_overrides"] or None), ("seeds", s["seeds"]),
            ("data", t.get("data")), ("tokenizer", shown("tokenizer")), ("steps", shown("steps")),
            ("sequence length", shown("seq_len")), ("batch (sequences)", shown("batch_size")),
            ("learning rate", shown("lr", f"{t['lr']:g}")),
            ("warm-up, then cosine to", shown("warmup", f"{warmup}, then lr × {t.get('min_lr_ratio')}")),
            ("held-out evaluation", shown("eval_tokens", evaluation)), ("depth probes", shown("variance_every", probes)),
            ("diagnosis tokens", f"{s['diagnose']['tokens']:,}" if s["diagnose"].get("tokens") else "default")]


def _summary_of(run_dir: Path) -> str:
    path = run_dir / "diagnostics" / "report.json"
    return json.loads(path.read_text()).get("summary", "") if path.is_file() else ""


# ---------------------------------------------------------------------------------------------- a regime sweep
def write_sweep_report(result: dict[str, Any], out: str | Path, measures: tuple[str, ...]) -> dict[str, str]:
    """One figure per measure across the cells of a sweep (``depthlab.compare.sweep``) and ``out/report.html``:
    those figures, then every cell's table (compare's columns, mean ± std over seeds) with a link to its own report."""
    out = Path(out)
    labels = [e["cell"] for e in result["cells"]]
    figs: dict[str, str] = {}
    for key in measures:
        schemes, by_scheme = measure_rows(result)
        series = {s: [(row.get(key), row.get(key + "_std")) for row in by_scheme[s]] for s in schemes}
        if any(m is not None for points in series.values() for m, _ in points):
            title = f"{COLUMNS[key][0]} per cell (mean over seeds, bar: std)"
            figs[key] = P.across_cells(labels, series, COLUMNS[key][0], title, out / f"{key}_across_cells.png").name
    write_text_atomic(out / "report.html", render_sweep(result, out, figs))
    return figs


def render_sweep(result: dict[str, Any], out: Path, figs: dict[str, str]) -> str:
    s = result["settings"]
    sweep = ", ".join(f"{k} ∈ {{{', '.join(str(v) for v in values)}}}" for k, values in result["sweep"].items())
    body = [f"<h1>depthlab compare sweep — {H.esc(', '.join(s['schemes']))} on {H.esc(s['preset'])}</h1>",
            f"<p>{H.esc(sweep)}: {len(result['cells'])} cells, each training every scheme with seeds "
            f"{H.esc(s['seeds'])} on the same data order, then diagnosing them on the same held-out text. "
            "Deepest third = the last max(1, round(L/3)) blocks.</p>"]
    for key, name in figs.items():
        body += [f"<h2>{H.esc(COLUMNS[key][0])}</h2>", H.img(out / name, COLUMNS[key][0])]
    for entry in result["cells"]:
        body.append(f'<h2>cell {H.esc(entry["cell"])} <span class="muted">(<a href="{H.esc(entry["dir"])}/report.html">'
                    "its report</a>)</span></h2>")
        if "error" in entry:
            body.append(f"<p>failed: {H.esc(entry['error'])}</p>")
            continue
        keys = shown_columns(entry["table"])
        body.append(H.table(["scheme", *(COLUMNS[k][0] for k in keys)],
                            [[row["scheme"], *(format_cell(row, k) for k in keys)] for row in entry["table"]]))
    body += ["<h2>Reproduce</h2>", f"<pre>{H.esc(result.get('command') or '(library call)')}</pre>"]
    return H.page(f"depthlab compare sweep — {', '.join(s['schemes'])}", body)
