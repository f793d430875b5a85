"""Vision Transformers with every scheme of the registry (the paper's Table 5 and Figure 8).

    from depthlab.models.vit import vit_from_preset, build_vit
    model = build_vit(vit_from_preset("vit-tiny", scheme="lns", position="after-branch"))

A ViT is one more family of ``depthlab.models.schemes.Parts`` (LayerNorm, bidirectional attention, GELU
MLP); its blocks come from the same registry as the decoder's. Its config (``ViTConfig``) lives beside
the decoder's in ``depthlab.models.config``, its presets in ``depthlab.models.presets``; image data in ``depthlab.data.images``.
"""

from __future__ import annotations

from typing import Any

from depthlab.base.lazy import lazy_exports

__all__ = ["ViTConfig", "VIT_PRESETS", "vit_from_preset", "ViT", "ViTOutput", "build_vit", "vit_parts",
           "vit_num_params"]

__getattr__ = lazy_exports(__name__, {
    "ViTConfig": "depthlab.models.config", "VIT_PRESETS": "depthlab.models.presets", "ViT": "depthlab.models.vit.model",
    "ViTOutput": "depthlab.models.vit.model", "build_vit": "depthlab.models.vit.model", "vit_parts": "depthlab.models.vit.model",
    "vit_num_params": "depthlab.models.vit.model"})


def vit_from_preset(name: str, **overrides: Any):
    """The ViT preset ``name`` with fields or scheme options replaced (``vit_from_preset("vit-tiny", n_layers=4)``);
    :func:`depthlab.from_preset` restricted to ViT presets."""
    from depthlab.base.errors import ConfigError, choices
    from depthlab.models.configure import from_preset
    from depthlab.models.presets import VIT_PRESETS

    if name not in VIT_PRESETS:
        raise ConfigError(f"unknown ViT preset {name!r}; {choices(VIT_PRESETS)}")
    return from_preset(name, **overrides)
