"""The Hugging Face decoder families depthlab knows: one :class:`Family` entry per transformers ``model_type``,
the one place a ``model_type`` means something.

    fam = family_of("olmo2")                  # the entry (DepthlabError naming the known ones when absent)
    fam = family_of("gemma4_text", "stream")  # ... refused with the family's reason when it cannot stream
    layers = get_path(model, fam.layers)      # the block ModuleList of a causal LM of that family
    cut_config(config, keep=[0, 1, 3], n_layers=4)   # the config of the pruned model, every per-layer fact cut
    model = tiny_model("deepseek_v4")         # its smallest random model, its entry's fix-ups applied (hf/tiny.py)

The default is transformers' own classes (built on the meta device by the streamed engine), blocks at
``model.layers``, pre-norms ``input_layernorm`` / ``post_attention_layernorm`` computing ``weight * x̂``; an
entry says only how its family differs: where the blocks and final norm sit, which config fields hold one
entry per layer (cut with the layers), which list layer indices (renumbered) and which index rules must be
rewritten (:mod:`depthlab.hf.family_rules`), which norms are the block's *pre*-norms (LayerNorm Scaling scales their
outputs), whether those norms compute ``(1 + weight) * x̂`` (Gemma, Qwen3-Next), how :func:`depthlab.hf.from_hf`
reads it (:class:`Conversion`), its smallest test model, and why a capability is refused where it is. The streamed
engine, prune's export (in memory and shard by shard), LNS, the converters, ``find_layers`` and the monitor read it;
the README's "Supported models" table is generated from it (:func:`family_table`).

Every module path of an entry is relative to ``base``, the causal LM's base model (``model``, ``transformer``,
``gpt_neox``); ``layers``, ``final_norm``, ``collapse`` and ``layer_slices`` give the full paths (also the
checkpoint's key prefixes). So the same entry serves where the decoder sits elsewhere: an image-text-to-text
wrapper's language tower is its text family's entry with ``base`` set to the wrapper's text-model path
(``dataclasses.replace(fam, base="model.language_model")``), and an entry inferred from a model outside the table
is a ``Family`` built from what the model shows (its block list, final norm, per-layer config lists).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from depthlab.base.errors import DepthlabError, choices
from depthlab.hf import inferred
from depthlab.hf.family_rules import CONFIG_LIMITS, INDEX_RULES, LIMIT_NOTES, config_field, draw_hash_routes

#: The capabilities a family entry may refuse (the README table's columns after "diagnose").
CAPABILITIES: tuple[str, ...] = ("diagnose", "stream", "prune", "lns", "monitor")

#: Config fields holding one entry per layer in every family that has them (cut with the layers).
LAYER_LISTS: tuple[str, ...] = ("layer_types", "mlp_layer_types", "no_rope_layers")

_PRE = ("input_layernorm", "post_attention_layernorm")
_SANDWICH = ("input_layernorm", "pre_feedforward_layernorm")  # Gemma: post_* norms sit on the branch outputs
_MOE4 = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
_LINEAR = {"linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8}


@dataclass(frozen=True)
class Conversion:
    """How :func:`depthlab.hf.from_hf` reads a family as depthlab's Llama-layout ``DecoderLM`` (every field off: the
    Llama layout itself), and the config :func:`depthlab.hf.to_hf` writes for a depthlab model of that shape."""

    qkv_bias: bool = False  # q/k/v projections carry biases (Qwen2): the family's own, so attention_bias is not refused
    qk_norm: bool = False  # a per-head RMSNorm on queries and keys (Qwen3)
    window_switch: str = ""  # the config field that turns ``sliding_window`` on (Qwen2's use_sliding_window); "": on
    #                          whenever a window is set
    export: dict[str, Any] = field(default_factory=dict)  # config fields to_hf writes (switches off, no extra biases)


@dataclass(frozen=True)
class Experts:
    """Where a family's routed experts sit in a decoder layer (every path relative to the layer, then to ``block``):
    what ``prune --unit expert`` measures and cuts (:mod:`depthlab.hf.experts`). A layer is an MoE layer when
    ``block`` holds ``experts`` (DeepSeek's first dense layers, Llama 4's interleaved ones are not)."""

    count: str  # the config field of the routed-expert count, cut with the experts (num_experts, n_routed_experts, ...)
    block: str = "mlp"  # the layer's MoE module
    router: str = "gate"  # the router, in the block: its rows (weight, bias, score correction) are per expert
    experts: str = "experts"  # the routed experts, in the block: every tensor's first dim is the expert
    shared: tuple[str, ...] = ()  # the block's shared experts (and their gates): every token reads them, never removed
    dense: bool = False  # every expert runs on the gate-scaled input (Llama 4), not on its top-k tokens only
    groups: str = ""  # config field: the router picks groups of experts first (DeepSeek-V3 n_group); the same
    #                   number goes from each group
    fixed_routes: tuple[str, ...] = ()  # mlp_layer_types whose routes are a fixed token table (DeepSeek-V4 hash_moe)


@dataclass(frozen=True)
class Family:
    """What depthlab needs to know of one transformers decoder family, the rest generic."""

    model_type: str  # transformers' config.model_type
    name: str  # as the README table shows it
    kind: str = "dense"  # dense | MoE | hybrid | multi-stream (README)
    base: str = "model"  # dotted path from the causal LM to its base model; the paths below are relative to it
    blocks: str = "layers"  # the block ModuleList
    norm: str = "norm"  # the norm after the last block
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
    stream_collapse: str = ""  # the module that collapses the streams before the final norm
    slices: dict[str, str] = field(default_factory=dict)  # tensor key -> "dim:config_field": one slice of that
    #                                   width per layer along that dim (Gemma 4's per-layer embedding table), cut too
    layer_maps: tuple[str, ...] = ()  # config fields mapping a layer index to overrides (``per_layer_config``)
    convert: Conversion | None = None  # how depthlab.hf.from_hf turns it into a DecoderLM; None: it does not
    tiny: dict[str, Any] = field(default_factory=dict)  # config overrides of its smallest test model (hf/tiny.py)
    tiny_fixup: Callable[[Any], None] | None = None  # what its random test model needs to behave like a trained one
    inferred: bool = False  # read from the model itself (depthlab.hf.inferred), not a row of the table
    count: str = "num_hidden_layers"  # the config field holding the number of blocks (Qwen-VL's vision towers: depth)
    wrapped: str = ""  # a text tower transformers builds only inside this image-text-to-text wrapper (no causal LM
    #                    class of its own): tested through the wrapper (depthlab.hf.wrappers), not alone
    experts: Experts | None = None  # its routed experts (MoE families): what ``prune --unit expert`` cuts

    def why_not(self, capability: str) -> str | None:
        return self.refused.get(capability)

    def at_base(self, path: str) -> str:
        """The dotted path from the causal LM of ``path`` (relative to the base model)."""
        return f"{self.base}.{path}" if self.base else path

    @property
    def layers(self) -> str:
        """The block ModuleList, from the causal LM; also the checkpoint's key prefix of the blocks."""
        return self.at_base(self.blocks)

    @property
    def final_norm(self) -> str:
        """The norm after the last block, from the causal LM ("" when the LM head reads the last block's output)."""
        return self.at_base(self.norm) if self.norm else ""

    @property
    def collapse(self) -> str:
        """The module collapsing the residual streams before the final norm ("" for one stream)."""
        return self.at_base(self.stream_collapse) if self.stream_collapse else ""

    @property
    def layer_slices(self) -> dict[str, str]:
        """:attr:`slices` keyed by the checkpoint's (full) tensor keys."""
        return {self.at_base(key): spec for key, spec in self.slices.items()}


# ---------------------------------------------------------------------------------------------- the registry
_QWEN_WINDOW = ("max_window_layers",)
_QWEN_SHARED = ("shared_expert", "shared_expert_gate")
_NO_PRE = ("OLMo 2/3 normalise the branch outputs (post_attention/post_feedforward_layernorm), not the block "
           "inputs: there is no pre-norm to scale")
_LLAMA = Conversion(export={"attention_bias": False, "mlp_bias": False})
_FAMILIES: tuple[Family, ...] = (
    Family("llama", "Llama 2/3, SmolLM2", convert=_LLAMA),
    Family("mistral", "Mistral", convert=Conversion()),
    Family("qwen2", "Qwen2/2.5", index_rules=_QWEN_WINDOW,
           convert=Conversion(qkv_bias=True, window_switch="use_sliding_window", export={"use_sliding_window": False})),
    Family("qwen3", "Qwen3", index_rules=_QWEN_WINDOW,
           convert=Conversion(qk_norm=True, export={"attention_bias": False, "use_sliding_window": False})),
    Family("qwen3_5_text", "Qwen3.5 (text)", "hybrid", norm_offset=1.0, tiny=_LINEAR),
    Family("qwen3_5_moe_text", "Qwen3.5-MoE (text)", "hybrid", norm_offset=1.0,
           experts=Experts("num_experts", shared=_QWEN_SHARED),
           tiny={**_MOE4, **_LINEAR, "shared_expert_intermediate_size": 32}),
    Family("qwen2_5_vl_text", "Qwen2.5-VL (text)", index_rules=_QWEN_WINDOW, wrapped="qwen2_5_vl",
           tiny={"rope_parameters": {"rope_type": "default", "mrope_section": [2, 1, 1], "rope_theta": 10000.0}}),
    Family("qwen3_vl_text", "Qwen3-VL (text)", wrapped="qwen3_vl"),
    Family("gemma", "Gemma", norm_offset=1.0),
    Family("gemma2", "Gemma 2", pre_norms=_SANDWICH, norm_offset=1.0),
    Family("gemma3_text", "Gemma 3 (text)", pre_norms=_SANDWICH, norm_offset=1.0),
    Family("gemma4_text", "Gemma 4 (text)", pre_norms=_SANDWICH, limits=("kv_sharing",),
           index_rules=("num_kv_shared_layers",), token_args=("per_layer_input",),
           slices={"embed_tokens_per_layer.weight": "1:hidden_size_per_layer_input",
                   "per_layer_model_projection.weight": "0:hidden_size_per_layer_input"},
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
    Family("gpt_neox", "GPT-NeoX, Pythia", base="gpt_neox", norm="final_layer_norm"),
    Family("gpt2", "GPT-2", base="transformer", blocks="h", norm="ln_f", pre_norms=("ln_1", "ln_2")),
    Family("mixtral", "Mixtral", "MoE", experts=Experts("num_local_experts"),
           tiny={"num_local_experts": 4, "num_experts_per_tok": 2}),
    Family("qwen2_moe", "Qwen2-MoE", "MoE", index_lists=("mlp_only_layers",),
           experts=Experts("num_experts", shared=_QWEN_SHARED),
           index_rules=("decoder_sparse_step", "max_window_layers"),
           tiny={**_MOE4, "shared_expert_intermediate_size": 32}),
    Family("qwen3_moe", "Qwen3-MoE", "MoE", index_lists=("mlp_only_layers",), index_rules=("decoder_sparse_step",),
           experts=Experts("num_experts"),
           tiny=_MOE4),
    Family("olmoe", "OLMoE", "MoE", experts=Experts("num_experts"), tiny={"num_experts": 4, "num_experts_per_tok": 2}),
    Family("deepseek_v3", "DeepSeek-V3", "MoE", index_rules=("first_k_dense_replace",),
           experts=Experts("n_routed_experts", shared=("shared_experts",), groups="n_group"),
           tiny={"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "first_k_dense_replace": 1,
                 "n_group": 1, "topk_group": 1, "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8,
                 "qk_nope_head_dim": 8, "v_head_dim": 8, "num_key_value_heads": 4}),
    Family("gpt_oss", "gpt-oss", "MoE", experts=Experts("num_local_experts", router="router"),
           tiny={"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 8}),
    Family("llama4_text", "Llama 4 (text)", "MoE", index_lists=("moe_layers",),
           experts=Experts("num_local_experts", block="feed_forward", router="router", shared=("shared_expert",),
                           dense=True),
           tiny={"num_local_experts": 2, "num_experts_per_tok": 1, "intermediate_size_mlp": 64,
                 "interleave_moe_layer_step": 2}),
    Family("qwen3_next", "Qwen3-Next", "hybrid", norm_offset=1.0, index_lists=("mlp_only_layers",),
           index_rules=("decoder_sparse_step",), experts=Experts("num_experts", shared=_QWEN_SHARED),
           tiny={**_MOE4, **_LINEAR, "shared_expert_intermediate_size": 32}),
    Family("deepseek_v4", "DeepSeek-V4", "multi-stream", token_args=("input_ids",), row_args=("attention_mask",),
           streams="hc_mult", stream_collapse="hc_head",
           experts=Experts("n_routed_experts", shared=("shared_experts",), fixed_routes=("hash_moe",)),
           tiny={"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
           tiny_fixup=draw_hash_routes),
)

#: model_type -> its entry: every model type depthlab knows (the README table's rows).
FAMILIES: dict[str, Family] = {f.model_type: f for f in _FAMILIES}
#: The families :func:`depthlab.hf.from_hf` converts into a depthlab DecoderLM (the Llama layout).
CONVERTIBLE_MODEL_TYPES: tuple[str, ...] = tuple(f.model_type for f in _FAMILIES if f.convert is not None)


def supporting(capability: str) -> list[str]:
    """The model types whose entry does not refuse ``capability``."""
    return [t for t, f in FAMILIES.items() if f.why_not(capability) is None]


#: The families LayerNorm Scaling hooks (:mod:`depthlab.hf.lns`): those with pre-norms.
LNS_MODEL_TYPES: tuple[str, ...] = tuple(supporting("lns"))


def known_family(which: Any) -> Family | None:
    """The entry of a model type (a string: the table's rows only, else None), or of a config (a transformers config
    or config.json's dict): its row, else the entry inferred from the class transformers builds for it
    (:func:`inferred_family`). The one lookup every function here goes through."""
    if which is None or isinstance(which, str):
        return FAMILIES.get(which or "")
    return FAMILIES.get(config_field(which, "model_type") or "") or inferred_family(which)


#: The line the report and the export record carry for an entry read from the model.
INFERRED = "layout inferred"


def _inferred(model_type: str, fields: dict[str, Any]) -> Family:
    return Family(model_type, f"{model_type} ({INFERRED})", fields.get("kind", "dense"), pre_norms=(),
                  inferred=True, **{k: v for k, v in fields.items() if k != "kind"})


def inferred_family(config: Any) -> Family:
    """The entry of a model type outside the table, read from the model transformers builds for ``config`` on the
    meta device (:mod:`depthlab.hf.inferred`); a capability it cannot have is refused in the entry, saying why.
    Its pre-norms are probed when LayerNorm Scaling asks for them (:func:`family_of` with "lns")."""
    return _inferred(str(config_field(config, "model_type")), inferred.layout_of_config(config))


def _with_pre_norms(fam: Family, config: Any) -> Family:
    """An inferred entry completed with its pre-norms (probed on a tiny model of the family), or refusing LNS."""
    import dataclasses

    found = inferred.probe_pre_norms(config)
    if isinstance(found, str):
        return dataclasses.replace(fam, refused={**fam.refused, "lns": found})
    return dataclasses.replace(fam, pre_norms=found[0], norm_offset=found[1])


#: What each capability is called in a refusal ("depthlab cannot <what> ...").
WHAT = {"stream": "stream", "prune": "prune", "lns": "apply LayerNorm Scaling to", "diagnose": "diagnose",
        "monitor": "monitor", None: "read"}


def cannot_line(model_type: Any, capability: str | None, why: str, name: str | None = None) -> str:
    """The refusal of ``capability`` for ``model_type`` (its entry's ``name``; default: an inferred layout's)."""
    return f"depthlab cannot {WHAT[capability]} {name or f'{model_type} ({INFERRED})'} (model type {model_type!r}): {why}"


def family_of(which: Any, capability: str | None = None) -> Family:
    """The entry of ``which`` (a model type, a config or config.json's dict: :func:`known_family`); a one-line
    DepthlabError naming the families that can when it is unknown, or saying why when its entry refuses
    ``capability`` (one of :data:`CAPABILITIES`)."""
    what = WHAT[capability]
    fam = known_family(which)
    model_type = which if which is None or isinstance(which, str) else config_field(which, "model_type")
    if fam is None:
        can = supporting(capability) if capability else list(FAMILIES)
        raise DepthlabError(f"depthlab cannot {what} model type {model_type!r}: not a family it knows; "
                            f"supported: {', '.join(can)}")
    if fam.inferred and capability == "lns" and fam.why_not("lns") is None:
        fam = _with_pre_norms(fam, which)
    why = fam.why_not(capability) if capability else None
    if why is not None:
        raise DepthlabError(cannot_line(model_type, capability, why, fam.name))
    return fam


def family_of_model(model: Any, capability: str | None = None) -> Family:
    """:func:`family_of` for an HF model: its table row, else the entry read from the model itself."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type is None or model_type in FAMILIES:
        return family_of(model_type, capability)
    fam = _inferred(model_type, inferred.layout(model))
    if capability == "lns" and fam.why_not("lns") is None:
        fam = _with_pre_norms(fam, config)
    why = fam.why_not(capability) if capability else None
    if why is not None:
        raise DepthlabError(cannot_line(model_type, capability, why, fam.name))
    return fam


def refusal_before_load(target: Any, capability: str) -> str | None:
    """Why ``capability`` is refused for the HF checkpoint directory ``target``, from its config.json alone (and the
    class transformers builds for it on the meta device): one line, before any weight is read; None when it is not
    refused, or when ``target`` is not an HF directory (a depthlab run, a name, a model already opened)."""
    from depthlab.base.paths import model_dir_config

    config = model_dir_config(target)  # None: no HF directory, or a config.json the loader names the fault of
    if config is None:
        return None
    if isinstance(config.get("vision_config"), dict):
        return None  # an image-text wrapper: its towers' entries decide (depthlab.hf.wrappers)
    try:
        family_of(config, capability)
    except DepthlabError as err:
        return str(err).splitlines()[0]
    return None


def layout_line(model: Any) -> str | None:
    """What the report says of where an HF causal LM's layout came from: "family table", its inferred entry's name
    ("olmo (layout inferred)"), or None (not a decoder depthlab reads: no HF config, no generate, or refused)."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type in FAMILIES:
        return "family table"
    if model_type is None or not hasattr(model, "generate"):
        return None
    fam = _inferred(model_type, inferred.layout(model))
    return fam.name if fam.why_not("diagnose") is None else None


def conversion_of(model_type: str | None) -> Conversion:
    """How :func:`depthlab.hf.from_hf` reads ``model_type``; a one-line DepthlabError naming the convertible
    families when it does not."""
    fam = known_family(model_type)
    if fam is None or fam.convert is None:
        raise DepthlabError(f"unsupported HF model_type {model_type!r}; {choices(CONVERTIBLE_MODEL_TYPES)}")
    return fam.convert


def export_family(qkv_bias: bool, qk_norm: bool) -> Family:
    """The first convertible family whose layout is a depthlab model's (q/k/v biases, QK-norm): what
    :func:`depthlab.hf.to_hf` writes it as."""
    for fam in _FAMILIES:
        if fam.convert is not None and (fam.convert.qkv_bias, fam.convert.qk_norm) == (qkv_bias, qk_norm):
            return fam
    raise DepthlabError(f"no transformers family has q/k/v biases={qkv_bias} with QK-norm={qk_norm}; "
                        f"convertible: {', '.join(CONVERTIBLE_MODEL_TYPES)}")


def config_limit(config: Any, capability: str, removed: Sequence[int] = ()) -> str | None:
    """Why the family's :data:`CONFIG_LIMITS` refuse ``capability`` on this config (for ``prune``: removing the 1-based
    blocks ``removed``), or None: also for a model type the registry does not know (nothing to limit)."""
    fam = known_family(config_field(config, "model_type"))
    for name in fam.limits if fam is not None else ():
        why = CONFIG_LIMITS[name](config, capability, removed)
        if why is not None:
            return why
    return None


def check_config(config: Any, capability: str, removed: Sequence[int] = ()) -> None:
    """A one-line DepthlabError when the family's :data:`CONFIG_LIMITS` refuse ``capability`` on this config (for
    ``prune``: removing the 1-based blocks ``removed``)."""
    fam = family_of(config, capability)  # a row, or the layout inferred from the config
    why = config_limit(config, capability, removed)
    if why is not None:
        what = "stream" if capability == "stream" else capability
        raise DepthlabError(f"depthlab cannot {what} this {fam.name} model: {why}")


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


def _settable(config: Any, name: str) -> bool:
    """Whether ``config.name = ...`` can be set: not a read-only property, nor a name transformers maps onto one
    (``attribute_map``: Bamba's layer_types is its read-only layers_block_type)."""
    name = (getattr(type(config), "attribute_map", None) or {}).get(name, name)
    prop = getattr(type(config), name, None)
    return not isinstance(prop, property) or prop.fset is not None


def cut_config(config: Any, keep: Sequence[int], n_layers: int, fam: Family | None = None) -> None:
    """``config`` rewritten in place for the model that keeps the 0-based layers ``keep`` of ``n_layers``: index
    rules first, then per-layer lists sliced, index lists renumbered, the block count (``fam.count``) set. ``fam``:
    the entry whose rules apply (default: the config's row, or the entry read from the model transformers builds for
    it, :func:`known_family`; an image-text wrapper's tower passes its own, :func:`depthlab.hf.wrappers.cut_tower`)."""
    fam = fam or known_family(config)
    maps = {name: dict(config.to_dict().get(name) or {}) for name in fam.layer_maps}
    for name in fam.index_rules:
        INDEX_RULES[name](config, keep, n_layers)
    for name in dict.fromkeys((*LAYER_LISTS, *fam.layer_lists)):
        values = getattr(config, name, None)
        if isinstance(values, (list, tuple)) and len(values) == n_layers and _settable(config, name):
            setattr(config, name, [values[i] for i in keep])  # a read-only property follows the fields it reads
    renumber = {old: new for new, old in enumerate(keep)}
    for name in fam.index_lists:
        values = getattr(config, name, None)
        if isinstance(values, (list, tuple)):
            setattr(config, name, [renumber[i] for i in values if i in renumber])
    setattr(config, fam.count, len(keep))
    for name, overrides in maps.items():  # set after the layer count: transformers checks the indices against it
        setattr(config, name, None)
        setattr(config, name, {renumber[int(i)]: v for i, v in overrides.items() if int(i) in renumber})


def layer_slice_index(fam: Family, key: str, config: Any, keep: Sequence[int]) -> tuple[int, list[int]] | None:
    """For a tensor holding one slice per layer (``fam.layer_slices``, by checkpoint key): (its dim, the indices along
    it of the kept layers' slices, in order); None for any other tensor. ``config`` is the original's."""
    spec = fam.layer_slices.get(key)
    if spec is None:
        return None
    dim, width_field = spec.split(":")
    width = int(config_field(config, width_field))
    return int(dim), [i * width + k for i in keep for k in range(width)]


#: What the table's last row (a decoder outside the table, its layout inferred) says of each capability.
GENERIC_NOTES: dict[str, str] = {
    "diagnose": ("outside the table: one ModuleList of num_hidden_layers blocks under the base model, a final norm "
                 "beside it, per-layer config lists cut with the blocks, all read from the model transformers builds "
                 "(meta device); encoders, encoder-decoders, image-text models no wrapper entry reads and models with "
                 "no such list are refused from config.json before any weight is read, by every command, in "
                 "0.14-0.17 s (before torch is imported: a committed table of every transformers class's structure, "
                 "docs/families.md); verified on "
                 "92 of the 111 decoder families transformers 5.24 builds outside the table (83 %; the rest refused "
                 "in one line, none wrong: docs/families.md)"),
    "stream": ("only once the layer-by-layer forward of a small model of the same family and flags equals that "
               "model's own forward; refused in one line otherwise"),
    "prune": ("the export is checked against the original with the blocks skipped (logits, cached generate) and "
              "refused, nothing written, when they differ"),
    "lns": "where its pre-norms are found by probing a small model of the family (weight * x or (1 + weight) * x)",
}


def family_table(extra_rows: Sequence[str] = ()) -> str:
    """The README's "Supported models" table (markdown), from the registry: one row per family, each refusal
    a numbered note below the table; ``extra_rows`` (the image-text wrappers' row) before the last, generic row."""
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
    cells = []
    for cap in CAPABILITIES:
        note = GENERIC_NOTES.get(cap)
        if note is not None and note not in notes:
            notes.append(note)
        cells.append(f"yes [{notes.index(note) + 1}]" if note is not None else "yes")
    rows.extend(extra_rows)
    rows.append(f"| any other decoder: {INFERRED} | any | any | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n\n" + "\n".join(f"[{i}] {why}." for i, why in enumerate(notes, start=1))
