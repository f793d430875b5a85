"""Any transformers config made tiny: the sizes of a model of any family, found from the config's own field names.

    overrides = tiny_overrides(AutoConfig.for_model("stablelm"))   # {"hidden_size": 32, "num_hidden_layers": 4, ...}
    config = AutoConfig.for_model("stablelm", **overrides)         # 4 blocks of width 32, vocabulary 300

A family outside the registry has no ``Family.tiny``; its smallest model comes from :data:`SHRINK`, rules on field
names (an integer field whose name matches a rule is lowered to the rule's value: widths, head counts, expert counts,
ranks, windows, vocabulary, positions), the per-layer lists of the config cut to the new depth (keeping one block of
each kind), maps keyed by layer index renumbered, and token ids moved into the small vocabulary. A family whose
sizes obey a rule the names do not show is a line of :data:`FIXUPS`, by model type (data, not code). Used by
:func:`depthlab.hf.tiny.tiny_config` for model types outside the registry, and by :mod:`depthlab.hf.inferred` to
probe a family's pre-norms on a small model of the same code and flags.
"""

from __future__ import annotations

import re
from typing import Any

#: (field-name pattern, tiny value): an integer field whose (canonical) name matches the first rule that matches
#: is set to the rule's value when its own is larger.
SHRINK: tuple[tuple[str, int], ...] = (
    (r"vocab_size|_vocab$", 300),
    (r"per_layer_input$", 8),
    (r"^(n_group|topk_group|num_expert_groups?|topk_groups?)$", 1),
    (r"^(num_hidden_layers|num_layers|n_layers?|decoder_layers|num_blocks)$", 4),
    (r"^(hidden_size|d_model|n_embd|embedding_dim|lru_width|attention_hidden_size)$", 32),
    (r"key_value_heads$|kv_heads$|query_groups$", 2),
    (r"^qk_head_dim$", 16),
    (r"head_?dim$|^d_head$|^dim_head$|^kv_channels$|_headdim$|^d_rel$|rotary_dim$|^dim_model_base$", 8),
    (r"^moe.*(intermediate|ffn)|expert.*(intermediate|ffn|hidden)", 32),
    (r"intermediate_size|ffn.*(dim|size)|^dim_ff$|^dff$|^d_inner$|ffn_hidden", 64),
    (r"^(num_experts|num_local_experts|n_routed_experts|moe_num_experts)$", 4),
    (r"^(num_experts_per_tok|moe_topk|top_k|moe_k)$", 2),
    (r"lora_rank$", 16),
    (r"_rank$", 8),
    (r"heads$|^n_head$|^attention_heads$", 4),
    (r"d_state$|^state_size$|ssm_state_size$", 8),
    (r"chunk_?size$|block_size$", 16),
    (r"window(_size|_len)?$|^local_attention$", 8),
    (r"max_position_embeddings|^n_positions$|^n_ctx$|^context_length$|^max_seq_len$|max_length$", 256),
    (r"topk|top_k", 4),
)

#: Token ids of the tiny model (inside its vocabulary of 300).
TOKEN_IDS: dict[str, int] = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}

#: Config fields that are never sizes (left as they are, nested ones included).
KEEP: frozenset[str] = frozenset({"rope_scaling", "rope_parameters", "id2label", "label2id", "quantization_config"})

#: Families whose tiny sizes obey a rule the field names do not show: model type -> overrides (applied last).
FIXUPS: dict[str, dict[str, Any]] = {
    "deepseek_v2": {"num_experts_per_tok": 2},  # the default config routes to None experts
    "bamba": {"attn_layer_indices": [1, 3]},  # the default has no attention block
    "granitemoehybrid": {"layer_types": ["linear_attention", "attention", "linear_attention", "attention"]},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1},
    "mamba2": {"num_heads": 8},  # heads x head_dim = expand x hidden
    "nemotron_h": {"mamba_num_heads": 8, "mamba_head_dim": 8},
    "dots3_note_text": {"head_dim": 16},  # sliding-window heads: qk_nope_head_dim + qk_rope_head_dim
    "zamba": {"attention_hidden_size": 64, "attention_head_dim": 16,  # attention reads [h, embeddings]
              "layers_block_type": ["linear_attention", "hybrid", "linear_attention", "hybrid"]},
    "zamba2": {"attention_hidden_size": 64, "attention_head_dim": 16, "kv_channels": 16, "n_mamba_heads": 8},
    "falcon_h1": {"mamba_d_ssm": 64},  # mamba heads x head dim
    "gemma3n_text": {"layer_types": ["sliding_attention", "full_attention"] * 2, "num_kv_shared_layers": 2},
}

#: Families whose tiny sizes depend on the config: (a field the config has, the overrides that follow from it).
RULES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("kv_lora_rank", {"num_key_value_heads": 4}),  # multi-head latent attention: as many K/V heads as query heads
    ("mamba_n_heads", {"mamba_n_heads": 8, "mamba_d_head": 8}),  # heads x head_dim = expand x hidden
)

#: Integer fields counting layers (besides the depth itself): scaled with the depth, at least 1 when they were.
LAYER_COUNTS = r"^num_\w+_layers$|^max_window_layers$|^first_k_dense_replace$"


def _rule(name: str) -> int | None:
    for pattern, value in SHRINK:
        if re.search(pattern, name):
            return value
    return None


def _shrunk(values: dict[str, Any], canonical: dict[str, str]) -> dict[str, Any]:
    """The fields of ``values`` (a config's dict) that :data:`SHRINK` lowers, nested config dicts included."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = canonical.get(key, key)
        if key in KEEP or isinstance(value, bool):
            continue
        if name in TOKEN_IDS and (isinstance(value, int) or isinstance(value, list)):
            out[key] = TOKEN_IDS[name]
        elif isinstance(value, int):
            tiny = _rule(name)
            if tiny is not None and value > tiny:
                out[key] = tiny
        elif isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
            sub = _shrunk(value, {})
            if sub:
                out[key] = {**value, **sub}
    return out


def covering(values: list, k: int) -> list[int]:
    """``k`` indices into ``values``, in order: the first of each distinct value first (so a hybrid's tiny model keeps
    a block of each kind), then the earliest others."""
    firsts: list[int] = []
    for i, v in enumerate(values):
        if all(values[j] != v for j in firsts):
            firsts.append(i)
    pick = firsts[:k]
    pick += [i for i in range(len(values)) if i not in pick][: k - len(pick)]
    return sorted(pick)


def _layer_fields(values: dict[str, Any], n: int, k: int) -> dict[str, Any]:
    """Per-layer lists (length ``n``) cut to ``k`` entries, the same layers for every list; maps keyed by a layer
    index (``per_layer_config``) keep the kept layers' entries, renumbered."""
    lists = {key: v for key, v in values.items() if isinstance(v, (list, tuple)) and len(v) == n}
    maps = {key: v for key, v in values.items() if key not in KEEP and isinstance(v, dict) and v
            and all(str(i).isdigit() and int(i) < n for i in v)}
    kinds = [tuple(str(v[i]) for v in lists.values()) for i in range(n)]  # each layer's kind, over every list
    keep = covering(kinds, k)
    out: dict[str, Any] = {key: [v[i] for i in keep] for key, v in lists.items()}
    for key, v in maps.items():
        entries = {int(i): value for i, value in v.items()}
        out[key] = {new: entries[old] for new, old in enumerate(keep) if old in entries}
    return out


def tiny_overrides(config: Any, n_layers: int = 4) -> dict[str, Any]:
    """The config fields that make ``config`` (a transformers config) a tiny model of ``n_layers`` blocks: every
    size lowered by :data:`SHRINK`, per-layer fields cut, then the family's :data:`RULES` and :data:`FIXUPS`."""
    canonical = {stored: canon for canon, stored in (getattr(type(config), "attribute_map", None) or {}).items()}
    values = config.to_dict()
    out = _shrunk(values, canonical)
    n = getattr(config, "num_hidden_layers", None)
    if isinstance(n, int) and n > n_layers:
        out.update(_layer_fields({**values, **out}, n, n_layers))
        for key, value in values.items():
            if re.search(LAYER_COUNTS, key) and isinstance(value, int) and not isinstance(value, bool) and value > 0:
                out[key] = max(1, round(value * n_layers / n))
        for key in [k for k, name in canonical.items() if name == "num_hidden_layers"] + ["num_hidden_layers"]:
            if key in values:
                out[key] = n_layers
    elif isinstance(n, int):  # already as shallow: kept (its per-layer lists have that length)
        out = {k: v for k, v in out.items() if canonical.get(k, k) != "num_hidden_layers"}
    for field, overrides in RULES:
        if values.get(field) is not None:
            out.update(overrides)
            for entries in (v for v in out.values() if isinstance(v, dict)):  # per-layer maps of overrides
                for entry in (e for e in entries.values() if isinstance(e, dict)):
                    entry.update({k: v for k, v in overrides.items() if k in entry})
    out.update(FIXUPS.get(getattr(config, "model_type", ""), {}))
    return out


def jitter_norms(model: Any) -> Any:
    """Norm weights drawn from U(0.5, 1.5) and biases from N(0, 0.1), in place (so a wrong scale placement shows);
    returns the model."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
    return model


def small_model(config: Any) -> Any:
    """A small random causal LM of ``config``'s family and flags (its sizes from :func:`tiny_overrides`), fp32, norms
    jittered, drawn from seed 0 without touching the caller's random state."""
    import torch
    from transformers import AutoModelForCausalLM

    small = type(config).from_dict({**config.to_dict(), **tiny_overrides(config)})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return jitter_norms(AutoModelForCausalLM.from_config(small, trust_remote_code=False).float().eval())
