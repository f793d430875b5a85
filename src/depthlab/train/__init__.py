"""Pre-training: the loop, optimiser + schedule, atomic checkpoints, metrics, distributed.

    from depthlab import from_preset
    from depthlab.train import TrainConfig, train, load_run
    summary = train(from_preset("tiny", scheme="lns"), TrainConfig(data="builtin", steps=300), "runs/lns")
    model, tokenizer, config = load_run("runs/lns")
"""

from depthlab.store.checkpoint import find_checkpoint, list_checkpoints
from depthlab.targets.runs import load_run
from depthlab.train.config import TrainConfig
from depthlab.train.loop import RESUME_KEYS, TrainingDiverged, train
from depthlab.train.optim import lr_at

__all__ = ["TrainConfig", "train", "load_run", "find_checkpoint", "list_checkpoints", "TrainingDiverged",
           "lr_at", "RESUME_KEYS"]
