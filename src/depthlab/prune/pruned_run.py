"""Pruned depthlab models as depthlab models: each kept block remembers its original depth.

A pruned LNS model must keep 1/sqrt(l) of each block's *original* depth l, so the pruned
``ModelConfig`` records ``block_depths`` (the original 1-based depth of every block; a model that was
already pruned composes its depths). The run directory written here (``config.json``, ``tokenizer/``,
``checkpoint/step-00000000/``) is what ``depthlab diagnose`` and :func:`depthlab.train.load_run` read.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any


def drop_blocks(model, removed: list[int]):
    """A new ``DecoderLM`` without blocks ``removed`` (1-based); kept blocks keep their original depth."""
    from depthlab.models.decoder import model_with_weights

    cfg = model.cfg
    n = cfg.n_layers
    depths = cfg.depths  # original depths (composed when the model was pruned before)
    keep = [i for i in range(n) if i + 1 not in set(removed)]
    new_cfg = dataclasses.replace(cfg, n_layers=len(keep), block_depths=[depths[i] for i in keep])
    renumber = {f"blocks.{old}.": f"blocks.{new}." for new, old in enumerate(keep)}
    state = {}
    for key, value in model.state_dict().items():
        if key.startswith("blocks."):
            prefix = ".".join(key.split(".")[:2]) + "."
            if prefix not in renumber:
                continue
            key = renumber[prefix] + key[len(prefix):]
        state[key] = value.detach().clone()
    device = next(model.parameters()).device
    return model_with_weights(new_cfg, state, "the pruned model", device).train(False)


def write_run(model, target, run_dir: Path, report: dict[str, Any]) -> Path:
    """A depthlab run directory holding ``model`` at step 0 (no optimizer state: continued training starts
    a fresh optimizer), its tokenizer, and a config recording where it was pruned from."""
    from depthlab.base.store.checkpoint import save_checkpoint

    config = {"model": model.cfg.to_dict(), "train": target.info.get("train"),
              "tokenizer": {"spec": getattr(target.tokenizer, "spec", None)},
              "pruned": {"from": str(target.name), "removed_blocks": report["removed_blocks"],
                         "method": report["method"], "healed_steps": (report.get("heal") or {}).get("steps", 0)},
              "command": report.get("command")}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if target.tokenizer is not None:
        target.tokenizer.save(run_dir / "tokenizer")
    state = {k: v for k, v in model.state_dict().items()}
    save_checkpoint(run_dir, 0, state, {}, {"tokens": 0, "sequences": 0, "pruned": True}, config, keep_last=1)
    return run_dir


__all__ = ["drop_blocks", "write_run"]
