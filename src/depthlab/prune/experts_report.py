"""The report of ``prune --unit expert``: ``prune.json`` (every number: the experts removed, each expert's REAP
saliency, routing frequency and gate, losses, cost, the export check) and a short ``report.html``, on either engine."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from depthlab.base.fileio import json_safe
from depthlab.base.htmlpage import esc, kv_table, page, table
from depthlab.base.metrics import perplexity
from depthlab.base.provenance import versions


def experts_report(target: Any, opts: Any, removal: dict[int, list[int]], details: dict[str, Any],
                   scores: dict[str, Any], losses: dict[str, float | None], gen: dict[str, Any], batches: Any,
                   command: str | None, moe: dict[int, Any], kept: int) -> dict[str, Any]:
    """prune.json's sections of an expert prune (the engine fills export, cost, latency, heal, engine, seconds)."""
    n = kept + len(next(iter(removal.values()), []))
    return {
        "model": {k: v for k, v in target.info.items() if k != "config"},
        "unit": "expert", "method": details.pop("method"),
        "removed_experts": {str(b): gone for b, gone in sorted(removal.items())},
        "numbering": "1-based block numbers; experts numbered from 0 as in the original checkpoint's keys (the export "
                     "renumbers the kept ones 0..kept-1 in order)",
        "experts": {"original": n, "pruned": kept, "moe_blocks": sorted(moe),
                    "top_k": moe[min(moe)].top_k, "groups": moe[min(moe)].groups},
        "selection": {"remove": opts.remove, "fraction": opts.fraction, "budget": opts.budget, "experts": opts.experts,
                      **details},
        "scores": scores,
        "data": {"spec": opts.data, "split": "val", "seq_len": batches.seq_len},
        "loss": losses, "ppl": {k: perplexity(v) if v is not None else None for k, v in losses.items()},
        "generate": gen or None,
        "options": {**asdict(opts), "heal": asdict(opts.heal)}, "command": command,
    }


def experts_summary(r: dict[str, Any]) -> str:
    loss, e = r["loss"], r["experts"]
    c0, c1 = r["cost"]["original"], r["cost"]["pruned"]
    healed = f", {loss['healed']:.4f} healed" if loss.get("healed") is not None else ""
    lat = r.get("latency")
    speed = f"; generation latency x{1 / lat['speedup']:.2f}" if lat else ""
    return (f"Removed {e['original'] - e['pruned']} of {e['original']} routed experts from each of "
            f"{len(e['moe_blocks'])} MoE blocks ({r['method']}): held-out loss {loss['original']:.4f} -> "
            f"{loss['pruned']:.4f}{healed}; parameters -{100 * (1 - c1['params'] / c0['params']):.1f}%{speed}; "
            f"export max |Δ logit| {r['export']['max_abs_logit_diff']:.2e}.")


def write_experts_report(report: dict[str, Any], out: Path) -> Path:
    """``prune.json`` and ``report.html``: losses, the experts removed per block, the export check."""
    report["summary"] = experts_summary(report)
    (out / "prune.json").write_text(json.dumps(json_safe({**report, "versions": versions()}), indent=2) + "\n")
    rows = [(s, f"{v:.4f}", f"{report['ppl'][s]:.2f}") for s, v in report["loss"].items() if v is not None]
    scores = report["scores"]["blocks"]
    per_block = [(b, ", ".join(map(str, gone)) or "–",
                  ", ".join(f"{scores[b]['reap'][e]:.3g}" for e in gone) or "–",
                  ", ".join(f"{scores[b]['frequency'][e]:.3f}" for e in gone) or "–")
                 for b, gone in report["removed_experts"].items()]
    exp = report["export"]
    body = [f"<h1>depthlab prune --unit expert ({esc(report['method'])})</h1>",
            f'<p class="summary">{esc(report["summary"])}</p>',
            table(["model", "held-out loss", "perplexity"], rows),
            "<h2>Experts removed</h2>",
            table(["block", "experts", "REAP saliency", "routing frequency"], per_block),
            kv_table([("export loaded as", exp.get("architecture")),
                      ("max |Δ logit| vs the pruned model", f"{exp['max_abs_logit_diff']:.2e}"),
                      ("every MoE block the same count", report["selection"]["same_count"]),
                      ("engine", (report.get("engine") or {}).get("line"))]),
            f'<p class="muted">command: <code>{esc(report.get("command"))}</code></p>']
    path = out / "report.html"
    path.write_text(page("depthlab prune", body))
    return path
