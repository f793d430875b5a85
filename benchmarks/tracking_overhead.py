"""Cost of depth tracking relative to training: one probe vs one train step, interleaved.

    python benchmarks/tracking_overhead.py --preset tiny --repeats 10

A *step* is what the trainer does per optimizer step on the preset's CPU defaults (global batch of
``batch_size`` sequences of ``seq_len`` tokens, forward + loss + backward + Adam). A *probe* is
``Evaluator.probe()`` on the fixed probe batch (``probe_batch_size`` held-out sequences), in three
variants: variance only (what the trainer did before tracking), tracking without removal, full
tracking; and ``tracking_default``, the trainer's default schedule (removal at every
``removal_every``-th probe), computed from the two. They run back to back in each round (order
rotating), so machine noise hits all; the
medians give the overhead at the default probe interval (``variance_every = steps // 20``, one extra
probe at step 0): overhead = (steps // every + 1) · t_probe / (steps · t_step).
Writes tracking_overhead_<device>_<preset>.json (outside the checkout unless ``--out benchmarks/results``) with the
command, versions and raw timings.
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
from depthlab.base.provenance import versions
from depthlab.train import TrainConfig
from depthlab.train import distributed as D
from depthlab.train.evaluator import Evaluator
from depthlab.train.optim import build_optimizer
from depthlab.train.step import Forward

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_out import apply_threads, common_args, result_path  # noqa: E402  (sibling module)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny")
    args = common_args(p, repeats=10).parse_args()
    apply_threads(args)
    cfg = d.from_preset(args.preset, scheme="lns")
    tc = TrainConfig(data="builtin").resolve(cfg)
    B, T, P = tc.batch_size, tc.seq_len, tc.probe_batch_size
    model = d.build_model(cfg)
    env = D.DistEnv()
    forward = Forward(D.wrap(model, env, torch.device("cpu")), torch.device("cpu"), lambda: torch.autocast("cpu", enabled=False))
    opt = build_optimizer(model, tc, torch.device("cpu"))
    x = torch.randint(cfg.vocab_size, (B, T))
    probe = torch.randint(cfg.vocab_size, (P, T + 1))
    variants = {
        "variance_only": Evaluator(forward, [], probe[:, :-1], env),
        "tracking_no_removal": Evaluator(forward, [], probe[:, :-1], env, model=model, probe_labels=probe[:, 1:],
                                         track_depth=True, track_removal=False),
        "tracking_full": Evaluator(forward, [], probe[:, :-1], env, model=model, probe_labels=probe[:, 1:],
                                   track_depth=True, track_removal=True),
    }

    def step() -> None:
        loss = forward(x, x.roll(-1, 1)).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    jobs = {"train_step": step, **{k: v.probe for k, v in variants.items()}}
    for fn in jobs.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {k: [] for k in jobs}
    load_before = os.getloadavg()
    for r in range(args.repeats):
        names = list(jobs)[r % len(jobs):] + list(jobs)[: r % len(jobs)]
        for name in names:
            t0 = time.perf_counter()
            jobs[name]()
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    steps = tc.steps
    every = tc.variance_every
    n_probes = steps // every + 1
    # the trainer sweeps removal at every removal_every-th probe only: the default schedule's average probe
    removal_share = (steps // every // tc.removal_every + 1) / n_probes
    med["tracking_default"] = med["tracking_no_removal"] + removal_share * (med["tracking_full"] - med["tracking_no_removal"])
    variants = {**variants, "tracking_default": None}
    overhead = {k: n_probes * (med[k] - med["variance_only"]) / (steps * med["train_step"]) for k in variants}
    result = {
        "benchmark": "tracking_overhead", "device": "cpu", "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
        "command": "python " + " ".join(sys.argv), "versions": versions(), "preset": args.preset,
        "train": {"batch_size": B, "seq_len": T, "probe_batch_size": P, "steps": steps, "variance_every": every,
                  "removal_every": tc.removal_every},
        "median_s": med, "probe_over_step": {k: med[k] / med["train_step"] for k in variants},
        "added_overhead_vs_variance_only": overhead,
        "total_probe_overhead": {k: n_probes * med[k] / (steps * med["train_step"]) for k in variants},
        "load_before": load_before, "load_after": os.getloadavg(), "raw_s": times,
    }
    path = result_path(f"tracking_overhead_cpu_{args.preset}.json", args.out)
    path.write_text(json.dumps(result, indent=1) + "\n")
    for k in variants:
        print(f"{k:22s} probe {med[k] * 1e3:7.1f} ms = {med[k] / med['train_step']:.2f} steps; "
              f"at the default interval ({n_probes} probes / {steps} steps): +{100 * overhead[k]:.1f}% over "
              f"variance-only, {100 * result['total_probe_overhead'][k]:.1f}% of training in all")
    print(f"train step {med['train_step'] * 1e3:.1f} ms; wrote {path}")


if __name__ == "__main__":
    main()
