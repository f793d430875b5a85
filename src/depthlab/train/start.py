"""Starting a training run from given weights on given data (fine-tuning) instead of from scratch.

    start = StartFrom(tokenizer, state_dict, load_data, record={"finetune": {...}})
    train(model_cfg, train_cfg, out, start=start)

:func:`load_source` reads the weights to start from (a depthlab run, e.g. a pruned one, or an HF model
directory); ``depthlab finetune`` and ``depthlab train --init-from`` use it.

The trainer is otherwise unchanged: a fresh run builds the model as usual, then loads
``state_dict`` before the first step; ``load_data(cfg, tokenizer, env)`` replaces
:func:`~depthlab.train.data.load_train_data` (same :class:`~depthlab.train.data.TrainData`
contract); ``tokenizer`` is the run's tokenizer (saved to ``tokenizer/``); ``record`` is merged into
config.json. A resumed run restores its own checkpoint and ignores ``state_dict``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from depthlab.base.errors import DepthlabError
from depthlab.data import Tokenizer
from depthlab.models.config import ModelConfig
from depthlab.train import distributed as D
from depthlab.train.config import TrainConfig
from depthlab.train.data import TrainData


@dataclass(frozen=True)
class StartFrom:
    tokenizer: Tokenizer
    state_dict: dict[str, torch.Tensor]
    load_data: Callable[[TrainConfig, Tokenizer, D.DistEnv], TrainData]
    record: dict[str, Any] = field(default_factory=dict)  # extra config.json keys


@dataclass
class Source:
    model_cfg: ModelConfig
    state_dict: dict[str, torch.Tensor]
    tokenizer: Tokenizer
    info: dict[str, Any]


def load_source(path: str | Path, what: str = "source", dtype: torch.dtype = torch.float32) -> Source:
    """The weights, model config and tokenizer to start from: a depthlab run or checkpoint directory (its
    latest intact checkpoint; a pruned run's blocks keep their original depths) or an HF model directory.
    DepthlabError otherwise; ``what`` names the source in that message. ``dtype``: the weights' (an HF model
    is read straight into it; a run's checkpoint is cast after loading)."""
    p = Path(path)
    if not p.exists():
        raise DepthlabError(f"{what} {str(p)!r} does not exist")
    cfg = read_json_object(p / "config.json") if p.is_dir() else None
    if cfg is not None and "model" in cfg and "train" in cfg:
        src = _from_run(p)
        return replace(src, state_dict={k: v.to(dtype) if v.is_floating_point() else v
                                                    for k, v in src.state_dict.items()})
    if cfg is not None and ("model_type" in cfg or "architectures" in cfg):
        return _from_hf(p, dtype)
    raise DepthlabError(f"{str(p)!r} is neither a depthlab run (config.json + checkpoint/) nor a Hugging Face "
                        "model directory (config.json with model_type)")


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _from_run(path: Path) -> Source:
    from depthlab.targets.runs import load_run_checkpoint

    model, tok, config, ckpt = load_run_checkpoint(path)  # the newest intact checkpoint, as resume and diagnose
    if tok is None:
        raise DepthlabError(f"{str(path)!r} has no tokenizer/ beside its checkpoints; training from it needs one")
    step = read_json_object(ckpt / "trainer_state.json") or {}
    info = {"kind": "depthlab-run", "path": str(path.resolve()), "checkpoint": str(ckpt.resolve()),
            "step": step.get("step"), "scheme": model.cfg.scheme, "train_data": config.get("train", {}).get("data")}
    return Source(model.cfg, model.state_dict(), tok, info)


def _from_hf(path: Path, dtype: torch.dtype) -> Source:
    from depthlab.data import build_tokenizer
    from depthlab.hf import from_hf

    model = from_hf(str(path), dtype=dtype)
    tok = build_tokenizer(f"hf:{path.resolve()}")
    info = {"kind": "hf", "path": str(path.resolve()), "scheme": model.cfg.scheme}
    return Source(model.cfg, model.state_dict(), tok, info)
