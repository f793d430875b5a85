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
upcasting a 128k-row table per call would cost more than it saves). Modules in training mode are left alone:
their gradients belong to the bf16 parameters.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle


def upcast_while_computing(model: nn.Module, compute_dtype: torch.dtype = torch.float32) -> list[RemovableHandle]:
    """Hooks on every ``nn.Linear`` and ``nn.Embedding`` of ``model`` whose weights are not ``compute_dtype``
    (see the module docstring); returns the handles."""
    handles = []
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor) or not weight.is_floating_point() or weight.dtype == compute_dtype:
            continue
        if isinstance(module, nn.Linear):
            handles.append(module.register_forward_pre_hook(_Up(compute_dtype), with_kwargs=True))
            handles.append(module.register_forward_hook(_down))
        elif isinstance(module, nn.Embedding):
            handles.append(module.register_forward_hook(_Cast(compute_dtype)))
    return handles


class _Up:
    """Pre-hook: the module's floating parameters and inputs in ``dtype``; the stored tensors kept aside."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if module.training:
            return None
        stored = {}
        for name, p in module.named_parameters(recurse=False):
            if p.is_floating_point() and p.dtype != self.dtype:
                stored[name] = p.data
                p.data = p.data.to(self.dtype)
        module._depthlab_stored = stored
        return tuple(_cast(a, self.dtype) for a in args), {k: _cast(v, self.dtype) for k, v in kwargs.items()}


def _down(module: nn.Module, args: Any, output: Any) -> None:
    """Post-hook: the stored (bf16) tensors back; the fp32 copies go."""
    for name, data in getattr(module, "_depthlab_stored", {}).items():
        getattr(module, name).data = data
    module._depthlab_stored = {}


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
