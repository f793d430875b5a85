"""Model configuration: one typed dataclass and the paper's size presets (plain data).

    cfg = depthlab.from_preset("llama-130m", scheme="lns")   # preset + overrides (litgpt style)
    cfg = ModelConfig.from_json(path)                         # round-trips through JSON

This module depends on nothing else in depthlab but its errors: the scheme registry builds on it.
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


def check_positive_ints(obj: Any, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def check_positive_numbers(obj: Any, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
            raise ConfigError(f"{name} must be a positive finite number, got {value!r}")


class SchemedConfig(JsonConfig):
    """What every model family's config shares (ModelConfig, ViTConfig): ``n_layers``, ``scheme``,
    ``scheme_options`` and ``block_depths`` fields, the depths they give, their checks, and ``replace``."""

    @property
    def depths(self) -> list[int]:
        """The 1-based depth l of each block: 1..L, or the original depths a pruned model kept."""
        return list(self.block_depths) if self.block_depths is not None else list(range(1, self.n_layers + 1))

    def check_scheme_fields(self) -> None:
        if not isinstance(self.scheme_options, dict):
            raise ConfigError(f"scheme_options must be a dict, got {self.scheme_options!r}")
        if self.block_depths is not None:
            d = self.block_depths
            if len(d) != self.n_layers or any(not isinstance(x, int) or x < 1 for x in d) or sorted(set(d)) != list(d):
                raise ConfigError(f"block_depths must be {self.n_layers} increasing positive integers, got {d!r}")

    def replace(self, **overrides: Any):
        """A copy with fields replaced. A new ``scheme`` drops the old scheme's options unless
        ``scheme_options`` is given too; scheme options by name go through ``depthlab.configure``."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ConfigError(f"unknown {type(self).__name__} field(s) {unknown}; {choices(sorted(known))} "
                              "(scheme options: depthlab.configure(cfg, name=value))")
        if "scheme" in overrides and overrides["scheme"] != self.scheme and "scheme_options" not in overrides:
            overrides["scheme_options"] = {}
        return dataclasses.replace(self, **overrides)


#: Scheme options that were flat ModelConfig fields before the registry owned them, with their old
#: defaults. ``from_dict`` moves a saved non-default value into ``scheme_options`` (the registry knows
#: these names as option aliases) and drops the defaults, so run directories written earlier still load.
_FORMER_FIELDS: dict[str, Any] = {"lns_position": "after-norm", "mix_alpha": 0.25, "norm_groups": 4,
                                  "layerscale_init": None}


@dataclass
class ModelConfig(SchemedConfig):
    """A LLaMA-style decoder: its shape, and the name and options of its normalization scheme.

    The config validates shapes only; the scheme name and its options are validated by the registry
    (``depthlab.schemes``) when a config is made with ``from_preset`` / ``configure`` and again when a
    model is built, so this module needs to know nothing of schemes.
    """

    name: str = "custom"  # preset name or a label; a preset's name also selects its training defaults
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
    qk_norm: bool = False  # RMSNorm on each head's queries and keys before RoPE (OLMo 2, Qwen3); any scheme
    tie_embeddings: bool = False  # share the input embedding and the LM head
    init_std: float = 0.02  # std of the normal init of every linear / embedding weight
    scheme: str = "pre"  # normalization scheme, a key of depthlab.SCHEMES
    scheme_options: dict[str, Any] = field(default_factory=dict)  # the scheme's options that differ from defaults
    block_depths: list[int] | None = None  # original 1-based depth of each block (pruned models); None = 1..L
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

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        check_positive_ints(self, ("vocab_size", "n_layers", "d_model", "n_heads", "d_ff", "max_seq_len"))
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ConfigError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                f"choose n_heads among the divisors of {self.d_model} or set head_dim"
            )
        if self.dim_head % 2:
            raise ConfigError(f"head size {self.dim_head} must be even for RoPE")
        if self.n_heads % self.kv_heads:
            raise ConfigError(f"n_heads={self.n_heads} is not divisible by n_kv_heads={self.kv_heads}")
        check_positive_numbers(self, ("norm_eps", "init_std", "rope_theta"))
        self.check_scheme_fields()

    # ------------------------------------------------------------------ JSON / copies
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        data = dict(data)
        former = {k: data.pop(k) for k in list(data) if k in _FORMER_FIELDS}
        moved = {k: v for k, v in former.items() if v != _FORMER_FIELDS[k]}
        if moved:
            data["scheme_options"] = {**moved, **data.get("scheme_options", {})}
        return super().from_dict(data)


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
