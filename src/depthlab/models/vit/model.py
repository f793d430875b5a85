"""ViT: patch embedding + class token + positions ─► blocks from the scheme registry ─► norm ─► linear head.

The residual stream at block boundaries is exposed as in ``DecoderLM``: ``hidden_states[0]`` is the
embedding output (input of block 1, after the scheme's ``embed_norm``), ``hidden_states[l]`` the output
of block ``l`` (before the final norm); ``run_blocks`` / ``head`` let the diagnostics reuse a prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from depthlab.base.errors import DepthlabError
from depthlab.models.config import ViTConfig
from depthlab.models.decoder import SchemedModel
from depthlab.models.nn.attention import Attention
from depthlab.models.nn.mlp import GeluMLP
from depthlab.models.nn.norms import GroupLayerNorm, LayerNorm
from depthlab.models.schemes import Parts, get_scheme


def vit_parts(cfg: ViTConfig) -> Parts:
    """A ViT's parts: LayerNorm (scalable, for LNS), bidirectional attention with biases, GELU MLP."""
    d, h = cfg.d_model, cfg.n_heads

    def attention() -> Attention:
        return Attention(d, h, h, d // h, qkv_bias=True, causal=False, out_bias=True)

    return Parts(d, cfg.n_layers, attention, lambda: GeluMLP(d, cfg.d_ff),
                 lambda scale=1.0, dim=None: LayerNorm(dim or d, cfg.norm_eps, scale=scale),
                 lambda groups: GroupLayerNorm(d, groups, cfg.norm_eps))


@dataclass
class ViTOutput:
    logits: torch.Tensor  # (B, num_classes)
    loss: torch.Tensor | None = None  # mean cross-entropy when labels were given
    hidden_states: tuple[torch.Tensor, ...] | None = None  # L+1 tensors (B, T, D), T = patches + 1


class ViT(SchemedModel):
    """pixels ─ patch_embed ─ [cls; patches] + pos_embed ─ embed_norm ─► block_1 … block_L ─► norm ─ pool ─ head."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        scheme = get_scheme(cfg.scheme)
        options, parts = scheme.validate(cfg), vit_parts(cfg)  # type: ignore[arg-type]
        d = cfg.d_model
        self.patch_embed = nn.Conv2d(cfg.channels, d, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.seq_len, d))
        self.embed_norm = scheme.embed_norm(parts, options)  # nn.Identity but for Peri-LN
        self.blocks = nn.ModuleList(scheme.block(parts, options, layer) for layer in cfg.depths)
        self.norm = scheme.final_norm(parts, options)  # never scaled by LNS
        self.classifier = nn.Linear(d, cfg.num_classes)

    # ------------------------------------------------------------------ init
    def init_own(self) -> None:
        """The ViT's own parameters after the scheme's rule: patch embedding, class token, positions."""
        std = self.cfg.init_std
        for p in (self.patch_embed.weight, self.cls_token, self.pos_embed):
            nn.init.trunc_normal_(p, std=std, a=-2 * std, b=2 * std)
        nn.init.zeros_(self.patch_embed.bias)

    # ------------------------------------------------------------------ pieces (used by diagnostics)
    def embed(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) pixels -> (B, T, D) input of block 1 (class token first)."""
        if pixel_values.dim() != 4 or pixel_values.shape[1:] != (self.cfg.channels, self.cfg.image_size,
                                                                 self.cfg.image_size):
            want = (self.cfg.channels, self.cfg.image_size, self.cfg.image_size)
            raise DepthlabError(f"pixel_values must have shape (B, {', '.join(map(str, want))}), "
                                f"got {tuple(pixel_values.shape)}")
        x = self.patch_embed(pixel_values.to(self.patch_embed.weight.dtype)).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.embed_norm(x)

    def run_blocks(self, h: torch.Tensor, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Apply blocks ``start .. stop-1`` (0-based positions) to a residual stream (B, T, D)."""
        for block in self.blocks[start:stop]:
            h = block(h, None)
        return h

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm, pooling and classifier: residual stream (B, T, D) -> logits (B, num_classes)."""
        h = self.norm(h)
        pooled = h[:, 0] if self.cfg.pool == "cls" else h[:, 1:].mean(dim=1)
        return self.classifier(pooled)

    # ------------------------------------------------------------------ forward
    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None,
                output_hidden_states: bool = False) -> ViTOutput:
        h = self.embed(pixel_values)
        hidden = [h] if output_hidden_states else None
        for block in self.blocks:
            h = block(h, None)
            if hidden is not None:
                hidden.append(h)
        logits = self.head(h)
        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        return ViTOutput(logits, loss, tuple(hidden) if hidden is not None else None)

    def profile_input(self, batch: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Random model inputs for profiling passes at init (Admin): ``batch`` images of N(0, 1) pixels."""
        c, s = self.cfg.channels, self.cfg.image_size
        return torch.randn((batch, c, s, s), generator=generator)



def vit_num_params(cfg: ViTConfig) -> int:
    """Parameter count of the ViT ``cfg`` describes, from a meta-device build (no memory, no init)."""
    return ViT.count_params(cfg)


def build_vit(cfg: ViTConfig, device: torch.device | str | None = None) -> ViT:
    """Build and initialise a ViT (:meth:`~depthlab.models.decoder.SchemedModel.build`)."""
    return ViT.build(cfg, device)  # type: ignore[return-value]
