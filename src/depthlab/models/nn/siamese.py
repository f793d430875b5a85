"""SiameseNorm (Li et al. 2026, arXiv:2602.08064): a Pre-Norm-like and a Post-Norm-like stream that share
every block. Each sub-layer reads a mix of the two streams and adds its output to both:

    x = N_post(x)                                 the Post-Norm-like stream is normalised before each use
    z = f( N_in( x + N_pre(y) ) )                 the branch reads both streams
    x = x + z / c,   y = y + z                    c = sqrt(2l): the Post-Norm-like stream gets a damped update

and, after the last block, ``N_final( N_x(x) + N_y(y) )`` feeds the head. Both streams start as the
embedding. The form and ``c`` follow the authors' DeiT / DiT implementation (github.com/Qwen-Applications/
SiameseNorm, "post-pre"). Equations: docs/paper.md §9.11.

**The interface** is mHC's (``depthlab.models.nn.hyper``): the two streams travel side by side as one
tensor (B, T, 2·D), the Pre-Norm-like stream y in channels 0 .. D-1 and the Post-Norm-like stream x in
D .. 2D-1; :class:`~depthlab.models.nn.hyper.StreamExpand` copies the embedding into both, and
:class:`SiameseCollapse` is the final norm.
"""

from __future__ import annotations

import math

import torch
from torch import nn

Rope = tuple[torch.Tensor, torch.Tensor]


class SiameseBlock(nn.Module):
    """One block of SiameseNorm over the state (B, T, 2·D) = [y (Pre-Norm-like) | x (Post-Norm-like)].

        y ──────────────┬─ N_pre ─┐                     ┌──(+)─► y'
        x ─ N_post ─────┼─────────(+)─ N_in ─ f ─── z ──┤
                        └──────────────────────────────(+ z/c)─► x'        (attention, then FFN)
    """

    SLOTS = ("attn_post", "attn_pre", "attn_in", "ffn_post", "ffn_pre", "ffn_in")

    def __init__(self, layer: int, attn: nn.Module, ffn: nn.Module, **norms: nn.Module) -> None:
        super().__init__()
        missing = sorted(set(self.SLOTS) - set(norms)) + sorted(set(norms) - set(self.SLOTS))
        if missing:
            raise TypeError(f"SiameseBlock needs exactly the norms {', '.join(self.SLOTS)}; wrong: {missing}")
        self.layer = layer  # 1-based depth l
        self.attn, self.ffn = attn, ffn
        for name in self.SLOTS:
            setattr(self, name, norms[name])
        self.c = math.sqrt(2 * layer)  # the Post-Norm-like stream's damping, a Python float

    def forward(self, s: torch.Tensor, rope: Rope | None) -> torch.Tensor:  # (B, T, 2D) -> (B, T, 2D)
        y, x = s.chunk(2, dim=-1)
        x = self.attn_post(x)
        z = self.attn(self.attn_in(x + self.attn_pre(y)), rope)
        x, y = x + z / self.c, y + z
        x = self.ffn_post(x)
        z = self.ffn(self.ffn_in(x + self.ffn_pre(y)))
        x, y = x + z / self.c, y + z
        return torch.cat((y, x), dim=-1)

    def extra_repr(self) -> str:
        return f"layer={self.layer}, c={self.c:.6g}"


class SiameseCollapse(nn.Module):
    """(B, T, 2·D) -> (B, T, D): ``final( post(x) + pre(y) )``, the read-out of the two streams."""

    def __init__(self, pre: nn.Module, post: nn.Module, final: nn.Module) -> None:
        super().__init__()
        self.pre, self.post, self.final = pre, post, final

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        y, x = s.chunk(2, dim=-1)
        return self.final(self.post(x) + self.pre(y))
