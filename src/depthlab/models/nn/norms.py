"""Norms and the fixed / learnable scalings that schemes slot into a block.

A constant ``scale`` (LNS's 1/sqrt(l)) is a Python float, so state dicts stay those of Pre-LN and meta-device
builds keep it. Before ``torch.compile``, :func:`lift_constants` hands it over as data (a 0-dim buffer, not
saved): compiled, a float literal goes into the generated kernels' source, so every block of LNS got kernels of
its own (on the GPU, each one compiled and tuned: LNS compiled 2-3x longer than Pre-LN); read as data, the L
blocks share one set of kernels, as Pre-LN's do. The numbers do not change.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """RMSNorm as in LLaMA: normalise in fp32, cast back, multiply by the weight.

    ``scale`` is a constant output multiplier: LNS's 1/sqrt(l) when the scaling sits right after the
    norm. A Python float (no parameter, no buffer: state dicts stay those of Pre-LN and meta-device
    builds keep it), applied to the D-vector weight rather than the (B, T, D) output, so LNS costs
    nothing over Pre-LN.
    """

    def __init__(self, dim: int, eps: float = 1e-6, scale: float = 1.0) -> None:
        super().__init__()
        self.eps = eps
        self.scale = self.factor = float(scale)  # factor: what forward multiplies by (lift_constants: a buffer)
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return (self.weight * self.factor) * y.to(x.dtype)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}" + (f", scale={self.scale:.6g}" if self.scale != 1.0 else "")


class LayerNorm(nn.Module):
    """LayerNorm (mean and variance over the last dim, affine weight and bias), with the same constant
    output ``scale`` as RMSNorm: LNS multiplies the whole output, ``(γ ⊙ x̂ + β) · s``, folded into γ and β."""

    def __init__(self, dim: int, eps: float = 1e-6, scale: float = 1.0) -> None:
        super().__init__()
        self.eps = eps
        self.scale = self.factor = float(scale)  # factor: what forward multiplies by (lift_constants: a buffer)
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = (self.weight, self.bias) if self.scale == 1.0 else (self.weight * self.factor, self.bias * self.factor)
        return F.layer_norm(x.float(), (x.shape[-1],), w.float(), b.float(), self.eps).to(x.dtype)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}" + (f", scale={self.scale:.6g}" if self.scale != 1.0 else "")


class GroupLayerNorm(LayerNorm):
    """Group-LN with LayerNorm statistics: ``groups`` contiguous channel groups normalised separately."""

    def __init__(self, dim: int, groups: int, eps: float = 1e-6) -> None:
        super().__init__(dim, eps)
        self.groups = groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = x.float().unflatten(-1, (self.groups, -1))  # (..., G, D/G)
        y = F.layer_norm(g, (g.shape[-1],), eps=self.eps).flatten(-2)
        return ((self.weight * self.factor) * y + self.bias * self.factor).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, groups={self.groups}"


class GroupRMSNorm(RMSNorm):
    """Group-LN: RMS-normalise ``groups`` contiguous channel groups separately (Wu & He 2018)."""

    def __init__(self, dim: int, groups: int, eps: float = 1e-6) -> None:
        super().__init__(dim, eps)
        self.groups = groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = x.float().unflatten(-1, (self.groups, -1))  # (..., G, D/G)
        y = F.rms_norm(g, (g.shape[-1],), eps=self.eps).flatten(-2)
        return (self.weight * self.factor) * y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, groups={self.groups}"


class Scale(nn.Module):
    """Multiply by a constant: LNS's 1/sqrt(l) at the positions other than right after the norm.
    A Python float, not a parameter nor a buffer, so it is absent from the state dict and survives
    meta-device construction (see the module docstring for compiled models)."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = self.factor = float(scale)  # factor: what forward multiplies by (lift_constants: a buffer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor

    def extra_repr(self) -> str:
        return f"{self.scale:.6g}"


class ScalarGain(nn.Module):
    """SkipInit: one learnable scalar on a branch output (shape (1,): FSDP2 cannot shard 0-dim tensors)."""

    def __init__(self, init: float) -> None:
        super().__init__()
        self.init = float(init)
        self.gain = nn.Parameter(torch.full((1,), self.init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gain

    def reset_parameters(self) -> None:
        nn.init.constant_(self.gain, self.init)

    def extra_repr(self) -> str:
        return f"init={self.init:.6g}"


class ChannelGain(nn.Module):
    """LayerScale: a learnable per-channel diag(lambda) on a branch output; Admin's omega."""

    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.init = float(init)
        self.gain = nn.Parameter(torch.full((dim,), self.init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gain

    def reset_parameters(self) -> None:
        nn.init.constant_(self.gain, self.init)

    def extra_repr(self) -> str:
        return f"{self.gain.shape[0]}, init={self.init:.6g}"


def lift_constants(model: nn.Module) -> int:
    """Before ``torch.compile(model)``: every constant ``scale`` other than 1 of this module's norms and scalings
    becomes data, a 0-dim float32 buffer on the model's device (not persistent: the state dict does not change).
    ``scale`` stays the float. The same products as before (the buffer holds the float32 value the literal is
    rounded to); see the module docstring for why. Returns how many were lifted (again: none)."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    lifted = 0
    for module in model.modules():
        if isinstance(module, (RMSNorm, LayerNorm, Scale)) and module.scale != 1.0 and not isinstance(module.factor,
                                                                                                     torch.Tensor):
            del module.factor
            module.register_buffer("factor", torch.tensor(module.scale, dtype=torch.float32, device=device),
                                   persistent=False)
            lifted += 1
    return lifted
