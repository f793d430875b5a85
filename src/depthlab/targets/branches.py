"""Where a block's attention and MLP branches end: the modules whose outputs are added to the residual stream.

    attn, mlp = branch_ends(layer)                # HF decoder layers and depthlab blocks alike
    with zeroed(attn):                            # the block without its attention branch (its MLP still runs)
        out = layer(x)

A sublayer *unit* (:data:`UNITS`) is removed by zeroing its branch's output, which is what zeroing its output
projection's weights (``o_proj`` / ``down_proj``, and their biases) does to a Hugging Face checkpoint. Where the
branches end is one table (:data:`BRANCH_ENDS`): depthlab blocks name theirs (``attn_out`` / ``ffn_out``, after any
Sandwich / Peri-LN output norm or LNS scale), HF decoder layers keep the attention and MLP as ``self_attn`` /
``mlp`` (Llama, Mistral, Qwen2/3, Gemma, OLMo, Phi-3, ...), GPT-2 as ``attn`` / ``mlp``, Falcon/GPT-NeoX as
``self_attention`` / ``mlp`` and Mixtral's MoE as ``block_sparse_moe``. The diagnostics measure the units
(:mod:`depthlab.analysis.diagnostics.sublayers`), the streamed sweep zeroes them in its lanes
(:mod:`depthlab.targets.stream.sweep`), ``prune --unit`` removes them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from depthlab.base.errors import DepthlabError

UNITS = ("attn", "mlp")  # the sublayer units, in block order

#: (attention branch end, MLP branch end) attribute names of a block, tried in order; the first pair it has wins.
BRANCH_ENDS: tuple[tuple[str, str], ...] = (
    ("attn_out", "ffn_out"),  # depthlab PreNormBlock / PostNormBlock slots (after the branch's output norm or scale)
    ("self_attn", "mlp"),  # HF Llama, Mistral, Qwen2/3, Gemma, OLMo, Phi-3, ...
    ("self_attn", "block_sparse_moe"),  # Mixtral
    ("attn", "mlp"),  # GPT-2, nanoGPT
    ("self_attention", "mlp"),  # Falcon, GPT-NeoX-style
    ("attention", "feed_forward"),  # torchtitan's Llama
)


def branch_ends(layer: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(attention, MLP) branch-end modules of ``layer``; DepthlabError naming the layer type when it has neither."""
    for attn, mlp in BRANCH_ENDS:
        a, m = getattr(layer, attn, None), getattr(layer, mlp, None)
        if isinstance(a, nn.Module) and isinstance(m, nn.Module):
            return a, m
    pairs = ", ".join(f"{a}/{m}" for a, m in BRANCH_ENDS)
    raise DepthlabError(f"{type(layer).__name__} keeps no attention and MLP branch that depthlab knows ({pairs}); "
                        "cannot measure or remove sublayers of it")


def check_sublayers(layers: Sequence[nn.Module]) -> None:
    """Refuse, before any work, blocks without a known attention and MLP branch (hyper-connection blocks, which mix
    several residual streams, and encoders such as BERT, whose attention module holds its own residual and norm)."""
    for layer in layers:
        branch_ends(layer)


def _zero_like(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return torch.zeros_like(out)
    if isinstance(out, tuple | list) and out and isinstance(out[0], torch.Tensor):
        return type(out)([torch.zeros_like(out[0]), *out[1:]])
    raise DepthlabError(f"a sublayer returned {type(out).__name__}; cannot zero it")


@contextlib.contextmanager
def zeroed(*modules: nn.Module) -> Iterator[None]:
    """While inside, each of ``modules`` returns zeros of its output's shape (its branch is removed)."""
    handles = [m.register_forward_hook(lambda _m, _a, out: _zero_like(out)) for m in modules]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def unit_modules(layers: Sequence[nn.Module], unit: str) -> list[nn.Module]:
    """The branch-end module of ``unit`` (attn or mlp) of every layer."""
    if unit not in UNITS:
        raise DepthlabError(f"unknown sublayer unit {unit!r}; choose one of: {', '.join(UNITS)}")
    return [branch_ends(layer)[UNITS.index(unit)] for layer in layers]
