"""Initialisation rules by name. Init-based schemes (Scaled Init, ...) are rules here, not blocks.

Every rule starts from LLaMA's: linear and embedding weights ~ N(0, init_std), biases 0, norm
weights 1, learnable gains at their scheme's initial value.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from depthlab.errors import ConfigError, choices
from depthlab.nn.norms import ChannelGain, RMSNorm, ScalarGain
from depthlab.schemes import deepnorm_beta


def _base(model: nn.Module, std: float) -> None:
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, (RMSNorm, ScalarGain, ChannelGain)):
            module.reset_parameters()


def _output_projections(block: nn.Module) -> list[nn.Linear]:
    return [block.attn.o_proj, block.ffn.down_proj]


def init_normal(model: nn.Module) -> None:
    _base(model, model.cfg.init_std)


def init_scaled(model: nn.Module) -> None:
    """GPT-2 / Megatron: output projections ~ N(0, std / sqrt(2L))."""
    init_normal(model)
    std = model.cfg.init_std / math.sqrt(2 * model.cfg.n_layers)
    for block in model.blocks:
        for lin in _output_projections(block):
            nn.init.normal_(lin.weight, mean=0.0, std=std)


def init_depth_scaled(model: nn.Module) -> None:
    """Zhang et al. 2019: output projections of block l ~ N(0, std / sqrt(2l))."""
    init_normal(model)
    for block in model.blocks:
        std = model.cfg.init_std / math.sqrt(2 * block.layer)
        for lin in _output_projections(block):
            nn.init.normal_(lin.weight, mean=0.0, std=std)


def init_deepnorm(model: nn.Module) -> None:
    """DeepNet: xavier normal with gain beta=(8L)^-1/4 on v, o and FFN weights; gain 1 on q, k."""
    init_normal(model)
    beta = deepnorm_beta(model.cfg.n_layers)
    for block in model.blocks:
        a, f = block.attn, block.ffn
        for lin in (a.q_proj, a.k_proj):
            nn.init.xavier_normal_(lin.weight, gain=1.0)
        for lin in (a.v_proj, a.o_proj, f.gate_proj, f.up_proj, f.down_proj):
            nn.init.xavier_normal_(lin.weight, gain=beta)


INIT_RULES: dict[str, Callable[[nn.Module], None]] = {
    "normal": init_normal,
    "scaled": init_scaled,
    "depth-scaled": init_depth_scaled,
    "deepnorm": init_deepnorm,
}


@torch.no_grad()
def initialize(model: nn.Module, rule: str) -> None:
    if rule not in INIT_RULES:
        raise ConfigError(f"unknown init rule {rule!r}; {choices(INIT_RULES)}")
    INIT_RULES[rule](model)
