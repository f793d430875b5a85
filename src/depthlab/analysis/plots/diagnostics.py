"""Figures of ``depthlab diagnose``: plain numbers in, one PNG per function, its path out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from depthlab.analysis.plots._base import log_norm, run_color, same_lengths, save, subplots, ticks
from depthlab.base.errors import DepthlabError


def angular_heatmap(matrix: Sequence[Sequence[float | None]], path: str | Path, title: str = "") -> Path:
    """The paper's layout: x = block l, y = n; colour = d(x^l, x^{l+n}) on a log scale (the deep blocks' small
    distances stay readable next to block 1's). ``matrix[n-1][l-1]``: L rows of L values."""
    L = len(matrix)
    if not L or any(len(row) != L for row in matrix):
        raise DepthlabError(f"angular heatmap: the matrix must hold L rows of L values (matrix[n-1][l-1]); got rows of "
                            f"{sorted({len(row) for row in matrix})} values for {L} rows")
    m = np.array([[np.nan if v is None else v for v in row] for row in matrix], dtype=float)
    fig, ax = subplots(figsize=(6.4, 5.2))
    im = ax.imshow(np.ma.masked_invalid(m), origin="lower", cmap="viridis", norm=log_norm(m), aspect="auto",
                   extent=(0.5, L + 0.5, 0.5, L + 0.5), interpolation="nearest")
    ax.set_xlabel("layer l (input of block l)")
    ax.set_ylabel("block size n  (distance to layer l+n)")
    ax.set_xticks(ticks(L))
    ax.set_yticks(ticks(L))
    fig.colorbar(im, ax=ax, label="angular distance  arccos(cos)/π  (log colour scale)")
    ax.set_title(title or "Angular distance d(x^l, x^{l+n})", fontsize=10)
    return save(fig, path)


def adjacent_angular(adjacent: Sequence[float], path: str | Path, threshold: float | None = None, title: str = "",
                     scheme: str | None = None) -> Path:
    """d(x^l, x^{l+1}) per block l: how much each block turns the residual stream (in the scheme's colour)."""
    L = len(adjacent)
    fig, ax = subplots(figsize=(6.4, 3.4))
    ax.plot(range(1, L + 1), adjacent, marker="o", ms=3.5, color=run_color(scheme))
    if threshold is not None:
        ax.axhline(threshold, color="tab:red", ls="--", lw=1, label=f"near-identity threshold {threshold:g}")
        ax.legend(fontsize=8)
    ax.set_xlabel("block l")
    ax.set_ylabel("d(x^l, x^{l+1})")
    ax.set_xticks(ticks(L))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.set_title(title or "Adjacent-layer angular distance", fontsize=10)
    return save(fig, path)


def removal_drop(delta_loss: Sequence[float], path: str | Path, base_loss: float | None = None,
                 delta_acc: Sequence[float] | None = None, title: str = "", scheme: str | None = None) -> Path:
    """Held-out loss increase when block l alone is removed (log scale; in the scheme's colour, grey where removing
    the block lowers the loss), and the accuracy drop."""
    L = same_lengths("removal figure", delta_loss=delta_loss, **({"delta_acc": delta_acc} if delta_acc is not None
                                                                   else {}))
    n = 2 if delta_acc is not None else 1
    fig, axes = subplots(n, 1, figsize=(6.4, 3.2 * n), sharex=True, squeeze=False)
    ax = axes[0, 0]
    d = np.asarray(delta_loss, dtype=float)
    ax.bar(range(1, L + 1), np.clip(np.abs(d), 1e-4, None), color=np.where(d > 0, run_color(scheme), "#b0b0b0"))
    ax.set_yscale("log")
    ax.set_ylabel("|Δ loss| (nats, log; grey: lower)")
    ax.grid(alpha=0.3, axis="y")
    full = f" (full model {base_loss:.3f})" if base_loss is not None else ""
    ax.set_title(title or ("Loss increase when one block is removed" + full),
                 fontsize=10)
    if delta_acc is not None:
        ax2 = axes[1, 0]
        ax2.bar(range(1, L + 1), np.asarray(delta_acc) * 100, color=run_color(scheme))
        ax2.axhline(0, color="k", lw=0.8)
        ax2.set_ylabel("Δ accuracy (points)")
        ax2.grid(alpha=0.3, axis="y")
    axes[-1, 0].set_xlabel("removed block l")
    axes[-1, 0].set_xticks(ticks(L))
    return save(fig, path)


def swap_and_removal(removal: Sequence[float | None], swap: Sequence[float | None], path: str | Path,
                     threshold_nats: float | None = None, title: str = "") -> Path:
    """Per block, the Δloss when it is removed, and per adjacent pair (drawn between its two blocks) the Δloss when the
    two exchange places (symlog; missing values left out); the effective depth's threshold as a dashed line."""
    L = len(removal)
    if len(swap) != max(L - 1, 0):
        raise DepthlabError(f"swap figure: {len(swap)} pairs for {L} blocks (expected {max(L - 1, 0)})")
    fig, ax = subplots(1, 1, figsize=(6.4, 3.4))
    x = np.arange(1, L + 1)
    rem = np.array([np.nan if v is None else v for v in removal], dtype=float)
    ax.bar(x, np.nan_to_num(rem), width=0.6, color="tab:blue", alpha=0.8, label="block l removed")
    sw = np.array([np.nan if v is None else v for v in swap], dtype=float)
    ax.plot(x[:-1] + 0.5, sw, marker="o", ms=4, color="tab:red", label="blocks l, l+1 swapped")
    if threshold_nats is not None:
        ax.axhline(threshold_nats, color="k", ls="--", lw=0.8, label="effective-depth threshold")
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.axhline(0, color="k", lw=0.6)
    ax.set_ylabel("Δ loss (nats, symlog)")
    ax.set_xlabel("block l")
    ax.set_xticks(ticks(L))
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    ax.set_title(title or "Removal and swap of blocks", fontsize=10)
    return save(fig, path)


def variance_growth(variance: Sequence[float], mean_norm: Sequence[float], path: str | Path, title: str = "",
                    scheme: str | None = None) -> Path:
    """Output variance of each block (state x^{l+1}; l = 0 is the embedding) and the residual norm."""
    S = same_lengths("variance figure", variance=variance, mean_norm=mean_norm)
    fig, (a1, a2) = subplots(1, 2, figsize=(9.6, 3.4))
    a1.plot(range(S), variance, marker="o", ms=3.5, color=run_color(scheme))
    a1.set_yscale("log")
    a1.set_xlabel("block l  (0 = embedding output)")
    a1.set_ylabel("variance of output")
    a1.set_title("Layerwise output variance", fontsize=10)
    a2.plot(range(S), mean_norm, marker="o", ms=3.5, color=run_color(scheme))
    a2.set_yscale("log")
    a2.set_xlabel("block l  (0 = embedding output)")
    a2.set_ylabel("mean ‖x‖₂ per token")
    a2.set_title("Residual norm growth", fontsize=10)
    for a in (a1, a2):
        a.set_xticks([0] + ticks(S - 1, 12))
        a.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    return save(fig, path)


def jacobian_heatmaps(matrices: Mapping[int, np.ndarray], path: str | Path, dims: int = 64, title: str = "") -> Path:
    """Fig 5 style: the token-averaged Jacobian of a few blocks (top-left ``dims`` x ``dims``)."""
    layers = sorted(matrices)
    n = len(layers)
    fig, axes = subplots(1, n, figsize=(3.1 * n + 0.6, 3.3), squeeze=False)
    vmax = max(float(np.abs(np.asarray(matrices[l])[:dims, :dims]).max()) for l in layers) or 1.0
    im = None
    for ax, l in zip(axes[0], layers):
        m = np.asarray(matrices[l])[:dims, :dims]
        im = ax.imshow(m, cmap="RdBu_r", vmin=-vmax, vmax=vmax, interpolation="nearest")
        ax.set_title(f"block {l}", fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.85, label="∂y_i/∂x_j")
    fig.suptitle(title or f"Token-averaged block Jacobians (first {dims} dims)", fontsize=10)
    return save(fig, path, layout=False)


def jacobian_summary(layers: Sequence[int], rel_dist: Sequence[float], diag_share: Sequence[float], path: str | Path,
                     rel_dist_per_token: Sequence[float] | None = None, title: str = "") -> Path:
    """Per block: ||J - I||_F / ||I||_F (0 = identity) and the diagonal share of ||J||_F^2."""
    same_lengths("Jacobian summary", layers=layers, rel_dist=rel_dist, diag_share=diag_share,
                 **({"rel_dist_per_token": rel_dist_per_token} if rel_dist_per_token is not None else {}))
    fig, (a1, a2) = subplots(1, 2, figsize=(9.6, 3.4))
    a1.plot(layers, rel_dist, marker="o", ms=3.5, label="token-averaged J")
    if rel_dist_per_token is not None:
        a1.plot(layers, rel_dist_per_token, marker="s", ms=3, ls="--", label="per token, averaged")
        a1.legend(fontsize=8)
    a1.set_xlabel("block l")
    a1.set_ylabel("‖J − I‖_F / ‖I‖_F")
    a1.set_ylim(bottom=0)
    a1.set_title("Distance of the block Jacobian to the identity", fontsize=10)
    a2.plot(layers, diag_share, marker="o", ms=3.5, color="tab:green")
    a2.set_ylim(0, 1.02)
    a2.set_xlabel("block l")
    a2.set_ylabel("Σ J_ii² / ‖J‖_F²")
    a2.set_title("Diagonal share", fontsize=10)
    for a in (a1, a2):
        a.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    return save(fig, path)


def sublayer_units(sublayers: Mapping[str, Mapping[str, Sequence[float]]], path: str | Path, title: str = "") -> Path:
    """Per block, the attention and the MLP side by side: the removal Δloss of each (when measured, symlog) and the
    contribution of each to the residual stream (‖branch‖ / ‖stream‖)."""
    attn, mlp = sublayers["attn"], sublayers["mlp"]
    L = same_lengths("sublayer figure", attn=attn["contribution"], mlp=mlp["contribution"])
    panels = [("contribution", "‖branch‖ / ‖stream‖ (log)")]
    if "delta_loss" in attn:
        panels.insert(0, ("delta_loss", "Δ loss when removed (nats, symlog)"))
    fig, axes = subplots(len(panels), 1, figsize=(6.4, 3.0 * len(panels)), sharex=True, squeeze=False)
    x = np.arange(1, L + 1)
    for ax, (key, label) in zip(axes[:, 0], panels):
        ax.bar(x - 0.2, attn[key], width=0.4, color="tab:blue", label="attention")
        ax.bar(x + 0.2, mlp[key], width=0.4, color="tab:orange", label="MLP")
        if key == "delta_loss":
            ax.set_yscale("symlog", linthresh=1e-3)
            ax.axhline(0, color="k", lw=0.8)
        else:
            ax.set_yscale("log")
        ax.set_ylabel(label, fontsize=9)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    axes[0, 0].set_title(title or "Attention and MLP of each block", fontsize=10)
    axes[-1, 0].set_xlabel("block l")
    axes[-1, 0].set_xticks(ticks(L))
    return save(fig, path)


def logit_lens(lens: Mapping[str, Sequence[float]], path: str | Path, title: str = "") -> Path:
    """The logit lens by layer: held-out loss of each layer's stream decoded by the final norm and head (the final
    model's as a dashed line), and its top-1 agreement with the final layer and KL to it."""
    n = same_lengths("logit lens figure", agreement=lens["agreement"], kl=lens["kl"])
    x = np.arange(n)
    panels = 2 if "loss" in lens else 1
    fig, axes = subplots(panels, 1, figsize=(6.4, 3.0 * panels), sharex=True, squeeze=False)
    if "loss" in lens:
        ax = axes[0, 0]
        ax.plot(x, lens["loss"], marker="o", ms=3, color="tab:blue")
        ax.axhline(lens["loss"][-1], color="k", ls="--", lw=0.8, label=f"final layer {lens['loss'][-1]:.3f}")
        ax.set_ylabel("held-out loss (nats)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    ax = axes[-1, 0]
    ax.plot(x, np.asarray(lens["agreement"]) * 100, marker="o", ms=3, color="tab:green", label="top-1 = final (%)")
    ax.set_ylabel("top-1 agreement with the final layer (%)", fontsize=9)
    ax.set_ylim(0, 102)
    ax.grid(alpha=0.3)
    ax2 = ax.twinx()
    ax2.plot(x, lens["kl"], color="tab:red", ls=":", marker=".", label="KL(final ‖ lens)")
    ax2.set_ylabel("KL(final ‖ lens) (nats)", fontsize=9, color="tab:red")
    axes[0, 0].set_title(title or "Logit lens: each layer decoded by the final norm and head", fontsize=10)
    ax.set_xlabel("residual stream after block i (0 = embeddings)")
    ax.set_xticks(ticks(n))
    return save(fig, path)


def depth_attention_map(weights: Sequence[Sequence[float | None]], readers: Sequence[str], sources: Sequence[str],
                        path: str | Path, title: str = "") -> Path:
    """Attention Residuals' depth map: row = a reader (the input of ``attn l``, ``ffn l`` or the final norm),
    column = a source it may read (the embedding, a sub-layer output or a block sum); blank where the source
    comes after the reader. Left: the softmax weight averaged over the tokens. Right: the same relative to a
    uniform read (weight x number of sources read, log2; 0 = what a plain residual sum would give)."""
    from matplotlib.colors import TwoSlopeNorm

    m = np.array([[np.nan if v is None else v for v in row] for row in weights], dtype=float)
    R, S = m.shape
    rel = np.log2(np.clip(m * np.sum(np.isfinite(m), axis=1, keepdims=True), 1e-6, None))
    lim = max(1.0, float(np.nanmax(np.abs(rel))) if np.isfinite(rel).any() else 1.0)
    fig, axes = subplots(1, 2, figsize=(min(4.0 + 0.4 * S, 22.0), min(2.4 + 0.2 * R, 12.0)))
    step_s, step_r = max(1, S // 24), max(1, R // 24)
    for ax, data, kw, label in ((axes[0], m, dict(cmap="viridis", vmin=0.0, vmax=max(float(np.nanmax(m)), 1e-9)),
                                 "mean softmax weight"),
                                (axes[1], rel, dict(cmap="RdBu_r", norm=TwoSlopeNorm(0.0, -lim, lim)),
                                 "log2(weight x sources read)")):
        im = ax.imshow(np.ma.masked_invalid(data), aspect="auto", interpolation="nearest", **kw)
        ax.set_xticks(range(0, S, step_s), [sources[i] for i in range(0, S, step_s)], rotation=90, fontsize=7)
        ax.set_yticks(range(0, R, step_r), [readers[i] for i in range(0, R, step_r)], fontsize=7)
        ax.set_xlabel("source (what is read)")
        fig.colorbar(im, ax=ax, label=label)
    axes[0].set_ylabel("reader (the input of)")
    axes[0].set_title("weight", fontsize=9)
    axes[1].set_title("against a uniform read (red: more, blue: less)", fontsize=9)
    fig.suptitle(title or "Depth attention: which earlier outputs each layer reads", fontsize=10)
    return save(fig, path)
