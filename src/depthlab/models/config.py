"""Model configurations: typed dataclasses, plain data (the preset tables live in ``depthlab.models.presets``).

    cfg = depthlab.from_preset("llama-130m", scheme="lns")   # preset + overrides (litgpt style)
    cfg = ModelConfig.from_json(path)                         # round-trips through JSON

``SchemedConfig`` owns what every model family shares (depth, width, heads, the scheme and its options,
block depths); ``ModelConfig`` adds a LLaMA decoder's fields, ``ViTConfig`` a ViT classifier's. This module
depends on nothing else in depthlab but its errors: the scheme registry builds on it.
"""


from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from depthlab.base.errors import ConfigError, choices


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
            from depthlab.base.fileio import write_text_atomic

            write_text_atomic(path, text + "\n")
        return text

    @classmethod
    def from_json(cls, path_or_text: str | Path):
        """From a JSON string or the path of a JSON file."""
        text = str(path_or_text)
        if not text.lstrip().startswith("{"):
            text = Path(path_or_text).read_text()
        return cls.from_dict(json.loads(text))


#: The largest model depthlab builds: blocks, width (d_model, d_ff, heads), and parameters of the blocks. Beyond
#: them a config is a typo (``n_layers: 1e8``), refused before any memory is taken (building would hang).
MAX_LAYERS, MAX_WIDTH, MAX_PARAMS = 10_000, 2**18, 10**13


def check_size(cfg: Any) -> None:
    """Refuse a model beyond :data:`MAX_LAYERS`, :data:`MAX_WIDTH` or :data:`MAX_PARAMS` (naming the field)."""
    for name, top in (("n_layers", MAX_LAYERS), ("d_model", MAX_WIDTH), ("d_ff", MAX_WIDTH), ("n_heads", MAX_WIDTH)):
        if getattr(cfg, name) > top:
            raise ConfigError(f"{name}={getattr(cfg, name)} is beyond what depthlab builds: give {name} <= {top}")
    d = cfg.d_model
    params = cfg.n_layers * (4 * d * d + 3 * d * cfg.d_ff)
    if params > MAX_PARAMS:
        raise ConfigError(f"n_layers={cfg.n_layers}, d_model={d}, d_ff={cfg.d_ff} make about {params:.2g} parameters, "
                          f"beyond what depthlab builds ({MAX_PARAMS:.0e}); lower n_layers or the width")


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


@dataclass(kw_only=True)
class SchemedConfig(JsonConfig):
    """What every model family's config shares: its name, shape, scheme and options, the depths they give,
    their checks, and ``replace``. Defaults are a 12-block, 768-wide model; presets set the real shapes."""

    name: str = "custom"  # preset name or a label; a preset's name also selects its training defaults
    n_layers: int = 12  # number of transformer blocks L
    d_model: int = 768  # hidden size
    n_heads: int = 12  # (query) attention heads
    d_ff: int = 2048  # feed-forward inner size (SwiGLU for a decoder, GELU MLP for a ViT)
    norm_eps: float = 1e-6  # norm epsilon (RMSNorm for a decoder, LayerNorm for a ViT)
    init_std: float = 0.02  # std of the normal init of every linear / embedding weight
    scheme: str = "pre"  # normalization scheme, a key of depthlab.SCHEMES
    scheme_options: dict[str, Any] = field(default_factory=dict)  # the scheme's options that differ from defaults
    block_depths: list[int] | None = None  # original 1-based depth of each block (pruned models); None = 1..L
    extra: dict[str, Any] = field(default_factory=dict)  # free-form provenance (e.g. HF source)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_positive_ints(self, ("n_layers", "d_model", "n_heads", "d_ff"))
        check_size(self)
        check_positive_numbers(self, ("norm_eps", "init_std"))
        self.check_scheme_fields()

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
        ``scheme_options`` is given too; scheme options by name go through ``depthlab.models.configure``."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ConfigError(f"unknown {type(self).__name__} field(s) {unknown}; {choices(sorted(known))} "
                              "(scheme options: depthlab.models.configure(cfg, name=value))")
        if "scheme" in overrides and overrides["scheme"] != self.scheme and "scheme_options" not in overrides:
            overrides["scheme_options"] = {}
        return dataclasses.replace(self, **overrides)


#: Scheme options that were flat ModelConfig fields before the registry owned them, with their old
#: defaults. ``from_dict`` moves a saved non-default value into ``scheme_options`` (the registry knows
#: these names as option aliases) and drops the defaults, so run directories written earlier still load.
_FORMER_FIELDS: dict[str, Any] = {"lns_position": "after-norm", "mix_alpha": 0.25, "norm_groups": 4,
                                  "layerscale_init": None}


@dataclass(kw_only=True)
class ModelConfig(SchemedConfig):
    """A LLaMA-style decoder: its shape, and the name and options of its normalization scheme.

    The config validates shapes only; the scheme name and its options are validated by the registry
    (``depthlab.models.schemes``) when a config is made with ``from_preset`` / ``configure`` and again when a
    model is built, so this module needs to know nothing of schemes.
    """

    vocab_size: int = 32000  # tokenizer size (T5: 32000)
    n_kv_heads: int | None = None  # key/value heads (grouped-query attention); None = n_heads
    head_dim: int | None = None  # per-head size; None = d_model // n_heads
    max_seq_len: int = 1024  # longest sequence the model is meant for (RoPE itself extrapolates)
    rope_theta: float = 10000.0  # RoPE base
    qkv_bias: bool = False  # bias on q/k/v projections (the Qwen2 shape)
    qk_norm: bool = False  # RMSNorm on each head's queries and keys before RoPE (OLMo 2, Qwen3); any scheme
    tie_embeddings: bool = False  # share the input embedding and the LM head

    # ------------------------------------------------------------------ derived shapes
    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def dim_head(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        super().validate()
        check_positive_ints(self, ("vocab_size", "max_seq_len"))
        if self.vocab_size > 2**24 or self.max_seq_len > 2**24:
            name = "vocab_size" if self.vocab_size > 2**24 else "max_seq_len"
            raise ConfigError(f"{name}={getattr(self, name)} is beyond what depthlab builds: give {name} <= {2**24}")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ConfigError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                f"choose n_heads among the divisors of {self.d_model} or set head_dim"
            )
        if self.dim_head % 2:
            raise ConfigError(f"head size {self.dim_head} must be even for RoPE")
        if self.n_heads % self.kv_heads:
            raise ConfigError(f"n_heads={self.n_heads} is not divisible by n_kv_heads={self.kv_heads}")
        check_positive_numbers(self, ("rope_theta",))

    # ------------------------------------------------------------------ JSON / copies
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        data = dict(data)
        former = {k: data.pop(k) for k in list(data) if k in _FORMER_FIELDS}
        moved = {k: v for k, v in former.items() if v != _FORMER_FIELDS[k]}
        if moved:
            data["scheme_options"] = {**moved, **data.get("scheme_options", {})}
        return super().from_dict(data)


POOLS = ("cls", "mean")


@dataclass(kw_only=True)
class ViTConfig(SchemedConfig):
    """A ViT image classifier (Dosovitskiy et al. 2021) whose blocks follow a registry scheme."""

    image_size: int = 224  # input height = width, pixels
    patch_size: int = 16  # square patch side; image_size must be a multiple of it
    channels: int = 3  # input channels (3 RGB, 1 grey)
    num_classes: int = 1000  # classifier outputs
    pool: str = "cls"  # what the head reads: the class token ("cls") or the mean of the patch tokens ("mean")

    # ------------------------------------------------------------------ derived shapes
    @property
    def dim_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def seq_len(self) -> int:
        """Tokens per image: the patches plus the class token (kept for ``pool="mean"`` too, as timm)."""
        return self.n_patches + 1

    @property
    def max_seq_len(self) -> int:
        """The longest token sequence the model takes (what ``TrainConfig`` checks ``seq_len`` against)."""
        return self.seq_len

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        super().validate()
        check_positive_ints(self, ("image_size", "patch_size", "channels", "num_classes"))
        if self.image_size % self.patch_size:
            raise ConfigError(f"image_size={self.image_size} is not a multiple of patch_size={self.patch_size}")
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                              f"choose n_heads among the divisors of {self.d_model}")
        if self.pool not in POOLS:
            raise ConfigError(f"unknown pool {self.pool!r}; {choices(POOLS)}")
