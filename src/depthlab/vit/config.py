"""ViT configuration: shapes, the scheme and its options (the registry's field names), presets.

    cfg = vit_from_preset("vit-s", scheme="lns", position="after-branch")   # the paper's best ViT placement

Field names are those of ``depthlab.config.ModelConfig`` wherever they mean the same (``n_layers``,
``d_model``, ``scheme``, ``scheme_options``, ``block_depths`` ...), since the registry reads them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from depthlab.config import JsonConfig
from depthlab.errors import ConfigError, choices
from depthlab.schemes import SCHEMES, get_scheme

POOLS = ("cls", "mean")


@dataclass
class ViTConfig(JsonConfig):
    """A ViT image classifier (Dosovitskiy et al. 2021) whose blocks follow a registry scheme."""

    name: str = "custom"  # preset name or a label
    image_size: int = 224  # input height = width, pixels
    patch_size: int = 16  # square patch side; image_size must be a multiple of it
    channels: int = 3  # input channels (3 RGB, 1 grey)
    num_classes: int = 1000  # classifier outputs
    n_layers: int = 12  # number of transformer blocks L
    d_model: int = 384  # hidden size
    n_heads: int = 6  # attention heads
    d_ff: int = 1536  # GELU MLP inner size
    norm_eps: float = 1e-6  # LayerNorm epsilon (timm 1e-6; HF's ViTConfig defaults to 1e-12)
    pool: str = "cls"  # what the head reads: the class token ("cls") or the mean of the patch tokens ("mean")
    init_std: float = 0.02  # std of the normal init of linear weights, patch embedding, cls token, positions
    scheme: str = "pre"  # normalization scheme, a key of depthlab.SCHEMES
    scheme_options: dict[str, Any] = field(default_factory=dict)  # the scheme's options that differ from defaults
    block_depths: list[int] | None = None  # original 1-based depth of each block (pruned models); None = 1..L
    extra: dict[str, Any] = field(default_factory=dict)  # free-form provenance (e.g. HF source)

    def __post_init__(self) -> None:
        self.validate()

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

    @property
    def depths(self) -> list[int]:
        """The 1-based depth l of each block: 1..L, or the original depths a pruned model kept."""
        return list(self.block_depths) if self.block_depths is not None else list(range(1, self.n_layers + 1))

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        for name in ("image_size", "patch_size", "channels", "num_classes", "n_layers", "d_model", "n_heads", "d_ff"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.image_size % self.patch_size:
            raise ConfigError(f"image_size={self.image_size} is not a multiple of patch_size={self.patch_size}")
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                              f"choose n_heads among the divisors of {self.d_model}")
        for name in ("norm_eps", "init_std"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"{name} must be a positive finite number, got {value!r}")
        if self.pool not in POOLS:
            raise ConfigError(f"unknown pool {self.pool!r}; {choices(POOLS)}")
        if not isinstance(self.scheme_options, dict):
            raise ConfigError(f"scheme_options must be a dict, got {self.scheme_options!r}")
        if self.block_depths is not None:
            d = self.block_depths
            if len(d) != self.n_layers or any(not isinstance(x, int) or x < 1 for x in d) or sorted(set(d)) != list(d):
                raise ConfigError(f"block_depths must be {self.n_layers} increasing positive integers, got {d!r}")

    def replace(self, **overrides: Any) -> "ViTConfig":
        """A copy with fields replaced; a new ``scheme`` drops the old scheme's options unless
        ``scheme_options`` is given too."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ConfigError(f"unknown ViTConfig field(s) {unknown}; {choices(sorted(known))} "
                              "(scheme options: vit_configure(cfg, name=value))")
        if "scheme" in overrides and overrides["scheme"] != self.scheme and "scheme_options" not in overrides:
            overrides["scheme_options"] = {}
        return dataclasses.replace(self, **overrides)


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


def vit_checked(cfg: ViTConfig) -> ViTConfig:
    """``cfg`` with its scheme and options validated by the registry and stored canonically."""
    scheme = get_scheme(cfg.scheme)
    canonical = scheme.canonical(cfg.scheme_options)
    cfg = cfg if canonical == cfg.scheme_options else dataclasses.replace(cfg, scheme_options=canonical)
    scheme.validate(cfg)  # type: ignore[arg-type]  # the registry reads d_model, n_layers, scheme_options
    return cfg


def _foreign_default(key: str, value: Any) -> bool:
    """Another scheme's option at its default (``lns_position="after-norm"`` on ``pre``): a no-op, accepted,
    as ``depthlab.configure`` does, so one set of settings serves every scheme of a comparison."""
    for other in SCHEMES.values():
        for opt in other.options:
            if key in (opt.name, opt.alias):
                try:
                    return opt.parse(key, value) == opt.default
                except ConfigError:
                    return False
    return False


def vit_configure(base: ViTConfig, **overrides: Any) -> ViTConfig:
    """``base`` with fields and scheme options (by name or alias) replaced, checked by the registry."""
    fields = {f.name for f in dataclasses.fields(ViTConfig)}
    cfg = base.replace(**{k: v for k, v in overrides.items() if k in fields})
    scheme = get_scheme(cfg.scheme)
    own = {}
    for key, value in overrides.items():
        if key in fields:
            continue
        if any(key in (o.name, o.alias) for o in scheme.options):
            own[key] = value
        elif not _foreign_default(key, value):
            takers = [n for n, s in SCHEMES.items() if any(key in (o.name, o.alias) for o in s.options)]
            where = f"an option of schemes {', '.join(takers)}" if takers else "an option of any scheme"
            raise ConfigError(f"unknown setting {key!r} (= {value!r}) for scheme {cfg.scheme!r}: not a ViTConfig "
                              f"field ({', '.join(sorted(fields))}), and {where}")
    return vit_checked(dataclasses.replace(cfg, scheme_options=scheme.canonical({**cfg.scheme_options, **own})))


def vit_from_preset(name: str, **overrides: Any) -> ViTConfig:
    """The ViT preset ``name`` with fields or scheme options replaced (``vit_from_preset("vit-tiny", n_layers=4)``)."""
    if name not in VIT_PRESETS:
        raise ConfigError(f"unknown ViT preset {name!r}; {choices(VIT_PRESETS)}")
    get_scheme(overrides.get("scheme", ViTConfig.scheme))  # an unknown scheme is named before any option of it
    return vit_configure(ViTConfig(name=name, **VIT_PRESETS[name]), **overrides)
