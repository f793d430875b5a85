"""Optimiser and learning-rate schedule: Adam/AdamW/Muon, linear warm-up then cosine to min_lr_ratio.

``muon``: Muon for the hidden matrices and AdamW for the rest, one optimizer (:mod:`depthlab.train.muon`, which
states the split rule and the update); the scheme's rules below apply to both parts.

A scheme may declare trainer-side rules (``Scheme.optim_rules``: CompleteP's depth-scaled learning
rates and epsilon): the parameters are grouped by their learning-rate multiplier (``lr_scale`` in each
param group, which ``set_lr`` applies to the schedule), and Adam's epsilon is multiplied by the scheme's
``eps_scale``. A scheme without rules gets one group with multiplier 1, as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

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


def param_groups(model: nn.Module, rules: OptimRules, muon: frozenset[str] = frozenset()) -> list[dict]:
    """The model's parameters grouped by learning-rate multiplier (and, with ``muon``: the names Muon updates, by
    whether Muon updates them), in order of first appearance."""
    groups: dict[tuple[float, bool], list[nn.Parameter]] = {}
    for name, param in model.named_parameters():
        groups.setdefault((float(rules.lr_scale(name)), name in muon), []).append(param)
    return [{"params": params, "lr_scale": scale, **({"muon": is_muon} if muon else {})}
            for (scale, is_muon), params in groups.items()]


def build_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """Adam, AdamW or Muon + AdamW with the config's betas/eps/weight decay and the scheme's rules (per-group lr
    multipliers, Adam's epsilon); fused Adam(W) kernels on CUDA and CPU; with ``weights`` bf16, the
    stochastic-rounding Adam of :mod:`depthlab.train.bf16_weights`."""
    rules = optim_rules(model)
    kwargs = dict(lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps * rules.eps_scale,
                  weight_decay=cfg.weight_decay)
    if cfg.weights == "bf16":
        from depthlab.train.bf16_weights import StochasticRoundingAdam

        return StochasticRoundingAdam(param_groups(model, rules), **kwargs, decoupled=cfg.optimizer == "adamw",
                                      seed=cfg.seed)
    if device.type in FUSED_DEVICES:
        kwargs["fused"] = True
    if cfg.optimizer == "muon":
        from depthlab.train.muon import MuonAdamW, muon_split

        return MuonAdamW(param_groups(model, rules, frozenset(muon_split(model)["muon"])), **kwargs)
    cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    return cls(param_groups(model, rules), **kwargs)


def optimizer_record(cfg: TrainConfig, skeleton: Callable[[], nn.Module]) -> dict[str, Any]:
    """What config.json records of a Muon run's optimizer: ``{"optimizer_split": {"muon": [names], "adamw": [names],
    "rule": ...}}`` from the model's ``skeleton()`` (built on the meta device); nothing for Adam(W). Raises
    ConfigError, before anything is written, for a model Muon cannot train."""
    if cfg.optimizer != "muon":
        return {}
    from depthlab.train.muon import RULE, muon_split

    return {"optimizer_split": {**muon_split(skeleton()), "rule": RULE}}


def skips_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` can skip an update on the device (torch's fused Adam(W) reads ``found_inf``, as
    GradScaler sets it), so the trainer need not read each loss before stepping."""
    return type(optimizer) in (torch.optim.Adam, torch.optim.AdamW) and bool(optimizer.defaults.get("fused"))


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
