"""Depth tracking: how much each block does, measured from one forward on a fixed probe batch.

    probe = depth_probe(model, input_ids, labels)      # {"layer_angular": [L floats], ...}

The trainer calls this at every probe step and appends the lists to ``metrics.jsonl``, so a run shows
*when* deep blocks start (or stop) working. Each quantity is computed by the same accumulators that
``diagnose`` uses on each of its batches (docs/paper.md §5), so on the same checkpoint and batch the
numbers are ``diagnose``'s:

- ``layer_variance``     element variance of block l's output x^{l+1} (Fig. 4);
- ``layer_angular``      d(x^l, x^{l+1}) = arccos(cos)/π averaged over tokens (eq. 1, adjacent pairs);
- ``layer_contribution`` ‖x^{l+1} − x^l‖ / ‖x^l‖ averaged over tokens: how far block l moves the
                         residual stream relative to its size;
- ``layer_norm_gain``    mean |γ| of block l's pre-norm weights (attention and FFN): the knob with which
                         an LNS block can undo its 1/√l (None for blocks without such norms);
- ``layer_removal``      Δloss on the probe batch when block l is skipped (prefix reuse), optional:
                         L partial forwards, the costly part on big models;
- ``depth_attention``    for Attention Residuals only: which earlier sources each sub-layer reads, the
                         readers' softmax weights averaged over the probe's tokens (a dict, not a per-block
                         list: :class:`~depthlab.analysis.diagnostics.depthmap.DepthMap`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from depthlab.analysis.diagnostics.angular import AngularAccumulator, adjacent
from depthlab.analysis.diagnostics.capture import ResidualCapture, find_layers
from depthlab.analysis.diagnostics.depthmap import DepthMap
from depthlab.analysis.diagnostics.removal import RemovalAccumulator
from depthlab.analysis.diagnostics.variance import VarianceAccumulator

TRACKED = ("layer_variance", "layer_angular", "layer_contribution", "layer_norm_gain", "layer_removal")
PRE_NORMS = ("attn_norm", "ffn_norm")  # depthlab block slots; HF Llama: input_/post_attention_layernorm
HF_PRE_NORMS = ("input_layernorm", "post_attention_layernorm")
OTHER_PRE_NORMS = ("ln_1", "ln_2", "attention_norm")  # GPT-2 / nanoGPT blocks; torchtitan's (with ffn_norm)


def contribution(states: list[torch.Tensor]) -> list[float]:
    """‖x^{l+1} − x^l‖₂ / ‖x^l‖₂ per token, averaged over tokens, for l = 1..L (states: L+1 × (B, T, D))."""
    out = []
    for a, b in zip(states[:-1], states[1:]):
        a, b = a.double(), b.double()
        ratio = (b - a).norm(dim=-1) / a.norm(dim=-1).clamp_min(1e-30)
        out.append(float(ratio.mean()))
    return out


def norm_gains(layers: list[nn.Module]) -> list[float | None]:
    """Mean |γ| over the pre-norm weights of each block (both branches together)."""
    gains: list[float | None] = []
    for layer in layers:
        norms = [getattr(layer, n, None) for n in (*PRE_NORMS, *HF_PRE_NORMS, *OTHER_PRE_NORMS)]
        weights = [n.weight for n in norms if n is not None and isinstance(getattr(n, "weight", None), torch.Tensor)]
        gains.append(float(torch.cat([w.detach().abs().float().flatten() for w in weights]).mean()) if weights else None)
    return gains


@torch.no_grad()
def depth_probe(model: nn.Module, input_ids: torch.Tensor, labels: torch.Tensor | None = None, *,
                removal: bool = True, forward: Callable[[torch.Tensor], torch.Tensor] | None = None,
                layers: Sequence[nn.Module] | None = None) -> dict[str, Any]:
    """Every tracked quantity of ``model`` on one batch (``input_ids`` (B, T); ``labels`` (B, T) for
    the removal Δloss). ``forward(ids) -> logits`` defaults to ``model(ids).logits``; ``layers``, the
    blocks in order, to :func:`find_layers` (``depthlab.analysis.monitor`` passes those a user names)."""
    layers = list(find_layers(model) if layers is None else layers)
    L = len(layers)
    capture = ResidualCapture(model, layers, forward or (lambda ids: model(ids).logits))
    depth_map = DepthMap.of(model)
    with depth_map.recording() if depth_map is not None else contextlib.nullcontext():
        logits, states = capture.run(input_ids)
    angular, variance = AngularAccumulator(L + 1), VarianceAccumulator(L + 1)
    angular.update(states)
    variance.update(states)
    out: dict[str, Any] = {
        "layer_variance": variance.result()["variance"][1:],
        "layer_angular": adjacent(angular.mean()),
        "layer_contribution": contribution(states),
        "layer_norm_gain": norm_gains(layers),
    }
    if removal and labels is not None:
        acc = RemovalAccumulator(L)
        acc.update(capture, input_ids, labels, logits, states)
        out["layer_removal"] = acc.result()["delta_loss"]
    if depth_map is not None:
        out["depth_attention"] = depth_map.result()
    return out


def deepest_third(n_layers: int) -> list[int]:
    """Block indices (1-based) of the deepest third: the last max(1, round(L/3)) blocks."""
    k = max(1, round(n_layers / 3))
    return list(range(n_layers - k + 1, n_layers + 1))


def deep_mean(values: list[float | None]) -> float | None:
    """Mean of a per-block list over the deepest third of its blocks (None entries skipped)."""
    tail = [values[l - 1] for l in deepest_third(len(values)) if values[l - 1] is not None]
    return sum(tail) / len(tail) if tail else None
