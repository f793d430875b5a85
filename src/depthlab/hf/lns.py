"""LayerNorm Scaling (LNS) for Hugging Face decoder models (every family of :mod:`depthlab.hf.families` with pre-norms).

    from depthlab.hf import apply_layernorm_scaling, fold_layernorm_scaling, load
    model = AutoModelForCausalLM.from_config(config)      # or from_pretrained(...)
    apply_layernorm_scaling(model)                        # in place: block l's pre-norms x 1/sqrt(l)
    Trainer(model=model, ...).train()
    model.save_pretrained("out")                          # vanilla weights + a marker in config.json
    model = load("out")                                   # LNS restored from the marker
    vanilla = fold_layernorm_scaling(model)               # plain transformers model, same logits

How: a forward hook on each of a decoder layer's pre-norms (the family entry's ``pre_norms``: Llama's
``input_layernorm`` and ``post_attention_layernorm``, Gemma's ``input_layernorm`` and ``pre_feedforward_layernorm``
(its sandwich post-norms are not scaled), GPT-2's ``ln_1``/``ln_2``) multiplies the norm's output by ``1/sqrt(l)``
(``l`` = 1-based layer position); a family without pre-norms (OLMo 2/3) is refused, saying why. A hook changes no
class and no parameter, so state-dict keys stay those of the vanilla model, ``save_pretrained``
writes a checkpoint any runtime can read, and ``torch.compile``, gradient checkpointing (the hook
runs again on recomputation) and ``Trainer`` see an ordinary module. The scale is a Python float
held by the hook object: nothing in the state dict, nothing for meta-device init to wipe.

Qwen3's ``q_norm``/``k_norm`` inside attention and the final norm are not scaled (docs/paper.md §1.2: only
the two pre-norms of each block). Folding multiplies the norm's affine output by the scale: ``weight`` (and a
LayerNorm's ``bias``) times ``s``; a norm computing ``(1 + weight) * x̂`` (Gemma) gets ``weight' = (1 + weight)·s - 1``.

The fact is recorded in ``model.config.layernorm_scaling`` (saved in ``config.json``). A *plain*
``AutoModelForCausalLM.from_pretrained`` of such a checkpoint ignores that field and builds the
vanilla (unscaled) network: a different model with different logits. Load it with
:func:`load`, or export with :func:`fold_layernorm_scaling` for inference anywhere else.
"""

from __future__ import annotations

import copy
import logging
from typing import Any, Iterator

import torch
from torch import nn

from depthlab.base.errors import DepthlabError
from depthlab.hf.families import LNS_MODEL_TYPES, Family, get_path
from depthlab.models.schemes import lns_scale

log = logging.getLogger(__name__)

#: The two pre-norms of a Llama-layout decoder layer that LNS scales (docs/paper.md §1.2); other families: their
#: entry's ``pre_norms``.
SCALED_NORMS: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm")

#: Name of the ``config`` field that records LNS; saved by ``save_pretrained``.
CONFIG_KEY = "layernorm_scaling"

#: The marker written to ``config.layernorm_scaling``; ``version`` is bumped on incompatible change.
MARKER: dict[str, Any] = {"position": "after-norm", "version": 1, "scale": "1/sqrt(l)", "norms": list(SCALED_NORMS)}


class LayerNormScalingHook:
    """Forward hook: multiply a norm's output by the constant ``scale`` (= 1/sqrt(layer))."""

    def __init__(self, layer: int) -> None:
        self.layer = int(layer)  # 1-based depth index l
        self.scale = lns_scale(self.layer)

    def __call__(self, module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return output * self.scale

    def __repr__(self) -> str:
        return f"LayerNormScalingHook(layer={self.layer}, scale={self.scale:.6g})"


# ---------------------------------------------------------------------- structure
def _model_type(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type is None:
        raise DepthlabError(
            f"{type(model).__name__} is not a Hugging Face transformers model (no config.model_type); "
            "LayerNorm Scaling for HF models supports: " + ", ".join(LNS_MODEL_TYPES)
            + " (depthlab's own models: build them with scheme='lns')"
        )
    return model_type


def _family(model: nn.Module) -> Family:
    """The entry of the model's language tower (a text model's row, or its layout read from the model with its
    pre-norms probed; an image-text wrapper's text family, based where the wrapper keeps it: LNS scales the decoder's
    pre-norms only)."""
    from depthlab.hf.wrappers import model_tower_family

    _model_type(model)
    return model_tower_family(model, "language", "lns")


def _scaled_norms(model: nn.Module) -> Iterator[tuple[int, nn.Module]]:
    """(1-based layer, norm module) for the pre-norms of every decoder layer; checks support."""
    fam = _family(model)
    layers = get_path(model, fam.layers)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise DepthlabError(f"{type(model).__name__} has no decoder layers at {fam.layers}")
    for layer, block in enumerate(layers, start=1):
        for name in fam.pre_norms:
            norm = getattr(block, name, None)
            weight = getattr(norm, "weight", None)
            if not isinstance(weight, nn.Parameter) or weight.dim() != 1:
                raise DepthlabError(f"decoder layer {layer - 1} of {type(model).__name__} has no norm {name!r}")
            yield layer, norm


def _hooks(norm: nn.Module) -> list[int]:
    return [hid for hid, hook in norm._forward_hooks.items() if isinstance(hook, LayerNormScalingHook)]


def is_layernorm_scaled(model: nn.Module) -> bool:
    """True when LNS hooks are active on ``model`` (not merely recorded in its config); False for a family that has
    no pre-norms to hook."""
    return any(_hooks(module) for module in model.modules())


def layernorm_scaling_marker(config: Any) -> dict[str, Any] | None:
    """The LNS marker recorded in an HF ``config`` (or ``None``); raises on an unknown version."""
    marker = getattr(config, CONFIG_KEY, None)
    if marker is None:
        return None
    if not isinstance(marker, dict) or marker.get("version") != MARKER["version"] or marker.get("position") != MARKER["position"]:
        raise DepthlabError(
            f"config.{CONFIG_KEY}={marker!r} is not a LayerNorm Scaling marker this depthlab understands "
            f"(expected version {MARKER['version']}, position {MARKER['position']!r})"
        )
    return marker


# ---------------------------------------------------------------------- public API
def apply_layernorm_scaling(model: nn.Module) -> nn.Module:
    """Apply LNS in place: both pre-norm outputs of decoder layer ``l`` (1-based) are multiplied by
    ``1/sqrt(l)``; records ``config.layernorm_scaling``. Returns ``model``.

    Raises ``ValueError`` (a ``DepthlabError``) for an unsupported architecture or when LNS is
    already active (applying twice would scale twice). A model whose config carries the marker but
    has no active hooks (a checkpoint read with plain ``from_pretrained``) gets LNS restored.
    """
    norms = list(_scaled_norms(model))  # validates the architecture first
    n_pre = len(_family(model).pre_norms)
    if any(_hooks(norm) for _, norm in norms):
        raise DepthlabError("LayerNorm Scaling is already applied to this model; applying it twice would scale twice "
                            "(call remove_layernorm_scaling first)")
    layernorm_scaling_marker(model.config)  # an unknown marker is an error, not silently overwritten
    for layer, norm in norms:
        norm.register_forward_hook(LayerNormScalingHook(layer))
    setattr(model.config, CONFIG_KEY, {**copy.deepcopy(MARKER), "norms": list(_family(model).pre_norms)})
    log.info("LayerNorm Scaling applied to %d decoder layers of %s", len(norms) // n_pre, type(model).__name__)
    return model


def remove_layernorm_scaling(model: nn.Module) -> nn.Module:
    """Undo :func:`apply_layernorm_scaling` in place (hooks and config marker); weights untouched."""
    norms = list(_scaled_norms(model))
    if not any(_hooks(norm) for _, norm in norms):
        raise DepthlabError("LayerNorm Scaling is not applied to this model; nothing to remove")
    for _, norm in norms:
        for hid in _hooks(norm):
            del norm._forward_hooks[hid]
    if hasattr(model.config, CONFIG_KEY):
        delattr(model.config, CONFIG_KEY)
    return model


def fold_layernorm_scaling(model: nn.Module, inplace: bool = False) -> nn.Module:
    """A vanilla model computing the same function: each scaled norm's weight is multiplied by
    ``1/sqrt(l)`` and the hooks and marker are removed. Exact at inference (RMSNorm(x)·γ·s =
    RMSNorm(x)·(γ·s)), up to float rounding. Returns a deep copy unless ``inplace=True``.
    Do not keep training the folded model as if it were LNS: the training dynamics differ."""
    if not is_layernorm_scaled(model):
        marked = getattr(model.config, CONFIG_KEY, None)
        hint = " (its config carries the marker: load it with depthlab.hf.load)" if marked else ""
        raise DepthlabError("LayerNorm Scaling is not applied to this model; nothing to fold" + hint)
    folded = model if inplace else copy.deepcopy(model)
    scales = [(norm, _hook_scale(norm)) for _, norm in _scaled_norms(folded)]
    offset = _family(folded).norm_offset
    remove_layernorm_scaling(folded)
    with torch.no_grad():
        for norm, scale in scales:
            bias = getattr(norm, "bias", None)
            fold_norm_(norm.weight, bias if isinstance(bias, nn.Parameter) else None, scale, offset)
    return folded


def fold_norm_(weight: torch.Tensor, bias: torch.Tensor | None, scale: float, offset: float = 0.0) -> None:
    """In place: a norm computing ``(offset + weight) * x̂ + bias`` made to compute ``scale`` times that."""
    weight.copy_((weight.double() + offset).mul(scale).sub(offset).to(weight.dtype))
    if bias is not None:
        bias.mul_(scale)


def _hook_scale(norm: nn.Module) -> float:
    (hid,) = _hooks(norm)
    return norm._forward_hooks[hid].scale


def load(path: str, auto_class: Any = None, **from_pretrained_kwargs: Any) -> nn.Module:
    """Load an HF checkpoint (``save_pretrained`` directory or hub id) and restore LayerNorm
    Scaling when its config records it. ``auto_class`` defaults to ``AutoModelForCausalLM``;
    extra keyword arguments go to ``from_pretrained`` (``torch_dtype``, ``device_map``, ...)."""
    from depthlab.hf.loading import load_pretrained

    model = load_pretrained(path, auto_class, **from_pretrained_kwargs)
    if layernorm_scaling_marker(model.config) is not None:
        apply_layernorm_scaling(model)
    return model


__all__ = [
    "SCALED_NORMS", "CONFIG_KEY", "MARKER", "LayerNormScalingHook",
    "apply_layernorm_scaling", "remove_layernorm_scaling", "fold_layernorm_scaling", "is_layernorm_scaled",
    "layernorm_scaling_marker", "load", "fold_norm_",
]
