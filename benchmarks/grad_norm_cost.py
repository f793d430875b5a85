"""Cost of the per-block gradient norms (``layer_grad_norm``) relative to a train step, interleaved.

    python benchmarks/grad_norm_cost.py --preset tiny --repeats 20 --out benchmarks/results

A *step* is forward + loss + backward + Adam on the preset's CPU training batch; *grad norms* is
:func:`depthlab.analysis.diagnostics.probes.grad_norm_tensor` over the blocks' gradients, read to the host (what a
probe step adds). Both run in each round, order alternating. The trainer adds the grad norms at probe steps only, so
the overhead at the default interval is (steps // every) · t_norms / (steps · t_step).
Writes grad_norm_cost_cpu_<preset>.json (outside the checkout unless ``--out benchmarks/results``) with the command,
versions, load and raw timings.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

import depthlab as d
from depthlab.analysis.diagnostics.probes import grad_norm_tensor
from depthlab.base.provenance import versions
from depthlab.train import TrainConfig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", default=None, help="folder or .json file (default: outside the checkout; "
                   "--out benchmarks/results updates the committed result)")
    args = p.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_out import result_path

    path = result_path(f"grad_norm_cost_cpu_{args.preset}.json", args.out)
    cfg = d.from_preset(args.preset, scheme="lns")
    tc = TrainConfig(data="builtin").resolve(cfg)
    model = d.build_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(cfg.vocab_size, (tc.batch_size, tc.seq_len))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x, labels=x.roll(-1, 1)).loss.backward()
        opt.step()

    def norms() -> None:
        grad_norm_tensor(model.blocks).tolist()

    step()
    norms()
    times: dict[str, list[float]] = {"train_step": [], "grad_norms": []}
    load_before = os.getloadavg()
    for r in range(args.repeats):
        for name in (["train_step", "grad_norms"] if r % 2 == 0 else ["grad_norms", "train_step"]):
            t0 = time.perf_counter()
            (step if name == "train_step" else norms)()
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    every = tc.variance_every
    overhead = (tc.steps // every) * med["grad_norms"] / (tc.steps * med["train_step"])
    result = {"benchmark": "grad_norm_cost", "device": "cpu", "cpu_count": os.cpu_count(),
              "threads": torch.get_num_threads(), "command": "python " + " ".join(sys.argv), "versions": versions(),
              "preset": args.preset, "n_layers": cfg.n_layers, "batch": [tc.batch_size, tc.seq_len],
              "median_s": med, "norms_over_step": med["grad_norms"] / med["train_step"],
              "overhead_at_default_interval": overhead, "steps": tc.steps, "variance_every": every,
              "load_before": load_before, "load_after": os.getloadavg(), "raw_s": times}
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"train step {med['train_step'] * 1e3:.1f} ms, grad norms {med['grad_norms'] * 1e3:.2f} ms "
          f"({100 * result['norms_over_step']:.2f}% of a step; {100 * overhead:.3f}% of training at the default "
          f"interval, every {every} of {tc.steps} steps); wrote {path}")


if __name__ == "__main__":
    main()
