"""``--optimizer muon``: Muon for the hidden matrices, AdamW for every other parameter, as one optimizer.

    split = muon_split(model)                       # {"muon": [names], "adamw": [names]}, by the rule below
    opt = MuonAdamW(groups, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, fused=True)

**The update** (Jordan et al. 2024, "Muon: an optimizer for hidden layers"; the scaling of Liu et al. 2025, "Muon
is Scalable for LLM Training"; PyTorch's ``torch.optim.Muon`` with ``adjust_lr_fn="match_rms_adamw"``, which
this equals bit for bit, tests/train/test_muon.py): for a matrix W (A x B) with gradient G,

    M <- 0.95 M + 0.05 G;   U = 0.95 M + 0.05 G                  (Nesterov momentum, torch's lerp form)
    O = NS5(U)                                                     (≈ U's orthogonal factor, see newton_schulz)
    W <- W (1 - lr wd) - lr * 0.2 sqrt(max(A, B)) * O              (decoupled weight decay; RMS matched to AdamW)

The factor 0.2 sqrt(max(A, B)) gives the update the RMS of a typical AdamW update (Liu et al.), so Muon takes
the run's own learning rate and schedule: one ``--lr`` for both parts, and a scheme's per-parameter lr
multipliers (CompleteP's depth rule) apply to both. Weight decay (``--weight-decay``, default 0 as for Adam)
applies to both parts alike, so a sweep over optimisers changes the optimiser only.

**The split** (:func:`muon_split`), one rule for every scheme and family: the ``weight`` of every ``nn.Linear``
inside the model's block list (attention q/k/v/o and the feed-forward projections) goes to Muon; everything else
to AdamW: the embedding, the output head (tied or not), every norm's gain, biases, and the extra parameters of
schemes with streams or depth mixing (hyper-connections' 2-D mixing matrices ``res`` / ``w_res`` / ``phi``,
AttnRes's queries, gates, scalars), which are not linear maps of the hidden state. The run's config.json records
the split by parameter name (``optimizer_split``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from depthlab.base.errors import ConfigError

#: Keller Jordan's quintic Newton-Schulz coefficients (a, b, c), as in torch.optim.Muon and modded-nanogpt.
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5  # Newton-Schulz iterations
NS_EPS = 1e-7  # floor of the Frobenius norm the input is divided by
MOMENTUM = 0.95  # Nesterov momentum
RMS_MATCH = 0.2  # update RMS of AdamW that Muon's update is scaled to (Liu et al. 2025)

#: What config.json records of the update rule beside the split.
RULE = {"momentum": MOMENTUM, "nesterov": True, "ns_steps": NS_STEPS, "ns_coefficients": list(NS_COEFFICIENTS),
        "lr_adjust": f"{RMS_MATCH} * sqrt(max(rows, cols))", "rest": "adamw"}


def newton_schulz(g: torch.Tensor, steps: int = NS_STEPS, eps: float = NS_EPS,
                  dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The quintic Newton-Schulz iteration X <- aX + (bA + cA²)X, A = XXᵀ, on ``g / ‖g‖_F`` in ``dtype`` (bf16, as
    every Muon implementation runs it; the tests also run it in float64): it maps every singular value of ``g`` into
    about [0.7, 1.2] and keeps the singular vectors, i.e. ≈ the orthogonal factor UVᵀ of ``g = USVᵀ`` without an
    SVD. A tall matrix is iterated transposed (the same result; A is then the smaller Gram matrix)."""
    a, b, c = NS_COEFFICIENTS
    x = g.to(dtype)
    tall = g.size(0) > g.size(1)
    if tall:
        x = x.T
    x.div_(x.norm().clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.T
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, poly, x, beta=a)
    return x.T if tall else x


def update_scale(shape: torch.Size) -> float:
    """The multiplier of the learning rate for a matrix of ``shape``: 0.2 sqrt(max(rows, cols))."""
    return RMS_MATCH * math.sqrt(max(shape[0], shape[1]))


def muon_split(model: nn.Module) -> dict[str, list[str]]:
    """``{"muon": [...], "adamw": [...]}``: the model's parameter names by the module docstring's rule (the weight of
    every ``nn.Linear`` inside the block list to Muon). ConfigError when the blocks hold no such matrix."""
    from depthlab.targets.layers import find_layers

    blocks = find_layers(model)
    hidden = {id(m.weight) for block in blocks for m in block.modules() if isinstance(m, nn.Linear)}
    split: dict[str, list[str]] = {"muon": [], "adamw": []}
    for name, p in model.named_parameters():
        split["muon" if id(p) in hidden and p.ndim == 2 else "adamw"].append(name)
    if not split["muon"]:
        raise ConfigError(f"optimizer 'muon' needs linear layers inside the blocks of {type(model).__name__}, and "
                          "this model has none; give --optimizer adam or adamw")
    return split


class MuonAdamW(torch.optim.AdamW):
    """One optimizer: groups whose ``muon`` is true take the Muon update (module docstring), every other group
    torch's AdamW (fused where the device has the kernel). One optimizer, so the trainer's schedule (``lr`` and
    ``lr_scale`` per group), checkpoints (one state dict: AdamW's moments and Muon's momentum buffers) and the
    sharded state-dict helpers treat it as any other.

    It does not skip an update on the device (no ``found_inf``): the trainer reads each step's loss before
    stepping (:func:`depthlab.train.optim.skips_on_device` says False)."""

    def __init__(self, params: Iterable[dict[str, Any]], *, lr: float, betas: tuple[float, float], eps: float,
                 weight_decay: float, fused: bool | None = None) -> None:
        groups = [{"muon": False, **g} for g in params]
        super().__init__(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused)
        for group in self.param_groups:
            bad = [tuple(p.shape) for p in group["params"] if group["muon"] and p.ndim != 2]
            if bad:
                raise ConfigError(f"Muon updates 2-D matrices only; a Muon group holds parameters of shape {bad[0]}")

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Loading a state dict: AdamW's own pass (its defaults, its ``step`` counters) over its groups only."""
        groups = state["param_groups"]
        super().__setstate__({**state, "param_groups": [g for g in groups if not g.get("muon")]})
        self.param_groups = groups

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        groups = self.param_groups
        self.param_groups = [g for g in groups if not g["muon"]]  # AdamW's step sees its own groups only
        try:
            super().step()
        finally:
            self.param_groups = groups
        for group in groups:
            if group["muon"]:
                self._muon_step(group)
        return loss

    def _muon_step(self, group: dict[str, Any]) -> None:
        """One Muon update of every matrix of ``group`` that has a gradient (the order of torch.optim.Muon's)."""
        lr, wd = group["lr"], group["weight_decay"]
        for p in group["params"]:
            if p.grad is None:
                continue
            grad, state = p.grad, self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(grad, memory_format=torch.preserve_format)
            buf = state["momentum_buffer"]
            buf.lerp_(grad, 1 - MOMENTUM)
            ortho = newton_schulz(grad.lerp(buf, MOMENTUM))
            p.mul_(1 - lr * wd)
            p.add_(ortho, alpha=-lr * update_scale(p.shape))
