"""``Target``: a model loaded for measurement, with what the diagnostics need to run it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass
class Target:
    """A model ready for the diagnostics."""

    model: nn.Module
    name: str  # what the user named
    kind: str  # "depthlab" | "depthlab-vit" | "hf-causal-lm" | "hf-encoder" | "hf-image-text" (a vision tower)
    tokenizer: Any  # depthlab.data.Tokenizer (encode, eos_id, pad_id) or None
    info: dict[str, Any] = field(default_factory=dict)  # shape and provenance for the report
    max_seq_len: int | None = None  # longest input the model accepts (None: unbounded)
    batches_for: Callable[[Any], Any] | None = None  # opts -> its own held-out batches (ViT runs: images)
    plan: Any = None  # the EnginePlan that chose to load it in memory (depthlab.targets.engine), when one did
    tower: str = "language"  # the block list measured: a text model's, or an image-text wrapper's language / vision
    forward: Callable[[Any], torch.Tensor] | None = None  # inputs -> logits, where the kind's default does not do
    #                                                      (a wrapper's vision tower: image-text inputs; Llama 4's text)
    processor: Any = None  # an image-text wrapper's processor (depthlab.hf.processors), once loaded

    @property
    def causal(self) -> bool:
        return self.kind != "hf-encoder"

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def forward_fn(self) -> Callable[[torch.Tensor], torch.Tensor | None]:
        model = self.model
        if self.forward is not None:
            return self.forward
        if self.kind in ("depthlab", "depthlab-vit"):
            return lambda ids: model(ids).logits
        if self.kind == "hf-causal-lm":
            return lambda ids: model(input_ids=ids, use_cache=False).logits
        return lambda ids: (model(input_ids=ids, attention_mask=torch.ones_like(ids)), None)[1]
