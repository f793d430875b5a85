"""Training with bf16 weights and no fp32 copy (``TrainConfig.weights = "bf16"``; ``finetune --dtype bf16``).

    cast_weights(model)                          # every floating parameter to bf16, in place
    handles = upcast_linears(model)              # on a CPU: each nn.Linear computes in fp32 from its bf16 weight
    optimizer = StochasticRoundingAdam(groups, lr=..., betas=..., eps=..., weight_decay=..., decoupled=True, seed=0)

Mixed precision (``--dtype bf16`` in ``train``) keeps an fp32 master copy of the weights and computes under bf16
autocast: 4 bytes per parameter plus Adam's 8. Here the weights and Adam's two moments are bf16 (6 bytes per
parameter, half as much), and nothing holds the whole model in fp32 at any time:

* **Compute.** The forward runs under bf16 autocast. On a CPU each ``nn.Linear`` instead computes in fp32 from
  its bf16 weight, upcast for the matmul and dropped after: the backward upcasts again rather than keeping the fp32
  copy alive until then. On this project's CPU (AVX2, no bf16 instructions) a bf16 matmul takes a slow path: one
  Llama-3-8B-shaped layer on 256 tokens takes 28.4 s in bf16 and 10.1 s upcast to fp32
  (benchmarks/results/streamed_bf16_vs_fp32_cpu.json), so the upcast is the CPU default; on a GPU the autocast
  bf16 matmul is the fast one.
* **Updates.** An Adam step computes in fp32 one tensor at a time and rounds the new weights and moments to bf16
  *stochastically* (up or down with probability proportional to the distance, so the rounding is unbiased): with
  round-to-nearest, updates smaller than half a bf16 spacing (2^-8 of the weight) are lost every step and
  fine-tuning at small learning rates stalls (Zamirai et al. 2020, "Revisiting BFloat16 Training"; torchao's
  ``bf16_stochastic_round``). The random bits come from a generator seeded by (seed, step, tensor), so a resumed
  run continues exactly.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from depthlab.targets.upcast import upcast_linears

__all__ = ["StochasticRoundingAdam", "cast_weights", "stochastic_round", "upcast_linears"]

#: bf16 is the upper half of an fp32: adding a uniform 16-bit integer below the cut and truncating rounds
#: stochastically.
_LOW_BITS = 1 << 16


def cast_weights(model: nn.Module) -> nn.Module:
    """Every floating parameter of ``model`` to bf16, in place (buffers, such as rotary tables, stay)."""
    for p in model.parameters():
        if p.is_floating_point():
            p.data = p.data.to(torch.bfloat16)
    return model


def stochastic_round(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``x`` (fp32) rounded to bf16 up or down at random, ``E[result] == x`` (non-finite values stay)."""
    x = x.float().contiguous()
    noise = torch.randint(0, _LOW_BITS, x.shape, generator=generator, device=x.device, dtype=torch.int32)
    rounded = ((x.view(torch.int32) + noise) & -_LOW_BITS).view(torch.float32)
    return torch.where(torch.isfinite(rounded), rounded, x).to(torch.bfloat16)  # exact: the low bits are zero


class StochasticRoundingAdam(torch.optim.Optimizer):
    """Adam / AdamW for bf16 parameters: fp32 arithmetic per tensor, weights and moments stored in bf16 by
    stochastic rounding (the module docstring). ``decoupled``: AdamW's weight decay, else Adam's L2 term.
    Param groups may carry ``lr_scale`` (the trainer's schemes' multipliers), applied by the trainer's ``set_lr``."""

    def __init__(self, params: Iterable[Any], lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, decoupled: bool = False, seed: int = 0) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, decoupled=decoupled))
        self.seed = seed

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        assert closure is None, "closures are not supported"
        generator = None
        for group in self.param_groups:
            b1, b2 = group["betas"]
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.bfloat16)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.bfloat16)
                state["step"] += 1
                t = int(state["step"])
                if generator is None:  # one stream per optimizer step, continued tensor after tensor
                    generator = torch.Generator(p.device).manual_seed(self.seed * 1_000_003 + t)
                w, g = p.float(), p.grad.float()
                if wd and not group["decoupled"]:
                    g = g + wd * w
                m = state["exp_avg"].float().mul_(b1).add_(g, alpha=1 - b1)
                v = state["exp_avg_sq"].float().mul_(b2).addcmul_(g, g, value=1 - b2)
                if wd and group["decoupled"]:
                    w.mul_(1 - lr * wd)
                denom = (v / (1 - b2**t)).sqrt_().add_(eps)
                w.addcdiv_(m, denom, value=-lr / (1 - b1**t))
                p.copy_(stochastic_round(w, generator))
                state["exp_avg"].copy_(stochastic_round(m, generator))
                state["exp_avg_sq"].copy_(stochastic_round(v, generator))
