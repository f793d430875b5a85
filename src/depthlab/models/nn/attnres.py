"""Attention Residuals (AttnRes; Kimi Team 2026, arXiv:2603.15031): each sub-layer's input is a softmax-weighted
combination of the earlier depth sources, in place of their plain sum.

A *source* is the embedding or a sub-layer's output (Full AttnRes), or the sum of the sub-layer outputs
of a group of layers (Block AttnRes: ``b_0`` = the embedding, ``b_n`` = block n's sum, the current block's
partial sum included while it fills). Before each attention and each FFN, and once more before the final
norm, a :class:`DepthAttention` with its own pseudo-query ``w`` reads the sources available there:

    alpha_i = softmax_i( w · RMSNorm(v_i) ),    h = Σ_i alpha_i v_i            (paper eqs. 2-4)

``w`` starts at zero, so every reader starts as the plain average of its sources, and the RMSNorm (with
its own gain) keeps a large source from dominating the weights. The keys' norm is an RMSNorm for every
model family (as in the official code). Equations and sources: docs/paper.md §9.9.

**The interface.** Between blocks the sources travel as ONE tensor (B, T, S·D), slot-major (slot k is
channels k·D .. (k+1)·D - 1), with every slot not yet written at zero: each block still maps (B, T, X) ->
(B, T, X), so the capture hooks, the accumulators, layer removal (a removed block writes nothing) and the
Jacobians work unchanged and measure the whole stack of sources. Which slots a sub-layer reads and which
one it adds its output into is fixed by its position (``depthlab.models.schemes.attnres_slots``).
:class:`SourceExpand` (the scheme's ``embed_norm``) puts the embedding into slot 0; :class:`SourceCollapse`
(its final norm) is the final reader followed by the family's norm.
"""

from __future__ import annotations

import torch
from torch import nn

Rope = tuple[torch.Tensor, torch.Tensor]


class DepthAttention(nn.Module):
    """Softmax attention over depth sources with one learned pseudo-query (zero at init).

    The keys are the sources through an RMSNorm with its own gain ``key_gain`` (the official code's
    ``attn_res_norm``), computed fused: ``w · (γ ⊙ v / rms(v)) = (v · (γ ⊙ w)) / rms(v)``, so no normalised
    copy of the K sources is made. ``reader`` names this reader and ``sources`` the sources it reads, in slot
    order (labels for the depth-attention map of ``diagnose``); ``softmax`` is a module so that the weights
    can be read with a forward hook on it (``depthlab.analysis.diagnostics.depthmap``)."""

    def __init__(self, d_model: int, reader: str, sources: tuple[str, ...], eps: float = 1e-6) -> None:
        super().__init__()
        self.query = nn.Parameter(torch.zeros(d_model))  # w: the official code's proj = Linear(d, 1, bias=False)
        self.key_gain = nn.Parameter(torch.ones(d_model))  # γ of the keys' RMSNorm
        self.eps = eps
        self.softmax = nn.Softmax(dim=-1)
        self.reader, self.sources = reader, tuple(sources)

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.query)
        nn.init.ones_(self.key_gain)

    def _logits(self, V: torch.Tensor) -> torch.Tensor:  # (..., D) -> (...): w · RMSNorm(v), fused
        ms = torch.linalg.vector_norm(V.float(), dim=-1).square() / V.shape[-1]
        return (V.float() @ (self.key_gain * self.query).float()) * torch.rsqrt(ms + self.eps)

    def forward(self, V: torch.Tensor, last: torch.Tensor | None = None) -> torch.Tensor:
        """V: the sources (B, T, K, D) -> their weighted sum (B, T, D). ``last`` (B, T, D): one more source after
        them, given apart (the slot the block's attention has just added to, before the state is rewritten)."""
        logits = self._logits(V)  # (B, T, K)
        if last is not None:
            logits = torch.cat((logits, self._logits(last).unsqueeze(-1)), dim=-1)
        alpha = self.softmax(logits).to(V.dtype)  # (B, T, K [+ 1]): weights over the sources
        h = torch.einsum("btk,btkd->btd", alpha[..., :V.shape[-2]], V)
        return h if last is None else h + alpha[..., -1:] * last

    def extra_repr(self) -> str:
        return f"reader={self.reader!r}, sources={len(self.sources)}, eps={self.eps}"


def add_to_slots(H: torch.Tensor, slots: tuple[int, ...], ys: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """``H`` (B, T, S, D) with each ``ys[i]`` (B, T, D) added to slot ``slots[i]`` (out of place: one copy of ``H``,
    whose gradient then passes back unchanged; a slot named twice gets both)."""
    index = torch.tensor(slots, dtype=torch.long, device=H.device)
    return H.index_add(-2, index, torch.stack(ys, dim=-2).to(H.dtype))


class SourceExpand(nn.Module):
    """(B, T, D) -> (B, T, S·D): the embedding in slot 0, every other slot zero."""

    def __init__(self, slots: int) -> None:
        super().__init__()
        self.slots = slots

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat((x, x.new_zeros(*x.shape[:-1], (self.slots - 1) * x.shape[-1])), dim=-1)

    def extra_repr(self) -> str:
        return f"slots={self.slots}"


class SourceCollapse(nn.Module):
    """(B, T, S·D) -> (B, T, D): the final reader over every source ("the final output layer aggregates all
    block representations"), then the family's final norm."""

    def __init__(self, slots: int, depth: DepthAttention, norm: nn.Module) -> None:
        super().__init__()
        self.slots, self.depth, self.norm = slots, depth, norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.depth(x.unflatten(-1, (self.slots, -1))))

    def extra_repr(self) -> str:
        return f"slots={self.slots}"


class AttnResBlock(nn.Module):
    """A Pre-LN block whose two residual connections are depth attention over the source slots.

        X (B, T, S·D) ─ view (B, T, S, D)
          h = attn_depth(X[:, :, :attn_read]);  X[attn_write] += attn(attn_norm(h))
          h = ffn_depth(X[:, :, :ffn_read]);    X[ffn_write]  += ffn(ffn_norm(h))      ─► X' (B, T, S·D)

    Full AttnRes: each sub-layer writes a slot of its own and reads every slot before it. Block AttnRes:
    the sub-layers of one block of layers add into the same slot (its partial sum), and the first
    sub-layer of a block reads only the completed blocks (paper eq. 6).
    """

    def __init__(self, layer: int, attn: nn.Module, ffn: nn.Module, attn_norm: nn.Module, ffn_norm: nn.Module,
                 attn_depth: DepthAttention, ffn_depth: DepthAttention, slots: int,
                 attn_slots: tuple[int, int], ffn_slots: tuple[int, int]) -> None:
        super().__init__()
        self.layer = layer  # 1-based depth l
        self.attn, self.ffn, self.attn_norm, self.ffn_norm = attn, ffn, attn_norm, ffn_norm
        self.attn_depth, self.ffn_depth = attn_depth, ffn_depth
        self.slots = slots
        (self.attn_read, self.attn_write), (self.ffn_read, self.ffn_write) = attn_slots, ffn_slots
        if self.ffn_read != self.attn_write + 1:
            raise ValueError(f"the FFN must read up to the attention's slot {self.attn_write}, got {ffn_slots}")

    def forward(self, x: torch.Tensor, rope: Rope | None) -> torch.Tensor:  # (B, T, S·D) -> (B, T, S·D)
        H = x.unflatten(-1, (self.slots, -1))  # (B, T, S, D)
        a = self.attn(self.attn_norm(self.attn_depth(H[..., :self.attn_read, :])), rope)
        written = H[..., self.attn_write, :] + a  # the FFN reads the slots before it, then this one
        f = self.ffn(self.ffn_norm(self.ffn_depth(H[..., :self.attn_write, :], written)))
        return add_to_slots(H, (self.attn_write, self.ffn_write), (a, f)).flatten(-2)  # one copy of the state

    def extra_repr(self) -> str:
        return (f"layer={self.layer}, slots={self.slots}, attn reads {self.attn_read} writes {self.attn_write}, "
                f"ffn reads {self.ffn_read} writes {self.ffn_write}")
