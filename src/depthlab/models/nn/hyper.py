"""Hyper-Connections (HC; Zhu et al. 2024) and manifold-constrained Hyper-Connections (mHC; Xie et al. 2025).

The residual stream is widened to ``n`` streams. Each sub-layer (attention, feed-forward) reads one
mix of the streams, and writes its output back into every stream while the streams are re-mixed:

    h  = Σ_i pre_i · H_i                        (what the branch sees: (B, T, D))
    H' = res · H + post ⊗ f(h)                  (res: (n, n), out stream x in stream; post: (n,))

HC learns ``pre``, ``res``, ``post`` freely (static) and adds token-dependent terms ``s·tanh(·)`` of the
normalised streams (dynamic). mHC keeps ``pre`` in (0, 1) and ``post`` in (0, 2) through sigmoids and
projects ``res`` onto the doubly stochastic matrices (Sinkhorn-Knopp), so the residual mix neither
amplifies nor shrinks the streams' sum. Equations and sources: docs/paper.md §9.8.

**The interface.** Between blocks the n streams travel as ONE tensor (B, T, n·D), stream-major
(stream i is channels i·D .. (i+1)·D - 1): every block still maps (B, T, X) -> (B, T, X), so the
capture hooks, the angular / variance accumulators, layer removal (a removed block passes all n
streams on) and the Jacobians work unchanged; they measure the whole n-stream state. ``StreamExpand``
(the scheme's ``embed_norm``) copies the embedding into the n streams; ``StreamCollapse`` (its final
norm) sums them and applies the family's norm, so the model code knows nothing of streams.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

Rope = tuple[torch.Tensor, torch.Tensor]
Weights = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # pre (..., n), res (..., n, n), post (..., n)

#: mHC's starting logits: ``pre`` reads stream k mod n (logit +GAP, the others -GAP), ``res`` starts at
#: 0 on the diagonal and -GAP off it (Sinkhorn of that is within 1e-3 of the identity), ``post`` at 0
#: (2·sigmoid(0) = 1). So a fresh mHC model computes, to within e^-GAP, what a fresh HC model computes.
MHC_INIT_GAP = 8.0
#: The dynamic terms' starting scales (HC's s_alpha, s_beta; mHC's alpha_pre, alpha_post, alpha_res).
DYNAMIC_SCALE_INIT = 0.01


#: DeepSeek-V4's numerical floor (``hc_eps``): added to ``pre``, to the mixing matrix after its softmax and to every
#: Sinkhorn denominator. Not in the mHC paper's equations, but it changes near-permutation matrices (tested against
#: transformers' ``DeepseekV4HyperConnection``; docs/paper.md §9.8).
MHC_FLOOR = 1e-6


def sinkhorn(logits: torch.Tensor, iters: int, floor: float = 0.0) -> torch.Tensor:
    """Sinkhorn-Knopp on exp(logits) (..., n, n), laid out [out stream, in stream], as DeepSeek-V4 computes it
    (``hc_split_sinkhorn``): a softmax over the output streams (plus ``floor``), then each row normalised over
    the input streams, then ``iters - 1`` rounds of columns then rows, every denominator plus ``floor``. The
    rows sum to 1 (exactly when ``floor`` is 0), so every output stream is a convex combination of the input
    streams; the columns sum to 1 to within the method's convergence."""
    m = torch.softmax(logits.float(), dim=-2) + floor
    m = m / (m.sum(dim=-1, keepdim=True) + floor)
    for _ in range(iters - 1):
        m = m / (m.sum(dim=-2, keepdim=True) + floor)
        m = m / (m.sum(dim=-1, keepdim=True) + floor)
    return m.to(logits.dtype)


class StreamExpand(nn.Module):
    """(B, T, D) -> (B, T, n·D): the embedding output copied into each of the n streams."""

    def __init__(self, streams: int) -> None:
        super().__init__()
        self.streams = streams

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.unsqueeze(-2).expand(*x.shape[:-1], self.streams, x.shape[-1]).flatten(-2)

    def extra_repr(self) -> str:
        return f"streams={self.streams}"


class StreamCollapse(nn.Module):
    """(B, T, n·D) -> (B, T, D): the sum of the n streams (HC's read-out), then the family's final norm."""

    def __init__(self, streams: int, norm: nn.Module) -> None:
        super().__init__()
        self.streams, self.norm = streams, norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.unflatten(-1, (self.streams, -1)).sum(dim=-2))

    def extra_repr(self) -> str:
        return f"streams={self.streams}"


class HyperConnection(nn.Module):
    """Static HC around sub-layer ``index`` (0-based over all sub-layers: attention of block l is
    2(l-1), its feed-forward 2(l-1)+1). Starts as Pre-LN: ``pre`` = e_{index mod n}, ``res`` = I,
    ``post`` = 1, so n equal streams stay equal (HC's initialisation)."""

    def __init__(self, d_model: int, streams: int, index: int) -> None:
        super().__init__()
        self.d_model, self.streams, self.index = d_model, streams, index
        pre, res, post = self.initial()
        self.pre = nn.Parameter(pre)
        self.res = nn.Parameter(res)  # HC: A_r, [in stream, out stream]; mHC: b_res, [out stream, in stream]
        self.post = nn.Parameter(post)

    def initial(self) -> Weights:
        """The starting (pre, res, post) parameters."""
        eye = torch.eye(self.streams)
        return eye[self.index % self.streams], eye, torch.ones(self.streams)

    def reset_parameters(self) -> None:
        with torch.no_grad():
            for param, value in zip((self.pre, self.res, self.post), self.initial()):
                param.copy_(value)

    def weights(self, H: torch.Tensor) -> Weights:
        """(pre, res, post) for ``H`` (B, T, n, D); ``res`` is [out stream, in stream]."""
        return self.pre, self.res.T, self.post

    def forward(self, H: torch.Tensor, branch: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """H: (B, T, n, D) -> (B, T, n, D), calling ``branch`` once on the read mix (B, T, D)."""
        pre, res, post = self.weights(H)
        h = (pre.unsqueeze(-2) @ H).squeeze(-2)  # (B, T, D)
        return res @ H + post.unsqueeze(-1) * branch(h).unsqueeze(-2)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, streams={self.streams}, index={self.index}"


class DynamicHyperConnection(HyperConnection):
    """Dynamic HC: the static weights plus ``s·tanh(N(H) W)`` per token, N the family's norm over each
    stream; W starts at 0 (so it starts as static HC) and s at ``DYNAMIC_SCALE_INIT``."""

    def __init__(self, d_model: int, streams: int, index: int, norm: nn.Module) -> None:
        super().__init__(d_model, streams, index)
        self.norm = norm
        self.w_pre = nn.Parameter(torch.zeros(d_model))
        self.w_res = nn.Parameter(torch.zeros(d_model, streams))
        self.w_post = nn.Parameter(torch.zeros(d_model))
        self.s_alpha = nn.Parameter(torch.full((1,), DYNAMIC_SCALE_INIT))  # scales pre and res (HC's s_alpha)
        self.s_beta = nn.Parameter(torch.full((1,), DYNAMIC_SCALE_INIT))  # scales post (HC's s_beta)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        with torch.no_grad():
            for w in (self.w_pre, self.w_res, self.w_post):
                w.zero_()
            self.s_alpha.fill_(DYNAMIC_SCALE_INIT)
            self.s_beta.fill_(DYNAMIC_SCALE_INIT)

    def weights(self, H: torch.Tensor) -> Weights:
        Hn = self.norm(H)  # (B, T, n, D)
        pre = self.pre + self.s_alpha * torch.tanh(Hn @ self.w_pre)  # (B, T, n)
        res = self.res + self.s_alpha * torch.tanh(Hn @ self.w_res)  # (B, T, n_in, n_out)
        post = self.post + self.s_beta * torch.tanh(Hn @ self.w_post)  # (B, T, n)
        return pre, res.transpose(-1, -2), post


class ManifoldHyperConnection(HyperConnection):
    """Static mHC: ``pre = sigmoid(b_pre)``, ``post = 2 sigmoid(b_post)``, ``res = Sinkhorn(b_res)``
    (doubly stochastic). The parameters hold the logits b (see ``MHC_INIT_GAP``)."""

    def __init__(self, d_model: int, streams: int, index: int, sinkhorn_iters: int, floor: float = MHC_FLOOR) -> None:
        super().__init__(d_model, streams, index)
        self.sinkhorn_iters, self.floor = sinkhorn_iters, floor

    def initial(self) -> Weights:
        eye, gap = torch.eye(self.streams), MHC_INIT_GAP
        return gap * (2 * eye[self.index % self.streams] - 1), -gap * (1 - eye), torch.zeros(self.streams)

    def logits(self, H: torch.Tensor) -> Weights:
        """(pre, res, post) logits; ``res`` is [out stream, in stream]."""
        return self.pre, self.res, self.post

    def weights(self, H: torch.Tensor) -> Weights:
        pre, res, post = self.logits(H)
        return torch.sigmoid(pre) + self.floor, sinkhorn(res, self.sinkhorn_iters, self.floor), 2.0 * torch.sigmoid(post)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, sinkhorn_iters={self.sinkhorn_iters}"


class DynamicManifoldHyperConnection(ManifoldHyperConnection):
    """Dynamic mHC: logits ``alpha · (RMS(vec H) φ) + b`` per token, vec H the n·D streams flattened and
    RMS a weightless RMS normalisation; φ starts at 0 (so it starts as static mHC), alpha at
    ``DYNAMIC_SCALE_INIT``."""

    def __init__(self, d_model: int, streams: int, index: int, sinkhorn_iters: int, eps: float = 1e-6,
                 floor: float = MHC_FLOOR) -> None:
        super().__init__(d_model, streams, index, sinkhorn_iters, floor)
        self.eps = eps
        self.phi = nn.Parameter(torch.zeros(streams * d_model, streams * (streams + 2)))  # [pre | post | res]
        self.alpha = nn.Parameter(torch.full((3,), DYNAMIC_SCALE_INIT))  # alpha_pre, alpha_post, alpha_res

    def reset_parameters(self) -> None:
        super().reset_parameters()
        with torch.no_grad():
            self.phi.zero_()
            self.alpha.fill_(DYNAMIC_SCALE_INIT)

    def logits(self, H: torch.Tensor) -> Weights:
        n = self.streams
        x = F.rms_norm(H.flatten(-2).float(), (H.shape[-2] * H.shape[-1],), eps=self.eps).to(H.dtype)
        m = x @ self.phi  # (B, T, n + n + n*n)
        pre = self.alpha[0] * m[..., :n] + self.pre
        post = self.alpha[1] * m[..., n:2 * n] + self.post
        res = self.alpha[2] * m[..., 2 * n:].unflatten(-1, (n, n)) + self.res
        return pre, res, post


class HyperBlock(nn.Module):
    """A Pre-LN block whose two residual connections are hyper-connections over n streams.

        X (B, T, n·D) ─ view (B, T, n, D) ─ attn_hc[ attn(attn_norm(·)) ] ─ ffn_hc[ ffn(ffn_norm(·)) ] ─► X'

    Each ``*_hc`` reads a mix h of the streams, runs its branch on h (norm first, as in Pre-LN) and
    writes the output back into the re-mixed streams (see the module docstring).
    """

    def __init__(self, layer: int, attn: nn.Module, ffn: nn.Module, attn_norm: nn.Module, ffn_norm: nn.Module,
                 attn_hc: HyperConnection, ffn_hc: HyperConnection) -> None:
        super().__init__()
        self.layer = layer  # 1-based depth l
        self.attn, self.ffn, self.attn_norm, self.ffn_norm = attn, ffn, attn_norm, ffn_norm
        self.attn_hc, self.ffn_hc = attn_hc, ffn_hc

    def forward(self, x: torch.Tensor, rope: Rope | None) -> torch.Tensor:  # (B, T, n·D) -> (B, T, n·D)
        H = x.unflatten(-1, (self.attn_hc.streams, -1))  # (B, T, n, D)
        H = self.attn_hc(H, lambda h: self.attn(self.attn_norm(h), rope))
        H = self.ffn_hc(H, lambda h: self.ffn(self.ffn_norm(h)))
        return H.flatten(-2)
