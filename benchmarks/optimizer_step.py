"""One AdamW step over a preset's parameters: torch's default implementation, foreach, fused (the trainer's
choice on CPU and CUDA, ``depthlab.train.optim.FUSED_DEVICES``), and optionally a compiled foreach step.

usage:
    python benchmarks/optimizer_step.py --preset tiny --threads 1
    python benchmarks/optimizer_step.py --preset llama-20m --threads 1 --compiled   # + torch.compile(opt.step)

Every implementation gets the same parameters and gradients; each round steps each of them once, in a
rotating order (interleaved); the time of an implementation = the median over ``--repeats`` rounds.
``--compiled`` adds a ``torch.compile``d foreach step (tensor lr, ``capturable=True``, so that a new lr
each step does not recompile); its compile time is recorded. Writes
``optimizer_step_<device>_<preset>.json`` outside the checkout (``--out benchmarks/results``: the committed one).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

import depthlab

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_out import apply_threads, common_args, result_path  # noqa: E402  (sibling module)


def optimizers(params: list[torch.Tensor], grads: list[torch.Tensor], compiled: bool) -> tuple[dict, float | None]:
    """name -> step callable, each over its own copy of the parameters; and the compile seconds."""
    def make(**kw):
        copies = [p.detach().clone().requires_grad_() for p in params]
        for c, g in zip(copies, grads):
            c.grad = g.clone()
        return torch.optim.AdamW(copies, weight_decay=0.0, **kw)

    out = {"default": make(lr=1e-4).step, "foreach": make(lr=1e-4, foreach=True).step,
           "fused": make(lr=1e-4, fused=True).step}
    compile_s = None
    if compiled:
        step = torch.compile(make(lr=torch.tensor(1e-4), foreach=True, capturable=True).step)
        t = time.perf_counter()
        step()
        compile_s = time.perf_counter() - t
        out["compiled-foreach"] = step
    return out, compile_s


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--compiled", action="store_true", help="also a compiled foreach step (minutes to compile on a CPU)")
    args = common_args(p, repeats=10).parse_args(argv)
    apply_threads(args)
    device = torch.device(args.device)
    params = [q.detach().to(device) for q in depthlab.build_model(depthlab.from_preset(args.preset)).parameters()]
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(q.shape, generator=gen).to(device) for q in params]
    steps, compile_s = optimizers(params, grads, args.compiled)
    for step in steps.values():
        step()  # first step: state allocation
    names, times = list(steps), {n: [] for n in steps}
    load = list(os.getloadavg())
    for r in range(args.repeats):
        for n in names[r % len(names):] + names[: r % len(names)]:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            steps[n]()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[n].append(time.perf_counter() - t)
    med = {n: statistics.median(v) for n, v in times.items()}
    report = {"benchmark": "optimizer_step", "command": "python benchmarks/optimizer_step.py "
              + shlex.join(sys.argv[1:] if argv is None else argv), "device": args.device, "torch": torch.__version__,
              "threads": torch.get_num_threads(), "preset": args.preset, "params": sum(q.numel() for q in params),
              "tensors": len(params), "median_ms": {n: 1000 * v for n, v in med.items()},
              "speedup_of_fused_over": {n: v / med["fused"] for n, v in med.items()}, "compile_s": compile_s,
              "seconds_all": times, "loadavg_before_after": [load, list(os.getloadavg())]}
    out = result_path(f"optimizer_step_{device.type}_{args.preset}.json", args.out)
    out.write_text(json.dumps(report, indent=2) + "\n")
    for n in names:
        print(f"{n:<17} {1000 * med[n]:9.1f} ms   fused is {med[n] / med['fused']:.2f}x faster")
    print(f"compile: {compile_s}; load average before/after {report['loadavg_before_after']}; wrote {out}")
    return report


if __name__ == "__main__":
    main()
