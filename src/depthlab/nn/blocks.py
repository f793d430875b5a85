"""Residual blocks, one class per norm placement. Schemes fill the slots (``nn.Identity`` = off).

Every slot a scheme may fill is a named submodule, so a scheme is a choice of modules, never an
if/elif in ``forward``; and two schemes that share weights (``pre`` and ``lns``) share state-dict keys.
"""

from __future__ import annotations

import torch
from torch import nn

from depthlab.config import ModelConfig
from depthlab.nn.attention import Attention
from depthlab.nn.mlp import SwiGLU
from depthlab.nn.norms import RMSNorm

Rope = tuple[torch.Tensor, torch.Tensor]


def _attention(cfg: ModelConfig) -> Attention:
    return Attention(cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.dim_head, cfg.qkv_bias)


class PreNormBlock(nn.Module):
    """Pre-LN block and its variants (LNS, Sandwich, Group-LN, SkipInit, LayerScale, scaled inits).

        x ─┬─ prescale ─ norm ─ attn ─ out ─┐
           └────────────────────────────── (+) ─ resid_scale ─► h     (same again with ffn)

    LNS (after-norm) uses norms with ``scale=1/sqrt(l)``; its other positions put ``Scale(1/sqrt(l))``
    in ``*_prescale``, ``*_out`` or ``resid_scale``. Sandwich-LN puts a second norm in ``*_out``;
    SkipInit/LayerScale a learnable gain; Group-LN a ``GroupRMSNorm`` in ``*_norm``.
    """

    def __init__(self, cfg: ModelConfig, layer: int, **slots: nn.Module):
        super().__init__()
        self.layer = layer  # 1-based depth index l
        self.attn_prescale = slots.pop("attn_prescale", nn.Identity())
        self.attn_norm = slots.pop("attn_norm", None) or _rms(cfg)
        self.attn = _attention(cfg)
        self.attn_out = slots.pop("attn_out", nn.Identity())
        self.ffn_prescale = slots.pop("ffn_prescale", nn.Identity())
        self.ffn_norm = slots.pop("ffn_norm", None) or _rms(cfg)
        self.ffn = SwiGLU(cfg.d_model, cfg.d_ff)
        self.ffn_out = slots.pop("ffn_out", nn.Identity())
        self.resid_scale = slots.pop("resid_scale", nn.Identity())
        if slots:
            raise TypeError(f"PreNormBlock has no slot(s) {sorted(slots)}")

    def forward(self, x: torch.Tensor, rope: Rope) -> torch.Tensor:  # (B, T, D) -> (B, T, D)
        x = self.resid_scale(x + self.attn_out(self.attn(self.attn_norm(self.attn_prescale(x)), rope)))
        x = self.resid_scale(x + self.ffn_out(self.ffn(self.ffn_norm(self.ffn_prescale(x)))))
        return x


class PostNormBlock(nn.Module):
    """Post-LN block and its variants (DeepNorm's constant alpha, Admin's learnable omega).

        x ─┬─ attn ─┐
           └─ resid ─ (+) ─ norm ─► x'        (same again with ffn)
    """

    def __init__(self, cfg: ModelConfig, layer: int, **slots: nn.Module):
        super().__init__()
        self.layer = layer
        self.attn_resid = slots.pop("attn_resid", nn.Identity())
        self.attn = _attention(cfg)
        self.attn_norm = _rms(cfg)
        self.ffn_resid = slots.pop("ffn_resid", nn.Identity())
        self.ffn = SwiGLU(cfg.d_model, cfg.d_ff)
        self.ffn_norm = _rms(cfg)
        if slots:
            raise TypeError(f"PostNormBlock has no slot(s) {sorted(slots)}")

    def forward(self, x: torch.Tensor, rope: Rope) -> torch.Tensor:  # (B, T, D) -> (B, T, D)
        x = self.attn_norm(self.attn_resid(x) + self.attn(x, rope))
        x = self.ffn_norm(self.ffn_resid(x) + self.ffn(x))
        return x


def _rms(cfg: ModelConfig) -> RMSNorm:
    return RMSNorm(cfg.d_model, cfg.norm_eps)
