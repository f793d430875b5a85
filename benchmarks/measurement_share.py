"""What a run's held-out evaluations and depth probes cost at the default schedule, measured against its estimate.

    python benchmarks/measurement_share.py --repeats 5

For each case (a preset, overrides and training settings, each left to its default schedule), times on random
tokens, interleaved round by round: one training step (the trainer's: forward, loss, backward, fused Adam), one
held-out evaluation of ``eval_tokens`` (forward only, ``eval_batch_size`` sequences at a time), one depth probe
without and with the removal sweep. Then, for the schedule ``TrainConfig.resolve`` chose, the measured share of
training time the evaluations (periodic, and with the final one) and the probes (periodic, and with the ones at
step 0 and the end) take, beside the token-count estimate the plan line states
(``depthlab.train.config.measurement_costs``). The goal (issue 38): each periodic kind within 5 % of the run,
both within 10 %. Writes measurement_share_cpu.json (outside the checkout unless ``--out benchmarks/results``).
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
from depthlab.train.config import measured_steps, measurement_costs
from depthlab.train.evaluator import Evaluator
from depthlab.train.optim import build_optimizer
from depthlab.train.step import Forward

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_out import apply_threads, common_args, result_path  # noqa: E402  (sibling module)

#: (name, preset overrides, TrainConfig settings): the default tiny run, the issue's 6-step 24-block run, the demo.
CASES = (
    ("tiny, 300 steps (its defaults)", {}, {}),
    ("tiny with 24 blocks, 6 steps", {"n_layers": 24}, {"steps": 6}),
    ("the demo's runs (64 steps, batch 8, 4,096 held-out tokens, probes every 8)", {},
     {"steps": 64, "batch_size": 8, "eval_tokens": 4096, "variance_every": 8}),
)


def timings(overrides: dict, settings: dict, repeats: int) -> tuple[TrainConfig, int, dict[str, float]]:
    """(resolved config, blocks, median seconds of: train_step, evaluation, probe, probe_removal)."""
    cfg = d.from_preset("tiny", scheme="lns", **overrides)
    tc = TrainConfig(data="builtin", **settings).resolve(cfg)
    model, env, cpu = d.build_model(cfg), D.DistEnv(), torch.device("cpu")
    forward = Forward(D.wrap(model, env, cpu), cpu, lambda: torch.autocast("cpu", enabled=False))
    opt = build_optimizer(model, tc, cpu)
    B, T, P, E = tc.batch_size, tc.seq_len, tc.probe_batch_size, tc.eval_batch_size
    x = torch.randint(cfg.vocab_size, (B, T))
    evals = [torch.randint(cfg.vocab_size, (E, T + 1)) for _ in range(max(1, -(-tc.eval_tokens // (E * T))))]
    probe = torch.randint(cfg.vocab_size, (P, T + 1))
    plain = Evaluator(forward, evals, probe[:, :-1], env, model=model, probe_labels=probe[:, 1:], track_depth=True,
                      track_removal=False)
    sweeping = Evaluator(forward, evals, probe[:, :-1], env, model=model, probe_labels=probe[:, 1:],
                         track_depth=True, track_removal=True)

    def step() -> None:
        forward(x, x.roll(-1, 1)).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    jobs = {"train_step": step, "evaluation": plain.evaluate, "probe": plain.probe, "probe_removal": sweeping.probe}
    for fn in jobs.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {k: [] for k in jobs}
    for r in range(repeats):
        for name in list(jobs)[r % len(jobs):] + list(jobs)[: r % len(jobs)]:
            t0 = time.perf_counter()
            jobs[name]()
            times[name].append(time.perf_counter() - t0)
    return tc, cfg.n_layers, {k: statistics.median(v) for k, v in times.items()}


def shares(tc: TrainConfig, n_layers: int, med: dict[str, float]) -> dict[str, float]:
    """Measured and estimated shares of the training time, for the schedule ``tc`` holds."""
    steps, train = tc.steps, tc.steps * med["train_step"]
    n_eval = len(measured_steps(tc.eval_every, steps))
    probes = [0, *measured_steps(tc.variance_every, steps)] if tc.variance_every else []
    sweeps = [t for t in probes if tc.track_removal and (t in (0, steps) or (
        tc.removal_every and (t // tc.variance_every) % tc.removal_every == 0))]
    sweep = med["probe_removal"] - med["probe"]
    evaluation, probe, removal = measurement_costs(tc.to_dict(), n_layers)  # the plan line's estimate, in steps
    return {
        "evaluations_periodic": (n_eval - 1) * med["evaluation"] / train,
        "evaluations_all": n_eval * med["evaluation"] / train,
        "probes_periodic": (max(0, len(probes) - 2) * med["probe"] + max(0, len(sweeps) - 2) * sweep) / train,
        "probes_all": (len(probes) * med["probe"] + len(sweeps) * sweep) / train,
        "estimate_evaluations_all": n_eval * evaluation / steps,
        "estimate_probes_all": (len(probes) * probe + len(sweeps) * removal) / steps,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args = common_args(p, repeats=5).parse_args()
    apply_threads(args)
    load_before, cases = os.getloadavg(), []
    for name, overrides, settings in CASES:
        tc, n_layers, med = timings(overrides, settings, args.repeats)
        share = shares(tc, n_layers, med)
        cases.append({"case": name, "overrides": overrides, "settings": settings, "median_s": med, "share": share,
                      "schedule": {k: getattr(tc, k) for k in ("steps", "batch_size", "seq_len", "eval_tokens",
                                                                  "eval_every", "variance_every", "track_removal",
                                                                  "removal_every")}})
        print(f"{name}: evaluations {100 * share['evaluations_all']:.1f}% of training (est. "
              f"{100 * share['estimate_evaluations_all']:.1f}%; periodic {100 * share['evaluations_periodic']:.1f}%), "
              f"probes {100 * share['probes_all']:.1f}% (est. {100 * share['estimate_probes_all']:.1f}%; periodic "
              f"{100 * share['probes_periodic']:.1f}%)")
    model = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                  if l.startswith("model name")), "unknown") if Path("/proc/cpuinfo").is_file() else "unknown"
    result = {"benchmark": "measurement_share", "device": "cpu", "cpu_model": model, "cpu_count": os.cpu_count(),
              "threads": torch.get_num_threads(), "command": "python " + " ".join(sys.argv), "versions": versions(),
              "cases": cases, "load_before": load_before, "load_after": os.getloadavg()}
    path = result_path("measurement_share_cpu.json", args.out)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
