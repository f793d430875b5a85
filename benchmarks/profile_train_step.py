"""Profile training steps of depthlab (pre / lns) and HF Llama with torch.profiler, op by op.

usage:
    python benchmarks/profile_train_step.py --preset llama-20m --seq-len 256 --batch-size 4
    python benchmarks/profile_train_step.py --models pre,pre+compile,hf --sort self_cpu_time_total --rows 25

``--models`` takes train_throughput.py's variants (``MODEL[+bf16][+compile]``, ``hf``, ``official``).
Prints, per model, the ops that take the most self time over ``--steps`` steps (after ``--warmup``),
so differences between the implementations (norm, RoPE, attention, loss) show up by name.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
from train_throughput import HF_KINDS, FixedBatch, hf_step, parse_variant, trainer_step  # noqa: E402  (sibling script)

import depthlab  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="llama-20m")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--models", default="pre,lns,hf")
    p.add_argument("--sort", default="self_cpu_time_total")
    p.add_argument("--rows", type=int, default=20)
    args = p.parse_args(argv)

    cfg = depthlab.from_preset(args.preset, max_seq_len=max(args.seq_len, 1))
    tokens = torch.randint(cfg.vocab_size, (args.batch_size, args.seq_len + 1), generator=torch.Generator().manual_seed(0))
    data = FixedBatch(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
    for name in [n.strip() for n in args.models.split(",") if n.strip()]:
        v = parse_variant(name)
        _, step = (hf_step if v.model in HF_KINDS else trainer_step)(v, cfg, data, torch.device("cpu"), 0)
        for _ in range(args.warmup):
            step()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps):
                step()
        total = sum(e.self_cpu_time_total for e in prof.key_averages()) / 1e6
        print(f"\n===== {name}: {total:.2f}s self CPU over {args.steps} steps =====")
        print(prof.key_averages().table(sort_by=args.sort, row_limit=args.rows))


if __name__ == "__main__":
    main()
