"""Figures of ``depthlab theory``: the variance recursions, the gradient bounds, the empirical check."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes

from depthlab.analysis.plots._base import save, scheme_color, subplots
from depthlab.models.schemes import SCHEMES


def _label(name: str) -> str:
    """A scheme's short name from the registry's summary ("Pre-LN: ..." -> "Pre-LN"); other keys as given."""
    return SCHEMES[name].summary.split(":")[0] if name in SCHEMES else name


def _curves(ax: Axes, x: Mapping[str, Sequence[float]] | Sequence[float], ys: Mapping[str, Sequence[float]],
            marker: str | None = None) -> None:
    for name, y in ys.items():
        xs = x[name] if isinstance(x, Mapping) else x
        ax.plot(xs, y, color=scheme_color(name), label=_label(name), marker=marker, ms=4, lw=1.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(frameon=False)


def plot_theory(
    path: str | Path,
    variance: Mapping[str, Sequence[float]],
    gradient_bound: Mapping[str, Sequence[float]],
    emp_variance: Mapping[str, Sequence[float]] | None = None,
    emp_jacobian_depths: Sequence[int] | None = None,
    emp_jacobian_gain: Mapping[str, Sequence[float]] | None = None,
    emp_label: str = "",
) -> Path:
    """2×2 panels: recursion variance, gradient bound (top); empirical variance and ‖∂y_l/∂x_1‖ (bottom).

    ``variance``/``gradient_bound``: scheme -> values at depth 1..L. ``emp_variance``: scheme -> values
    at depth 0..L (index 0 = embedding, drawn as a dotted reference level; the curve shows 1..L).
    ``emp_jacobian_gain``: scheme -> values at ``emp_jacobian_depths``.
    """
    rows = 2 if emp_variance else 1
    fig, axes = subplots(rows, 2, figsize=(11, 4.2 * rows), squeeze=False)
    depth = len(next(iter(variance.values())))
    layers = np.arange(1, depth + 1)

    ax = axes[0][0]
    _curves(ax, layers, variance)
    ax.set(title="Lemma 3.2 / 4.1 recursions", xlabel="layer l", ylabel="σ²_l")
    ax = axes[0][1]
    _curves(ax, layers, gradient_bound)
    ax.set(title="Theorem 3.3 / 4.2 bound on ‖∂y_L/∂x_1‖", xlabel="depth L", ylabel="bound product")

    if emp_variance:
        ax = axes[1][0]
        n = len(next(iter(emp_variance.values())))
        _curves(ax, np.arange(1, n), {k: v[1:] for k, v in emp_variance.items()})
        for v in emp_variance.values():  # embedding variance as a reference level
            ax.axhline(v[0], color="grey", ls=":", lw=1)
        ax.set(title="Measured residual variance", xlabel="block l (output)", ylabel="Var(h_l)")
        ax.text(0.02, 0.97, "dotted: embedding", transform=ax.transAxes, va="top", fontsize=8, color="grey")
    if emp_jacobian_gain and emp_jacobian_depths:
        ax = axes[1][1]
        _curves(ax, list(emp_jacobian_depths), emp_jacobian_gain, marker="o")
        ax.set(title="Measured ‖∂y_l/∂x_1‖ (RMS gain)", xlabel="block l", ylabel="‖Jᵀw‖ / ‖w‖")
    if emp_label:
        fig.text(0.5, 0.005, emp_label, ha="center", fontsize=9, color="#444")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    return save(fig, path, layout=False)
