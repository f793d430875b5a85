"""Vision Transformers with every scheme of the registry (the paper's Table 5 and Figure 8).

    from depthlab.vit import vit_from_preset, build_vit
    model = build_vit(vit_from_preset("vit-tiny", scheme="lns", position="after-branch"))

A ViT is one more family of ``depthlab.schemes.Parts`` (LayerNorm, bidirectional attention, GELU
MLP); its blocks come from the same registry as the decoder's. Its config (``ViTConfig``) lives beside
the decoder's in ``depthlab.config``, its presets in ``depthlab.presets``; image data in ``depthlab.data.images``.
"""

from __future__ import annotations

from typing import Any

from depthlab._lazy import lazy_exports

__all__ = ["ViTConfig", "VIT_PRESETS", "vit_from_preset", "ViT", "ViTOutput", "build_vit", "vit_parts",
           "vit_num_params"]

__getattr__ = lazy_exports(__name__, {
    "ViTConfig": "depthlab.config", "VIT_PRESETS": "depthlab.presets", "ViT": "depthlab.vit.model",
    "ViTOutput": "depthlab.vit.model", "build_vit": "depthlab.vit.model", "vit_parts": "depthlab.vit.model",
    "vit_num_params": "depthlab.vit.model"})


def vit_from_preset(name: str, **overrides: Any):
    """The ViT preset ``name`` with fields or scheme options replaced (``vit_from_preset("vit-tiny", n_layers=4)``);
    :func:`depthlab.from_preset` restricted to ViT presets."""
    from depthlab.configure import from_preset
    from depthlab.errors import ConfigError, choices
    from depthlab.presets import VIT_PRESETS

    if name not in VIT_PRESETS:
        raise ConfigError(f"unknown ViT preset {name!r}; {choices(VIT_PRESETS)}")
    return from_preset(name, **overrides)
