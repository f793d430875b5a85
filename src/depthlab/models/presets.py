"""Every preset table in one place, as plain data: model shapes per family and training defaults per preset.

    depthlab.from_preset("llama-130m", scheme="lns")     # PRESETS (decoders)
    depthlab.from_preset("vit-tiny")                     # VIT_PRESETS (ViT classifiers)
    TrainConfig().resolve(cfg)                           # TRAIN_DEFAULTS[cfg.name] fills what a run leaves None

Nothing here imports anything: configs, families and the trainer read these tables.
"""

from __future__ import annotations

from typing import Any


def _llama(n_layers: int, d_model: int, n_heads: int, d_ff: int) -> dict[str, Any]:
    return dict(n_layers=n_layers, d_model=d_model, n_heads=n_heads, d_ff=d_ff, max_seq_len=1024)


#: Decoder presets: the paper's (official code ``configs/llama_*.json``) plus ``tiny`` for CPU demos.
PRESETS: dict[str, dict[str, Any]] = {
    # 16 blocks of width 128: deep and narrow, so the depth effects show within minutes on 2 cores.
    "tiny": dict(n_layers=16, d_model=128, n_heads=4, d_ff=352, vocab_size=4096, max_seq_len=256),
    "llama-9m": _llama(4, 128, 4, 352),
    "llama-20m": _llama(4, 256, 4, 688),
    "llama-35m": _llama(6, 384, 8, 1024),
    "llama-40m": _llama(8, 416, 8, 1024),
    "llama-60m": _llama(8, 512, 8, 1376),
    "llama-71m": _llama(12, 512, 8, 1368),
    "llama-100m": _llama(12, 640, 10, 1708),
    "llama-130m": _llama(12, 768, 12, 2048),
    "llama-250m": _llama(24, 768, 16, 2560),
    "llama-350m": _llama(24, 1024, 16, 2736),
    "llama-1b": _llama(24, 2048, 32, 5461),
    "llama-3b": _llama(32, 2560, 32, 6848),
    "llama-7b": _llama(32, 4096, 32, 11008),
    # Paper §5.3.2: Qwen2.5-0.5B shape (GQA 14/2, q/k/v bias, tied embeddings, RoPE base 1e6).
    "qwen2.5-0.5b": dict(
        n_layers=24, d_model=896, n_heads=14, n_kv_heads=2, d_ff=4864, qkv_bias=True,
        tie_embeddings=True, rope_theta=1_000_000.0, vocab_size=151936, max_seq_len=2048,
    ),
}

#: ``vit-tiny``: sized for scikit-learn's 8x8 digits on one CPU core (16 patches of 2x2 + CLS, 8 blocks of width
#: 64). Its init_std 0.05 keeps ViT-S's per-component q/k scale (0.02*sqrt(384) ~ 0.05*sqrt(64) ~ 0.4); at 0.02 the
#: attention of a width-64 model starts uniform and 150 steps reach 42 % instead of 94 % held-out accuracy.
#: ``vit-s``: ViT-S/16 as in the paper's Table 5 (ImageNet-1K, 224 px; LayerScale removed = scheme "pre").
VIT_PRESETS: dict[str, dict[str, Any]] = {
    "vit-tiny": dict(image_size=8, patch_size=2, channels=1, num_classes=10, n_layers=8, d_model=64, n_heads=4,
                     d_ff=128, init_std=0.05),
    "vit-s": dict(image_size=224, patch_size=16, channels=3, num_classes=1000, n_layers=12, d_model=384, n_heads=6,
                  d_ff=1536),
}

#: Training defaults per preset: the TrainConfig fields a run leaves None. LMs: docs/paper.md §4.2 (lr, steps,
#: warm-up fraction, and for ``tiny`` CPU-sized batch, sequence length and held-out tokens).
TRAIN_DEFAULTS: dict[str, dict[str, Any]] = {
    "tiny": dict(lr=2e-3, steps=300, warmup=0.1, seq_len=128, batch_size=16, eval_tokens=32_768),
    "llama-9m": dict(lr=1e-3, steps=10_000, warmup=0.1),
    "llama-20m": dict(lr=1e-3, steps=10_000, warmup=0.1),
    "llama-35m": dict(lr=1e-3, steps=10_000, warmup=0.1),
    "llama-40m": dict(lr=1e-3, steps=10_000, warmup=0.1),
    "llama-60m": dict(lr=1e-3, steps=10_000, warmup=0.1),
    "llama-71m": dict(lr=1e-3, steps=10_000, warmup=0.1),
    "llama-100m": dict(lr=1e-3, steps=20_000, warmup=0.1),
    "llama-130m": dict(lr=1e-3, steps=20_000, warmup=0.1),
    "llama-250m": dict(lr=1e-3, steps=40_000, warmup=0.1),
    "llama-350m": dict(lr=5e-4, steps=60_000, warmup=0.1),
    "llama-1b": dict(lr=5e-4, steps=100_000, warmup=0.01),
    "llama-3b": dict(lr=5e-4, steps=100_000, warmup=0.01),
    "llama-7b": dict(lr=5e-4, steps=100_000, warmup=0.01),
    "qwen2.5-0.5b": dict(lr=5e-4, steps=60_000, warmup=0.1),
    # ViTs: vit-tiny from the digits study; vit-s as the paper's Table 5 (ImageNet-1K)
    "vit-tiny": dict(lr=2e-3, steps=600, warmup=0.1, batch_size=64, grad_clip=1.0),
    "vit-s": dict(lr=1e-3, steps=100_000, warmup=0.05, batch_size=1024, grad_clip=1.0),
}
#: What an LM preset without its own value gets (docs/paper.md §4.2).
PAPER_DEFAULTS = dict(lr=1e-3, steps=20_000, warmup=0.1, seq_len=256, batch_size=512, eval_tokens=1_048_576)
