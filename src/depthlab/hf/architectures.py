"""The Hugging Face decoder families depthlab knows: one :class:`Family` entry per transformers ``model_type``.

    fam = family_of("olmo2")                  # the entry (DepthlabError naming the known ones when absent)
    fam = family_of("gemma4_text", "stream")  # ... refused with the family's reason when it cannot stream
    layers = get_path(model, fam.layers)      # the block ModuleList of a causal LM of that family
    cut_config(config, keep=[0, 1, 3], n_layers=4)   # the config of the pruned model, every per-layer fact cut

The default is transformers' own classes (built on the meta device by the streamed engine), blocks at
``model.layers``, pre-norms ``input_layernorm`` / ``post_attention_layernorm`` computing ``weight * x̂``; an
entry says only how its family differs: where the blocks and final norm sit, which config fields hold one
entry per layer (cut with the layers), which list layer indices (renumbered) and which index rules must be
rewritten, which norms are the block's *pre*-norms (LayerNorm Scaling scales their outputs), whether those
norms compute ``(1 + weight) * x̂`` (Gemma, Qwen3-Next), and why a capability is refused where it is. The
streamed engine, prune's export (in memory and shard by shard), LNS, ``find_layers`` and the monitor read it;
the README's "Supported models" table is generated from it (:func:`family_table`).

``tiny`` holds the config overrides of the family's smallest model (4 layers of width 32, vocabulary 300):
what the tests and the benchmark build with ``AutoConfig.for_model`` + ``from_config``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from depthlab.base.errors import DepthlabError

#: The capabilities a family entry may refuse (the README table's columns after "diagnose").
CAPABILITIES: tuple[str, ...] = ("diagnose", "stream", "prune", "lns", "monitor")

#: Config fields holding one entry per layer in every family that has them (cut with the layers).
LAYER_LISTS: tuple[str, ...] = ("layer_types", "mlp_layer_types", "no_rope_layers")

_PRE = ("input_layernorm", "post_attention_layernorm")
_SANDWICH = ("input_layernorm", "pre_feedforward_layernorm")  # Gemma: post_* norms sit on the branch outputs
_MOE4 = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
_LINEAR = {"linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8}


@dataclass(frozen=True)
class Family:
    """What depthlab needs to know of one transformers decoder family, the rest generic."""

    model_type: str  # transformers' config.model_type
    name: str  # as the README table shows it
    kind: str = "dense"  # dense | MoE | hybrid | multi-stream (README)
    layers: str = "model.layers"  # dotted path from the causal LM to the blocks; also the checkpoint's key prefix
    final_norm: str = "model.norm"  # dotted path of the norm after the last block
    pre_norms: tuple[str, ...] = _PRE  # the block's pre-norms (LNS scales their outputs), by attribute name
    norm_offset: float = 0.0  # the norms compute (norm_offset + weight) * x̂
    layer_lists: tuple[str, ...] = ()  # config fields with one entry per layer, besides LAYER_LISTS
    index_lists: tuple[str, ...] = ()  # config fields listing 0-based layer indices: kept ones renumbered
    index_rules: tuple[str, ...] = ()  # names in INDEX_RULES: config integers that depend on layer positions
    refused: dict[str, str] = field(default_factory=dict)  # capability -> why it cannot be done (one line)
    limits: tuple[str, ...] = ()  # names in CONFIG_LIMITS: what some configs of the family cannot do (one line each)
    token_args: tuple[str, ...] = ()  # block-forward arguments holding per-token values the model computes before
    #                                   block 1 (Gemma 4's per-layer embeddings, DeepSeek-V4's ids for hash routing)
    row_args: tuple[str, ...] = ()  # block-forward keyword arguments recorded for one row that must have every row
    #                                 (DeepSeek-V4's attention mask, concatenated with per-row compressor biases)
    streams: str = ""  # config field: the number n of residual streams a block passes on as (B, T, n, D)
    collapse: str = ""  # dotted path of the module that collapses the streams before the final norm
    layer_slices: dict[str, str] = field(default_factory=dict)  # tensor key -> "dim:config_field": one slice of that
    #                                   width per layer along that dim (Gemma 4's per-layer embedding table), cut too
    layer_maps: tuple[str, ...] = ()  # config fields mapping a layer index to overrides (``per_layer_config``)
    convertible: bool = False  # depthlab.hf.from_hf turns it into a depthlab DecoderLM
    tiny: dict[str, Any] = field(default_factory=dict)  # config overrides of its smallest test model

    def why_not(self, capability: str) -> str | None:
        return self.refused.get(capability)


# ---------------------------------------------------------------------------------------------- index rules
def _count_below(name: str) -> Callable[[Any, Sequence[int], int], None]:
    """An integer meaning "the first k layers": becomes the number of kept layers below k."""
    def rule(config: Any, keep: Sequence[int], n_layers: int) -> None:
        k = getattr(config, name, None)
        if isinstance(k, int):
            setattr(config, name, sum(1 for i in keep if i < k))
    return rule


def _count_last(name: str) -> Callable[[Any, Sequence[int], int], None]:
    """An integer meaning "the last k layers": becomes the number of kept layers among them."""
    def rule(config: Any, keep: Sequence[int], n_layers: int) -> None:
        k = getattr(config, name, None)
        if isinstance(k, int):
            setattr(config, name, sum(1 for i in keep if i >= n_layers - k))
    return rule


def _sparse_step(config: Any, keep: Sequence[int], n_layers: int) -> None:
    """Qwen-MoE ``decoder_sparse_step`` (layer i is MoE when (i+1) % step == 0 and i is not in ``mlp_only_layers``):
    a step > 1 does not survive a cut, so the dense layers are listed in ``mlp_only_layers`` and the step becomes 1."""
    step = getattr(config, "decoder_sparse_step", None)
    if not isinstance(step, int) or step <= 1:
        return
    dense = set(getattr(config, "mlp_only_layers", None) or [])
    dense |= {i for i in range(n_layers) if (i + 1) % step != 0}
    config.mlp_only_layers = sorted(i for i in range(n_layers) if i in dense)  # renumbered by index_lists after
    config.decoder_sparse_step = 1


#: Config integers that depend on layer positions, by name: each rewrites the config for the kept layers
#: (0-based ``keep``) before the per-layer and index lists are cut.
INDEX_RULES: dict[str, Callable[[Any, Sequence[int], int], None]] = {
    "max_window_layers": _count_below("max_window_layers"),  # Qwen2/3: layers below it attend fully
    "first_k_dense_replace": _count_below("first_k_dense_replace"),  # DeepSeek: the first k layers are dense
    "decoder_sparse_step": _sparse_step,
    "num_kv_shared_layers": _count_last("num_kv_shared_layers"),  # Gemma 4: the last k layers reuse earlier K/V
}

# ---------------------------------------------------------------------------------------------- config limits
def _get(config: Any, name: str, default: Any = None) -> Any:
    """A config field, from a transformers config or config.json's dict."""
    return config.get(name, default) if isinstance(config, dict) else getattr(config, name, default)


def _kv_sharing(config: Any, capability: str, removed: Sequence[int]) -> str | None:
    """Gemma 4's KV sharing: the last ``num_kv_shared_layers`` blocks reuse the keys and values of the last earlier
    block of their attention type (its producer). Streaming does not carry them from block to block; pruning keeps
    the function only while every producer with a kept consumer stays, and the last kept block is full attention
    (transformers forces it)."""
    n, shared = _get(config, "num_hidden_layers"), _get(config, "num_kv_shared_layers", 0) or 0
    types = list(_get(config, "layer_types", None) or [])
    if capability == "stream" and shared:
        return (f"blocks {n - shared + 1}..{n} reuse the keys and values of earlier blocks (num_kv_shared_layers="
                f"{shared}), which the layer-by-layer engine does not carry from block to block")
    if capability != "prune" or len(types) != n:
        return None
    gone, first = set(removed), n - shared
    keep = [i for i in range(n) if i + 1 not in gone]
    if shared:
        producers = {t: max(i for i in range(first) if types[i] == t) for t in set(types[first:])}
        lost = sorted(p + 1 for t, p in producers.items() if p + 1 in gone
                      and any(i >= first and types[i] == t for i in keep))
        if lost:
            return (f"blocks {lost} cannot go: blocks {first + 1}..{n} reuse their keys and values "
                    f"(num_kv_shared_layers={shared}), and no config can point them elsewhere")
    if keep and types[keep[-1]] != "full_attention":
        return (f"blocks {sorted(gone)} cannot all go: block {keep[-1] + 1} ({types[keep[-1]]}) would become the last, "
                "and Gemma 4's config forces its last block to full attention")
    return None


#: What each config limit means for a capability, as the README table's notes say it.
LIMIT_NOTES: dict[str, dict[str, str]] = {"kv_sharing": {
    "diagnose": "with KV sharing, removing a block whose keys and values later blocks reuse has no defined output (no "
                "pruned model computes it): its removal Δloss is reported as not measurable (null, with the reason)",
    "stream": "not with KV sharing (num_kv_shared_layers > 0: later blocks reuse the keys and values of earlier ones, "
              "which the layer-by-layer engine does not carry); refused in one line",
    "prune": "a block whose keys and values later blocks reuse (KV sharing) cannot go, nor blocks that would leave a "
             "sliding-attention block last: --remove / --budget choose among the others (every method, both engines), "
             "and a request they cannot meet or --blocks naming them is refused in one line, before any work"}}
#: What some configs of a family cannot do, by name: (config or config.json's dict, capability, removed 1-based
#: blocks) -> one line saying why, or None.
CONFIG_LIMITS: dict[str, Callable[[Any, str, Sequence[int]], str | None]] = {"kv_sharing": _kv_sharing}


def config_limit(config: Any, capability: str, removed: Sequence[int] = ()) -> str | None:
    """Why the family's :data:`CONFIG_LIMITS` refuse ``capability`` on this config (for ``prune``: removing the 1-based
    blocks ``removed``), or None: also for a model type the registry does not know (nothing to limit)."""
    fam = FAMILIES.get(_get(config, "model_type") or "")
    for name in fam.limits if fam is not None else ():
        why = CONFIG_LIMITS[name](config, capability, removed)
        if why is not None:
            return why
    return None


def check_config(config: Any, capability: str, removed: Sequence[int] = ()) -> None:
    """A one-line DepthlabError when the family's :data:`CONFIG_LIMITS` refuse ``capability`` on this config (for
    ``prune``: removing the 1-based blocks ``removed``)."""
    fam = family_of(_get(config, "model_type"), capability)
    why = config_limit(config, capability, removed)
    if why is not None:
        what = "stream" if capability == "stream" else capability
        raise DepthlabError(f"depthlab cannot {what} this {fam.name} model: {why}")


# ---------------------------------------------------------------------------------------------- the registry
_QWEN_WINDOW = ("max_window_layers",)
_NO_PRE = ("OLMo 2/3 normalise the branch outputs (post_attention/post_feedforward_layernorm), not the block "
           "inputs: there is no pre-norm to scale")
_FAMILIES: tuple[Family, ...] = (
    Family("llama", "Llama 2/3, SmolLM2", convertible=True),
    Family("mistral", "Mistral", convertible=True),
    Family("qwen2", "Qwen2/2.5", index_rules=_QWEN_WINDOW, convertible=True),
    Family("qwen3", "Qwen3", index_rules=_QWEN_WINDOW, convertible=True),
    Family("qwen3_5_text", "Qwen3.5 (text)", "hybrid", norm_offset=1.0, tiny=_LINEAR),
    Family("gemma2", "Gemma 2", pre_norms=_SANDWICH, norm_offset=1.0),
    Family("gemma3_text", "Gemma 3 (text)", pre_norms=_SANDWICH, norm_offset=1.0),
    Family("gemma4_text", "Gemma 4 (text)", pre_norms=_SANDWICH, limits=("kv_sharing",),
           index_rules=("num_kv_shared_layers",), token_args=("per_layer_input",),
           layer_slices={"model.embed_tokens_per_layer.weight": "1:hidden_size_per_layer_input",
                         "model.per_layer_model_projection.weight": "0:hidden_size_per_layer_input"},
           layer_maps=("per_layer_config",),
           tiny={"vocab_size_per_layer_input": 300, "hidden_size_per_layer_input": 8, "global_head_dim": 16}),
    Family("olmo2", "OLMo 2", pre_norms=(),
           refused={"lns": _NO_PRE}),
    Family("olmo3", "OLMo 3", pre_norms=(),
           refused={"lns": _NO_PRE}),
    Family("phi3", "Phi-3/4"),
    Family("granite", "Granite"),
    Family("smollm3", "SmolLM3"),
    Family("glm4", "GLM-4"),
    Family("gpt_neox", "GPT-NeoX, Pythia", layers="gpt_neox.layers", final_norm="gpt_neox.final_layer_norm"),
    Family("gpt2", "GPT-2", layers="transformer.h", final_norm="transformer.ln_f", pre_norms=("ln_1", "ln_2")),
    Family("mixtral", "Mixtral", "MoE", tiny={"num_local_experts": 4, "num_experts_per_tok": 2}),
    Family("qwen2_moe", "Qwen2-MoE", "MoE", index_lists=("mlp_only_layers",),
           index_rules=("decoder_sparse_step", "max_window_layers"),
           tiny={**_MOE4, "shared_expert_intermediate_size": 32}),
    Family("qwen3_moe", "Qwen3-MoE", "MoE", index_lists=("mlp_only_layers",), index_rules=("decoder_sparse_step",),
           tiny=_MOE4),
    Family("olmoe", "OLMoE", "MoE", tiny={"num_experts": 4, "num_experts_per_tok": 2}),
    Family("deepseek_v3", "DeepSeek-V3", "MoE", index_rules=("first_k_dense_replace",),
           tiny={"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "first_k_dense_replace": 1,
                 "n_group": 1, "topk_group": 1, "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8,
                 "qk_nope_head_dim": 8, "v_head_dim": 8, "num_key_value_heads": 4}),
    Family("gpt_oss", "gpt-oss", "MoE", tiny={"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 8}),
    Family("llama4_text", "Llama 4 (text)", "MoE", index_lists=("moe_layers",),
           tiny={"num_local_experts": 2, "num_experts_per_tok": 1, "intermediate_size_mlp": 64,
                 "interleave_moe_layer_step": 2}),
    Family("qwen3_next", "Qwen3-Next", "hybrid", norm_offset=1.0, index_lists=("mlp_only_layers",),
           index_rules=("decoder_sparse_step",), tiny={**_MOE4, **_LINEAR, "shared_expert_intermediate_size": 32}),
    Family("deepseek_v4", "DeepSeek-V4", "multi-stream", token_args=("input_ids",), row_args=("attention_mask",),
           streams="hc_mult",
           collapse="model.hc_head", tiny={"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}),
)

#: model_type -> its entry.
FAMILIES: dict[str, Family] = {f.model_type: f for f in _FAMILIES}
#: Every model_type depthlab knows (the README table's rows).
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(FAMILIES)
#: The families :func:`depthlab.hf.from_hf` converts into a depthlab DecoderLM (the Llama layout).
CONVERTIBLE_MODEL_TYPES: tuple[str, ...] = tuple(f.model_type for f in _FAMILIES if f.convertible)
#: Keyword arguments every tiny test model shares (``Family.tiny`` adds to them).
TINY_BASE: dict[str, Any] = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
                             "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 300, "max_position_embeddings": 256,
                             "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


def supporting(capability: str) -> list[str]:
    """The model types whose entry does not refuse ``capability``."""
    return [t for t, f in FAMILIES.items() if f.why_not(capability) is None]


def family_of(model_type: str | None, capability: str | None = None) -> Family:
    """The entry of ``model_type``; a one-line DepthlabError naming the families that can when it is unknown or
    when its entry refuses ``capability`` (one of :data:`CAPABILITIES`)."""
    what = {"stream": "stream", "prune": "prune", "lns": "apply LayerNorm Scaling to", "diagnose": "diagnose",
            "monitor": "monitor", None: "read"}[capability]
    fam = FAMILIES.get(model_type or "")
    if fam is None:
        can = supporting(capability) if capability else list(SUPPORTED_MODEL_TYPES)
        raise DepthlabError(f"depthlab cannot {what} model type {model_type!r}: not a family it knows; "
                            f"supported: {', '.join(can)}")
    why = fam.why_not(capability) if capability else None
    if why is not None:
        raise DepthlabError(f"depthlab cannot {what} {fam.name} (model type {model_type!r}): {why}")
    return fam


def family_of_model(model: Any, capability: str | None = None) -> Family:
    """:func:`family_of` for an HF model (its ``config.model_type``)."""
    return family_of(getattr(getattr(model, "config", None), "model_type", None), capability)


def get_path(obj: Any, path: str) -> Any:
    """``obj.a.b.c`` for ``path`` "a.b.c" (None where an attribute is missing)."""
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def split_path(obj: Any, path: str) -> tuple[Any, str]:
    """(the module owning the last attribute of ``path``, that attribute's name)."""
    owner, _, attr = path.rpartition(".")
    return (get_path(obj, owner) if owner else obj), attr


def cut_config(config: Any, keep: Sequence[int], n_layers: int) -> None:
    """``config`` rewritten in place for the model that keeps the 0-based layers ``keep`` of ``n_layers``: index
    rules first, then per-layer lists sliced, index lists renumbered, ``num_hidden_layers`` set."""
    fam = FAMILIES.get(getattr(config, "model_type", ""))
    maps = {name: dict(config.to_dict().get(name) or {}) for name in (fam.layer_maps if fam else ())}
    rules = fam.index_rules if fam else ("max_window_layers",)
    for name in rules:
        INDEX_RULES[name](config, keep, n_layers)
    for name in (*LAYER_LISTS, *(fam.layer_lists if fam else ())):
        values = getattr(config, name, None)
        if isinstance(values, (list, tuple)) and len(values) == n_layers:
            setattr(config, name, [values[i] for i in keep])
    renumber = {old: new for new, old in enumerate(keep)}
    for name in fam.index_lists if fam else ():
        values = getattr(config, name, None)
        if isinstance(values, (list, tuple)):
            setattr(config, name, [renumber[i] for i in values if i in renumber])
    config.num_hidden_layers = len(keep)
    for name, overrides in maps.items():  # set after the layer count: transformers checks the indices against it
        setattr(config, name, None)
        setattr(config, name, {renumber[int(i)]: v for i, v in overrides.items() if int(i) in renumber})


def layer_slice_index(fam: Family, key: str, config: Any, keep: Sequence[int]) -> tuple[int, list[int]] | None:
    """For a tensor holding one slice per layer (``fam.layer_slices``): (its dim, the indices along it of the kept
    layers' slices, in order); None for any other tensor. ``config`` is the original's."""
    spec = fam.layer_slices.get(key)
    if spec is None:
        return None
    dim, width_field = spec.split(":")
    width = int(_get(config, width_field))
    return int(dim), [i * width + k for i in keep for k in range(width)]


def tiny_config(model_type: str, **overrides: Any) -> Any:
    """The config of the family's smallest model (``AutoConfig.for_model``): 4 layers of width 32, vocabulary 300."""
    from transformers import AutoConfig

    fam = family_of(model_type)
    return AutoConfig.for_model(model_type, **{**TINY_BASE, **fam.tiny, **overrides})


def family_table() -> str:
    """The README's "Supported models" table (markdown), from the registry: one row per family, each refusal
    a numbered note below the table."""
    notes: list[str] = []
    rows = ["| family | model_type | kind | " + " | ".join(CAPABILITIES) + " |", "|" + "---|" * (3 + len(CAPABILITIES))]
    for fam in _FAMILIES:
        cells = []
        for cap in CAPABILITIES:
            why = fam.why_not(cap)
            limits = [LIMIT_NOTES[name][cap] for name in fam.limits if cap in LIMIT_NOTES[name]]
            for note in [why] if why is not None else limits:
                if note not in notes:
                    notes.append(note)
            marks = " ".join(f"[{notes.index(note) + 1}]" for note in limits)
            cells.append(f"no [{notes.index(why) + 1}]" if why is not None else f"yes {marks}".strip())
        rows.append(f"| {fam.name} | `{fam.model_type}` | {fam.kind} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n\n" + "\n".join(f"[{i}] {why}." for i, why in enumerate(notes, start=1))
