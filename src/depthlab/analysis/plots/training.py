"""Figures of ``depthlab train``: plain numbers in, one PNG per function, its path out."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.ticker import MaxNLocator

from depthlab.analysis.plots._base import colormap, run_color, save, subplots, ticks
from depthlab.analysis.plots.diagnostics import depth_attention_map


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
                path: str | Path, title: str = "", scheme: str | None = None) -> Path:
    """Train loss (line) and held-out loss (markers) against step, in the scheme's colour."""
    fig, ax = subplots(figsize=(6.4, 3.6))
    ax.plot(*train, lw=1, color=run_color(scheme), alpha=0.85, label="train loss")
    if len(evals[0]):
        ax.plot(*evals, "o--", ms=4, lw=1, color=run_color(scheme), label="held-out loss")
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
}

#: How each heatmap colours its values, and what its title says about it. Block 1 (or the last block's variance)
#: is often 10-1000x the deep blocks', so a linear scale would paint every deep block the same dark colour: the
#: positive quantities get a log scale, the removal Δloss (negative when a block hurts) a symmetric log scale around
#: 0, and the norm gains (which start at 1) a linear scale centred at 1.
HEATMAP_SCALES = {
    "layer_angular": "log", "layer_contribution": "log", "layer_variance": "log",
    "layer_removal": "symlog", "layer_norm_gain": "centred at 1",
}


def _norm(key: str, v: np.ndarray) -> tuple[Any, str]:
    """(matplotlib norm, colour map) of heatmap ``key`` over values ``v`` (see :data:`HEATMAP_SCALES`)."""
    from matplotlib import colors

    finite = v[np.isfinite(v)]
    scale = HEATMAP_SCALES[key]
    if scale == "log":
        positive = finite[finite > 0]
        low, high = (float(positive.min()), float(positive.max())) if positive.size else (1e-3, 1.0)
        return colors.LogNorm(vmin=low, vmax=max(high, low * 1.001)), "magma"
    if scale == "symlog":
        top = float(np.abs(finite).max()) if finite.size else 1.0
        linthresh = max(top * 1e-3, 1e-12)  # three decades below the largest |Δloss| shown on the log part
        return colors.SymLogNorm(linthresh=linthresh, vmin=-top, vmax=top, base=10), "RdBu_r"
    spread = float(np.abs(finite - 1.0).max()) if finite.size else 0.0
    spread = spread or 1e-3
    return colors.TwoSlopeNorm(vcenter=1.0, vmin=1.0 - spread, vmax=1.0 + spread), "PuOr_r"


def _edges(steps: Sequence[int]) -> np.ndarray:
    """Cell edges around each probe step (probes need not be evenly spaced: the last step, removal sweeps)."""
    s = np.asarray(steps, dtype=float)
    if len(s) == 1:
        return np.array([s[0] - 0.5, s[0] + 0.5])
    mid = (s[1:] + s[:-1]) / 2
    return np.concatenate([[s[0] - (mid[0] - s[0])], mid, [s[-1] + (s[-1] - mid[-1])]])


def depth_tracking(series: dict[str, tuple[Sequence[int], Sequence[Sequence[float | None]]]], path: str | Path,
                   title: str = "") -> Path:
    """One block × step heatmap per tracked quantity: how much each block does as training goes on.
    ``series[key] = (steps, rows)``: the probe steps that measured it (the removal sweep runs at every
    few probes only) and, per step, its L values (None: not measured). Colour scales per
    :data:`HEATMAP_SCALES`, each named in its panel's title, so the deep blocks stay readable next to block 1."""
    keys = [k for k in TRACKED_LABELS if k in series and len(series[k][0]) > 1]
    n_blocks = max(len(series[k][1][0]) for k in keys) if keys else 1
    height = 3.6 + max(0.0, (n_blocks - 24) * 0.03)
    fig, axes = subplots(1, len(keys), figsize=(3.5 * len(keys), height), squeeze=False)
    first, last = min(series[k][0][0] for k in keys) if keys else 0, max(series[k][0][-1] for k in keys) if keys else 1
    for ax, key in zip(axes[0], keys):
        steps, rows = series[key]
        v = np.array([[np.nan if x is None else x for x in row] for row in rows], dtype=float).T  # (L, n)
        norm, cmap = _norm(key, v)
        shown = np.ma.masked_invalid(np.where(v > 0, v, np.nan) if HEATMAP_SCALES[key] == "log" else v)
        mesh = ax.pcolormesh(_edges(steps), np.arange(0.5, v.shape[0] + 1), shown, norm=norm, cmap=cmap,
                             shading="flat")
        ax.set_xlim(first, last)  # one step axis for every panel (the removal sweep probes fewer steps)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))
        ax.set_ylabel("block l")
        ax.set_yticks(ticks(v.shape[0]))
        ax.set_title(f"{TRACKED_LABELS[key]}\n({HEATMAP_SCALES[key]} colour scale)", fontsize=8)
        bar = fig.colorbar(mesh, ax=ax, fraction=0.046, pad=0.03)
        if HEATMAP_SCALES[key] == "centred at 1":
            bar.formatter.set_useOffset(False)
            bar.update_ticks()
    fig.suptitle(title or "Depth over training", fontsize=10)
    return save(fig, path)


def run_figures(run_dir: str | Path) -> list[Path]:
    """``layer_variance.png``, ``depth_tracking.png``, ``loss.png`` and (Attention Residuals) ``depth_attention.png``
    of a run directory, from its metrics.jsonl."""
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
    maps = [l for l in lines if "depth_attention" in l]  # Attention Residuals: the last probe's depth map
    if maps:
        dm = maps[-1]["depth_attention"]
        out.append(depth_attention_map(dm["weights"], dm["readers"], dm["sources"], run_dir / "depth_attention.png",
                                       f"Depth attention at step {maps[-1]['step']} ({scheme})"))
    tr = [l for l in lines if "loss" in l]
    ev = [l for l in lines if "eval_loss" in l]
    if tr:
        out.append(loss_curves(([l["step"] for l in tr], [l["loss"] for l in tr]),
                               ([l["step"] for l in ev], [l["eval_loss"] for l in ev]), run_dir / "loss.png",
                               f"Training ({scheme})", scheme))
    return out
