"""Hugging Face ``ViTForImageClassification`` -> depthlab ``ViT`` (scheme ``pre``), weights copied exactly."""

from __future__ import annotations

from typing import Any

import torch

from depthlab.base.errors import DepthlabError
from depthlab.models.config import ViTConfig
from depthlab.models.configure import checked
from depthlab.models.vit.model import ViT

#: depthlab key (block ``{i}``) <- HF key under ``vit.encoder.layer.{i}.`` (transformers 4.x)
_BLOCK_KEYS_V4 = {
    "attn_norm.weight": "layernorm_before.weight", "attn_norm.bias": "layernorm_before.bias",
    "attn.q_proj.weight": "attention.attention.query.weight", "attn.q_proj.bias": "attention.attention.query.bias",
    "attn.k_proj.weight": "attention.attention.key.weight", "attn.k_proj.bias": "attention.attention.key.bias",
    "attn.v_proj.weight": "attention.attention.value.weight", "attn.v_proj.bias": "attention.attention.value.bias",
    "attn.o_proj.weight": "attention.output.dense.weight", "attn.o_proj.bias": "attention.output.dense.bias",
    "ffn_norm.weight": "layernorm_after.weight", "ffn_norm.bias": "layernorm_after.bias",
    "ffn.fc1.weight": "intermediate.dense.weight", "ffn.fc1.bias": "intermediate.dense.bias",
    "ffn.fc2.weight": "output.dense.weight", "ffn.fc2.bias": "output.dense.bias",
}
#: the same under ``vit.layers.{i}.`` (transformers 5.x renamed the ViT modules)
_BLOCK_KEYS_V5 = {
    **{f"{n}.{w}": f"{h}.{w}" for n, h in (("attn_norm", "layernorm_before"), ("ffn_norm", "layernorm_after"))
       for w in ("weight", "bias")},
    **{f"attn.{p}.{w}": f"attention.{p}.{w}" for p in ("q_proj", "k_proj", "v_proj", "o_proj")
       for w in ("weight", "bias")},
    **{f"ffn.{p}.{w}": f"mlp.{p}.{w}" for p in ("fc1", "fc2") for w in ("weight", "bias")},
}
#: depthlab key <- HF key, outside the blocks
_TOP_KEYS = {
    "patch_embed.weight": "vit.embeddings.patch_embeddings.projection.weight",
    "patch_embed.bias": "vit.embeddings.patch_embeddings.projection.bias",
    "cls_token": "vit.embeddings.cls_token",
    "pos_embed": "vit.embeddings.position_embeddings",
    "norm.weight": "vit.layernorm.weight", "norm.bias": "vit.layernorm.bias",
    "classifier.weight": "classifier.weight", "classifier.bias": "classifier.bias",
}


def vit_config_from_hf(hf_config: Any) -> ViTConfig:
    """The ``pre`` ViTConfig of an HF ``ViTConfig``; refuses what our ViT cannot express, in one line."""
    c = hf_config
    problems = []
    if getattr(c, "hidden_act", "gelu") != "gelu":
        problems.append(f"hidden_act={c.hidden_act!r} (only exact 'gelu')")
    if not getattr(c, "qkv_bias", True):
        problems.append("qkv_bias=False")
    if problems:
        raise DepthlabError(f"cannot convert this HF ViT: {'; '.join(problems)}")
    size = c.image_size if isinstance(c.image_size, int) else c.image_size[0]
    patch = c.patch_size if isinstance(c.patch_size, int) else c.patch_size[0]
    return checked(ViTConfig(
        name=f"hf:{getattr(c, '_name_or_path', '') or 'vit'}", image_size=size, patch_size=patch,
        channels=c.num_channels, num_classes=c.num_labels, n_layers=c.num_hidden_layers, d_model=c.hidden_size,
        n_heads=c.num_attention_heads, d_ff=c.intermediate_size, norm_eps=c.layer_norm_eps, pool="cls",
        init_std=c.initializer_range, scheme="pre", extra={"hf_model_type": "vit"}))


def from_hf_vit(hf_model: Any) -> ViT:
    """A depthlab ``ViT`` (scheme ``pre``) with the weights of an HF ``ViTForImageClassification``."""
    cfg = vit_config_from_hf(hf_model.config)
    src = hf_model.state_dict()
    state: dict[str, torch.Tensor] = {}
    for ours, theirs in _TOP_KEYS.items():
        state[ours] = src[theirs]
    v5 = "vit.layers.0.layernorm_before.weight" in src
    prefix, keys = ("vit.layers", _BLOCK_KEYS_V5) if v5 else ("vit.encoder.layer", _BLOCK_KEYS_V4)
    for i in range(cfg.n_layers):
        for ours, theirs in keys.items():
            state[f"blocks.{i}.{ours}"] = src[f"{prefix}.{i}.{theirs}"]
    state = {k: v.detach().clone() for k, v in state.items()}
    model: ViT = ViT.with_weights(cfg, state, "the HF ViT", device=next(hf_model.parameters()).device)
    return model
