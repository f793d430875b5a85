"""Diagnostics of ViT runs: the held-out images as the runner's batches, and the run as a Target.

    target = load_target("runs/vit")            # a ViT run: kind "depthlab-vit", no tokenizer (vit_run_parts)
    report = diagnose(target, DiagnoseOptions(tokens=8192))
        # angular distance and layerwise variance over held-out images (every token: class + patches),
        # removal Δloss and Δaccuracy per removed block, block Jacobians; no multiple-choice scoring

The held-out images are those the run evaluated on: the run's data spec (``--data`` overrides it) split
as ``depthlab.train.vit_family`` splits it, normalised with the training split's statistics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from depthlab.errors import DepthlabError

#: The --data default of ``diagnose`` (an LM corpus); a ViT run then reads its own images instead.
LM_DEFAULT_DATA = "builtin"


class ImageBatches:
    """(pixels, labels) batches of held-out images, in the shape ``diagnostics.runner`` streams."""

    def __init__(self, model: Any, data_spec: str, opts: Any, device: torch.device) -> None:
        from depthlab.train.vit_family import load_held_out

        if opts.batch_size < 1 or opts.tokens < 1:
            raise DepthlabError("--tokens and --batch-size must be positive")
        data = load_held_out(data_spec, model.cfg)
        self.seq_len = model.cfg.seq_len  # tokens per image (class token + patches)
        n = min(len(data.test_y), -(-opts.tokens // self.seq_len))
        self.x, self.y = data.test_x[:n], data.test_y[:n]
        self.batch_size, self.device, self.split = opts.batch_size, device, "held-out images"
        self.requested = n * self.seq_len
        self.short = False  # fewer held-out images than --tokens asks for is normal: all of them are used

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i in range(0, len(self.y), self.batch_size):
            yield self.x[i:i + self.batch_size].to(self.device), self.y[i:i + self.batch_size].to(self.device)


def vit_run_parts(path: Path, model: Any,
                  config: dict[str, Any]) -> tuple[dict[str, Any], Callable[[Any], ImageBatches]]:
    """What a Target of a ViT run (``model`` from ``load_run``) needs: its info, and its batches for options."""
    cfg, run_data = model.cfg, config["train"]["data"]
    info = {"source": f"depthlab run {path}", "architecture": "depthlab.ViT", "family": "vit", "scheme": cfg.scheme,
            "scheme_options": cfg.scheme_options, "n_layers": cfg.n_layers, "d_model": cfg.d_model,
            "n_heads": cfg.n_heads, "d_ff": cfg.d_ff, "image_size": cfg.image_size, "patch_size": cfg.patch_size,
            "num_classes": cfg.num_classes, "n_params": model.num_params(), "config": cfg.to_dict(),
            "train": config.get("train"),
            "not_measured": "multiple-choice scoring (LM only); perplexity (a classifier has accuracy instead)"}

    def batches(opts: Any) -> ImageBatches:
        spec = run_data if opts.data == LM_DEFAULT_DATA else opts.data
        return ImageBatches(model, spec, opts, next(model.parameters()).device)

    return info, batches
