"""Cost of ``DepthMonitorCallback`` on a Hugging Face ``Trainer`` run, against the trainer's own +2.7 %.

    python benchmarks/monitor_overhead.py --steps 60 --repeats 2          # ~4 min on 2 CPU cores
    python benchmarks/monitor_overhead.py --steps 300 --repeats 3         # the trainer's full schedule

The model is an HF ``LlamaForCausalLM`` of the ``tiny`` preset's shape (16 layers, d 128, SwiGLU 352,
vocab 4096) with LayerNorm Scaling applied; the run is the ``tiny`` preset's CPU recipe: batches of 16
random windows of 128 tokens (data loading is not what is measured), Adam, cosine schedule. The monitor
probes 8 held-out windows of 128 tokens every ``--every`` optimizer steps (default 15 = steps // 20 of the
trainer's 300-step recipe) and at the start and the last step, the removal sweep at every 4th probe:
the trainer's default schedule (``variance_every``, ``probe_batch_size``, ``removal_every``).

Two measurements, both reported:

- **within the run** (robust to machine noise): the monitor's own probe time (its ``timings``) over
  the rest of the Trainer's ``train_runtime``; extrapolated to the trainer's 300-step schedule from the
  measured mean probe cost with and without the removal sweep, as ``benchmarks/tracking_overhead.py``
  does for depthlab's trainer (whose ``added_overhead_vs_variance_only.tracking_default`` is the +2.7 %);
- **A/B**: ``train_runtime`` with the callback over ``train_runtime`` without it, the runs alternating
  (``--repeats`` pairs; the median of the paired ratios).

Writes results/monitor_overhead_<device>.json with the command, versions, machine and raw timings.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaForCausalLM, Trainer, TrainingArguments

import depthlab as d
from depthlab.analysis.monitor import DepthMonitorCallback
from depthlab.base.provenance import versions
from depthlab.hf import apply_layernorm_scaling
from depthlab.hf.export import hf_config_for

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_out import apply_threads, common_args, result_path  # noqa: E402  (sibling module)


class Windows(torch.utils.data.Dataset):
    def __init__(self, rows: torch.Tensor) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def one_run(a: argparse.Namespace, monitored: bool, out: Path) -> dict:
    cfg = d.from_preset(a.preset)
    torch.manual_seed(a.seed)
    model = LlamaForCausalLM(hf_config_for(cfg))
    apply_layernorm_scaling(model)
    gen = torch.Generator().manual_seed(a.seed)
    train = Windows(torch.randint(cfg.vocab_size, (a.steps * a.batch, a.seq_len), generator=gen))
    probe = torch.randint(cfg.vocab_size, (a.probe_rows, a.seq_len + 1), generator=gen)
    args = TrainingArguments(output_dir=str(out), max_steps=a.steps, per_device_train_batch_size=a.batch,
                             learning_rate=2e-3, lr_scheduler_type="cosine", warmup_steps=max(1, a.steps // 10),
                             max_grad_norm=0.0, report_to=[], logging_steps=10, save_strategy="no", disable_tqdm=True,
                             dataloader_num_workers=0, use_cpu=True, seed=a.seed)
    trainer = Trainer(model=model, args=args, train_dataset=train)
    cb = DepthMonitorCallback(probe, every=a.every, removal_every=a.removal_every).attach(trainer) if monitored else None
    t0 = time.perf_counter()
    runtime = trainer.train().metrics["train_runtime"]
    wall = time.perf_counter() - t0
    row = {"monitored": monitored, "train_runtime_s": runtime, "wall_s": wall}
    if cb is not None:
        row.update(probe_s=cb.monitor.seconds, timings=cb.monitor.timings, n_layers=cb.monitor.n_layers)
    return row


def summarise(a: argparse.Namespace, runs: list[dict]) -> dict:
    mon = [r for r in runs if r["monitored"]]
    base = [r for r in runs if not r["monitored"]]
    within = [r["probe_s"] / (r["train_runtime_s"] - r["probe_s"]) for r in mon]
    step_s = statistics.median((r["train_runtime_s"] - r["probe_s"]) / a.steps for r in mon)
    t_rm = [t for r in mon for (_, rm, t) in r["timings"] if rm]
    t_no = [t for r in mon for (_, rm, t) in r["timings"] if not rm]
    probe_rm, probe_no = statistics.median(t_rm), statistics.median(t_no)
    # the trainer's schedule (tiny: 300 steps, every 15, removal at every 4th probe, at the start and the last)
    steps, every = 300, 15
    n_probes = steps // every + 1

    def at_schedule(removal_every: int) -> float:
        n_removal = (steps // every // removal_every if removal_every else 0) + 1
        return (n_removal * probe_rm + (n_probes - n_removal) * probe_no) / (steps * step_s)

    schedule = at_schedule(a.removal_every)
    ab = [m["train_runtime_s"] / b["train_runtime_s"] - 1 for m, b in zip(mon, base)]
    return {"within_run_overhead": within, "within_run_overhead_median": statistics.median(within),
            "ab_overhead": ab, "ab_overhead_median": statistics.median(ab) if ab else None,
            "train_step_s": step_s, "probe_s_with_removal": probe_rm, "probe_s_without_removal": probe_no,
            "probe_over_step": {"with_removal": probe_rm / step_s, "without_removal": probe_no / step_s},
            "overhead_at_trainer_schedule_300_steps": schedule,
            "overhead_at_trainer_schedule_by_removal_every": {k: at_schedule(k) for k in (1, 2, 4, 8, 0)},
            "trainer_reference": "benchmarks/results/tracking_overhead_cpu_tiny.json: "
                                 "added_overhead_vs_variance_only.tracking_default = +2.7 %"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--every", type=int, default=15)
    p.add_argument("--removal-every", type=int, default=4)
    p.add_argument("--probe-rows", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2, help="pairs of runs (without, with the monitor), alternating")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tmp", type=Path, default=Path("/tmp/depthlab_monitor_overhead"))
    a = common_args(p).parse_args()
    apply_threads(a)
    load_before = os.getloadavg()
    runs = []
    for r in range(a.repeats):
        order = (False, True) if r % 2 == 0 else (True, False)
        pair = {m: one_run(a, m, a.tmp / f"{r}-{m}") for m in order}
        runs += [pair[False], pair[True]]
        print(f"pair {r}: without {pair[False]['train_runtime_s']:.1f}s, with {pair[True]['train_runtime_s']:.1f}s "
              f"(probes {pair[True]['probe_s']:.1f}s)", flush=True)
    result = {
        "benchmark": "monitor_overhead", "device": "cpu", "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(), "command": "python " + " ".join(sys.argv),
        "versions": versions(), "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()},
        **summarise(a, runs), "load_before": load_before, "load_after": os.getloadavg(), "runs": runs,
    }
    path = result_path("monitor_overhead_cpu.json", a.out)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"train step {result['train_step_s'] * 1e3:.0f} ms; probe {result['probe_s_without_removal'] * 1e3:.0f} ms "
          f"({result['probe_s_with_removal'] * 1e3:.0f} ms with the removal sweep)")
    print(f"overhead in these runs: {100 * result['within_run_overhead_median']:.1f} % (within the run), "
          f"{100 * result['ab_overhead_median']:.1f} % (A/B); at the trainer's 300-step schedule: "
          f"{100 * result['overhead_at_trainer_schedule_300_steps']:.1f} %; wrote {path}")


if __name__ == "__main__":
    main()
