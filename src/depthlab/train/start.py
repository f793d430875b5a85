"""Starting a training run from given weights on given data (fine-tuning) instead of from scratch.

    start = StartFrom(tokenizer, state_dict, load_data, record={"finetune": {...}})
    train(model_cfg, train_cfg, out, start=start)

The trainer is otherwise unchanged: a fresh run builds the model as usual, then loads
``state_dict`` before the first step; ``load_data(cfg, tokenizer, env)`` replaces
:func:`~depthlab.train.data.load_train_data` (same :class:`~depthlab.train.data.TrainData`
contract); ``tokenizer`` is the run's tokenizer (saved to ``tokenizer/``); ``record`` is merged into
config.json. A resumed run restores its own checkpoint and ignores ``state_dict``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from depthlab.data import Tokenizer
from depthlab.train import distributed as D
from depthlab.train.config import TrainConfig
from depthlab.train.data import TrainData


@dataclass(frozen=True)
class StartFrom:
    tokenizer: Tokenizer
    state_dict: dict[str, torch.Tensor]
    load_data: Callable[[TrainConfig, Tokenizer, D.DistEnv], TrainData]
    record: dict[str, Any] = field(default_factory=dict)  # extra config.json keys
