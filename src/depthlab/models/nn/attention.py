"""Self-attention: causal with RoPE (HF Llama's rotate-half convention) and grouped-query heads, or
bidirectional without RoPE (ViT)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RotaryEmbedding:
    """cos/sin tables for RoPE. Plain Python state (no buffers), so meta-device builds lose nothing."""

    def __init__(self, head_dim: int, theta: float) -> None:
        self.head_dim, self.theta = head_dim, float(theta)
        self._cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, seq_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if torch.compiler.is_compiling():  # computed inside the graph: a cache filled during tracing would
            return self._tables(seq_len, device)  # fail its guard on the next call and force a recompile
        key = (seq_len, str(device))
        if key not in self._cache:
            self._cache = {key: self._tables(seq_len, device)}  # keep one entry: seq lengths rarely vary
        return self._cache[key]

    def _tables(self, seq_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        exponent = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=device) / self.head_dim
        inv_freq = 1.0 / (self.theta**exponent)
        pos = torch.arange(seq_len, dtype=torch.float32, device=device)
        freqs = torch.outer(pos, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)  # (T, head_dim)
        return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, H, T, hd); cos/sin: (T, hd)."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    """Causal multi-head attention; ``q_norm`` / ``k_norm`` are QK-norm slots and ``v_norm`` HybridNorm's
    value norm (``nn.Identity`` = off).

        x ─ q_proj ─ q_norm ─ RoPE ─┐
        x ─ k_proj ─ k_norm ─ RoPE ─┼─ softmax(q k^T / sqrt(hd)) v ─ o_proj ─►
        x ─ v_proj ─ v_norm ────────┘

    QK-norm as in Qwen3 and Gemma 3 normalises each head's query and key vector (over ``head_dim``)
    before RoPE, so the two norms hold ``head_dim`` weights each, shared across heads. (OLMo 2
    normalises the whole projection instead; docs/paper.md §9.3.)
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, head_dim: int, qkv_bias: bool,
                 q_norm: nn.Module | None = None, k_norm: nn.Module | None = None, *, causal: bool = True,
                 out_bias: bool = False, v_norm: nn.Module | None = None) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.causal = causal  # False: bidirectional (ViT)
        self.q_proj = nn.Linear(d_model, n_heads * head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(n_heads * head_dim, d_model, bias=out_bias)
        self.q_norm = q_norm if q_norm is not None else nn.Identity()
        self.k_norm = k_norm if k_norm is not None else nn.Identity()
        self.v_norm = v_norm if v_norm is not None else nn.Identity()

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        """x: (B, T, D); ``rope`` the (cos, sin) tables, or None for models with learned positions (ViT)."""
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.n_heads, self.head_dim)).transpose(1, 2)  # (B, H, T, hd)
        k = self.k_norm(self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim)).transpose(1, 2)  # (B, Hkv, T, hd)
        v = self.v_norm(self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim)).transpose(1, 2)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, enable_gqa=self.n_kv_heads != self.n_heads)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))  # (B, T, D)
