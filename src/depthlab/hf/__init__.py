"""Hugging Face interop: load HF decoders into depthlab, export depthlab models as vanilla HF, LayerNorm Scaling for
HF models, and the registry of the transformers families depthlab knows (:mod:`depthlab.hf.families`).

    from depthlab.hf import from_hf, to_hf, apply_layernorm_scaling, fold_layernorm_scaling
"""

from depthlab.base.lazy import lazy_exports

__all__ = [
    "from_hf", "config_from_hf", "load_hf_model",
    "to_hf", "to_hf_model", "hf_config_for", "folded_state_dict", "exportable_schemes",
    "apply_layernorm_scaling", "remove_layernorm_scaling", "fold_layernorm_scaling", "is_layernorm_scaled",
    "layernorm_scaling_marker", "load",
    "FAMILIES", "CONVERTIBLE_MODEL_TYPES", "LNS_MODEL_TYPES", "family_of", "tiny_model", "save_tiny",
]

__getattr__ = lazy_exports(__name__, {
    **dict.fromkeys(("config_from_hf", "from_hf", "load_hf_model"), "depthlab.hf.convert"),
    **dict.fromkeys(("exportable_schemes", "folded_state_dict", "hf_config_for", "to_hf", "to_hf_model"),
                    "depthlab.hf.export"),
    **dict.fromkeys((
        "apply_layernorm_scaling", "fold_layernorm_scaling", "is_layernorm_scaled",
        "layernorm_scaling_marker", "load", "remove_layernorm_scaling"), "depthlab.hf.lns"),
    **dict.fromkeys(("FAMILIES", "CONVERTIBLE_MODEL_TYPES", "LNS_MODEL_TYPES", "family_of"), "depthlab.hf.families"),
    **dict.fromkeys(("tiny_model", "save_tiny"), "depthlab.hf.tiny"),
})
