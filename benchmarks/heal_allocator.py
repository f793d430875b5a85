"""What returning freed memory costs and saves: SmolLM2-135M LoRA heal steps with glibc's default malloc against
the mmap threshold fixed at 1 MiB while healing (``HealOptions.return_memory``, the default).

    python benchmarks/heal_allocator.py --rounds 2 --out benchmarks/results   # the committed result

Each measurement is a fresh child process: SmolLM2 loaded in bf16 (as ``prune --heal lora`` loads it), 6 blocks
removed, then ``--steps`` LoRA healing steps of ``--batch-size`` x 256 tokens with activation checkpointing on (the
default for this model), in one mode: ``fixed`` (what ``heal`` does by default) or ``default``
(``--no-heal-return-memory``: glibc raising its threshold as it does by default). The child reports the wall time of each
step and its peak RSS (``VmHWM``) before and after healing; the modes alternate over ``--rounds``. Result:
``heal_allocator_cpu.json`` with the CPU (``lscpu``), versions and load averages.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_out import result_path  # noqa: E402  (sibling module)
from prune_heal import lscpu  # noqa: E402

REMOVED = [14, 15, 16, 17, 18, 19]  # the blocks prune_heal.py --smollm2 removes (angular-block, 6)


def _hwm() -> int:
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) * 1024


def child(mode: str, steps: int, batch_size: int) -> dict:
    import torch

    import depthlab.prune.heal as H
    from depthlab.prune.options import HealOptions
    from depthlab.prune.pipeline import prune_model
    from depthlab.targets import load_target

    target = load_target("smollm2", dtype=torch.bfloat16)
    model = prune_model(target.model, REMOVED)
    before, times, step = _hwm(), [], H._heal_step

    def timed(*args):
        t0 = time.perf_counter()
        loss = step(*args)
        times.append(round(time.perf_counter() - t0, 3))
        return loss

    H._heal_step = timed
    _, info = H.heal(model, target.tokenizer, HealOptions(steps=steps, mode="lora", batch_size=batch_size, seq_len=256,
                                                          return_memory=mode == "fixed", progress=False))
    return {"mode": mode, "step_s": times, "peak_rss_before_heal": before, "peak_rss": _hwm(),
            "checkpointing": info["activation_checkpointing"], "train_loss": info["train_loss"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--out", default=None, help="folder or .json file (default: outside the checkout)")
    p.add_argument("--child", choices=("fixed", "default"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps, args.batch_size)))
        return
    load, runs = os.getloadavg(), []
    for r in range(args.rounds):
        for mode in (("fixed", "default") if r % 2 == 0 else ("default", "fixed")):
            out = subprocess.run([sys.executable, __file__, "--child", mode, "--steps", str(args.steps), "--batch-size",
                                  str(args.batch_size)], capture_output=True, text=True, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "train_loss"}), flush=True)
    summary = {m: {"median_step_s_after_first": statistics.median(s for r in runs if r["mode"] == m for s in r["step_s"][1:]),
                   "peak_rss_median": statistics.median(r["peak_rss"] for r in runs if r["mode"] == m)}
               for m in ("fixed", "default")}
    report = {"benchmark": "heal_allocator", "command": "python benchmarks/heal_allocator.py " + " ".join(sys.argv[1:]),
              "lscpu": lscpu(), "load_average_before": load, "load_average_after": os.getloadavg(),
              "settings": {"steps": args.steps, "batch_size": args.batch_size, "seq_len": 256, "removed": REMOVED},
              "summary": summary, "runs": runs}
    from depthlab.base.fileio import write_json_atomic

    path = result_path("heal_allocator_cpu.json", args.out)
    write_json_atomic(path, report)
    print(json.dumps(summary), f"\nwrote {path}")


if __name__ == "__main__":
    main()
