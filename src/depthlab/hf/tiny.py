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
