"""An image-text-to-text model directory (``*ForConditionalGeneration`` with a ``vision_config``) loaded for
evaluation: the model as transformers builds it (``AutoModelForImageTextToText``) and its processor.

Interim: the loading of such wrappers for every command (diagnose, prune, the towers) belongs to ``targets``; until it
is there, ``evaluate`` loads them here, so that image-text tasks can be scored. Text tasks score on the same model
(a text-only forward of the wrapper).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from depthlab.base.errors import DepthlabError, first_line


def image_text_config(path: str | Path) -> dict[str, Any] | None:
    """The ``config.json`` of a local image-text-to-text model directory (one with a ``vision_config``), else None:
    read from the file alone, no weights."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return None
    try:
        data = json.loads(cfg.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("vision_config"), dict) else None


def load_image_text(path: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
                    ) -> tuple[Any, Any]:
    """(a :class:`~depthlab.targets.Target` of the wrapper, its processor)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from depthlab.data.tokenizers import model_tokenizer
    from depthlab.hf.loading import third_party_output
    from depthlab.targets.target import Target

    try:
        with third_party_output(None):
            model = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype)
            processor = AutoProcessor.from_pretrained(path)
    except Exception as err:  # noqa: BLE001 - OSError, ValueError, ImportError (a processor's extra): one line
        raise DepthlabError(f"cannot load {path!r} as an image-text-to-text model with its processor: "
                            f"{first_line(err)[:300]}") from None
    model.to(device).eval()
    text = model.config.get_text_config()
    info = {"source": path, "architecture": type(model).__name__, "model_type": model.config.model_type,
            "text_model_type": getattr(text, "model_type", None), "n_layers": getattr(text, "num_hidden_layers", None),
            "d_model": getattr(text, "hidden_size", None), "vocab_size": getattr(text, "vocab_size", None),
            "n_params": sum(p.numel() for p in model.parameters()), "processor": type(processor).__name__,
            "dtype": str(dtype).replace("torch.", ""), "device": str(torch.device(device))}
    target = Target(model, path, "hf-causal-lm", model_tokenizer(path), info,
                    getattr(text, "max_position_embeddings", None))
    return target, processor


def refuse_image_tasks(tasks: list[Any], target: str) -> None:
    """DepthlabError, before ``target`` is loaded, when an image-text task would be scored on a text-only model."""
    from depthlab.data.image_tasks import ImageTask

    image = [t.name for t in tasks if isinstance(t, ImageTask)]
    if image:
        raise DepthlabError(f"task {image[0]!r} is image-text (it shows images), but {target!r} is not an "
                            "image-text-to-text model directory (its config.json has no vision_config)")
