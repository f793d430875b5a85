"""Hugging Face interop: load HF decoders into depthlab, export depthlab models as vanilla HF."""

from depthlab.hf.convert import (
    SUPPORTED_MODEL_TYPES,
    config_from_hf,
    exportable_schemes,
    folded_state_dict,
    from_hf,
    hf_config_for,
    load_hf_model,
    to_hf,
    to_hf_model,
)
from depthlab.hf.lns import SUPPORTED_MODEL_TYPES as LNS_SUPPORTED_MODEL_TYPES
from depthlab.hf.lns import (
    apply_layernorm_scaling,
    fold_layernorm_scaling,
    is_layernorm_scaled,
    layernorm_scaling_marker,
    load,
    remove_layernorm_scaling,
)

__all__ = [
    "from_hf", "to_hf", "to_hf_model", "config_from_hf", "hf_config_for", "load_hf_model",
    "folded_state_dict", "exportable_schemes", "SUPPORTED_MODEL_TYPES",
    "apply_layernorm_scaling", "remove_layernorm_scaling", "fold_layernorm_scaling", "is_layernorm_scaled",
    "layernorm_scaling_marker", "load", "LNS_SUPPORTED_MODEL_TYPES",
]
