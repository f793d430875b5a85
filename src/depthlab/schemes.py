"""The scheme registry: the ONE place that maps a scheme name to blocks and an init rule.

Each entry of ``SCHEMES`` says which block class each layer gets, what fills its slots, which
init rule (``depthlab.init``) applies, and how many parameters the scheme adds to plain Pre-LN.
Equations: SPEC.md §2; the paper's Table 1/6/7.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from depthlab.config import ModelConfig
from depthlab.errors import ConfigError, choices
from depthlab.nn.blocks import PostNormBlock, PreNormBlock
from depthlab.nn.norms import ChannelGain, GroupRMSNorm, RMSNorm, ScalarGain, Scale

BlockFactory = Callable[[ModelConfig, int], nn.Module]

#: LNS insertion positions (paper T8) -> the PreNormBlock slots that carry 1/sqrt(l): a ``*_norm``
#: slot gets ``RMSNorm(scale=1/sqrt(l))``, any other slot ``Scale(1/sqrt(l))``.
LNS_SLOTS: dict[str, tuple[str, ...]] = {
    "after-norm": ("attn_norm", "ffn_norm"),  # the method
    "before-norm": ("attn_prescale", "ffn_prescale"),
    "after-branch": ("attn_out", "ffn_out"),
    "after-residual": ("resid_scale",),  # diverges in the paper
    "attn-only": ("attn_norm",),
    "ffn-only": ("ffn_norm",),
}


@dataclass(frozen=True)
class Scheme:
    name: str
    summary: str  # one line, with the paper / source it comes from
    build_block: BlockFactory  # (cfg, l) -> block, l 1-based
    init: str = "normal"  # key of depthlab.init.INIT_RULES
    extra_params: Callable[[ModelConfig], int] = lambda cfg: 0  # parameters added to Pre-LN's count
    uses_lns: bool = False  # honours cfg.lns_position
    post_init: Callable[[nn.Module], None] | None = None  # e.g. Admin's profiling pass


def lns_scale(layer: int) -> float:
    """LayerNorm Scaling factor of block ``layer`` (1-based): 1/sqrt(l)."""
    return 1.0 / math.sqrt(layer)


def deepnorm_alpha(n_layers: int) -> float:
    """DeepNet residual weight for decoder-only models: (2L)^(1/4)."""
    return (2.0 * n_layers) ** 0.25


def deepnorm_beta(n_layers: int) -> float:
    """DeepNet init gain for v, o and FFN weights of decoder-only models: (8L)^(-1/4)."""
    return (8.0 * n_layers) ** -0.25


def layerscale_eps(cfg: ModelConfig) -> float:
    """CaiT's rule: 0.1 up to 18 layers, 1e-5 up to 24, 1e-6 deeper (unless set explicitly)."""
    if cfg.layerscale_init is not None:
        return cfg.layerscale_init
    return 0.1 if cfg.n_layers <= 18 else 1e-5 if cfg.n_layers <= 24 else 1e-6


# ---------------------------------------------------------------------- block factories
def _pre(cfg: ModelConfig, layer: int) -> nn.Module:
    return PreNormBlock(cfg, layer)


def _lns(cfg: ModelConfig, layer: int) -> nn.Module:
    s = lns_scale(layer)
    slots = {slot: RMSNorm(cfg.d_model, cfg.norm_eps, scale=s) if slot.endswith("_norm") else Scale(s)
             for slot in LNS_SLOTS[cfg.lns_position]}
    return PreNormBlock(cfg, layer, **slots)


def _post(cfg: ModelConfig, layer: int) -> nn.Module:
    return PostNormBlock(cfg, layer)


def _mix(cfg: ModelConfig, layer: int) -> nn.Module:
    return _post(cfg, layer) if layer <= cfg.n_post_ln_blocks else _pre(cfg, layer)


def _deepnorm(cfg: ModelConfig, layer: int) -> nn.Module:
    a = deepnorm_alpha(cfg.n_layers)
    return PostNormBlock(cfg, layer, attn_resid=Scale(a), ffn_resid=Scale(a))


def _sandwich(cfg: ModelConfig, layer: int) -> nn.Module:
    return PreNormBlock(cfg, layer, attn_out=RMSNorm(cfg.d_model, cfg.norm_eps), ffn_out=RMSNorm(cfg.d_model, cfg.norm_eps))


def _admin(cfg: ModelConfig, layer: int) -> nn.Module:
    # omega starts at 1 and is set by admin_profile() from a forward pass at init.
    return PostNormBlock(cfg, layer, attn_resid=ChannelGain(cfg.d_model, 1.0), ffn_resid=ChannelGain(cfg.d_model, 1.0))


def _group_ln(cfg: ModelConfig, layer: int) -> nn.Module:
    def norm() -> GroupRMSNorm:
        return GroupRMSNorm(cfg.d_model, cfg.norm_groups, cfg.norm_eps)

    return PreNormBlock(cfg, layer, attn_norm=norm(), ffn_norm=norm())


def _skipinit(cfg: ModelConfig, layer: int) -> nn.Module:
    g = 1.0 / math.sqrt(cfg.n_layers)
    return PreNormBlock(cfg, layer, attn_out=ScalarGain(g), ffn_out=ScalarGain(g))


def _layerscale(cfg: ModelConfig, layer: int) -> nn.Module:
    eps = layerscale_eps(cfg)
    return PreNormBlock(cfg, layer, attn_out=ChannelGain(cfg.d_model, eps), ffn_out=ChannelGain(cfg.d_model, eps))


def admin_profile(model: nn.Module) -> None:
    """Admin (Liu et al. 2020): set omega_i^2 = sum_{j<i} Var f_j from one profiling forward pass.

    Branches are numbered in execution order (attn_1, ffn_1, attn_2, ...); f_0 is the unit-variance
    normalised stream, so omega_1 = 1. Runs on random tokens at init; the omegas stay learnable.
    """
    variances: list[float] = []
    branches = [m for block in model.blocks for m in (block.attn, block.ffn)]
    hooks = [b.register_forward_hook(lambda _m, _i, out: variances.append(out.float().var().item())) for b in branches]
    try:
        gen = torch.Generator().manual_seed(0)
        tokens = torch.randint(model.cfg.vocab_size, (4, min(128, model.cfg.max_seq_len)), generator=gen)
        with torch.no_grad():
            model(tokens.to(next(model.parameters()).device))
    finally:
        for h in hooks:
            h.remove()
    gains = [g for block in model.blocks for g in (block.attn_resid, block.ffn_resid)]
    running = 1.0
    for gain, var in zip(gains, variances):
        gain.init = math.sqrt(running)
        gain.reset_parameters()
        running += var


SCHEMES: dict[str, Scheme] = {
    s.name: s
    for s in [
        Scheme("pre", "Pre-LN: x + f(N(x)); every modern LLM", _pre),
        Scheme("post", "Post-LN: N(x + f(x)); original Transformer", _post),
        Scheme("lns", "LayerNorm Scaling: x + f(N(x) / sqrt(l)); the paper's method", _lns, uses_lns=True),
        Scheme("mix", "Mix-LN: first round(alpha*L) blocks Post-LN, the rest Pre-LN (Li et al. 2024)", _mix),
        Scheme("deepnorm", "DeepNorm: N(alpha*x + f(x)), alpha=(2L)^1/4, init gain (8L)^-1/4 (DeepNet)", _deepnorm,
               init="deepnorm"),
        Scheme("sandwich", "Sandwich-LN: x + N_b(f(N_a(x))) (CogView)", _sandwich,
               extra_params=lambda cfg: 2 * cfg.n_layers * cfg.d_model),
        Scheme("admin", "Admin: N(omega*x + f(x)), omega profiled at init (Liu et al. 2020)", _admin,
               extra_params=lambda cfg: 2 * cfg.n_layers * cfg.d_model, post_init=admin_profile),
        Scheme("group-ln", "Group-LN: Pre-LN whose RMSNorm normalises channel groups separately", _group_ln),
        Scheme("scaled-init", "Scaled Init: Pre-LN, output projections std/sqrt(2L) (GPT-2)", _pre, init="scaled"),
        Scheme("depth-scaled-init", "Depth-Scaled Init: Pre-LN, output projections std/sqrt(2l)", _pre,
               init="depth-scaled"),
        Scheme("skipinit", "SkipInit: Pre-LN, learnable scalar on each branch, init 1/sqrt(L)", _skipinit,
               extra_params=lambda cfg: 2 * cfg.n_layers),
        Scheme("layerscale", "LayerScale: Pre-LN, learnable diag(lambda) on each branch (CaiT)", _layerscale,
               extra_params=lambda cfg: 2 * cfg.n_layers * cfg.d_model),
        Scheme("lns-scaled-init", "LNS + Scaled Init (worse than LNS alone in the paper)", _lns, init="scaled",
               uses_lns=True),
    ]
}


def get_scheme(name: str) -> Scheme:
    if name not in SCHEMES:
        raise ConfigError(f"unknown scheme {name!r}; {choices(SCHEMES)}")
    return SCHEMES[name]
BASELINE_SCHEME = "pre"  # the scheme every comparison is measured against
