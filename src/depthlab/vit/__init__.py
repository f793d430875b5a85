"""Vision Transformers with every scheme of the registry (the paper's Table 5 and Figure 8).

    from depthlab.vit import vit_from_preset, build_vit
    model = build_vit(vit_from_preset("vit-tiny", scheme="lns", position="after-branch"))

A ViT is one more family of ``depthlab.schemes.Parts`` (LayerNorm, bidirectional attention, GELU
MLP); its blocks come from the same registry as the decoder's.
"""

from depthlab.vit.config import VIT_PRESETS, ViTConfig, vit_configure, vit_from_preset
from depthlab.vit.model import ViT, ViTOutput, build_vit, vit_num_params, vit_parts

__all__ = ["ViTConfig", "VIT_PRESETS", "vit_from_preset", "vit_configure", "ViT", "ViTOutput", "build_vit",
           "vit_parts", "vit_num_params"]
