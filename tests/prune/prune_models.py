"""Tiny HF models and a byte tokenizer for the prune tests (own module name: each test folder has a
conftest, so ``from conftest import`` is ambiguous)."""

import torch
from streaming_models import byte_tokenizer  # noqa: F401 - the prune tests import it from here


def tiny_hf(kind: str = "llama", n_layers: int = 6, tie: bool = False, seed: int = 0):
    """A random fp32 Llama or Qwen2 with non-trivial norm weights (so a wrong norm shows)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = {"vocab_size": 300, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": n_layers,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
              "tie_word_embeddings": tie}
    model = (LlamaForCausalLM(LlamaConfig(**common)) if kind == "llama"
             else Qwen2ForCausalLM(Qwen2Config(**common, use_sliding_window=False)))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model.eval()
