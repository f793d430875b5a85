"""depthlab: measure the Curse of Depth in transformer LMs and cure it with LayerNorm Scaling.

    import depthlab as d
    model = d.build_model(d.from_preset("llama-130m", scheme="lns"))

``import depthlab`` is light: every name below is imported on first use (torch only once a model is built),
so the command line answers ``--help`` without loading the numerical stack.
"""

from depthlab._lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "ModelConfig": "depthlab.config", "ViTConfig": "depthlab.config", "PRESETS": "depthlab.presets",
    "VIT_PRESETS": "depthlab.presets", "from_preset": "depthlab.configure", "configure": "depthlab.configure",
    "scheme_option": "depthlab.configure", "build_model": "depthlab.model", "num_params": "depthlab.model",
    "DecoderLM": "depthlab.model", "LMOutput": "depthlab.model", "SCHEMES": "depthlab.schemes",
    "Scheme": "depthlab.schemes", "get_scheme": "depthlab.schemes", "lns_scale": "depthlab.schemes",
    "LNS_POSITIONS": "depthlab.schemes", "DepthlabError": "depthlab.errors", "ConfigError": "depthlab.errors",
}

__all__ = [*_EXPORTS, "__version__"]

__getattr__ = lazy_exports(__name__, _EXPORTS)
