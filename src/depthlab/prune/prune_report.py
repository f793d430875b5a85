"""The prune report: ``prune.json`` (every number), angular heatmaps before/after, ``report.html``; for blocks and,
with ``--unit attn|mlp``, for sublayers (:func:`units_report`, :func:`write_units_report`), on either engine."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from depthlab.analysis.diagnostics.angular import pair_matrix_to_layout
from depthlab.analysis.diagnostics.summary import ranges
from depthlab.base.fileio import json_safe
from depthlab.base.htmlpage import esc, img, kv_table, page, table
from depthlab.base.metrics import perplexity
from depthlab.base.provenance import versions

log = logging.getLogger(__name__)


def _jsonable(report: dict[str, Any]) -> dict[str, Any]:
    """Angular matrices (tensors) become the diagnose report's layout: matrix[n-1][l-1] = d(x^l, x^{l+n})."""
    out = dict(report)
    out["angular"] = {k: pair_matrix_to_layout(v) if isinstance(v, torch.Tensor) else v
                      for k, v in report["angular"].items()}
    out["angular"]["layout"] = "matrix[n-1][l-1] = d(x^l, x^{l+n}), mean arccos(cos)/pi over held-out tokens"
    out["versions"] = versions()
    return json_safe(out)


def summary_sentence(r: dict[str, Any]) -> str:
    loss, n = r["loss"], r["n_layers"]
    healed = ""
    if loss.get("healed") is not None:
        how = ("the linear heal" if r["heal"].get("mode") == "linear" else f"{r['heal']['steps']} healing steps")
        healed = f", {loss['healed']:.4f} after {how}"
    c0, c1 = r["cost"]["original"], r["cost"]["pruned"]
    latency = f"generation latency x{1 / r['latency']['speedup']:.2f}; " if r.get("latency") else ""
    return (f"Removed blocks {ranges(r['removed_blocks'])} ({r['method']}; {n['original']} -> {n['pruned']} blocks): "
            f"held-out loss {loss['original']:.4f} -> {loss['pruned']:.4f}{healed}; parameters -"
            f"{100 * (1 - c1['params'] / c0['params']):.1f}%, FLOPs/token -"
            f"{100 * (1 - c1['flops_per_token'] / c0['flops_per_token']):.1f}%; "
            f"{latency}export max |Δlogit| {_num(r['export']['max_abs_logit_diff'])}{_generation(r)}.")


def _num(v: float | None, spec: str = ".2e") -> str:
    """A number for the report, or "not measured" (None: e.g. a checkpoint too big to load whole)."""
    return "not measured" if v is None else format(v, spec)


def _generation(r: dict[str, Any]) -> str:
    gen = r.get("generate") or {}
    if not gen:
        return ""
    return (f"; {next(iter(gen.values()))['task']} exact match "
            + " -> ".join(f"{100 * g['acc']:.1f} % ({s})" for s, g in gen.items()))


def _figures(data: dict[str, Any], out: Path) -> dict[str, Path]:
    from depthlab.analysis.plots.diagnostics import angular_heatmap

    label = data["model"].get("label") or data["model"].get("source") or "model"
    figs = {}
    for stage, matrix in data["angular"].items():
        if stage == "layout":
            continue
        figs[stage] = angular_heatmap(matrix, out / f"angular_{stage}.png",
                                      f"Angular distance d(x^l, x^(l+n)), {stage}\n{label}")
    return figs


def _tables(r: dict[str, Any]) -> str:
    stages = [s for s in ("original", "pruned", "healed") if r["loss"].get(s) is not None]
    gen = r.get("generate") or {}
    rows = [(s, f"{r['loss'][s]:.4f}", f"{r['ppl'][s]:.2f}") + ((f"{100 * gen[s]['acc']:.1f} %" if s in gen else "–",)
                                                             if gen else ()) for s in stages]
    c0, c1 = r["cost"]["original"], r["cost"]["pruned"]
    lat = r.get("latency")  # None when the model was streamed (not held in memory)
    cost_rows = [("blocks", c0["n_layers"], c1["n_layers"], f"{c1['n_layers'] / c0['n_layers']:.3f}"),
                 ("parameters", f"{c0['params']:,}", f"{c1['params']:,}", f"{c1['params'] / c0['params']:.3f}"),
                 ("FLOPs / token", f"{c0['flops_per_token']:,}", f"{c1['flops_per_token']:,}",
                  f"{c1['flops_per_token'] / c0['flops_per_token']:.3f}")]
    if lat:
        cost_rows.append((f"generate {lat['pruned']['new_tokens']} tokens (s, {lat['pruned']['device']})",
                          f"{lat['original']['seconds']:.3f}", f"{lat['pruned']['seconds']:.3f}",
                          f"{lat['pruned']['seconds'] / lat['original']['seconds']:.3f}"))
    head = ["model", "loss", "perplexity"] + ([f"exact match ({next(iter(gen.values()))['task']})"] if gen else [])
    return ("<h2>Held-out loss</h2>" + table(head, rows)
            + "<h2>Cost</h2>" + table(["", "original", "pruned", "ratio"], cost_rows))


def render_html(r: dict[str, Any], figs: dict[str, Path]) -> str:
    heat = "".join(f'<div style="flex:1;min-width:300px">{img(p, f"angular distance, {s}")}</div>'
                   for s, p in figs.items())
    exp = r["export"]
    body = [
        f"<h1>depthlab prune: {esc(r['model'].get('label') or r['model'].get('source'))}</h1>",
        f'<p class="summary">{esc(summary_sentence(r))}</p>',
        "<h2>Removed blocks</h2>",
        kv_table([("removed (1-based, original numbering)", ", ".join(map(str, r["removed_blocks"]))),
                  ("kept", ranges(r["kept_blocks"])), ("method", r["method"]),
                  ("held-out data", f"{r['data']['spec']} ({r['data']['split']}, {r['data']['tokens']} tokens)")]),
        _tables(r),
        "<h2>Export check</h2>",
        kv_table([("checkpoint", exp["dir"]), ("loaded as", exp["architecture"]),
                  ("max |Δ logit| vs in-memory pruned model", _num(exp["max_abs_logit_diff"], ".3e")),
                  ("max |Δ logit| vs original with blocks skipped",
                   _num(exp["max_abs_logit_diff_vs_skipping_in_original"], ".3e")),
                  ("generate with KV cache = without", exp["generate_cache_matches_no_cache"]),
                  ("depthlab run directory", r.get("run_dir")),
                  ("engine", (r.get("engine") or {}).get("line"))]),
        "<h2>Angular distance before and after</h2>",
        f'<div style="display:flex;gap:8px;flex-wrap:wrap">{heat}</div>',
        f'<p class="muted">command: <code>{esc(r.get("command"))}</code></p>',
    ]
    return page("depthlab prune", body)


def write_report(report: dict[str, Any], out: str | Path) -> Path:
    """Write ``prune.json``, the heatmaps and ``report.html`` into ``out``; returns the HTML path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = _jsonable(report)
    data["summary"] = report["summary"] = summary_sentence(data)
    (out / "prune.json").write_text(json.dumps(data, indent=2) + "\n")
    figs = _figures(data, out)
    path = out / "report.html"
    path.write_text(render_html(data, figs))
    log.debug("wrote %s", path)
    return path


# ---------------------------------------------------------------------------------------------- sublayers (--unit)
def units_report(target, opts, removed, details, survey, losses, gen, batches, command, original_cost
                 ) -> dict[str, Any]:
    """prune.json's sections of a sublayer prune, on either engine."""
    L = len(survey[opts.unit]["angular"])
    return {
        "model": {k: v for k, v in target.info.items() if k != "config"},
        "unit": opts.unit, "method": details.pop("method"), "removed_blocks": removed,
        "numbering": f"1-based numbers of the blocks whose {opts.unit} sublayer was removed",
        "n_units": {"original": L, "pruned": L - len(removed)},
        "selection": {"remove": opts.remove, "budget": opts.budget, "blocks": opts.blocks, **details},
        "survey": survey,
        "data": {"spec": opts.data, "split": "val", "tokens": survey["tokens"], "seq_len": batches.seq_len},
        "loss": losses, "ppl": {k: perplexity(v) for k, v in losses.items()},
        "generate": gen or None,
        "cost": {"original": original_cost},
        "options": {**asdict(opts), "heal": asdict(opts.heal)}, "command": command,
    }


def write_units_report(report: dict[str, Any], out: Path) -> Path:
    """``prune.json`` and a short ``report.html``: losses, generative accuracy, speeds, the unit survey figure."""
    from depthlab.analysis.plots.diagnostics import sublayer_units

    report["summary"] = units_summary(report)
    (out / "prune.json").write_text(json.dumps(json_safe({**report, "versions": versions()}), indent=2) + "\n")
    fig = sublayer_units(report["survey"], out / "sublayers.png", f"Attention and MLP before pruning ({report['unit']})")
    stages = list(report["loss"])
    gen = report.get("generate") or {}
    rows = [(s, f"{report['loss'][s]:.4f}", f"{report['ppl'][s]:.2f}",
             f"{100 * gen[s]['acc']:.1f} %" if s in gen else "–") for s in stages]
    lat, exp = (report.get("latency") or {}).get("models", {}), report["export"]
    body = [f"<h1>depthlab prune --unit {esc(report['unit'])}</h1>", f'<p class="summary">{esc(report["summary"])}</p>',
            table(["model", "held-out loss", "perplexity", "generative exact match"], rows),
            "<h2>Speed (greedy generation)</h2>",
            table(["model", "seconds", "tokens/s"], [(k, f"{v['seconds']:.3f}", f"{v['tokens_per_s']:.1f}")
                                                     for k, v in lat.items()]) if lat else
            "<p>not measured: the model was read one layer at a time (it needs the model in memory)</p>",
            kv_table([("export max |Δ logit| vs the in-memory pruned model", f"{exp['max_abs_logit_diff']:.2e}"),
                      ("zeroed projections vs zeroed branch outputs", f"{exp['max_abs_logit_diff_zeroed_vs_hooked']:.2e}")]),
            img(fig, "attention and MLP per block"), f'<p class="muted">command: <code>{esc(report.get("command"))}</code></p>']
    path = out / "report.html"
    path.write_text(page("depthlab prune", body))
    return path


def units_summary(r: dict[str, Any]) -> str:
    loss, gen = r["loss"], r.get("generate") or {}
    g = "; generative exact match " + " -> ".join(f"{100 * gen[s]['acc']:.1f} %" for s in gen) if gen else ""
    lat = r.get("latency")
    own = f", depthlab skipping them x{lat['depthlab_speedup']:.2f}" if lat and "depthlab_speedup" in lat else ""
    speed = (f"; generation speed of the export in plain transformers x{lat['export_speedup']:.2f} (the zeroed "
             f"projections still run){own}" if lat else "; speed not measured (streamed: the zeroed projections "
             "still run in plain transformers)")
    return (f"Removed the {r['unit']} sublayer of blocks {r['removed_blocks']} ({r['method']}): held-out loss "
            + " -> ".join(f"{loss[s]:.4f}" for s in loss if loss[s] is not None) + g + speed + ".")
