"""depthlab: measure the Curse of Depth in transformer LMs and cure it with LayerNorm Scaling.

    import depthlab as d
    model = d.build_model(d.from_preset("llama-130m", scheme="lns"))

``import depthlab`` is light: every name below is imported on first use (torch only once a model is built),
so the command line answers ``--help`` without loading the numerical stack. Everything else is imported from
where it lives (``depthlab.hf``, ``depthlab.analysis.monitor``, ``depthlab.prune``, ...): one path per module.

The packages, from the ground up (docs/architecture.md): ``base`` (shared helpers, the on-disk store),
``models`` (configs, the scheme registry, the decoder and ViT), ``data``, ``hf`` (Hugging Face interop and
the model-family registry), ``targets`` (load anything measurable, in memory or one layer at a time),
``analysis`` (diagnostics, monitor, evaluate, theory, plots), ``train`` (pre-training and fine-tuning),
``prune``, ``compare``, ``cli``.
"""

from depthlab.base.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    **dict.fromkeys(("ModelConfig", "ViTConfig"), "depthlab.models.config"),
    **dict.fromkeys(("PRESETS", "VIT_PRESETS"), "depthlab.models.presets"),
    **dict.fromkeys(("from_preset", "configure", "scheme_option"), "depthlab.models.configure"),
    **dict.fromkeys(("build_model", "num_params", "DecoderLM", "LMOutput"), "depthlab.models.decoder"),
    **dict.fromkeys(("SCHEMES", "Scheme", "get_scheme", "lns_scale", "LNS_POSITIONS"), "depthlab.models.schemes"),
    **dict.fromkeys(("DepthlabError", "ConfigError"), "depthlab.base.errors"),
    **dict.fromkeys(("diagnose", "DiagnoseOptions", "load_target"), "depthlab.analysis.diagnostics"),
    **dict.fromkeys(("DepthMonitor", "DepthMonitorCallback"), "depthlab.analysis.monitor"),
}

__all__ = [*_EXPORTS, "__version__"]

__getattr__ = lazy_exports(__name__, _EXPORTS)
