"""A depthlab tokenizer as transformers sees it: the tokenizer files shipped beside an HF checkpoint, and the
special-token ids written into its config (so ``generate()`` stops at the tokenizer's own EOS).
"""

from __future__ import annotations

from typing import Any

from torch import nn


def hf_tokenizer(tokenizer: Any) -> Any | None:
    """A ``transformers`` tokenizer for a depthlab one (to ship beside an export), or None for the
    byte tokenizer, which has no HF equivalent."""
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

    inner = getattr(tokenizer, "tok", None)
    if isinstance(inner, PreTrainedTokenizerBase):
        return inner
    if inner is not None and hasattr(inner, "token_to_id"):  # a tokenizers.Tokenizer (our BPE)
        eos = inner.id_to_token(tokenizer.eos_id)
        pad = inner.id_to_token(tokenizer.pad_id)
        return PreTrainedTokenizerFast(tokenizer_object=inner, eos_token=eos, pad_token=pad)
    return None


def special_token_ids(tokenizer: Any) -> dict[str, int | None]:
    """``bos_token_id`` / ``eos_token_id`` / ``pad_token_id`` of a depthlab (or HF) tokenizer; None
    where it has no such token, or when there is no tokenizer."""
    if tokenizer is None:
        return {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    inner = getattr(tokenizer, "tok", None)
    bos = getattr(inner, "bos_token_id", None)
    eos = getattr(tokenizer, "eos_id", getattr(tokenizer, "eos_token_id", None))
    pad = getattr(tokenizer, "pad_id", getattr(tokenizer, "pad_token_id", None))
    return {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad}


def set_special_token_ids(hf_model: nn.Module, tokenizer: Any) -> None:
    """Write the tokenizer's own special-token ids into the model's config and generation config (not
    the LlamaConfig defaults bos=1 / eos=2, which name ordinary tokens of a depthlab vocabulary), so
    ``generate()`` stops at the tokenizer's EOS."""
    for key, value in special_token_ids(tokenizer).items():
        setattr(hf_model.config, key, value)
        if getattr(hf_model, "generation_config", None) is not None:
            setattr(hf_model.generation_config, key, value)


__all__ = ["hf_tokenizer", "special_token_ids", "set_special_token_ids"]
