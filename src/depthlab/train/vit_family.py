"""The ViT family's side of the trainer: run checks, image data, the loss module, held-out accuracy.

    run = open_vit_run(vit_cfg, train_cfg, out, resume, env)     # checks; no tokenizer; writes nothing
    data = load_vit_data(run, env)                                # train images by step, held-out batches, probe
    module = ViTLoss(model)                                       # forward(x, y, hidden, logits) -> LossOutput
    evaluator = ImageEvaluator(forward, data.eval_batches, data.probe_batch, env, ...)   # loss + top-1 accuracy

Batches are a pure function of (seed, step) (:class:`depthlab.data.images.TrainImages`, the same seeded
order as token sequences), so a resumed run reads exactly the images it would have. The held-out split
(:func:`depthlab.data.images.load_run_images`, seeded by its own seed, not the run's) is the same for every
seed of a comparison, and ``diagnose`` rebuilds it from ``config.json``. ``eval_tokens`` / ``seq_len`` mean
nothing to a ViT: every held-out image is evaluated; ``tokens`` counts training images.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from depthlab.base.errors import DepthlabError
from depthlab.data.images import TrainImages, check_image_spec, count_classes, load_run_images
from depthlab.models.presets import TRAIN_DEFAULTS, VIT_PRESETS
from depthlab.train import distributed as D
from depthlab.train.config import TrainConfig
from depthlab.train.data import TrainData
from depthlab.train.evaluator import Evaluator
from depthlab.train.rundir import (
    RunSetup,
    check_fresh_out,
    check_resume,
    defaulted_keys,
    latest_step,
    resumed_train_config,
    saved_config,
)

log = logging.getLogger(__name__)


def vit_train_config(train_cfg: TrainConfig, vit_cfg: Any, world_size: int = 1) -> TrainConfig:
    """``train_cfg`` with the ViT preset's defaults where it left None, resolved (``seq_len`` = tokens per image).
    ``data="builtin"`` (the default) means the built-in *image* set for a ViT: scikit-learn's digits."""
    if train_cfg.data == "builtin":
        train_cfg = train_cfg.replace(data="digits")
    check_image_spec(train_cfg.data)
    preset = TRAIN_DEFAULTS.get(vit_cfg.name, TRAIN_DEFAULTS["vit-tiny"])
    defaults = {**preset, "seq_len": vit_cfg.seq_len, "eval_tokens": 1}
    given = train_cfg.to_dict()
    return train_cfg.replace(**{k: v for k, v in defaults.items() if given.get(k) is None}).resolve(vit_cfg, world_size)


def open_vit_run(vit_cfg: Any, train_cfg: TrainConfig, out: Path, resume: bool, env: D.DistEnv) -> RunSetup:
    """Check ``out`` and the settings (a resume must match the saved run); no tokenizer; writes nothing."""
    saved = saved_config(out) if resume else None
    if not resume:
        check_fresh_out(out)
    else:
        train_cfg = resumed_train_config(train_cfg, saved)
    cfg = vit_train_config(train_cfg, vit_cfg, env.world_size)
    if not resume:
        vit_cfg = sized_head(vit_cfg, cfg.data)
    changed, at = {}, None
    if saved is not None:
        changed, at = check_resume(saved, vit_cfg, cfg, out), latest_step(out)
    return RunSetup(out, vit_cfg, cfg, None, resume, saved, changed, family="vit", defaulted=defaulted_keys(train_cfg),
                    resumed_at=at)


def sized_head(vit_cfg: Any, data: str) -> Any:
    """``vit_cfg`` with a classifier head of as many outputs as ``data`` has classes, when it has the preset's
    head (a 1000-class ViT-S on a 2-class folder gets a 2-class head, and says so); a head set on purpose
    (``--set num_classes=N``) that does not match the data is refused in one line."""
    n = count_classes(data)
    if n is None or n == vit_cfg.num_classes:
        return vit_cfg
    preset = VIT_PRESETS.get(vit_cfg.name, {}).get("num_classes")
    if vit_cfg.num_classes != preset:
        raise DepthlabError(f"{data!r} has {n} classes but the model's head has num_classes={vit_cfg.num_classes}; "
                            f"pass --set num_classes={n} (or leave it unset: the head is sized to the data)")
    log.info("%s: a %d-class head for the %d classes of %r (the preset's head has %d)", vit_cfg.name, n, n, data,
             vit_cfg.num_classes)
    return vit_cfg.replace(num_classes=n)


def load_vit_data(run: RunSetup, env: D.DistEnv) -> TrainData:
    """Training batches, held-out ``(pixels, labels)`` batches of ``eval_batch_size``, the probe batch."""
    cfg = run.cfg
    m = run.model_cfg
    data = load_run_images(cfg.data, m.image_size, m.channels, m.num_classes, exact=not run.resume)
    bs = cfg.eval_batch_size
    eval_batches = [(data.test_x[i:i + bs], data.test_y[i:i + bs]) for i in range(0, len(data.test_y), bs)]
    k = cfg.probe_batch_size
    return TrainData(TrainImages(data.train_x, data.train_y, cfg.seed, data.augment), eval_batches,
                     data.test_x[:k], data.test_y[:k])


class ViTLoss(nn.Module):
    """The ViT as the loss module the loop calls (the image counterpart of ``LMLoss``)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixels: torch.Tensor, labels: torch.Tensor | None = None, output_hidden_states: bool = False,
                return_logits: bool = False) -> D.LossOutput:
        out = self.model(pixels, labels, output_hidden_states)
        loss = out.loss if out.loss is not None else out.logits.new_zeros(())
        return D.LossOutput(loss, tuple(out.hidden_states or ()), out.logits if return_logits else None)


@dataclass(frozen=True)
class ImageEvalResult:
    loss: float  # mean cross-entropy over the held-out images
    acc: float  # top-1 accuracy
    images: int  # held-out images

    def record(self, step: int) -> dict[str, Any]:
        return {"step": step, "eval_loss": self.loss, "eval_acc": self.acc, "eval_images": self.images}

    def summary(self) -> dict[str, Any]:
        return {"eval_loss": self.loss, "eval_acc": self.acc}

    def describe(self) -> str:
        return f"eval loss {self.loss:.4f}, top-1 {100 * self.acc:.2f} %"


class ImageEvaluator(Evaluator):
    """Held-out loss and top-1 accuracy over every held-out image; probes as for LMs."""

    @property
    def tokens(self) -> int:
        return sum(len(y) for _, y in self.eval_batches)

    @torch.no_grad()
    def evaluate(self) -> ImageEvalResult:
        """Loss and top-1 accuracy over every held-out image."""

        def stats(batch: tuple[torch.Tensor, torch.Tensor]) -> list[float]:
            x, y = batch
            out = self.forward(x, y, False, True)
            return [out.loss.double().item() * len(y), (out.logits.argmax(-1).cpu() == y).sum().item(), len(y)]

        loss_sum, correct, images = self.sharded_sum(stats, 3).tolist()
        return ImageEvalResult(loss_sum / images, correct / images, int(images))
