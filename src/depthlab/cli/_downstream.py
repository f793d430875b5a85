"""``compare``'s --finetune / --eval flags (the paper's Table 2 on the compared runs)."""

from __future__ import annotations

import argparse


def add_downstream_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("downstream (paper Table 2): fine-tune each run, then evaluate it")
    g.add_argument("--finetune", metavar="DATA", help="SFT data for every run: builtin-sft | FILE.json | FILE.jsonl")
    g.add_argument("--eval", dest="eval_tasks", metavar="TASKS",
                   help="comma-separated tasks as for `depthlab evaluate` (FILE.jsonl, builtin-mc, hf:NAME)")
    g.add_argument("--finetune-steps", type=int, help="fine-tuning steps (default: 3 epochs)")
    g.add_argument("--finetune-lr", type=float, help="fine-tuning peak lr (default 1e-4)")
    g.add_argument("--finetune-batch-size", type=int, help="fine-tuning batch in examples (default 16)")
    g.add_argument("--finetune-seq-len", type=int, help="fine-tuning tokens per example (default 256)")
    g.add_argument("--eval-limit", type=int, help="score the first N items of each task")


def downstream_from_args(args: argparse.Namespace):
    """The compare's :class:`~depthlab.compare.downstream.Downstream` (inactive for commands without the flags)."""
    from depthlab.compare.downstream import Downstream

    get = lambda name: getattr(args, name, None)  # noqa: E731 - demo has none of these flags
    return Downstream(finetune=get("finetune"), tasks=get("eval_tasks"), steps=get("finetune_steps"),
                      lr=get("finetune_lr"), batch_size=get("finetune_batch_size"), seq_len=get("finetune_seq_len"),
                      limit=get("eval_limit"))
