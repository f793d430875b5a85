"""Model configuration: one typed dataclass, the paper's size presets, and overrides.

    cfg = from_preset("llama-130m", scheme="lns")          # preset + overrides (litgpt style)
    cfg = ModelConfig.from_json(path)                       # round-trips through JSON
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from depthlab.errors import ConfigError, choices

class JsonConfig:
    """Dataclass mixin: dict / JSON round-trip that refuses unknown fields by name."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown {cls.__name__} field(s) {unknown}; {choices(sorted(known))}")
        return cls(**data)

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True)
        if path is not None:
            Path(path).write_text(text + "\n")
        return text

    @classmethod
    def from_json(cls, path_or_text: str | Path):
        """From a JSON string or the path of a JSON file."""
        text = str(path_or_text)
        if not text.lstrip().startswith("{"):
            text = Path(path_or_text).read_text()
        return cls.from_dict(json.loads(text))


LNS_POSITIONS = ("after-norm", "before-norm", "after-branch", "after-residual", "attn-only", "ffn-only")


@dataclass
class ModelConfig(JsonConfig):
    """A LLaMA-style decoder and the normalization scheme of its blocks."""

    name: str = "custom"  # preset name or a label; informational
    vocab_size: int = 32000  # tokenizer size (T5: 32000)
    n_layers: int = 12  # number of transformer blocks L
    d_model: int = 768  # hidden size
    n_heads: int = 12  # query heads
    n_kv_heads: int | None = None  # key/value heads (grouped-query attention); None = n_heads
    head_dim: int | None = None  # per-head size; None = d_model // n_heads
    d_ff: int = 2048  # SwiGLU inner size
    max_seq_len: int = 1024  # longest sequence the model is meant for (RoPE itself extrapolates)
    norm_eps: float = 1e-6  # RMSNorm epsilon
    rope_theta: float = 10000.0  # RoPE base
    qkv_bias: bool = False  # bias on q/k/v projections (the Qwen2 shape)
    tie_embeddings: bool = False  # share the input embedding and the LM head
    init_std: float = 0.02  # std of the normal init of every linear / embedding weight
    scheme: str = "pre"  # normalization scheme, a key of depthlab.SCHEMES
    lns_position: str = "after-norm"  # where LNS multiplies by 1/sqrt(l) (paper T8); LNS schemes only
    mix_alpha: float = 0.25  # Mix-LN: the first round(mix_alpha * L) blocks are Post-LN
    norm_groups: int = 4  # Group-LN: channel groups normalised separately
    layerscale_init: float | None = None  # LayerScale epsilon; None = CaiT rule by depth
    extra: dict[str, Any] = field(default_factory=dict)  # free-form provenance (e.g. HF source)

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ derived shapes
    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def dim_head(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def n_post_ln_blocks(self) -> int:
        """Mix-LN: how many leading blocks are Post-LN, round(alpha * L) (paper: 3 of 12, 6 of 24)."""
        return int(math.floor(self.mix_alpha * self.n_layers + 0.5))

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        from depthlab.schemes import SCHEMES  # late import: schemes builds on this module

        if self.scheme not in SCHEMES:
            raise ConfigError(f"unknown scheme {self.scheme!r}; {choices(SCHEMES)}")
        if self.lns_position not in LNS_POSITIONS:
            raise ConfigError(f"unknown lns_position {self.lns_position!r}; {choices(LNS_POSITIONS)}")
        if self.lns_position != "after-norm" and not SCHEMES[self.scheme].uses_lns:
            lns = [n for n, s in SCHEMES.items() if s.uses_lns]
            raise ConfigError(
                f"lns_position={self.lns_position!r} only applies to an LNS scheme ({', '.join(lns)}), "
                f"not to scheme {self.scheme!r}"
            )
        for name in ("vocab_size", "n_layers", "d_model", "n_heads", "d_ff", "max_seq_len", "norm_groups"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ConfigError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                f"choose n_heads among the divisors of {self.d_model} or set head_dim"
            )
        if self.dim_head % 2:
            raise ConfigError(f"head size {self.dim_head} must be even for RoPE")
        if self.n_heads % self.kv_heads:
            raise ConfigError(f"n_heads={self.n_heads} is not divisible by n_kv_heads={self.kv_heads}")
        if self.d_model % self.norm_groups:
            raise ConfigError(f"d_model={self.d_model} is not divisible by norm_groups={self.norm_groups}")
        if not 0.0 <= self.mix_alpha <= 1.0:
            raise ConfigError(f"mix_alpha must lie in [0, 1], got {self.mix_alpha!r}")
        if self.norm_eps <= 0 or self.init_std <= 0 or self.rope_theta <= 0:
            raise ConfigError("norm_eps, init_std and rope_theta must be positive")

    # ------------------------------------------------------------------ parameter count
    def num_params(self, include_embeddings: bool = True) -> int:
        """Parameter count from the config alone (tests check it against the built module)."""
        from depthlab.schemes import SCHEMES

        d, kv = self.d_model, self.kv_heads * self.dim_head
        q = self.n_heads * self.dim_head
        attn = d * q + 2 * d * kv + q * d + (q + 2 * kv if self.qkv_bias else 0)
        ffn = 3 * d * self.d_ff
        block = attn + ffn + 2 * d  # two norm weights
        total = self.n_layers * block + SCHEMES[self.scheme].extra_params(self) + d  # + final norm
        if include_embeddings:
            total += self.vocab_size * d * (1 if self.tie_embeddings else 2)
        return total

    def replace(self, **overrides: Any) -> "ModelConfig":
        return from_dict_with_overrides(self.to_dict(), overrides)


def _llama(n_layers: int, d_model: int, n_heads: int, d_ff: int) -> dict[str, Any]:
    return dict(n_layers=n_layers, d_model=d_model, n_heads=n_heads, d_ff=d_ff, max_seq_len=1024)


#: The paper's presets (official code ``configs/llama_*.json``) plus ``tiny`` for CPU demos.
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


def from_dict_with_overrides(base: dict[str, Any], overrides: dict[str, Any]) -> ModelConfig:
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    for key in overrides:
        if key not in known:
            raise ConfigError(f"unknown ModelConfig field {key!r}; {choices(sorted(known))}")
    return ModelConfig(**{**base, **overrides})


def from_preset(name: str, **overrides: Any) -> ModelConfig:
    """The preset ``name`` with fields replaced by ``overrides`` (e.g. ``n_layers=2``)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; {choices(PRESETS)}")
    return from_dict_with_overrides({"name": name, **PRESETS[name]}, overrides)
