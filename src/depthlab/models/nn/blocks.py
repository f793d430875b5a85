"""Residual blocks, one class per norm placement. Schemes fill the slots (``nn.Identity`` = off).

Every slot a scheme may fill is a named submodule, so a scheme is a choice of modules, never an
if/elif in ``forward``; and two schemes that share weights (``pre`` and ``lns``) share state-dict keys.
A block knows nothing of configs or schemes: the registry (``depthlab.models.schemes``) builds its
attention, feed-forward and norm modules and hands them over.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

Rope = tuple[torch.Tensor, torch.Tensor]
NormFactory = Callable[[], nn.Module]


def _fill(block: nn.Module, slots: dict[str, nn.Module], defaults: dict[str, NormFactory | None]) -> None:
    """Set every slot of ``defaults`` from ``slots`` (or its default: a fresh norm, or ``nn.Identity``)."""
    unknown = sorted(set(slots) - set(defaults))
    if unknown:
        raise TypeError(f"{type(block).__name__} has no slot(s) {unknown}; slots: {', '.join(defaults)}")
    for name, default in defaults.items():
        module = slots.get(name)
        setattr(block, name, module if module is not None else default() if default else nn.Identity())


class PreNormBlock(nn.Module):
    """Pre-LN block and its variants (LNS, Sandwich, Peri-LN, Group-LN, DyT, SkipInit, LayerScale, inits).

        x ─┬─ prescale ─ norm ─ attn ─ out ─┐
           └────────────────────────────── (+) ─ resid_scale ─► h     (same again with ffn)

    LNS (after-norm) uses norms with ``scale=1/sqrt(l)``; its other positions put ``Scale(1/sqrt(l))``
    in ``*_prescale``, ``*_out`` or ``resid_scale``. Sandwich-LN / Peri-LN put a second norm in
    ``*_out``; SkipInit/LayerScale a learnable gain; Group-LN / DyT another module in ``*_norm``.
    """

    SLOTS = ("attn_prescale", "attn_norm", "attn_out", "ffn_prescale", "ffn_norm", "ffn_out", "resid_scale")

    def __init__(self, layer: int, attn: nn.Module, ffn: nn.Module, norm: NormFactory, **slots: nn.Module):
        super().__init__()
        self.layer = layer  # 1-based depth index l (a pruned model keeps its blocks' original l)
        self.attn, self.ffn = attn, ffn
        _fill(self, slots, {s: norm if s.endswith("_norm") else None for s in self.SLOTS})

    def forward(self, x: torch.Tensor, rope: Rope) -> torch.Tensor:  # (B, T, D) -> (B, T, D)
        x = self.resid_scale(x + self.attn_out(self.attn(self.attn_norm(self.attn_prescale(x)), rope)))
        x = self.resid_scale(x + self.ffn_out(self.ffn(self.ffn_norm(self.ffn_prescale(x)))))
        return x


class PostNormBlock(nn.Module):
    """Post-LN block and its variants (Mix-LN's first blocks, DeepNorm's alpha, Admin's omega, KEEL).

        x ─┬─ in ─ attn ─ out ──┐
           └─ resid ────────── (+) ─ norm ─► x'        (same again with ffn)

    KEEL puts a norm in ``*_in`` (LN(alpha·x + F(LN(x)))) and alpha = 2L in ``*_resid``.
    """

    SLOTS = ("attn_in", "attn_resid", "attn_out", "attn_norm", "ffn_in", "ffn_resid", "ffn_out", "ffn_norm")

    def __init__(self, layer: int, attn: nn.Module, ffn: nn.Module, norm: NormFactory, **slots: nn.Module):
        super().__init__()
        self.layer = layer
        self.attn, self.ffn = attn, ffn
        _fill(self, slots, {s: norm if s.endswith("_norm") else None for s in self.SLOTS})

    def forward(self, x: torch.Tensor, rope: Rope) -> torch.Tensor:  # (B, T, D) -> (B, T, D)
        x = self.attn_norm(self.attn_resid(x) + self.attn_out(self.attn(self.attn_in(x), rope)))
        x = self.ffn_norm(self.ffn_resid(x) + self.ffn_out(self.ffn(self.ffn_in(x))))
        return x


class HybridNormBlock(nn.Module):
    """HybridNorm (Zhuo et al. 2025): QKV-norm inside the attention, Post-Norm around the FFN.

        x ─┬─ attn (q, k, v normalised per head) ─┐
           └─────────────────────────────────── (+) ─ ffn_norm ─┬─ ffn ─┐
                                                                 └──── (+) ─► x'

    The attention reads the raw stream (its q / k / v norms are slots of the attention module), and the
    FFN sub-layer is ``N(h) + F(N(h))``: the stream itself is replaced by its normalised form, as in the
    authors' OLMo code (``ffn_norm`` with ``ffn_residual_after_norm``)."""

    def __init__(self, layer: int, attn: nn.Module, ffn: nn.Module, ffn_norm: nn.Module) -> None:
        super().__init__()
        self.layer = layer
        self.attn, self.ffn, self.ffn_norm = attn, ffn, ffn_norm

    def forward(self, x: torch.Tensor, rope: Rope) -> torch.Tensor:  # (B, T, D) -> (B, T, D)
        h = self.ffn_norm(x + self.attn(x, rope))
        return h + self.ffn(h)
