"""Figures of ``depthlab compare``: several schemes side by side (the paper's Fig 3/4/7).

Every function takes ``{scheme: numbers}`` mappings, writes one PNG and returns its path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from depthlab.analysis.plots._base import colormap, log_norm, save, scheme_color, subplots, ticks

Curve = tuple[Sequence[int], Sequence[float]]


def _colors(names) -> dict[str, str]:
    return {name: scheme_color(name) for name in names}


def loss_curves(train: Mapping[str, Curve], evals: Mapping[str, Curve], path: str | Path) -> Path:
    """Training loss (lines) and held-out loss (markers) of every scheme, overlaid."""
    colors = _colors(train)
    fig, ax = subplots(figsize=(7, 4))
    for name, (steps, loss) in train.items():
        ax.plot(steps, loss, lw=1.1, color=colors[name], alpha=0.85, label=f"{name} train")
        if name in evals and len(evals[name][0]):
            ax.plot(*evals[name], "o--", ms=4, lw=1, color=colors[name], label=f"{name} held-out")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats / token)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    ax.set_title("Loss curves", fontsize=10)
    return save(fig, path)


def variance_by_depth(variances: Mapping[str, Sequence[float]], path: str | Path) -> Path:
    """Output variance of every block at the end of training (paper Fig 4, right)."""
    colors = _colors(variances)
    fig, ax = subplots(figsize=(7, 4))
    L = max(len(v) for v in variances.values())
    for name, v in variances.items():
        ax.plot(range(1, len(v) + 1), v, "o-", ms=3.5, color=colors[name], label=name)
    ax.set_yscale("log")
    ax.set_xlabel("block l")
    ax.set_ylabel("output variance of block l")
    ax.set_xticks(ticks(L))
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title("Layerwise output variance after training", fontsize=10)
    return save(fig, path)


def variance_over_training(series: Mapping[str, tuple[Sequence[int], Sequence[Sequence[float]]]],
                           path: str | Path) -> Path:
    """One panel per scheme: each block's output variance against step, darker = deeper block;
    a shared log y-axis so the schemes compare at a glance (paper Fig 4, left)."""
    n = len(series)
    fig, axes = subplots(1, n, figsize=(4.2 * n, 3.8), sharey=True, squeeze=False)
    for ax, (name, (steps, rows)) in zip(axes[0], series.items()):
        v = np.asarray(rows, dtype=float)  # (probes, L)
        L = v.shape[1]
        shades = colormap("viridis")(np.linspace(0.9, 0.05, L))
        for l in range(L):
            ax.plot(steps, v[:, l], color=shades[l], lw=1.1, label=f"block {l + 1}" if l in (0, L - 1) else None)
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_title(name, fontsize=10, color=scheme_color(name))
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("output variance")
    fig.suptitle("Layerwise output variance during training (darker = deeper)", fontsize=10)
    return save(fig, path)


def angular_heatmaps(matrices: Mapping[str, Sequence[Sequence[float | None]]], path: str | Path) -> Path:
    """Angular distance d(x^l, x^{l+n}) per scheme in the paper's layout (x = l, y = n), one log colour scale for
    all (the deep blocks' small distances stay readable next to block 1's)."""
    ms = {k: np.array([[np.nan if x is None else x for x in row] for row in m], dtype=float) for k, m in matrices.items()}
    norm = log_norm(*ms.values())
    n = len(ms)
    fig, axes = subplots(1, n, figsize=(4.6 * n + 0.8, 4.2), squeeze=False)
    im = None
    for ax, (name, m) in zip(axes[0], ms.items()):
        L = m.shape[1]
        im = ax.imshow(np.ma.masked_invalid(m), origin="lower", cmap="viridis", norm=norm, aspect="auto",
                       extent=(0.5, L + 0.5, 0.5, L + 0.5), interpolation="nearest")
        ax.set_xticks(ticks(L, 8))
        ax.set_yticks(ticks(L, 8))
        ax.set_xlabel("layer l")
        ax.set_title(name, fontsize=10, color=scheme_color(name))
    axes[0][0].set_ylabel("block size n")
    fig.colorbar(im, ax=axes[0].tolist(), label="arccos(cos)/π  (log colour scale)", shrink=0.9)
    fig.suptitle("Angular distance between layer l and l+n (darker = more alike)", fontsize=10)
    return save(fig, path, layout=False)


def removal_drops(drops: Mapping[str, Sequence[float]], path: str | Path) -> Path:
    """Held-out loss increase when block l alone is removed, per scheme (paper Fig 7, left)."""
    colors = _colors(drops)
    n = len(drops)
    L = max(len(v) for v in drops.values())
    width = 0.8 / n
    fig, ax = subplots(figsize=(max(7, 0.45 * L * n / 2 + 3), 4))
    for i, (name, v) in enumerate(drops.items()):
        x = np.arange(1, len(v) + 1) + (i - (n - 1) / 2) * width
        ax.bar(x, v, width=width, color=colors[name], label=name)
    ax.set_yscale("symlog", linthresh=1e-2)
    ax.set_xlabel("removed block l")
    ax.set_ylabel("Δ held-out loss (nats)")
    ax.set_xticks(ticks(L))
    ax.axhline(0, color="black", lw=0.6)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    ax.set_title("Performance drop when one block is removed", fontsize=10)
    return save(fig, path)


def tracking_curves(series: Mapping[str, Mapping[str, tuple[Sequence[int], Sequence[float]]]], labels: Mapping[str, str],
                    path: str | Path) -> Path:
    """For each tracked quantity, its deepest-third mean against step, every scheme on one axis: where
    the curves cross is when one scheme's deep blocks start doing more than the other's.
    ``series[key][scheme] = (steps, values)``."""
    keys = list(series)
    fig, axes = subplots(1, len(keys), figsize=(3.4 * len(keys), 3.4), squeeze=False)
    schemes = sorted({s for k in keys for s in series[k]})
    colors = _colors(schemes)
    for ax, key in zip(axes[0], keys):
        for scheme, (steps, values) in series[key].items():
            ax.plot(steps, values, color=colors[scheme], lw=1.4, label=scheme)
        ax.set_xlabel("step")
        ax.set_title(labels.get(key, key) + "\n(deepest third, mean)", fontsize=8)
        ax.grid(alpha=0.3)
        if key == "layer_variance":
            ax.set_yscale("log")
        else:
            ax.ticklabel_format(axis="y", useOffset=False)  # norm gains near 1: 1.0004, not "+1" and 0.0004
    axes[0][0].legend(fontsize=8)
    return save(fig, path)


def across_cells(cells: Sequence[str], series: Mapping[str, Sequence[tuple[float | None, float | None]]], ylabel: str,
                 title: str, path: str | Path) -> Path:
    """One measure of a regime sweep: a cluster per cell, a marker per scheme at its mean over seeds, the bar its
    sample std (when several seeds ran). ``series[scheme] = [(mean, std) per cell]``; a None mean (a failed cell,
    a measure not taken) is left out."""
    colors = _colors(series)
    n = len(series)
    width = 0.4 / max(n, 1)
    fig, ax = subplots(figsize=(max(6.0, 1.3 * len(cells) + 2), 4))
    for i, (name, points) in enumerate(series.items()):
        xs = [c + (i - (n - 1) / 2) * width for c, (m, _) in enumerate(points) if m is not None]
        ms = [m for m, _ in points if m is not None]
        errs = [s or 0.0 for m, s in points if m is not None]
        ax.errorbar(xs, ms, yerr=errs, fmt="o", ms=5, capsize=3, color=colors[name], label=name)
    ax.set_xticks(range(len(cells)))
    ax.set_xlim(-0.6, len(cells) - 0.4)
    ax.set_xticklabels([c.replace(" ", "\n") for c in cells], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    return save(fig, path)
