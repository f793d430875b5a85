"""Optimiser and learning-rate schedule: Adam/AdamW, linear warm-up then cosine to min_lr_ratio."""

from __future__ import annotations

import math

import torch

from depthlab.train.config import TrainConfig

#: Devices whose Adam(W) step runs as one fused kernel (torch >= 2.4 has CPU and CUDA kernels). On this
#: project's CPU the fused step is 4-10x faster than torch's CPU default (a per-tensor loop); the weights
#: match the foreach implementation to rounding (tests/train/test_fast_path.py; benchmarks/README.md).
FUSED_DEVICES = ("cuda", "cpu")


def build_optimizer(params, cfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """Adam or AdamW with the config's betas/eps/weight decay; fused kernels on CUDA and CPU."""
    cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    kwargs = dict(lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps, weight_decay=cfg.weight_decay)
    if device.type in FUSED_DEVICES:
        kwargs["fused"] = True
    return cls(params, **kwargs)


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
    for group in optimizer.param_groups:
        group["lr"] = lr
