"""Does the learning rate tuned at one depth transfer to the others? A grid of depth x learning rate x scheme,
width fixed, each run trained by ``depthlab.train.train`` and scored by its held-out loss.

    PYTHONPATH=src flock /work/locks/cpu.lock python3 experiments/cpu-depth-transfer/run.py --out /tmp/depth-transfer
    PYTHONPATH=src python3 experiments/cpu-depth-transfer/analyze.py --runs /tmp/depth-transfer   # figures + fits here

Every run is the ``tiny`` preset (RoPE, SwiGLU, RMSNorm, the built-in corpus with its bpe:4096 tokenizer, batch
16 x 128 tokens, 10 % warm-up, cosine decay to 0.1 of the peak) at width 64 (4 heads, d_ff 176), with
``n_layers`` and ``lr`` from the grid. CompleteP runs at ``base_depth=2``: the shallowest depth of the grid,
where it is Pre-LN, so its optimum there is the "tuned at the base depth" rate. No depth probes, no
checkpoints kept: only the held-out loss (and the train loss) matters here. Runs go to ``--out``/runs/NAME,
two at a time (``--jobs``), one CPU thread each, the longest first; rerunning skips finished runs, so a
killed sweep continues. A run whose loss turns NaN/inf is recorded as diverged. ``--around-best K`` runs a
further seed only at the K rates nearest each (scheme, depth)'s best rate of the seeds already done.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import shutil
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory of the runs (outside the repository: they are large)")
    p.add_argument("--schemes", default="pre,completep:base_depth=2,lns")
    p.add_argument("--depths", default="2,4,8,16,32")
    p.add_argument("--lrs", default="1e-3,2e-3,4e-3,8e-3,1.6e-2,3.2e-2")
    p.add_argument("--seeds", default="0,1", help="each seed's whole grid runs before the next seed's")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=176)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--around-best", type=int, default=0, metavar="K",
                   help="for each scheme and depth, only the K rates of --lrs nearest (in log) the best one of the "
                        "runs already finished in --out (other seeds): a second seed where the optimum lies")
    return p.parse_args()


def run_name(scheme: str, depth: int, lr: float, seed: int) -> str:
    return f"{scheme.replace(':', '-').replace('=', '-')}-L{depth}-lr{lr:g}-seed{seed}"


def finished(out: Path) -> list[dict]:
    """The result rows of the runs finished in ``out``."""
    return [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*/result.json"))]


def nearest_to_best(rows: list[dict], scheme: str, depth: int, lrs: list[float], k: int) -> list[float]:
    """The ``k`` rates of ``lrs`` nearest (in log) the one with the lowest mean held-out loss in ``rows``."""
    import math

    losses: dict[float, list[float]] = {}
    for r in rows:
        if r["scheme"] == scheme and r["depth"] == depth:
            losses.setdefault(r["lr"], []).append(math.inf if r["diverged"] else r["eval_loss"])
    if not losses:
        return lrs
    best = min(losses, key=lambda lr: sum(losses[lr]) / len(losses[lr]))
    return sorted(sorted(lrs, key=lambda lr: abs(math.log(lr / best)))[:k])


def grid(args: argparse.Namespace) -> list[dict]:
    """Every run to do, seed by seed, the deepest (longest) first within a seed."""
    runs, done = [], finished(Path(args.out)) if args.around_best else []
    lrs = [float(x) for x in args.lrs.split(",")]
    for seed in (int(s) for s in args.seeds.split(",")):
        for depth in sorted((int(d) for d in args.depths.split(",")), reverse=True):
            for scheme in args.schemes.split(","):
                others = [r for r in done if r["seed"] != seed]
                for lr in nearest_to_best(others, scheme, depth, lrs, args.around_best) if args.around_best else lrs:
                    runs.append(dict(scheme=scheme, depth=depth, lr=lr, seed=seed, steps=args.steps, width=args.width,
                                     heads=args.heads, d_ff=args.d_ff, name=run_name(scheme, depth, lr, seed)))
    return runs


def train_one(job: tuple[dict, str]) -> dict:
    """One grid point in a worker process (one thread): its result row, also written as result.json."""
    spec, out = job
    import torch

    torch.set_num_threads(1)
    import depthlab as d
    from depthlab.train import TrainConfig, train
    from depthlab.train.loop import TrainingDiverged

    run = Path(out) / "runs" / spec["name"]
    cfg = d.from_preset("tiny", scheme=spec["scheme"], n_layers=spec["depth"], d_model=spec["width"],
                        n_heads=spec["heads"], d_ff=spec["d_ff"])
    tc = TrainConfig(data="builtin", steps=spec["steps"], lr=spec["lr"], seed=spec["seed"], eval_every=0,
                     variance_every=spec["steps"], track_depth=False, track_removal=False, ckpt_every=0, keep_last=1,
                     device="cpu", dtype="fp32", compile=False, log_every=25)
    t0, row = time.time(), {k: spec[k] for k in ("scheme", "depth", "lr", "seed", "steps", "width")}
    try:
        summary = train(cfg, tc, run, quiet=True)
        row.update(eval_loss=summary["eval_loss"], train_loss=summary["train_loss"], diverged=False,
                   tokens=summary["tokens"], params=d.num_params(cfg))
    except TrainingDiverged as err:
        row.update(eval_loss=None, train_loss=None, diverged=True, note=str(err))
    row["wall_s"] = round(time.time() - t0, 1)
    for ckpt in run.glob("checkpoint/step-*"):  # the weights are not needed, and 90 runs of them would fill the disk
        shutil.rmtree(ckpt, ignore_errors=True)
    (run / "result.json").write_text(json.dumps(row, indent=1) + "\n")
    return row


def main() -> None:
    args = parse()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    todo = [s for s in grid(args) if not (out / "runs" / s["name"] / "result.json").exists()]
    for s in todo:  # a run killed half-way left a directory the trainer would refuse to overwrite
        shutil.rmtree(out / "runs" / s["name"], ignore_errors=True)
    logging.info("%d runs to do (%d done)", len(todo), len(grid(args)) - len(todo))
    t0 = time.time()
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        for i, row in enumerate(pool.imap_unordered(train_one, [(s, str(out)) for s in todo]), 1):
            logging.info("[%d/%d, %.0f min] %s L=%d lr=%g seed=%d: %s (%.0f s)", i, len(todo), (time.time() - t0) / 60,
                         row["scheme"], row["depth"], row["lr"], row["seed"],
                         "diverged" if row["diverged"] else f"{row['eval_loss']:.4f}", row["wall_s"])


if __name__ == "__main__":
    main()
