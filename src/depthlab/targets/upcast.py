"""bf16 weights, fp32 arithmetic, no fp32 copy of the model: each linear layer's weights are upcast while it
computes and dropped after.

    handles = upcast_while_computing(model)       # model in bf16 on a CPU; forward passes now compute in fp32
    for h in handles: h.remove()                  # back to bf16 arithmetic

On a CPU without bf16 instructions (this project's AVX2 AMD EPYC) a bf16 matmul takes a slow path: one
Llama-3-8B-shaped decoder layer on 256 tokens takes 28.4 s in bf16 and 10.1 s upcast to fp32, the upcast
included (benchmarks/results/streamed_bf16_vs_fp32_cpu.json). ``load_target(..., dtype=bfloat16)`` on a CPU
therefore keeps the weights in bf16 (half the memory) and computes like the layer-streamed engine does: its
numbers are those of the fp32 model holding the bf16-rounded weights, whichever engine ran. At most one linear
layer's weights exist in fp32 at a time. Embedding outputs are cast up (a lookup needs no arithmetic, and
upcasting a 128k-row table per call would cost more than it saves). Each linear layer's forward is swapped for
an autograd function (:func:`upcast_linears`) that saves the bf16 weight, so the same mechanism trains with bf16
weights (``depthlab.train.bf16_weights``): gradients arrive in the parameters' bf16.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.hooks import RemovableHandle


def upcast_while_computing(model: nn.Module, compute_dtype: torch.dtype = torch.float32
                           ) -> list[RemovableHandle | _Restore]:
    """Hooks on every ``nn.Linear`` and ``nn.Embedding`` of ``model`` whose weights are not ``compute_dtype``
    (see the module docstring); returns the handles."""
    handles = []
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor) or not weight.is_floating_point() or weight.dtype == compute_dtype:
            continue
        if isinstance(module, nn.Linear):
            handles += upcast_linears(module)
        elif isinstance(module, nn.Embedding):
            handles.append(module.register_forward_hook(_Cast(compute_dtype)))
    return handles


class _UpcastLinear(torch.autograd.Function):
    """``F.linear`` in fp32 from a low-precision weight; saves that weight (not an fp32 copy) for the backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.bias_dtype, ctx.x_dtype = None if bias is None else bias.dtype, x.dtype
        with torch.autocast(x.device.type, enabled=False):
            return F.linear(x.float(), weight.float(), None if bias is None else bias.float())

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        grad = grad.float()
        with torch.autocast(grad.device.type, enabled=False):
            gx = grad @ weight.float() if ctx.needs_input_grad[0] else None
            gw = grad.reshape(-1, grad.shape[-1]).T @ x.reshape(-1, x.shape[-1]).float() if ctx.needs_input_grad[1] else None
        gb = grad.reshape(-1, grad.shape[-1]).sum(0).to(ctx.bias_dtype) if ctx.bias_dtype and ctx.needs_input_grad[2] else None
        return (None if gx is None else gx.to(ctx.x_dtype), None if gw is None else gw.to(weight.dtype), gb)


def _upcast_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return _UpcastLinear.apply(x, self.weight, self.bias)


class _Restore:
    """Undoes one :func:`upcast_linears` swap (a handle like torch's hooks')."""

    def __init__(self, module: nn.Linear) -> None:
        self.module = module

    def remove(self) -> None:
        self.module.__dict__.pop("forward", None)


def upcast_linears(model: nn.Module) -> list[_Restore]:
    """Each low-precision ``nn.Linear`` of ``model`` computes in fp32 from its stored weight, in inference and in
    training (the backward upcasts again instead of keeping an fp32 copy alive); returns handles whose
    ``remove()`` undoes it."""
    handles: list[_Restore] = []
    for module in model.modules():
        if isinstance(module, nn.Linear) and module.weight.dtype in (torch.bfloat16, torch.float16):
            module.forward = _upcast_forward.__get__(module)  # an instance attribute: nn.Module.__call__ uses it
            handles.append(_Restore(module))
    return handles


class _Cast:
    """Post-hook: a floating output in ``dtype``."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __call__(self, module: nn.Module, args: Any, output: Any) -> Any:
        return _cast(output, self.dtype)


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
        return value.to(dtype)
    return value
