"""Tiny HF models and a byte tokenizer for the prune tests (own module name: each test folder has a
conftest, so ``from conftest import`` is ambiguous)."""

import torch


def byte_tokenizer():
    """A 257-token byte-level HF tokenizer (no training, no download): what a tiny HF model dir ships."""
    from tokenizers import Tokenizer, decoders, models
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))}
    vocab["<eos>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


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
