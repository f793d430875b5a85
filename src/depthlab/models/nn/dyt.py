"""Dynamic Tanh (DyT), Zhu, Chen, He, LeCun & Liu 2025, "Transformers without Normalization".

A drop-in replacement for a norm layer: ``DyT(x) = γ ⊙ tanh(α·x) + β`` with one learnable scalar α
(initialised to ``alpha_init``) and per-channel γ (init 1) and β (init 0). No statistics are computed
over the token, so it is element-wise. See docs/paper.md §9.2.
"""

from __future__ import annotations

import torch
from torch import nn


class DyT(nn.Module):
    def __init__(self, dim: int, alpha_init: float = 0.5) -> None:
        super().__init__()
        self.alpha_init = float(alpha_init)
        self.alpha = nn.Parameter(torch.full((1,), self.alpha_init))  # (1,): FSDP2 cannot shard 0-dim
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., D) -> (..., D)
        return self.weight * torch.tanh(self.alpha * x) + self.bias

    def reset_parameters(self) -> None:
        nn.init.constant_(self.alpha, self.alpha_init)
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, alpha_init={self.alpha_init:.6g}"
