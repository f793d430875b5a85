"""Hugging Face interop: load HF decoders into depthlab, export depthlab models as vanilla HF."""

from depthlab.base.lazy import lazy_exports

__all__ = [
    "from_hf", "to_hf", "to_hf_model", "config_from_hf", "hf_config_for", "load_hf_model",
    "folded_state_dict", "exportable_schemes", "SUPPORTED_MODEL_TYPES",
    "apply_layernorm_scaling", "remove_layernorm_scaling", "fold_layernorm_scaling", "is_layernorm_scaled",
    "layernorm_scaling_marker", "load", "LNS_SUPPORTED_MODEL_TYPES",
]

__getattr__ = lazy_exports(__name__, {
    "LNS_SUPPORTED_MODEL_TYPES": "depthlab.hf.lns:SUPPORTED_MODEL_TYPES",
    **dict.fromkeys((
        "SUPPORTED_MODEL_TYPES", "config_from_hf", "exportable_schemes", "folded_state_dict", "from_hf",
        "hf_config_for", "load_hf_model", "to_hf", "to_hf_model"), "depthlab.hf.convert"),
    **dict.fromkeys((
        "apply_layernorm_scaling", "fold_layernorm_scaling", "is_layernorm_scaled",
        "layernorm_scaling_marker", "load", "remove_layernorm_scaling"), "depthlab.hf.lns"),
})
