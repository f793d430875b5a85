"""An image-text-to-text model directory as a target: one tower of the wrapper, in memory.

    target = load_target("path/to/qwen2.5-vl")                    # the language tower, read on text
    target = load_target("path/to/qwen2.5-vl", tower="vision")    # the vision tower, read on image-text items
    processor = processor_of(target)                              # what makes the wrapper's image-text inputs

The model is transformers' own wrapper (``AutoModelForImageTextToText``, LayerNorm Scaling restored from its config
marker as :func:`depthlab.hf.load` does). The **language tower** is measured as a causal LM on text (its blocks, the
wrapper's text-only forward; Llama 4's through its language model, the wrapper's own forward raising in transformers
5.24). The **vision tower** is measured by what the language model does with the image: its blocks' states on the
images of image-text items, and the loss of each item's answer given the image and the question
(:class:`~depthlab.analysis.diagnostics.heldout.ImageTextBatches`): the batches are the wrapper's image-text inputs,
its forward the wrapper's own. Which tower, and every refusal of a wrapper depthlab cannot read, comes from
config.json alone (:func:`check_wrapper_dir`), before any weight is read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from depthlab.base.errors import DepthlabError, first_line
from depthlab.hf.wrappers import check_tower_name, tower_family, wrapper_of
from depthlab.targets.target import Target


def image_text_config(path: str | Path) -> dict[str, Any] | None:
    """The ``config.json`` of a local image-text model directory (a known wrapper, or any config with a
    ``vision_config``), else None: read from the file alone, no weights."""
    cfg = Path(path).expanduser() / "config.json"
    if not cfg.is_file():
        return None
    try:
        data = json.loads(cfg.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    from depthlab.hf.wrappers import is_image_text

    return data if is_image_text(data) else None


def check_wrapper_dir(path: str | Path, tower: str, capability: str | None = None) -> None:
    """What config.json alone refuses for ``tower`` of the model at ``path`` (a wrapper depthlab does not know, one
    without a text decoder, a vision tower of a text-only model), in one line; nothing for a path without a
    readable config.json (the loader says why later)."""
    check_tower_name(tower)
    cfg = Path(path).expanduser() / "config.json"
    if not cfg.is_file():
        if tower != "language":
            raise DepthlabError(f"--tower {tower}: {str(path)!r} is not an image-text model directory (no config.json); "
                                "only an image-text-to-text wrapper has a vision tower")
        return
    try:
        config = json.loads(cfg.read_text())
    except (OSError, ValueError):
        return
    if isinstance(config, dict) and (tower != "language" or image_text_config(path) is not None):
        tower_family(config, tower, capability)


def wrapper_target(path: Path, name: str, dtype: torch.dtype, show: bool | None, tower: str) -> Target:
    """The wrapper at ``path`` loaded whole, as the :class:`Target` of its ``tower``."""
    from transformers import AutoModelForImageTextToText

    from depthlab.data.tokenizers import model_tokenizer
    from depthlab.hf.lns import load as load_lns
    from depthlab.hf.loading import third_party_output
    from depthlab.hf.wrappers import text_forward
    from depthlab.targets.layers import find_layers

    try:
        with third_party_output(show):
            model = load_lns(str(path), AutoModelForImageTextToText, dtype=dtype)
    except DepthlabError:
        raise
    except Exception as err:  # noqa: BLE001 - OSError, ValueError (unsupported config), ...: one line
        raise DepthlabError(f"cannot load {str(path)!r} as an image-text-to-text model: {first_line(err)[:300]}") from None
    model.eval()
    config = model.config
    info = wrapper_info(config, path, tower, len(find_layers(model, tower)), sum(p.numel() for p in model.parameters()))
    text = config.get_text_config()
    context = getattr(text, "max_position_embeddings", None)
    if tower == "language":
        return Target(model, name, "hf-causal-lm", model_tokenizer(str(path)), info, context, tower=tower,
                      forward=text_forward(model))
    return Target(model, name, "hf-image-text", model_tokenizer(str(path)), info, context, tower=tower,
                  forward=lambda inputs: model(**inputs, use_cache=False).logits)


def wrapper_info(config: Any, path: str | Path, tower: str, n_layers: int, n_params: int) -> dict[str, Any]:
    """What a report says of a wrapper measured on ``tower`` (both engines say the same)."""
    text = config.get_text_config()
    measured = text if tower == "language" else getattr(config, "vision_config", None)
    return {"source": str(path), "architecture": config.architectures[0] if getattr(config, "architectures", None)
            else None, "model_type": config.model_type, "tower": tower,
            "text_model_type": getattr(text, "model_type", None), "n_layers": n_layers,
            "d_model": getattr(measured, "hidden_size", None),
            "n_heads": getattr(measured, "num_attention_heads", getattr(measured, "num_heads", None)),
            "n_kv_heads": getattr(text, "num_key_value_heads", None) if tower == "language" else None,
            "d_ff": getattr(measured, "intermediate_size", None), "vocab_size": getattr(text, "vocab_size", None),
            "n_params": n_params, "layernorm_scaling": getattr(config, "layernorm_scaling", None),
            "depthlab_export": getattr(config, "depthlab", None)}


def processor_of(target: Any) -> Any:
    """The wrapper's processor (:func:`depthlab.hf.processors.wrapper_processor`: transformers' own, or its inputs
    made from the image processor), loaded once; a processor set on the target before (a test's) is kept."""
    if target.processor is None:
        from depthlab.hf.processors import wrapper_processor

        path = target.info.get("source")
        wrapper = wrapper_of(target.info.get("model_type") or "")
        target.processor = wrapper_processor(path, wrapper.expand if wrapper is not None else "")
    return target.processor
