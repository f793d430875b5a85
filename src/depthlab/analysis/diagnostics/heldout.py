"""The held-out text both engines of ``diagnose`` (and ``prune``'s survey) read: token batches of a data spec.

    batches = TextBatches(target, DiagnoseOptions(data="builtin", tokens=16384, seq_len=256))
    for x, y in batches:        # (B, T) inputs, (B, T) next-token labels (None for an encoder)
        ...

Re-iterable, so an engine can pass over it more than once (the joint check, the tuned lens, the depth map).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from depthlab.analysis.diagnostics.options import DiagnoseOptions
from depthlab.base.errors import DepthlabError

log = logging.getLogger(__name__)


def split_of(opts: DiagnoseOptions, target: Any) -> str:
    """``opts.split``; auto: val for the built-in data and depthlab runs (what they trained on is not held out), else
    all of it."""
    if opts.split != "auto":
        return opts.split
    return "val" if opts.data == "builtin" or str(target.info.get("source", "")).startswith("depthlab run") else "all"


class TextBatches:
    """Re-iterable (inputs, labels) pairs over held-out text, via depthlab.data."""

    def __init__(self, target: Any, opts: DiagnoseOptions) -> None:
        from depthlab.data import eval_token_batches

        if target.tokenizer is None:
            raise DepthlabError(f"{target.name!r} comes without a tokenizer; cannot turn --data text into tokens")
        if opts.tokens < 1 or opts.seq_len < 2 or opts.batch_size < 1:
            raise DepthlabError("--tokens and --batch-size must be positive and --seq-len at least 2")
        self.causal = target.causal
        seq_len = opts.seq_len
        limit = target.max_seq_len
        if limit is not None and seq_len > limit:
            log.warning("--seq-len %d exceeds what %s accepts; using %d", seq_len, target.name, limit)
            seq_len = limit
        self.seq_len = seq_len
        window = seq_len + 1 if self.causal else seq_len
        n_seq = -(-opts.tokens // seq_len)
        self.split = split_of(opts, target)
        self.inner = eval_token_batches(opts.data, target.tokenizer, n_seq * window, window, opts.batch_size, split=self.split)
        self.requested = n_seq * seq_len
        self.device = target.device
        self.batch_size = opts.batch_size

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        for b in self.inner:
            b = b.to(self.device)
            yield (b[:, :-1], b[:, 1:]) if self.causal else (b, None)

    @property
    def short(self) -> bool:
        return self.inner.short

    @property
    def n_batches(self) -> int:
        """Batches asked for (fewer when the data is short)."""
        return -(-(self.requested // self.seq_len) // self.batch_size)


def vision_items(spec: str, limit: int) -> list[Any]:
    """The image-text items a wrapper's vision tower is measured on: ``builtin`` / ``builtin-shapes`` (pictures made
    offline), an image folder (one sub-folder per class: each picture asked what it shows), or an image-text task
    file or glob in MMMU's format; every item checked as it is read (a missing or unreadable image, a missing
    answer: one line), before any model is loaded."""
    from pathlib import Path

    from depthlab.data.image_tasks import folder_task, load_image_task
    from depthlab.data.shapes import builtin_image_task

    if spec in ("builtin", "builtin-shapes"):
        return builtin_image_task("builtin-shapes", limit).items
    if Path(spec).is_dir():
        return folder_task(spec, limit).items
    return load_image_task(spec, limit).items


def check_vision_data(request: Any) -> None:
    """Before anything is loaded (a frame check of ``diagnose`` and ``prune``): the image-text items a vision tower is
    asked to be measured on, read and checked whole (:func:`vision_items`: an unreadable or missing image, a missing
    answer, one line)."""
    opts = request.opts
    if getattr(opts, "tower", "language") == "vision":
        vision_items(opts.data, opts.images)
        if isinstance(request.target, (str, Path)) and Path(request.target).expanduser().is_dir():
            from depthlab.hf.processors import check_image_token

            check_image_token(request.target)  # the processor's image token is the one the wrapper looks for


class ImageTextBatches:
    """Re-iterable (inputs, labels) of image-text items, one item a batch, for a wrapper's vision tower: ``inputs``
    the wrapper's (its processor's output for the item's prompt followed by its answer), ``labels`` the next-token
    targets of the answer's tokens only (:data:`IGNORE_INDEX` elsewhere): the removal of a vision block is measured
    by the loss of the answer given the image and the question, what the language model does with the image."""

    split = "items"
    short = False
    causal = True

    def __init__(self, target: Any, opts: DiagnoseOptions) -> None:
        from depthlab.analysis.evaluate.image_scoring import answer_inputs
        from depthlab.targets.wrappers import processor_of

        items = vision_items(opts.data, opts.images)
        processor = processor_of(target)
        model_type = target.info.get("model_type")
        self.rows = [answer_inputs(processor, item, model_type) for item in items]
        self.n_batches = len(self.rows)
        self.seq_len = max(ids.shape[1] for ids, _ in ((r[0]["input_ids"], None) for r in self.rows))
        self.requested = len(self.rows)
        self.device = target.device
        self.dtype = next(target.model.parameters()).dtype if hasattr(target, "model") else None

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        for inputs, labels in self.rows:
            yield ({k: v.to(self.device, self.dtype if v.is_floating_point() and self.dtype else v.dtype)
                    for k, v in inputs.items()}, labels.to(self.device))


def held_out(target: Any, opts: DiagnoseOptions) -> TextBatches | ImageTextBatches:
    """What a target is measured on: held-out text, or image-text items for a wrapper's vision tower."""
    return ImageTextBatches(target, opts) if target.kind == "hf-image-text" else TextBatches(target, opts)
