"""Where a block's attention and MLP branches write into the residual stream: their output projections, the weights
``prune --unit attn|mlp`` zeroes and ``--heal linear`` folds its maps into (one place for both, below the modules
that use them)."""

from __future__ import annotations

from torch import nn

from depthlab.base.errors import DepthlabError

#: The output projection of each unit, relative to a layer, tried in order (depthlab blocks, HF families, GPT-2).
OUT_PROJ: dict[str, tuple[str, ...]] = {
    "attn": ("attn.o_proj", "self_attn.o_proj", "attn.c_proj", "self_attention.dense", "attention.wo"),
    "mlp": ("ffn.down_proj", "ffn.fc2", "mlp.down_proj", "mlp.c_proj", "mlp.fc2", "mlp.dense_4h_to_h",
            "feed_forward.w2"),
}


def output_projection(layer: nn.Module, unit: str) -> nn.Linear:
    """``layer``'s ``unit`` (attn or mlp) output projection, an ``nn.Linear`` (GPT-2's Conv1D is not one)."""
    for path in OUT_PROJ[unit]:
        try:
            m = layer.get_submodule(path)
        except AttributeError:
            continue
        if isinstance(m, nn.Linear):
            return m
    raise DepthlabError(f"{type(layer).__name__} has no {unit} output projection depthlab knows "
                        f"({', '.join(OUT_PROJ[unit])}); cannot remove its {unit} sublayers")
