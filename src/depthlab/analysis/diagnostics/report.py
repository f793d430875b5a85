"""Write a diagnostics report: ``report.json`` (all numbers), PNG figures, one self-contained HTML
page (figures embedded as base64), and ``jacobians.npz`` (the mean Jacobian matrices drawn)."""

from __future__ import annotations

import html
import json
import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from depthlab.base.fileio import json_safe
from depthlab.base.htmlpage import img, page
from depthlab.base.htmlpage import kv_table as _kv
from depthlab.base.provenance import versions

log = logging.getLogger(__name__)


def make_figures(report: dict[str, Any], out: Path) -> dict[str, str]:
    from depthlab.analysis.plots import diagnostics as P

    name = report["model"].get("label") or report["model"]["name"]
    scheme = report["model"].get("scheme")  # each line in its scheme's colour, as in compare's figures
    figs: dict[str, Path] = {}
    ang = report["angular"]
    figs["angular_heatmap"] = P.angular_heatmap(ang["matrix"], out / "angular_heatmap.png",
                                                f"Angular distance d(x^l, x^(l+n))\n{name}")
    figs["angular_adjacent"] = P.adjacent_angular(ang["adjacent"], out / "angular_adjacent.png",
                                                  report["options"]["identity_threshold"],
                                                  f"Adjacent-layer angular distance\n{name}", scheme)
    var = report["variance"]
    figs["variance"] = P.variance_growth(var["variance"], var["mean_norm"], out / "variance.png", name, scheme)
    if "removal" in report:
        r = report["removal"]
        figs["removal"] = P.removal_drop(r["delta_loss"], out / "removal.png", r["base_loss"],
                                         report.get("mc", {}).get("delta_acc"), scheme=scheme)
    if "swap" in report and "removal" in report:
        eff = report.get("effective_depth") or {}
        figs["swap"] = P.swap_and_removal(report["removal"]["delta_loss"], report["swap"]["delta_loss"],
                                          out / "swap.png", eff.get("threshold_nats"),
                                          f"Removal and swap of blocks\n{name}")
    if "sublayers" in report:
        figs["sublayers"] = P.sublayer_units(report["sublayers"], out / "sublayers.png",
                                             f"Attention and MLP of each block\n{name}")
    if "lens" in report:
        figs["lens"] = P.logit_lens(report["lens"], out / "logit_lens.png", f"Logit lens\n{name}")
    dm = report.get("depth_attention")
    if dm:
        figs["depth_attention"] = P.depth_attention_map(dm["weights"], dm["readers"], dm["sources"],
                                                        out / "depth_attention.png", f"Depth attention\n{name}")
    jac = report.get("jacobian")
    if jac and jac.get("per_layer"):
        pl = jac["per_layer"]
        figs["jacobian_summary"] = P.jacobian_summary(jac["layers"], [p["rel_dist_identity"] for p in pl],
                                                      [p["diag_share"] for p in pl], out / "jacobian_summary.png",
                                                      [p["rel_dist_identity_per_token"] for p in pl], name)
        mats = report.get("_matrices") or {}
        if mats:
            figs["jacobian_heatmaps"] = P.jacobian_heatmaps({l: np.asarray(m) for l, m in mats.items()},
                                                            out / "jacobian_heatmaps.png", report["options"]["heatmap_dims"],
                                                            f"Token-averaged block Jacobians (first "
                                                            f"{report['options']['heatmap_dims']} dims)\n{name}")
    return {k: v.name for k, v in figs.items()}


def write_report(report: dict[str, Any], out_dir: str | Path) -> Path:
    """Write everything under ``out_dir``; returns the path of report.html."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = dict(report)
    mats = report.pop("_matrices", None) or {}
    report.setdefault("created", datetime.now(timezone.utc).isoformat(timespec="seconds"))
    report.setdefault("versions", versions())
    report["figures"] = make_figures({**report, "_matrices": mats}, out)
    if mats:
        np.savez_compressed(out / "jacobians.npz", **{f"block_{l}": np.asarray(m) for l, m in mats.items()})
        report["jacobian"]["matrices_file"] = "jacobians.npz"
    (out / "report.json").write_text(json.dumps(json_safe(report), indent=1) + "\n")
    path = out / "report.html"
    path.write_text(render_html(report, out))
    log.debug("wrote %s", path)
    return path


# ---------------------------------------------------------------------- HTML
def _img(out: Path, name: str | None, alt: str) -> str:
    return img(out / name if name else None, alt)


def _fmt(x: Any, nd: int = 4) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{nd}f}" if abs(x) < 1e5 else f"{x:.3e}"
    return str(x)


def _per_block_table(report: dict[str, Any]) -> str:
    L = len(report["angular"]["adjacent"])
    cols: list[tuple[str, list]] = [("adjacent angular d(x^l, x^{l+1})", report["angular"]["adjacent"]),
                                    ("output variance", report["variance"]["variance"][1:]),
                                    ("norm growth", report["variance"]["norm_growth"])]
    if "removal" in report:
        cols += [("loss without block", report["removal"]["loss"]), ("Δ loss", report["removal"]["delta_loss"])]
    if "swap" in report:
        cols += [("Δ loss, blocks l, l+1 swapped", [*report["swap"]["delta_loss"], None])]
    if "mc" in report and report["mc"].get("delta_acc"):
        cols += [("Δ MC accuracy", report["mc"]["delta_acc"])]
    jac = report.get("jacobian") or {}
    if jac.get("per_layer"):
        by = {l: p for l, p in zip(jac["layers"], jac["per_layer"])}
        cols += [("‖J−I‖/‖I‖", [by.get(l, {}).get("rel_dist_identity") for l in range(1, L + 1)]),
                 ("diag share", [by.get(l, {}).get("diag_share") for l in range(1, L + 1)])]
    head = "<tr><th>block</th>" + "".join(f"<th>{html.escape(c)}</th>" for c, _ in cols) + "</tr>"
    rows = "".join("<tr><td>%d</td>%s</tr>" % (l, "".join(f"<td>{_fmt(v[l - 1])}</td>" for _, v in cols))
                   for l in range(1, L + 1))
    return f'<div class="scroll"><table>{head}{rows}</table></div>'


def _table(index: str, rows: range, cols: list[tuple[str, list]]) -> str:
    head = f"<tr><th>{html.escape(index)}</th>" + "".join(f"<th>{html.escape(c)}</th>" for c, _ in cols) + "</tr>"
    body = "".join("<tr><td>%d</td>%s</tr>" % (i, "".join(f"<td>{_fmt(v[k])}</td>" for _, v in cols))
                   for k, i in enumerate(rows))
    return f'<div class="scroll"><table>{head}{body}</table></div>'


def _sublayer_section(report: dict[str, Any], out: Path, figs: dict[str, str]) -> list[str]:
    """Attention and MLP of each block: the figure and a table."""
    sub = report.get("sublayers")
    if not sub:
        return []
    cols: list[tuple[str, list]] = []
    for unit, label in (("attn", "attention"), ("mlp", "MLP")):
        if "delta_loss" in sub[unit]:
            cols.append((f"{label} Δ loss", sub[unit]["delta_loss"]))
        cols += [(f"{label} contribution", sub[unit]["contribution"]), (f"{label} angular", sub[unit]["angular"])]
    L = len(sub["attn"]["contribution"])
    return ["<h2>Attention and MLP</h2>",
            "<p>Each block's two branches as separate units. Δ loss: the held-out loss with that branch's output zeroed "
            "(what zeroing its output projection does) minus the full model's; contribution: ‖branch‖ / ‖stream it is "
            "added to‖; angular: d(stream before, stream after) of that branch alone, averaged over tokens.</p>",
            _img(out, figs.get("sublayers"), "attention and MLP per block"), _table("block", range(1, L + 1), cols)]


def _lens_section(report: dict[str, Any], out: Path, figs: dict[str, str]) -> list[str]:
    """The logit lens: the figure and a table."""
    lens = report.get("lens")
    if not lens:
        return []
    cols = ([("held-out loss", lens["loss"])] if "loss" in lens else []) + [
        ("top-1 agreement with the final layer", lens["agreement"]), ("KL(final ‖ lens)", lens["kl"])]
    tuned = lens.get("tuned")
    if tuned:  # the same eval half for both lenses
        cols += [("plain lens loss (eval half)", tuned["plain"]["loss"]), ("tuned lens loss (eval half)", tuned["loss"]),
                 ("tuned lens top-1 agreement", tuned["agreement"]), ("tuned lens KL", tuned["kl"])]
    return ["<h2>Logit lens</h2>",
            "<p>The residual stream after each block decoded by the model's own final norm and head, as if the model "
            "stopped there (row 0: the embeddings; the last row is the model itself).</p>",
            _img(out, figs.get("lens"), "logit lens"), _table("after block", range(len(lens["agreement"])), cols)] + (
        [f"<p>Tuned lens: {html.escape(tuned['method'])}; fitted on {tuned['fit_tokens']:,} tokens.</p>"] if tuned else [])


def _swap_section(report: dict[str, Any], out: Path, figs: dict[str, str]) -> list[str]:
    """The swap test beside the removal test, and the effective depth."""
    eff, sw = report.get("effective_depth"), report.get("swap")
    parts = []
    if eff:
        parts += ["<h2>Effective depth</h2>",
                  f"<p><b>{eff['n']} of {eff['n_layers']} blocks ({100 * eff['share']:.0f} %)</b>: those whose removal "
                  f"raises the held-out loss by more than {100 * eff['threshold']:g} % of the model's loss "
                  f"({eff['threshold_nats']:.4f} nats; <code>--effective-threshold</code>): blocks "
                  f"{html.escape(str(eff['blocks']))}.</p>"]
    if sw:
        parts += ["<h2>Swap test</h2>",
                  "<p>Held-out loss when adjacent blocks l and l+1 exchange places (block l+1 applied to x<sup>l</sup>, "
                  "then block l, each with its own weights and call) minus the model's, beside the loss when block l "
                  "is removed. A block that can be removed cheaply but not swapped reads what the block before it "
                  "wrote; one that swaps for free adds an order-insensitive update.</p>",
                  _img(out, figs.get("swap"), "removal and swap")]
    return parts


def _loss_row(loss: dict[str, Any] | None) -> list[tuple[str, Any]]:
    """The held-out loss with the perplexity of an LM or the top-1 accuracy of a classifier."""
    if not loss:
        return []
    if "accuracy" in loss:
        return [("held-out loss / top-1 accuracy", f"{loss['loss']:.4f} / {100 * loss['accuracy']:.2f} %")]
    return [("held-out loss / ppl", f"{loss['loss']:.4f} / {loss['ppl']:.2f}")]


def render_html(report: dict[str, Any], out: Path) -> str:
    m, d, figs = report["model"], report["data"], report.get("figures", {})
    name = m.get("label") or m["name"]
    shape = _kv([("model", m["name"]), ("description", m.get("label")), ("source", m.get("source")),
                 ("kind", m.get("kind")), ("architecture", m.get("architecture")), ("scheme", m.get("scheme")),
                 ("layers", m.get("n_layers")), ("width", m.get("d_model")),
                 ("heads (q / kv)", f"{m.get('n_heads')} / {m.get('n_kv_heads')}"),
                 ("FFN", m.get("d_ff")), ("vocabulary", m.get("vocab_size")),
                 ("parameters", f"{m['n_params']:,}" if m.get("n_params") else None),
                 ("LayerNorm Scaling (HF marker)", m.get("layernorm_scaling")),
                 ("dtype / device", f"{m.get('dtype')} / {m.get('device')}")])
    data = _kv([("data", d["spec"]), ("split", d["split"]), ("tokens evaluated", f"{d['tokens']:,}"
                + (f" (asked for {d['tokens_requested']:,}; the data holds no more)" if d.get("short") else "")),
                ("sequence length", d["seq_len"]), ("batch size", d["batch_size"]),
                *_loss_row(report.get("loss"))])
    parts = [f"<h1>Curse-of-Depth diagnostics — {html.escape(name)}</h1>",
             f'<p class="summary">{html.escape(report["summary"])}</p>',
             "<h2>Model</h2>", shape, "<h2>Data</h2>", data,
             "<h2>Angular distance</h2>",
             "<p>d(x<sup>l</sup>, x<sup>l+n</sup>) = arccos(cos)/π between the input of block l and the input of block l+n "
             "(x<sup>L+1</sup> = output of the last block), averaged over every evaluated token.</p>",
             _img(out, figs.get("angular_heatmap"), "angular distance heatmap"),
             _img(out, figs.get("angular_adjacent"), "adjacent angular distance")]
    if "removal" in report:
        r = report["removal"]
        rem = r.get("removable", {})
        parts += ["<h2>Layer removal</h2>",
                  f"<p>Held-out loss with one block removed (its input passes straight on), full model {r['base_loss']:.4f}. "
                  f"Removable within {rem.get('budget')} nats: <b>{rem.get('k')}</b> block(s) {rem.get('blocks')} "
                  f"({'checked by removing them together' if rem.get('checked') else 'estimated from single removals'}).</p>",
                  _img(out, figs.get("removal"), "removal")]
        if "mc" in report:
            mc = report["mc"]
            parts.append(f"<p>Multiple choice ({html.escape(mc['file'])}, {mc['items']} items): "
                         f"acc {mc['acc']:.3f}, acc_norm {mc['acc_norm']:.3f}.</p>")
    parts += _swap_section(report, out, figs)
    parts += _sublayer_section(report, out, figs) + _lens_section(report, out, figs)
    parts += ["<h2>Variance and residual norm</h2>", _img(out, figs.get("variance"), "variance")]
    if report.get("depth_attention"):
        parts += ["<h2>Depth attention (Attention Residuals)</h2>",
                  f"<p>Which earlier outputs each layer reads: the softmax weight of every reader (the input of each "
                  f"attention and FFN, and of the final norm) on every source before it, averaged over "
                  f"{report['depth_attention']['tokens']:,} tokens. A plain residual stream would weigh them all "
                  f"equally; numbers in report.json (<code>depth_attention</code>).</p>",
                  _img(out, figs.get("depth_attention"), "depth attention map")]
    jac = report.get("jacobian")
    if jac and jac.get("per_layer"):
        parts += ["<h2>Block Jacobians</h2>",
                  f"<p>∂y<sub>t</sub>/∂x<sub>t</sub> of each block at {jac['tokens']} sampled tokens "
                  f"(positions {jac.get('positions')}), "
                  "averaged over the tokens; 0 on the left plot = the identity map.</p>",
                  _img(out, figs.get("jacobian_summary"), "jacobian summary"),
                  _img(out, figs.get("jacobian_heatmaps"), "jacobian heatmaps")]
    parts += ["<h2>Per block</h2>", _per_block_table(report),
              "<h2>Provenance</h2>",
              _kv([("command", report.get("command")), ("engine", (report.get("engine") or {}).get("line")),
                   ("created", report.get("created")), ("seconds", report.get("seconds")),
                   ("versions", ", ".join(f"{k} {v}" for k, v in (report.get("versions") or {}).items()))]),
              '<p class="muted">All numbers: report.json beside this page.</p>']
    return page(f"depthlab diagnose — {name}", (p + "\n" for p in parts if p))
