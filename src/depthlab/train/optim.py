"""Optimiser and learning-rate schedule: Adam/AdamW, linear warm-up then cosine to min_lr_ratio.

A scheme may declare trainer-side rules (``Scheme.optim_rules``: CompleteP's depth-scaled learning
rates and epsilon): the parameters are grouped by their learning-rate multiplier (``lr_scale`` in each
param group, which ``set_lr`` applies to the schedule), and Adam's epsilon is multiplied by the scheme's
``eps_scale``. A scheme without rules gets one group with multiplier 1, as before.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from depthlab.models.decoder import SchemedModel
from depthlab.models.schemes import OptimRules, get_scheme
from depthlab.train.config import TrainConfig

#: Devices whose Adam(W) step runs as one fused kernel (torch >= 2.4 has CPU and CUDA kernels). On this
#: project's CPU the fused step is 4-10x faster than torch's CPU default (a per-tensor loop); the weights
#: match the foreach implementation to rounding (tests/train/test_fast_path.py; benchmarks/README.md).
FUSED_DEVICES = ("cuda", "cpu")


def optim_rules(model: nn.Module) -> OptimRules:
    """The rules the scheme of a depthlab ``model`` declares (any other module: none, one group)."""
    if not isinstance(model, SchemedModel):
        return OptimRules()
    return get_scheme(model.cfg.scheme).optimizer_rules(model.cfg)


def param_groups(model: nn.Module, rules: OptimRules) -> list[dict]:
    """The model's parameters grouped by learning-rate multiplier, in order of first appearance."""
    groups: dict[float, list[nn.Parameter]] = {}
    for name, param in model.named_parameters():
        groups.setdefault(float(rules.lr_scale(name)), []).append(param)
    return [{"params": params, "lr_scale": scale} for scale, params in groups.items()]


def build_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """Adam or AdamW with the config's betas/eps/weight decay and the scheme's rules (per-group lr multipliers,
    Adam's epsilon); fused kernels on CUDA and CPU; with ``weights`` bf16, the stochastic-rounding Adam of
    :mod:`depthlab.train.bf16_weights`."""
    rules = optim_rules(model)
    kwargs = dict(lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps * rules.eps_scale,
                  weight_decay=cfg.weight_decay)
    if cfg.weights == "bf16":
        from depthlab.train.bf16_weights import StochasticRoundingAdam

        return StochasticRoundingAdam(param_groups(model, rules), **kwargs, decoupled=cfg.optimizer == "adamw",
                                      seed=cfg.seed)
    cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    if device.type in FUSED_DEVICES:
        kwargs["fused"] = True
    return cls(param_groups(model, rules), **kwargs)


def skips_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` can skip an update on the device (torch's fused Adam(W) reads ``found_inf``, as
    GradScaler sets it), so the trainer need not read each loss before stepping."""
    return isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)) and bool(optimizer.defaults.get("fused"))


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of optimizer step ``step`` (0-based): linear warm-up to ``lr`` over the warm-up
    steps, then cosine from ``lr`` down to ``lr * min_lr_ratio`` at the last step."""
    warm, total = cfg.warmup_steps, cfg.steps
    if step < warm:
        return cfg.lr * (step + 1) / warm
    span = max(1, total - warm - 1)
    progress = min(1.0, (step - warm) / span)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.lr * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The scheduled ``lr`` times each group's ``lr_scale`` (1 for groups that carry none)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
