"""Figures of ``depthlab train``: plain numbers in, one PNG per function, its path out."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from depthlab.analysis.plots._base import colormap, save, subplots


def layer_variance(steps: Sequence[int], variances: Sequence[Sequence[float]], path: str | Path, title: str = "") -> Path:
    """The paper's Fig 4: left, each block's output variance against depth at the probed steps
    (darker = later); right, the variance of the first / middle / last block over training."""
    v = np.asarray(variances, dtype=float)  # (n_probes, L)
    L = v.shape[1]
    fig, (a, b) = subplots(1, 2, figsize=(10, 3.8))
    colors = colormap("viridis")(np.linspace(0.15, 0.95, len(steps)))
    for s, row, c in zip(steps, v, colors):
        a.plot(range(1, L + 1), row, color=c, lw=1.2, label=f"step {s}" if s in (steps[0], steps[-1]) else None)
    a.set_xlabel("block l")
    a.set_ylabel("output variance")
    a.set_yscale("log")
    a.legend(fontsize=8)
    a.grid(alpha=0.3)
    for idx, name in ((0, "block 1"), (L // 2, f"block {L // 2 + 1}"), (L - 1, f"block {L}")):
        b.plot(steps, v[:, idx], label=name)
    b.set_xlabel("step")
    b.set_ylabel("output variance")
    b.set_yscale("log")
    b.legend(fontsize=8)
    b.grid(alpha=0.3)
    fig.suptitle(title or "Layerwise output variance", fontsize=10)
    return save(fig, path)


def loss_curves(train: tuple[Sequence[int], Sequence[float]], evals: tuple[Sequence[int], Sequence[float]],
                path: str | Path, title: str = "") -> Path:
    """Train loss and held-out loss against step."""
    fig, ax = subplots(figsize=(6.4, 3.6))
    ax.plot(*train, lw=1, label="train loss")
    if len(evals[0]):
        ax.plot(*evals, marker="o", ms=3.5, label="held-out loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or "Training", fontsize=10)
    return save(fig, path)


#: Tracked per-block quantities (metrics.jsonl keys) and how figures name them.
TRACKED_LABELS = {
    "layer_angular": "angular distance d(x^l, x^{l+1})",
    "layer_removal": "Δloss when block l is removed",
    "layer_contribution": "‖x^{l+1} − x^l‖ / ‖x^l‖",
    "layer_norm_gain": "mean |γ| of the pre-norms",
    "layer_variance": "output variance",
    "layer_lens_loss": "logit-lens loss after block l",
    "layer_lens_agreement": "logit-lens top-1 = final",
    "layer_grad_norm": "‖grad‖ of block l's parameters",
}
LOG_SCALED = ("layer_variance", "layer_grad_norm")  # drawn as log10


def depth_tracking(series: dict[str, tuple[Sequence[int], Sequence[Sequence[float | None]]]], path: str | Path,
                   title: str = "") -> Path:
    """One block × step heatmap per tracked quantity: how much each block does as training goes on.
    ``series[key] = (steps, rows)``: the probe steps that measured it (the removal sweep runs at every
    few probes only) and, per step, its L values (None: not measured)."""
    keys = [k for k in TRACKED_LABELS if k in series and len(series[k][0]) > 1]
    fig, axes = subplots(1, len(keys), figsize=(3.3 * len(keys), 3.6), squeeze=False)
    for ax, key in zip(axes[0], keys):
        steps, rows = series[key]
        v = np.array([[np.nan if x is None else x for x in row] for row in rows], dtype=float).T  # (L, n)
        log = key in LOG_SCALED
        shown = np.log10(np.clip(v, 1e-12, None)) if log else v
        im = ax.imshow(shown, aspect="auto", origin="lower", cmap="magma",
                       extent=(steps[0], steps[-1], 0.5, v.shape[0] + 0.5))
        ax.set_xlabel("step")
        ax.set_ylabel("block l")
        ax.set_title(("log10 " if log else "") + TRACKED_LABELS[key], fontsize=8)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
    fig.suptitle(title or "Depth over training", fontsize=10)
    return save(fig, path)


def run_figures(run_dir: str | Path) -> list[Path]:
    """``layer_variance.png``, ``depth_tracking.png`` and ``loss.png`` of a run directory, from its
    metrics.jsonl."""
    run_dir = Path(run_dir)
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines() if l.strip()]
    scheme = json.loads((run_dir / "config.json").read_text())["model"]["scheme"]
    out = []
    var = [l for l in lines if "layer_variance" in l]
    if var:
        out.append(layer_variance([l["step"] for l in var], [l["layer_variance"] for l in var],
                                  run_dir / "layer_variance.png", f"Layerwise output variance ({scheme})"))
    tracked = [l for l in lines if "layer_angular" in l]
    if len(tracked) > 1:
        series = {k: ([l["step"] for l in tracked if k in l], [l[k] for l in tracked if k in l]) for k in TRACKED_LABELS}
        out.append(depth_tracking(series, run_dir / "depth_tracking.png", f"Depth over training ({scheme})"))
    tr = [l for l in lines if "loss" in l]
    ev = [l for l in lines if "eval_loss" in l]
    if tr:
        out.append(loss_curves(([l["step"] for l in tr], [l["loss"] for l in tr]),
                               ([l["step"] for l in ev], [l["eval_loss"] for l in ev]), run_dir / "loss.png",
                               f"Training ({scheme})"))
    return out
