"""Initialisation rules: callables ``rule(model)``, each a scheme's ``init`` in the registry.

Every rule starts from LLaMA's: linear and embedding weights ~ N(0, init_std), biases 0, and every
other module with parameters (norm weights, DyT, learnable gains) reset by its own
``reset_parameters`` to its scheme's initial value. Equations: docs/paper.md §2.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # the registry names these rules without loading torch; they run on built models
    from torch import nn

InitRule = Callable[["nn.Module"], None]


def _base(model: nn.Module, std: float) -> None:
    from torch import nn

    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif module is not model and any(True for _ in module.parameters(recurse=False)):
            module.reset_parameters()  # RMSNorm, LayerNorm, DyT, gains: their own initial values


def ffn_out_projections(ffn: nn.Module) -> list[nn.Linear]:
    """The feed-forward's output projection(s): SwiGLU ``down_proj``, GELU MLP ``fc2``."""
    from depthlab.models.nn.mlp import GeluMLP, SwiGLU

    if isinstance(ffn, SwiGLU):
        return [ffn.down_proj]
    if isinstance(ffn, GeluMLP):
        return [ffn.fc2]
    raise TypeError(f"no init rule knows the projections of a {type(ffn).__name__}")


def ffn_in_projections(ffn: nn.Module) -> list[nn.Linear]:
    """The feed-forward's input projection(s): SwiGLU ``gate_proj`` and ``up_proj``, GELU MLP ``fc1``."""
    from depthlab.models.nn.mlp import GeluMLP, SwiGLU

    if isinstance(ffn, SwiGLU):
        return [ffn.gate_proj, ffn.up_proj]
    if isinstance(ffn, GeluMLP):
        return [ffn.fc1]
    raise TypeError(f"no init rule knows the projections of a {type(ffn).__name__}")


def _output_projections(block: nn.Module) -> list[nn.Linear]:
    return [block.attn.o_proj, *ffn_out_projections(block.ffn)]


def init_normal(model: nn.Module) -> None:
    """LLaMA: every weight matrix ~ N(0, init_std)."""
    _base(model, model.cfg.init_std)


def init_scaled(model: nn.Module) -> None:
    """GPT-2 / Megatron: output projections ~ N(0, std / sqrt(2L))."""
    from torch import nn

    init_normal(model)
    std = model.cfg.init_std / math.sqrt(2 * model.cfg.n_layers)
    for block in model.blocks:
        for lin in _output_projections(block):
            nn.init.normal_(lin.weight, mean=0.0, std=std)


def init_depth_scaled(model: nn.Module) -> None:
    """Zhang et al. 2019: output projections of block l ~ N(0, std / sqrt(2l))."""
    from torch import nn

    init_normal(model)
    for block in model.blocks:
        std = model.cfg.init_std / math.sqrt(2 * block.layer)
        for lin in _output_projections(block):
            nn.init.normal_(lin.weight, mean=0.0, std=std)


def deepnorm_beta(n_layers: int) -> float:
    """DeepNet init gain for v, o and FFN weights of decoder-only models: (8L)^(-1/4)."""
    return (8.0 * n_layers) ** -0.25


def init_deepnorm(model: nn.Module) -> None:
    """DeepNet: xavier normal with gain beta=(8L)^-1/4 on v, o and FFN weights; gain 1 on q, k."""
    from torch import nn

    init_normal(model)
    beta = deepnorm_beta(model.cfg.n_layers)
    for block in model.blocks:
        a, f = block.attn, block.ffn
        for lin in (a.q_proj, a.k_proj):
            nn.init.xavier_normal_(lin.weight, gain=1.0)
        for lin in (a.v_proj, a.o_proj, *ffn_in_projections(f), *ffn_out_projections(f)):
            nn.init.xavier_normal_(lin.weight, gain=beta)
