"""An image-text-to-text model directory loaded for evaluation: its language tower's target (the wrapper as
transformers builds it, :mod:`depthlab.targets.wrappers`) and its processor, which image-text tasks are scored with.
Text tasks score on the same model (a text-only forward of the wrapper)."""

from __future__ import annotations

from typing import Any

import torch

from depthlab.base.errors import DepthlabError
from depthlab.targets.wrappers import image_text_config

__all__ = ["image_text_config", "load_image_text", "refuse_image_tasks"]


def load_image_text(path: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
                    ) -> tuple[Any, Any]:
    """(the language tower's :class:`~depthlab.targets.Target` of the wrapper at ``path``, its processor)."""
    from depthlab.targets.load import load_target
    from depthlab.targets.wrappers import processor_of

    target = load_target(path, device=device, dtype=dtype)
    return target, processor_of(target)


def refuse_image_tasks(tasks: list[Any], target: str) -> None:
    """DepthlabError, before ``target`` is loaded, when an image-text task would be scored on a text-only model."""
    from depthlab.data.image_tasks import ImageTask

    image = [t.name for t in tasks if isinstance(t, ImageTask)]
    if image:
        raise DepthlabError(f"task {image[0]!r} is image-text (it shows images), but {target!r} is not an "
                            "image-text-to-text model directory (its config.json has no vision_config)")
