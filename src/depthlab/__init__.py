"""depthlab: measure the Curse of Depth in transformer LMs and cure it with LayerNorm Scaling.

    import depthlab as d
    model = d.build_model(d.from_preset("llama-130m", scheme="lns"))
"""

from depthlab.config import PRESETS, ModelConfig
from depthlab.configure import configure, from_preset, scheme_option
from depthlab.errors import ConfigError, DepthlabError
from depthlab.model import DecoderLM, LMOutput, build_model, num_params
from depthlab.schemes import LNS_POSITIONS, SCHEMES, Scheme, get_scheme, lns_scale

__version__ = "0.1.0"

__all__ = [
    "ModelConfig", "PRESETS", "LNS_POSITIONS", "from_preset", "configure", "scheme_option", "build_model",
    "num_params", "DecoderLM", "LMOutput", "SCHEMES", "Scheme", "get_scheme", "lns_scale", "DepthlabError",
    "ConfigError", "__version__",
]

_SUBMODULES = ("hf", "data", "train", "diagnostics", "compare", "theory", "plots")


def __getattr__(name: str):
    """``depthlab.hf`` etc. import on first use, so ``import depthlab`` stays light."""
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"depthlab.{name}")
    raise AttributeError(f"module 'depthlab' has no attribute {name!r}")
