"""depthlab: measure the Curse of Depth in transformer LMs and cure it with LayerNorm Scaling.

    import depthlab as d
    model = d.build_model(d.from_preset("llama-130m", scheme="lns"))

``import depthlab`` is light: every name below is imported on first use (torch only once a model is built),
so the command line answers ``--help`` without loading the numerical stack.

The packages, from the ground up (docs/architecture.md): ``base`` (shared helpers, the on-disk store),
``models`` (configs, the scheme registry, the decoder and ViT), ``data``, ``hf`` (Hugging Face interop and
the model-family registry), ``targets`` (load anything measurable, in memory or one layer at a time),
``analysis`` (diagnostics, monitor, evaluate, theory, plots), ``train`` (pre-training and fine-tuning),
``prune``, ``compare``, ``cli``.
"""

from depthlab.base.lazy import alias_modules, lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    **dict.fromkeys(("ModelConfig", "ViTConfig"), "depthlab.models.config"),
    **dict.fromkeys(("PRESETS", "VIT_PRESETS"), "depthlab.models.presets"),
    **dict.fromkeys(("from_preset", "configure", "scheme_option"), "depthlab.models.configure"),
    **dict.fromkeys(("build_model", "num_params", "DecoderLM", "LMOutput"), "depthlab.models.decoder"),
    **dict.fromkeys(("SCHEMES", "Scheme", "get_scheme", "lns_scale", "LNS_POSITIONS"), "depthlab.models.schemes"),
    **dict.fromkeys(("DepthlabError", "ConfigError"), "depthlab.base.errors"),
}

#: Short module paths users import (and the paths of before the layout of design pass 3): each is the
#: module at its place in the layers, the same object (``depthlab.monitor is depthlab.analysis.monitor``).
MODULE_ALIASES = {
    **{f"depthlab.{m}": f"depthlab.analysis.{m}" for m in ("diagnostics", "evaluate", "monitor", "theory", "plots")},
    **{f"depthlab.{m}": f"depthlab.models.{m}" for m in ("config", "configure", "presets", "schemes", "families",
                                                         "nn", "vit")},
    "depthlab.model": "depthlab.models.decoder",
    **{f"depthlab.{m}": f"depthlab.base.{m}" for m in ("errors", "extras", "fileio", "htmlpage", "metrics", "progress",
                                                       "provenance", "store")},
    "depthlab.finetune": "depthlab.train.finetune",
}

__all__ = [*_EXPORTS, "__version__"]

alias_modules(MODULE_ALIASES)
__getattr__ = lazy_exports(__name__, _EXPORTS)
