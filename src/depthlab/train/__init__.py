"""Pre-training: the loop, optimiser + schedule, atomic checkpoints, metrics, distributed.

    from depthlab import from_preset
    from depthlab.train import TrainConfig, train, load_run
    summary = train(from_preset("tiny", scheme="lns"), TrainConfig(data="builtin", steps=300), "runs/lns")
    model, tokenizer, config = load_run("runs/lns")
"""

from depthlab.base.lazy import lazy_exports

__all__ = ["TrainConfig", "train", "load_run", "find_checkpoint", "list_checkpoints", "TrainingDiverged",
           "lr_at", "RESUME_KEYS"]

__getattr__ = lazy_exports(__name__, {
    **dict.fromkeys(("find_checkpoint", "list_checkpoints"), "depthlab.base.store.checkpoint"),
    "load_run": "depthlab.targets.runs",
    "TrainConfig": "depthlab.train.config",
    **dict.fromkeys(("RESUME_KEYS", "TrainingDiverged", "train"), "depthlab.train.loop"),
    "lr_at": "depthlab.train.optim",
})
