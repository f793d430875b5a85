"""The smallest random model of every family of the registry: what the tests, the benchmarks and a user's own
experiment build instead of downloading weights.

    config = tiny_config("qwen3", num_hidden_layers=6)    # AutoConfig.for_model: 4 layers of width 32, vocab 300
    model = tiny_model("deepseek_v4")                     # from_config, seeded, the entry's fix-ups applied
    path = save_tiny("gemma3_text", "ckpt/", max_shard_size="40KB")   # + a byte-level tokenizer: a model directory

Each family's own overrides (``Family.tiny``) and fix-ups (``Family.tiny_fixup``: what its random model needs to
behave like a trained one, e.g. DeepSeek-V4's hash-routing table drawn rather than all zeros) are entry data in
:mod:`depthlab.hf.families`, so adding a family adds its test model with it. ``jitter=True`` draws norm weights
from U(0.5, 1.5) and biases from N(0, 0.1), so a misplaced scale or a dropped bias shows in a comparison.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from depthlab.hf.families import family_of, known_family
from depthlab.hf.shrink import jitter_norms

#: Keyword arguments every tiny test model shares (``Family.tiny`` and the call's overrides add to them).
TINY_BASE: dict[str, Any] = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
                             "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 300, "max_position_embeddings": 256,
                             "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


def tiny_config(model_type: str, **overrides: Any) -> Any:
    """The config of the family's smallest model (``AutoConfig.for_model``): 4 layers of width 32, vocabulary 300.
    A model type outside the registry gets its sizes from its own field names (:func:`depthlab.hf.shrink.tiny_overrides`)."""
    from transformers import AutoConfig

    if known_family(model_type) is None:
        from depthlab.hf.shrink import tiny_overrides

        return AutoConfig.for_model(model_type, **{**tiny_overrides(AutoConfig.for_model(model_type)), **overrides})
    fam = family_of(model_type)
    return AutoConfig.for_model(model_type, **{**TINY_BASE, **fam.tiny, **overrides})


def tiny_model(model_type: str, *, seed: int = 0, jitter: bool = True, dtype: Any = None, **overrides: Any) -> Any:
    """The family's smallest random causal LM (:func:`tiny_config` with ``overrides``), in eval mode: drawn from
    ``seed``, its entry's fix-ups applied, norms and biases jittered unless ``jitter=False``, cast to ``dtype``."""
    import torch
    from transformers import AutoModelForCausalLM

    fam = known_family(model_type)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type, **overrides)).eval()
    if jitter:
        jitter_norms(model)
    if fam is not None and fam.tiny_fixup is not None:
        fam.tiny_fixup(model)
    return model if dtype is None else model.to(dtype)


def save_tiny(model: Any, out: str | Path, *, max_shard_size: str | None = None, **kwargs: Any) -> Path:
    """Save ``model`` (or ``tiny_model(model, **kwargs)`` when it is a model type) into ``out`` with
    ``save_pretrained`` (safetensors, in shards of ``max_shard_size`` when given) and a byte-level tokenizer: a
    directory every depthlab command and plain transformers load."""
    if isinstance(model, str):
        model = tiny_model(model, **kwargs)
    out = Path(out)
    model.save_pretrained(out, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    byte_tokenizer().save_pretrained(out)
    return out


def byte_tokenizer() -> Any:
    """A 257-token byte-level HF tokenizer (no training, no download): what a tiny model directory ships."""
    from tokenizers import Tokenizer, decoders, models
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))}
    vocab["<eos>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


# ---------------------------------------------------------------------------------------------- wrappers
def tiny_wrapper(model_type: str, *, seed: int = 0, jitter: bool = True, text: dict[str, Any] | None = None,
                 vision: dict[str, Any] | None = None, **top: Any) -> tuple[Any, Any]:
    """(the smallest random image-text-to-text wrapper of ``model_type``, its tokenizer): the text tower its text
    family's tiny config (4 blocks of width 32), the vision tower the entry's (3 blocks, so a per-layer list of either
    tower is told apart), the image token ids the tokenizer's own special tokens. Weight matrices a random init
    leaves at zero (Gemma 3's ``mm_input_projection_weight``) are drawn, else no image would reach the language
    model. ``text`` / ``vision`` / ``top``: overrides of each config."""
    import torch
    from transformers import AutoModelForImageTextToText

    config, tok = tiny_wrapper_config(model_type, text=text, vision=vision, **top)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2 and not p.any():
                p.normal_(0.0, 0.2)
    if jitter:
        jitter_norms(model)
    return model, tok


def tiny_wrapper_config(model_type: str, *, text: dict[str, Any] | None = None, vision: dict[str, Any] | None = None,
                        **top: Any) -> tuple[Any, Any]:
    """(the config of :func:`tiny_wrapper`'s model, its tokenizer), no model built."""
    from transformers import AutoConfig

    from depthlab.hf.wrappers import WRAPPERS

    spec = WRAPPERS[model_type].tiny
    tok = special_tokenizer([*spec["tokens"].values(), *spec.get("extra", [])], spec.get("named"))
    ids = {name: tok.convert_tokens_to_ids(token) for name, token in spec["tokens"].items()}
    text_type = WRAPPERS[model_type].text_type
    config = AutoConfig.for_model(model_type, text_config={**TINY_BASE, **family_of(text_type).tiny, **(text or {})},
                                  vision_config={**spec["vision"], **(vision or {})}, **{**spec.get("top", {}), **top},
                                  **ids)
    return config, tok


def tiny_processor(model_type: str, tokenizer: Any) -> Any:
    """The processor of the wrapper's tiny model: transformers' own where it can be built here, else the
    :class:`~depthlab.hf.processors.ExpandedProcessor` of its image processor (what :func:`depthlab.hf.processors.
    wrapper_processor` loads from the saved directory); the tokenizer alone for a wrapper without an image processor
    that builds here (Llama 4)."""
    import transformers

    from depthlab.hf.processors import ExpandedProcessor
    from depthlab.hf.wrappers import WRAPPERS

    wrapper = WRAPPERS[model_type]
    if "image_processor" not in wrapper.tiny:  # Llama 4: its only image processor needs torchvision
        return tokenizer
    name, kwargs = wrapper.tiny["image_processor"]
    image_processor = getattr(transformers, name)(**kwargs)
    if "processor" in wrapper.tiny:
        cls, extra = wrapper.tiny["processor"]
        return getattr(transformers, cls)(image_processor=image_processor, tokenizer=tokenizer, **extra)
    return ExpandedProcessor(image_processor, tokenizer, wrapper.expand, {})


def save_tiny_wrapper(model_type: str, out: str | Path, *, max_shard_size: str | None = None,
                      model: Any = None, tokenizer: Any = None, **kwargs: Any) -> Path:
    """A wrapper's tiny model (or ``model`` with its ``tokenizer``) saved into ``out`` with ``save_pretrained``, its
    tokenizer and its processor (or image processor): a directory every depthlab command, ``AutoProcessor`` (where
    it builds) and ``AutoModelForImageTextToText`` load."""
    if model is None:
        model, tokenizer = tiny_wrapper(model_type, **kwargs)
    out = Path(out)
    model.save_pretrained(out, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    tiny_processor(model_type, tokenizer).save_pretrained(str(out))
    return out


def special_tokenizer(specials: list[str], named: dict[str, str] | None = None) -> Any:
    """A byte-level tokenizer without merges: ids 0..2 pad/bos/eos, then the 256 bytes, then ``specials`` (never
    split); ``named`` gives some of them the names a processor reads (``tokenizer.boi_token``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2}
    for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet())):
        vocab[ch] = 3 + i
    for s in specials:
        vocab.setdefault(s, len(vocab))
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(["<pad>", "<bos>", "<eos>", *specials])
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                   **({"extra_special_tokens": named} if named else {}))
