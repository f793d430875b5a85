import pytest
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


@pytest.fixture
def hf_dir(tmp_path):
    """Save a tiny HF model (+ byte tokenizer) and return its directory."""
    def make(kind: str = "llama", n_layers: int = 6, tie: bool = False):
        path = tmp_path / f"{kind}-{n_layers}"
        tiny_hf(kind, n_layers, tie).save_pretrained(path)
        byte_tokenizer().save_pretrained(path)
        return path
    return make


PRUNE_OPTS = {"data": "builtin", "tokens": 128, "seq_len": 32, "batch_size": 2, "progress": False, "latency_tokens": 2}


@pytest.fixture(autouse=True)
def _fresh_logging():
    """``depthlab.cli.main`` configures the root logger on the stderr of the moment (pytest's capture of
    one test); drop that handler afterwards so the next test's main() binds its own stderr."""
    import logging

    yield
    root = logging.getLogger()
    for handler in list(root.handlers):
        if type(handler) is logging.StreamHandler:  # basicConfig's, not pytest's own capture handlers
            root.removeHandler(handler)
