"""Depth over training, measured on every checkpoint of long CPU runs (see README.md here).

    python experiments/cpu-depth-over-training/analyze.py [NAME=]RUN_DIR [...] --out experiments/cpu-depth-over-training

For each checkpoint of each run: the same depth probe the trainer logs (depthlab.analysis.diagnostics.probes:
adjacent angular distance, removal Δloss, contribution ‖x^{l+1}−x^l‖/‖x^l‖, pre-norm gain mean|γ|,
output variance) on one fixed held-out batch of the built-in corpus (the six held-out books), plus the
held-out loss of that batch. Writes results.json, depth_over_training.png and gap_over_training.png (for
each pair of runs named ``...pre...`` / ``...lns...``: the Pre-LN / LNS ratio of the deepest third's angular
distance, removal Δloss and contribution against step; 1 is where LNS's deep blocks would have caught up).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from depthlab.analysis.diagnostics.probes import TRACKED, deep_mean, depth_probe
from depthlab.analysis.plots._base import save, subplots
from depthlab.data import eval_token_batches
from depthlab.train import list_checkpoints, load_run

SEQ, N_SEQ = 128, 32  # 4,096 held-out tokens per probe


def probe_run(run: Path, known: dict | None = None) -> dict:
    """Probe every checkpoint of ``run``; ``known``: probes of an earlier analysis to keep (same batch)."""
    out = {}
    batch = None
    config = json.loads((run / "config.json").read_text())
    for ckpt in list_checkpoints(run):
        step = int(ckpt.name.split("-")[1])
        if known and str(step) in known:
            out[step] = known[str(step)]
            continue
        model, tok, _ = load_run(ckpt)
        if batch is None:
            batch = next(iter(eval_token_batches("builtin", tok, N_SEQ * SEQ, SEQ + 1, N_SEQ, split="val")))
        x, y = batch[:, :-1], batch[:, 1:]
        with torch.no_grad():
            loss = float(model(x, labels=y).loss)
        out[step] = {"probe_loss": loss, **depth_probe(model, x, y)}
        print(f"{run.name} step {step}: probe loss {loss:.4f}, deep angular "
              f"{deep_mean(out[step]['layer_angular']):.4f}, deep removal {deep_mean(out[step]['layer_removal']):.4f}")
    return {"scheme": config["model"]["scheme"], "lr": config["train"]["lr"], "steps": config["train"]["steps"],
            "model": {k: config["model"][k] for k in ("n_layers", "d_model", "n_heads", "d_ff")},
            "probes": out, "tracked": tracked(run)}


def tracked(run: Path) -> dict:
    """What the trainer itself tracked (metrics.jsonl, its 8-sequence probe batch), by step; step 0 included."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: {k: r[k] for k in TRACKED if k in r} for r in rows if "layer_angular" in r}


def _style(name: str, variants: list[str]) -> dict:
    """One colour per variant (the name without its scheme), solid for Pre-LN, dashed for LNS."""
    variant = name.replace("pre", "", 1).replace("lns", "", 1).strip("-") or "preset"
    if variant not in variants:
        variants.append(variant)
    return {"color": f"C{variants.index(variant)}", "ls": "--" if "lns" in name else "-"}


def figure(results: dict, path: Path) -> Path:
    keys = ["probe_loss", "layer_angular", "layer_removal", "layer_contribution", "layer_norm_gain"]
    fig, axes = subplots(2, 3, figsize=(13, 7.2))
    axes = axes.ravel()
    variants: list[str] = []
    for name, r in results.items():
        style = _style(name, variants)
        steps = sorted(r["probes"], key=int)
        for ax, k in zip(axes, keys):
            vals = [r["probes"][s][k] if k == "probe_loss" else deep_mean(r["probes"][s][k]) for s in steps]
            ax.plot([int(s) for s in steps], vals, marker="o", ms=3, label=name, **style)
            ax.set_title(k + ("" if k == "probe_loss" else " (deepest third)"), fontsize=9)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        last = r["probes"][steps[-1]]["layer_norm_gain"]
        axes[-1].plot(range(1, len(last) + 1), last, marker="o", ms=2, label=f"{name} (step {steps[-1]})", **style)
    L = max(len(r["probes"][max(r["probes"], key=int)]["layer_norm_gain"]) for r in results.values())
    axes[-1].plot(range(1, L + 1), [math.sqrt(l) for l in range(1, L + 1)], "k:", lw=1, label="sqrt(l)")
    axes[-1].set_yscale("log")
    axes[-1].set_title("pre-norm gain mean|γ| by block, last checkpoint", fontsize=9)
    axes[-1].set_xlabel("block l")
    axes[0].legend(fontsize=7)
    axes[-1].legend(fontsize=6)
    return save(fig, path)


def pairs(results: dict) -> list[tuple[str, str]]:
    """(pre run, lns run) pairs by name: ``pre-32x96`` goes with ``lns-32x96``."""
    return [(n, n.replace("pre", "lns", 1)) for n in results if "pre" in n and n.replace("pre", "lns", 1) in results]


def gap_figure(results: dict, path: Path) -> Path:
    keys = ["layer_angular", "layer_removal", "layer_contribution"]
    fig, axes = subplots(1, len(keys), figsize=(3.8 * len(keys), 3.4))
    for pre, lns in pairs(results):
        steps = sorted(set(results[pre]["probes"]) & set(results[lns]["probes"]), key=int)
        for ax, k in zip(axes, keys):
            ratio = [deep_mean(results[pre]["probes"][s][k]) / deep_mean(results[lns]["probes"][s][k]) for s in steps]
            ax.plot([int(s) for s in steps], ratio, marker="o", ms=3, label=f"{pre} / {lns}")
    for ax, k in zip(axes, keys):
        ax.axhline(1.0, color="k", lw=1, ls="--")
        ax.set_title(f"{k}, deepest third: Pre-LN / LNS", fontsize=8)
        ax.set_xlabel("step")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    return save(fig, path)


def _named(spec: str) -> tuple[str, Path]:
    name, _, path = spec.rpartition("=")
    return (name or Path(path).name), Path(path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=_named, help="run directories, optionally NAME=RUN_DIR")
    p.add_argument("--out", type=Path, default=Path(__file__).parent)
    p.add_argument("--reuse", action="store_true", help="keep the probes already in <out>/results.json")
    args = p.parse_args()
    torch.set_num_threads(1)
    old = json.loads((args.out / "results.json").read_text()) if args.reuse and (args.out / "results.json").is_file() else {}
    results = {name: probe_run(run, old.get(name, {}).get("probes")) for name, run in args.runs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1, default=float) + "\n")
    figure(results, args.out / "depth_over_training.png")
    gap_figure(results, args.out / "gap_over_training.png")
    assert set(TRACKED) <= set(next(iter(next(iter(results.values()))["probes"].values())))
    print(f"wrote results.json, depth_over_training.png and gap_over_training.png in {args.out}")


if __name__ == "__main__":
    main()
