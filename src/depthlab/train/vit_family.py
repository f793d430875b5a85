"""The ViT family's side of the trainer: run checks, image data, the loss module, held-out accuracy.

    run = open_vit_run(vit_cfg, train_cfg, out, resume, env)     # checks; no tokenizer; writes nothing
    data = load_vit_data(run, env)                                # train images by step, held-out batches, probe
    module = ViTLoss(model)                                       # forward(x, y, hidden, logits) -> LossOutput
    evaluator = ImageEvaluator(forward, data.eval_batches, data.probe_batch, env, ...)   # loss + top-1 accuracy

Batches are a pure function of (seed, step): global image ``i`` of the run is image ``perm_e[i mod N]``
of epoch ``e = i // N``'s seeded permutation, so a resumed run reads exactly the images it would have.
The held-out split (20 %, seeded by :data:`SPLIT_SEED`, not by the run seed) is the same for every seed
of a comparison, and ``diagnose`` rebuilds it from ``config.json``. ``eval_tokens`` / ``seq_len`` mean
nothing to a ViT: every held-out image is evaluated; ``tokens`` counts training images.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from depthlab.errors import DepthlabError
from depthlab.train import distributed as D
from depthlab.train.config import TrainConfig
from depthlab.train.data import TrainData
from depthlab.train.evaluator import Evaluator
from depthlab.train.rundir import RunSetup, check_resume, saved_config

#: Seed of the train / held-out split of every ViT run (the run seed fixes init, order and augmentation).
SPLIT_SEED = 0
HELD_OUT_FRACTION = 0.2
#: Training defaults per ViT preset (fields a TrainConfig leaves None); vit-tiny: phase 1's digits study.
VIT_DEFAULTS: dict[str, dict[str, Any]] = {
    "vit-tiny": dict(lr=2e-3, steps=600, warmup=0.1, batch_size=64, grad_clip=1.0),
    "vit-s": dict(lr=1e-3, steps=100_000, warmup=0.05, batch_size=1024, grad_clip=1.0),
}


def vit_train_config(train_cfg: TrainConfig, vit_cfg: Any, world_size: int = 1) -> TrainConfig:
    """``train_cfg`` with the ViT preset's defaults where it left None, resolved (``seq_len`` = tokens per image).
    ``data="builtin"`` (the default) means the built-in *image* set for a ViT: scikit-learn's digits."""
    if train_cfg.data == "builtin":
        train_cfg = train_cfg.replace(data="digits")
    preset = VIT_DEFAULTS.get(vit_cfg.name, VIT_DEFAULTS["vit-tiny"])
    defaults = {**preset, "seq_len": vit_cfg.seq_len, "eval_tokens": 1}
    given = train_cfg.to_dict()
    return train_cfg.replace(**{k: v for k, v in defaults.items() if given.get(k) is None}).resolve(vit_cfg, world_size)


def open_vit_run(vit_cfg: Any, train_cfg: TrainConfig, out: Path, resume: bool, env: D.DistEnv) -> RunSetup:
    """Check ``out`` and the settings (a resume must match the saved run); no tokenizer; writes nothing."""
    saved = saved_config(out) if resume else None
    if not resume and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DepthlabError(f"run directory {str(out)!r} already exists; "
                            "pass --resume to continue it or choose a new --out")
    cfg = vit_train_config(train_cfg, vit_cfg, env.world_size)
    if saved is not None:
        check_resume(saved, vit_cfg, cfg, out)
    return RunSetup(out, vit_cfg, cfg, None, resume, saved, family="vit")


def load_held_out(data_spec: str, vit_cfg: Any):
    """The run's ``ImageData`` (``depthlab.vit.data``): normalised, split by :data:`SPLIT_SEED`, checked
    against the model (classes, channels)."""
    from depthlab.vit.data import load_images

    data = load_images(data_spec, vit_cfg.image_size, vit_cfg.channels, HELD_OUT_FRACTION, SPLIT_SEED)
    if data.num_classes > vit_cfg.num_classes:
        raise DepthlabError(f"{data_spec!r} has {data.num_classes} classes but the model has num_classes="
                            f"{vit_cfg.num_classes}; pass --set num_classes={data.num_classes}")
    return data


class ImageBatches:
    """Training batches as a function of the step: ``rank_batch(step, B, rank, world) -> (pixels, labels)``."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, seed: int, augment: bool) -> None:
        self.x, self.y, self.seed, self.augment = x, y, seed, augment
        self._perms: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self.y)

    def _perm(self, epoch: int) -> torch.Tensor:
        if epoch not in self._perms:
            self._perms = {epoch: torch.randperm(len(self.y), generator=torch.Generator().manual_seed(
                self.seed * 1_000_003 + epoch))}
        return self._perms[epoch]

    def rank_batch(self, step: int, batch_size: int, rank: int = 0, world_size: int = 1
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        from depthlab.vit.data import augment_batch

        n, per = len(self.y), batch_size // world_size
        first = step * batch_size + rank * per
        idx = torch.stack([self._perm(i // n)[i % n] for i in range(first, first + per)])
        x = self.x[idx]
        if self.augment:
            x = augment_batch(x, torch.Generator().manual_seed(self.seed * 1_000_003 + 7919 * step + rank))
        return x, self.y[idx]


def load_vit_data(run: RunSetup, env: D.DistEnv) -> TrainData:
    """Training batches, held-out ``(pixels, labels)`` batches of ``eval_batch_size``, the probe batch."""
    cfg = run.cfg
    data = load_held_out(cfg.data, run.model_cfg)
    bs = cfg.eval_batch_size
    eval_batches = [(data.test_x[i:i + bs], data.test_y[i:i + bs]) for i in range(0, len(data.test_y), bs)]
    k = cfg.probe_batch_size
    return TrainData(ImageBatches(data.train_x, data.train_y, cfg.seed, data.augment), eval_batches,
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
        batches, world = self.eval_batches, self.env.world_size
        mine = batches[self.env.rank::world]
        total = torch.zeros(3, dtype=torch.float64)  # (loss sum, correct, images)
        with self.forward.eval_mode():
            for i in range(-(-len(batches) // world)):
                x, y = mine[i] if i < len(mine) else batches[0]
                out = self.forward(x, y, False, True)
                if i < len(mine):
                    correct = (out.logits.argmax(-1).cpu() == y).sum().item()
                    total += torch.tensor([out.loss.double().item() * len(y), correct, len(y)], dtype=torch.float64)
        D.all_reduce_sum(total, self.env)
        return ImageEvalResult((total[0] / total[2]).item(), (total[1] / total[2]).item(), int(total[2]))
