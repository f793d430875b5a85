"""Gradient-Preserving Activation Scaling (GPAS; Chen et al. 2025, arXiv:2506.22049).

After each residual add the stream is scaled down in the forward pass while its gradient passes back
unscaled, through a stop-gradient:

    y = x - SiLU(g) · sg(x)          forward: (1 - SiLU(g)) · x;   ∂L/∂x = ∂L/∂y

so the activations shrink (the deep blocks' updates are no longer dwarfed by the stream) without the
vanishing gradient a plain downscaling would bring. ``g`` is one learnable scalar, zero at init
(SiLU(0) = 0: a fresh GPAS model computes Pre-LN), which receives ``-SiLU'(g) · <sg(x), ∂L/∂y>``.
Equations and source: docs/paper.md §9.10.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class GradientPreservingScale(nn.Module):
    """``x - SiLU(gate) · x.detach()``: one learnable gate (shape (1,): FSDP2 cannot shard 0-dim tensors).

    In the official code one gate per decoder layer serves both sub-layers, so a GPAS block puts the
    same module in its ``resid_scale`` slot, which a :class:`~depthlab.models.nn.blocks.PreNormBlock`
    applies after both of its residual adds."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Parameter(torch.zeros(1))

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.gate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - F.silu(self.gate) * x.detach()
