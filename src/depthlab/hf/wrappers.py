"""Image-text-to-text wrappers (``*ForConditionalGeneration`` whose config wraps a ``text_config`` and a
``vision_config``): one :class:`Wrapper` entry per transformers ``model_type``, the registry's second half.

    fam = tower_family(config, "language")     # the text family's entry, its base moved into the wrapper
    fam = tower_family(config, "vision")       # the vision tower's entry: a Family of the same shape
    layers = find_tower(model, "vision")       # the vision blocks of a loaded wrapper
    cut_tower(config, "vision", keep=[0, 2], n_layers=3)   # both towers' per-layer facts, the wrapper's too

A wrapper is a set of **towers**, each a block list with its own inputs: the language tower reads text (and the
image features the wrapper scatters into it), the vision tower reads pixels. Each tower is a :class:`Family`: the
language tower is the text family of the checkpoint's ``text_config.model_type`` with ``base`` set to where the
wrapper keeps it (``dataclasses.replace(FAMILIES[text_type], base="model.language_model")``), so every path, rule
and limit of the text family follows; the vision tower is an entry of the same shape whose rules apply to the
``vision_config``. What ties them (the projector's feature layer, Qwen3-VL's deepstack) is wrapper data naming
rules in :mod:`depthlab.hf.family_rules`. Diagnose, prune, LNS and the monitor take a tower; nothing else in
depthlab names a wrapper.

Every refusal here reads the config alone (config.json's dict or a transformers config): a wrapper depthlab does not
know, one without a text decoder, a vision tower asked of a text-only model, a block the wrapper cannot lose.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from depthlab.base.errors import DepthlabError, choices
from depthlab.hf.families import (
    CAPABILITIES,
    Family,
    config_limit,
    cut_config,
    family_of,
    family_of_model,
    get_path,
    known_family,
)
from depthlab.hf.family_rules import CONFIG_LIMITS, WRAPPER_LIMITS, WRAPPER_RULES, config_field

#: The towers a model may have: every model a language tower (a text decoder), a wrapper also a vision tower.
TOWERS: tuple[str, ...] = ("language", "vision")

_SIGLIP = ("layer_norm1", "layer_norm2")
_QWEN_V = ("norm1", "norm2")
_QWEN_TOKENS = {"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>",
                "vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>"}
_QVIS = {"depth": 3, "hidden_size": 32, "intermediate_size": 64, "num_heads": 4, "out_hidden_size": 32, "patch_size": 4}
_VIS = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4}
_IDEFICS = ["<fake_token_around_image>", "<global-img>"] + [f"<row_{i}_col_{j}>" for i in (1, 2) for j in (1, 2)]
_QWEN_IP = {"image_processor": ("Qwen2VLImageProcessorPil", {"min_pixels": 16 * 16, "max_pixels": 32 * 32,
                                                              "patch_size": 4, "merge_size": 2})}
_IDEFICS_IP = {"size": {"longest_edge": 32}, "max_image_size": {"longest_edge": 32}, "do_image_splitting": False}
_LLAMA4_FORWARD = ("transformers 5.24's Llama4ForConditionalGeneration.forward reads image_outputs off its language "
                   "model's output and raises on every call (text or image)")


@dataclass(frozen=True)
class Wrapper:
    """What depthlab needs to know of one image-text-to-text wrapper: where each tower sits, what ties them."""

    model_type: str  # transformers' config.model_type of the wrapper
    name: str  # as the README table shows it
    language: str  # dotted path of the language tower's base model in the wrapper (its text family's ``base``)
    vision: Family  # the vision tower: ``base`` where it sits, its blocks, the rules of its ``vision_config``
    text_type: str  # the text family of transformers' default config (the tiny test model's); a checkpoint's own
    #                 ``text_config.model_type`` decides which text family its language tower is
    text_lm: str = ""  # a causal LM inside the wrapper that runs text alone, where the wrapper's forward cannot
    marker: str = ""  # the text standing for one image in a plain prompt ("": the processor's image_token)
    expand: str = ""  # how image-text inputs are made without the wrapper's processor (hf.processors.EXPANSIONS)
    vision_rules: tuple[str, ...] = ()  # names in WRAPPER_RULES: wrapper config fields cut with the vision blocks
    limits: tuple[str, ...] = ()  # names in WRAPPER_LIMITS: blocks the wrapper cannot lose
    refused: dict[str, str] = field(default_factory=dict)  # "vision" (the tower), "generate" -> why (one line)
    image_token_oov: bool = False  # its forward takes an image token id beyond the text vocabulary (embeds it as
    #                                padding, then scatters the image features there); others must hold it in vocab
    tiny: dict[str, Any] = field(default_factory=dict)  # its tiny test model (hf/tiny.py): vision / top overrides,
    #                                                     tokens (config field -> special token), named, extra tokens


def _vision(name: str, base: str, blocks: str = "encoder.layers", pre_norms: tuple[str, ...] = _SIGLIP,
            **kw: Any) -> Family:
    return Family(f"{name} (vision)", f"{name} (vision)", "vision", base=base, blocks=blocks, norm="",
                  pre_norms=pre_norms, **kw)


_QWEN = dict(marker="<|vision_start|><|image_pad|><|vision_end|>", expand="qwen")
_WRAPPERS: tuple[Wrapper, ...] = (
    Wrapper("gemma3", "Gemma 3", "model.language_model", _vision("Gemma 3", "model.vision_tower"), "gemma3_text",
            image_token_oov=True,
            tiny={"vision": {**_VIS, "image_size": 32, "patch_size": 8}, "top": {"mm_tokens_per_image": 4},
                  "tokens": {"image_token_index": "<image_soft_token>", "boi_token_index": "<start_of_image>",
                             "eoi_token_index": "<end_of_image>"},
                  "named": {"image_token": "<image_soft_token>", "boi_token": "<start_of_image>",
                            "eoi_token": "<end_of_image>"},
                  "image_processor": ("Gemma3ImageProcessorPil", {"size": {"height": 32, "width": 32}}),
                  "processor": ("Gemma3Processor", {"image_seq_length": 4})}),
    Wrapper("gemma4", "Gemma 4", "model.language_model",
            _vision("Gemma 4", "model.vision_tower", pre_norms=("input_layernorm", "pre_feedforward_layernorm")),
            "gemma4_text", expand="gemma4",
            tiny={"vision": {**_VIS, "num_key_value_heads": 4, "head_dim": 8, "patch_size": 4,
                             "position_embedding_size": 64},
                  "tokens": {"image_token_id": "<|image|>", "boi_token_id": "<|image>", "eoi_token_id": "<image|>",
                             "video_token_id": "<|video|>", "audio_token_id": "<|audio|>", "boa_token_id": "<|audio>",
                             "eoa_token_index": "<audio|>"},
                  "image_processor": ("Gemma4ImageProcessorPil", {"patch_size": 4, "max_soft_tokens": 70,
                                                                  "pooling_kernel_size": 3})}),
    Wrapper("llama4", "Llama 4", "language_model.model",
            _vision("Llama 4", "vision_model.model", "layers", ("input_layernorm", "post_attention_layernorm")),
            "llama4_text", text_lm="language_model",
            refused={"vision": _LLAMA4_FORWARD + "; its image processor needs torchvision",
                     "generate": _LLAMA4_FORWARD},
            tiny={"vision": {**_VIS, "intermediate_size": 128, "image_size": 32, "patch_size": 8,
                             "vision_output_dim": 32, "projector_input_dim": 32, "projector_output_dim": 32},
                  "tokens": {"image_token_index": "<|image|>", "boi_token_index": "<|image_start|>",
                             "eoi_token_index": "<|image_end|>"}}),
    Wrapper("qwen3_5", "Qwen3.5", "model.language_model", _vision("Qwen3.5", "model.visual", "blocks", _QWEN_V,
                                                                   count="depth"), "qwen3_5_text", **_QWEN,
            tiny={"vision": {**_QVIS, "num_position_embeddings": 64}, "tokens": _QWEN_TOKENS, **_QWEN_IP}),
    Wrapper("qwen3_5_moe", "Qwen3.5-MoE", "model.language_model",
            _vision("Qwen3.5-MoE", "model.visual", "blocks", _QWEN_V, count="depth"), "qwen3_5_moe_text", **_QWEN,
            tiny={"vision": {**_QVIS, "num_position_embeddings": 64}, "tokens": _QWEN_TOKENS, **_QWEN_IP}),
    Wrapper("qwen2_5_vl", "Qwen2.5-VL", "model.language_model",
            _vision("Qwen2.5-VL", "model.visual", "blocks", _QWEN_V, count="depth",
                    index_lists=("fullatt_block_indexes",)), "qwen2_5_vl_text", **_QWEN,
            tiny={"vision": {**_QVIS, "fullatt_block_indexes": [1, 2], "window_size": 16}, "tokens": _QWEN_TOKENS,
                  **_QWEN_IP}),
    Wrapper("qwen3_vl", "Qwen3-VL", "model.language_model",
            _vision("Qwen3-VL", "model.visual", "blocks", _QWEN_V, count="depth",
                    index_lists=("deepstack_visual_indexes",)), "qwen3_vl_text", limits=("deepstack",), **_QWEN,
            tiny={"vision": {**_QVIS, "deepstack_visual_indexes": [0, 1], "num_position_embeddings": 64},
                  "tokens": _QWEN_TOKENS, **_QWEN_IP}),
    Wrapper("mistral3", "Mistral 3 (Small 3.x)", "model.language_model",
            _vision("Mistral 3", "model.vision_tower", "transformer.layers", ("attention_norm", "ffn_norm")),
            "mistral", expand="pixtral", vision_rules=("vision_feature_layer",),
            tiny={"vision": {**_VIS, "image_size": 32, "patch_size": 8, "head_dim": 8},
                  "tokens": {"image_token_index": "[IMG]"}, "extra": ["[IMG_BREAK]", "[IMG_END]"],
                  "image_processor": ("PixtralImageProcessorPil", {"size": {"longest_edge": 32}, "patch_size": 8})}),
    Wrapper("llava", "LLaVA", "model.language_model", _vision("LLaVA", "model.vision_tower"), "llama",
            vision_rules=("vision_feature_layer",),
            tiny={"vision": {**_VIS, "image_size": 32, "patch_size": 8, "projection_dim": 32},
                  "top": {"image_seq_length": 16}, "tokens": {"image_token_index": "<image>"},
                  "image_processor": ("LlavaImageProcessorPil", {"size": {"shortest_edge": 32},
                                                                 "crop_size": {"height": 32, "width": 32}}),
                  "processor": ("LlavaProcessor", {"patch_size": 8, "vision_feature_select_strategy": "default",
                                                   "num_additional_image_tokens": 1})}),
    Wrapper("idefics3", "Idefics3", "model.text_model", _vision("Idefics3", "model.vision_model"), "llama",
            expand="idefics",
            tiny={"vision": {**_VIS, "image_size": 32, "patch_size": 8}, "tokens": {"image_token_id": "<image>"},
                  "extra": _IDEFICS, "image_processor": ("Idefics3ImageProcessorPil", _IDEFICS_IP),
                  "processor": ("Idefics3Processor", {"image_seq_len": 4})}),
    Wrapper("smolvlm", "SmolVLM", "model.text_model", _vision("SmolVLM", "model.vision_model"), "llama",
            expand="idefics",
            tiny={"vision": {**_VIS, "image_size": 32, "patch_size": 8}, "tokens": {"image_token_id": "<image>"},
                  "extra": _IDEFICS, "image_processor": ("SmolVLMImageProcessorPil", _IDEFICS_IP)}),
    Wrapper("paligemma", "PaliGemma", "model.language_model", _vision("PaliGemma", "model.vision_tower"), "gemma",
            image_token_oov=True,
            tiny={"vision": {**_VIS, "image_size": 32, "patch_size": 8, "projection_dim": 32},
                  "top": {"projection_dim": 32, "hidden_size": 32}, "tokens": {"image_token_index": "<image>"},
                  "image_processor": ("SiglipImageProcessorPil", {"size": {"height": 32, "width": 32},
                                                                  "image_seq_length": 16}),
                  "processor": ("PaliGemmaProcessor", {})}),
)

#: model_type -> its entry: every image-text-to-text wrapper depthlab knows (the README table's second part).
WRAPPERS: dict[str, Wrapper] = {w.model_type: w for w in _WRAPPERS}


# ---------------------------------------------------------------------------------------------- config lookups
def sub_config(config: Any, name: str) -> Any:
    """``config.text_config`` / ``config.vision_config`` (a dict for config.json's dict), or None."""
    sub = config_field(config, name)
    return sub if sub is not None and (isinstance(sub, dict) or hasattr(sub, "to_dict")) else None


def is_image_text(config: Any) -> bool:
    """Whether a config is an image-text model's (it has a ``vision_config``, or its type is a known wrapper)."""
    return sub_config(config, "vision_config") is not None or config_field(config, "model_type") in WRAPPERS


def wrapper_of(config: Any) -> Wrapper | None:
    """The entry of an image-text-to-text config (or of a model type), None for a text model; DepthlabError in one
    line for an image-text config depthlab does not know."""
    model_type = config if isinstance(config, str) else config_field(config, "model_type")
    if model_type in WRAPPERS:
        return WRAPPERS[model_type]
    if isinstance(config, str) or not is_image_text(config):
        return None
    raise DepthlabError(f"depthlab cannot read model type {model_type!r}: an image-text model (its config has a "
                        f"vision_config) that is not a wrapper it knows; {choices(list(WRAPPERS))}")


def check_tower_name(tower: str) -> str:
    if tower not in TOWERS:
        raise DepthlabError(f"unknown --tower {tower!r}; {choices(TOWERS)}")
    return tower


def text_type(config: Any) -> str | None:
    """The model type of a wrapper's text decoder (``text_config.model_type``), or None when it has none."""
    text = sub_config(config, "text_config")
    return config_field(text, "model_type") if text is not None else None


def tower_family(config: Any, tower: str = "language", capability: str | None = None) -> Family:
    """The entry of ``tower`` of the model ``config`` describes (config.json's dict or a transformers config): a
    text model's family (its only tower is the language tower), or a wrapper's language / vision tower; one line
    naming why when depthlab cannot read it or its entry refuses ``capability`` (one of :data:`CAPABILITIES`)."""
    check_tower_name(tower)
    wrapper = wrapper_of(config)
    model_type = config_field(config, "model_type")
    if wrapper is None:
        if tower == "vision":
            what = f"model type {model_type!r}" if model_type else "this model"
            raise DepthlabError(f"--tower vision: {what} is a text-only model (no vision_config); it has a language "
                                "tower only")
        return family_of(config if isinstance(config, dict) or hasattr(config, "to_dict") else model_type, capability)
    inner = text_type(config)
    if inner is None:
        raise DepthlabError(f"depthlab cannot read this {wrapper.name} model (model type {model_type!r}): its config "
                            "has no text_config, so there is no text decoder to measure or prune")
    if tower == "language":
        return dataclasses.replace(family_of(inner, capability), base=wrapper.language)
    why = wrapper.refused.get("vision")
    if why is not None:
        raise DepthlabError(f"depthlab cannot read the vision tower of {wrapper.name} (model type {model_type!r}): {why}")
    if sub_config(config, "vision_config") is None:
        raise DepthlabError(f"--tower vision: this {wrapper.name} config has no vision_config")
    if capability == "lns":
        raise DepthlabError("LayerNorm Scaling is the language tower's (the paper scales a decoder's pre-norms); "
                            "use --tower language")
    return wrapper.vision


def model_tower_family(model: Any, tower: str = "language", capability: str | None = None) -> Family:
    """:func:`tower_family` for a loaded model: a text model's row, else its layout read from the model itself
    (:func:`depthlab.hf.families.family_of_model`); a wrapper's tower by its entry."""
    config = getattr(model, "config", None)
    if tower == "language" and (config is None or wrapper_of(config) is None):
        return family_of_model(model, capability)
    return tower_family(config if config is not None else {}, tower, capability)


def tower_config(config: Any, tower: str) -> Any:
    """The (sub-)config holding ``tower``'s per-layer fields: a text model's own, a wrapper's ``text_config`` or
    ``vision_config``."""
    if wrapper_of(config) is None:
        return config
    return sub_config(config, "text_config" if tower == "language" else "vision_config")


def tower_layers(config: Any, tower: str) -> int:
    """How many blocks ``tower`` has, from the config alone."""
    fam = tower_family(config, tower)
    return int(config_field(tower_config(config, tower), fam.count))


def tower_limit(config: Any, tower: str, capability: str, removed: Sequence[int] = ()) -> str | None:
    """Why the config cannot do ``capability`` on ``tower`` (for ``prune``: lose its 1-based blocks ``removed``), or
    None: the text family's config limits (on the ``text_config``) and the wrapper's own."""
    wrapper = wrapper_of(config)
    if wrapper is None:
        return config_limit(config, capability, removed) if tower == "language" else None
    fam = tower_family(config, tower)
    sub = tower_config(config, tower)
    for name in fam.limits:
        why = CONFIG_LIMITS[name](sub, capability, removed)
        if why is not None:
            return why
    for name in wrapper.limits:
        why = WRAPPER_LIMITS[name](config, tower, capability, removed)
        if why is not None:
            return why
    return None


def check_tower(config: Any, tower: str, capability: str, removed: Sequence[int] = ()) -> Family:
    """:func:`tower_family` then :func:`tower_limit`, refused in one line; returns the tower's entry."""
    fam = tower_family(config, tower, capability)
    why = tower_limit(config, tower, capability, removed)
    if why is not None:
        wrapper = wrapper_of(config)
        what = f"this {fam.name} model" if wrapper is None else f"the {tower} tower of this {wrapper.name} model"
        raise DepthlabError(f"depthlab cannot {capability} {what}: {why}")
    return fam


def cut_tower(config: Any, tower: str, keep: Sequence[int], n_layers: int) -> None:
    """``config`` (a transformers config) rewritten in place for the model keeping the 0-based blocks ``keep`` of
    ``tower``'s ``n_layers``: the tower's (sub-)config cut by its entry's rules, the wrapper's fields that point at
    vision blocks rewritten."""
    wrapper = wrapper_of(config)
    fam = tower_family(config, tower)
    if wrapper is not None and tower == "vision":
        for name in wrapper.vision_rules:
            WRAPPER_RULES[name](config, keep, n_layers)
    cut_config(tower_config(config, tower), keep, n_layers, fam)


# ---------------------------------------------------------------------------------------------- loaded models
def find_tower(model: Any, tower: str = "language") -> Any:
    """The block ModuleList of ``tower`` of a loaded HF model (a wrapper, or a text model's language tower), or
    None when the entry's path holds none."""
    from torch import nn

    layers = get_path(model, tower_family(model.config, tower).layers)
    return layers if isinstance(layers, nn.ModuleList) and len(layers) else None


def text_forward(model: Any) -> Any:
    """``ids -> logits`` of a text-only forward of ``model``: the wrapper's own, or the causal LM inside it that runs
    text alone where the wrapper's cannot (Llama 4)."""
    wrapper = wrapper_of(getattr(model, "config", None) or {})
    lm = get_path(model, wrapper.text_lm) if wrapper is not None and wrapper.text_lm else model
    return lambda ids: lm(input_ids=ids, use_cache=False).logits


def known_model(config: Any) -> bool:
    """Whether the registry knows the model (a text family, or a wrapper whose text decoder is one)."""
    try:
        return wrapper_of(config) is not None or known_family(config_field(config, "model_type")) is not None
    except DepthlabError:
        return False


# ---------------------------------------------------------------------------------------------- the README table
def wrapper_row() -> str:
    """The README table's row of the image-text wrappers (their own table: :func:`wrapper_table`)."""
    types = " ".join(f"`{t}`" for t in WRAPPERS)
    return (f"| image-text wrappers, both towers ([docs/vlm.md](docs/vlm.md)) | {types} | wrapper | both towers | "
            "both towers | both towers | language | language |")


def wrapper_table() -> str:
    """The README's table of image-text-to-text wrappers (markdown), from the registry: one row per wrapper, each
    refusal a numbered note below."""
    notes: list[str] = []

    def mark(why: str | None, yes: str) -> str:
        if why is None:
            return yes
        if why not in notes:
            notes.append(why)
        return f"no [w{notes.index(why) + 1}]"

    rows = ["| wrapper | model_type | language tower (text family) | vision tower (blocks) | language: "
            + ", ".join(CAPABILITIES) + " | vision: diagnose, stream, prune | reload + generate |",
            "|" + "---|" * 7]
    for w in _WRAPPERS:
        text = known_family(w.text_type)
        rows.append(f"| {w.name} | `{w.model_type}` | `{w.language}` (`{w.text_type}`: {text.name if text else '?'}) "
                    f"| `{w.vision.layers}` | yes | {mark(w.refused.get('vision'), 'yes')} "
                    f"| {mark(w.refused.get('generate'), 'yes')} |")
    return "\n".join(rows) + ("\n\n" + "\n".join(f"[w{i}] {why}." for i, why in enumerate(notes, start=1))
                              if notes else "")
