"""A run's data: this rank's training sequences, the held-out evaluation batches, the probe batch.

    data = load_train_data(cfg, tokenizer, env)
    x, y = data.train.rank_batch(step - 1, cfg.batch_size, env.rank, env.world_size)
    data.eval_batches    # list of (B, seq_len + 1) held-out windows, the same at every evaluation
    data.probe_batch     # (probe_batch_size, seq_len) held-out inputs, the same at every probe
    data.probe_labels    # their targets (for the removal probe)

Held-out text is ``cfg.val_data`` when given (token shards: their own val split), else the
deterministic held-out split of ``cfg.data``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from depthlab.base.errors import DepthlabError
from depthlab.data import Tokenizer, eval_token_batches, is_shard_dir, load_sequences
from depthlab.train import distributed as D
from depthlab.train.config import TrainConfig


@dataclass(frozen=True)
class TrainData:
    train: Any  # TokenSequences / StreamingSequences: .rank_batch(step, batch_size, rank, world) -> (x, y)
    eval_batches: list[torch.Tensor]  # held-out windows (B, seq_len + 1)
    probe_batch: torch.Tensor  # fixed held-out inputs (probe_batch_size, seq_len)
    probe_labels: torch.Tensor | None = None  # their next-token targets (probe_batch_size, seq_len)


def load_train_data(cfg: TrainConfig, tok: Tokenizer, env: D.DistEnv) -> TrainData:
    """Tokenize (or map) the training data, rank 0 first (it fills the token cache), and cut the
    held-out batches. Raises DepthlabError when there is no held-out text of one window."""
    seqs = None
    for turn in (0, 1):
        if (turn == 0) == env.is_main:
            seqs = load_sequences(cfg.data, tok, cfg.seq_len, split="train", pack=cfg.pack, seed=cfg.seed,
                                  text_field=cfg.text_field, cache_dir=cfg.cache_dir, streaming=cfg.streaming,
                                  rank=env.rank, world_size=env.world_size)
        D.barrier(env)
    eval_batches = held_out_batches(cfg, tok)
    windows = torch.cat(eval_batches)[: cfg.probe_batch_size]
    return TrainData(seqs, eval_batches, windows[:, :-1], windows[:, 1:])


def held_out_batches(cfg: TrainConfig, tok: Tokenizer) -> list[torch.Tensor]:
    """``cfg.eval_tokens`` held-out tokens as windows of ``seq_len + 1``, ``eval_batch_size`` per batch."""
    window = cfg.seq_len + 1
    val_spec, val_split = (cfg.val_data, "all") if cfg.val_data else (cfg.data, "val")
    if cfg.val_data and is_shard_dir(cfg.val_data):
        val_split = "val"  # token shards keep their own held-out split
    batches = list(eval_token_batches(val_spec, tok, cfg.eval_tokens, window, cfg.eval_batch_size,
                                      split=val_split, text_field=cfg.text_field))
    if not batches:
        raise DepthlabError(f"no held-out text of {window} tokens in {val_spec!r} ({val_split} split); give --val-data")
    return batches
