"""Opening a run for ``diagnose`` / ``prune``: the engine chosen and the checkpoint opened once, against the earlier
command-line path that opened it twice (plan, then load). An A/B of two source trees on one machine.

    python benchmarks/open_target.py --old /path/to/older/src        # --preset llama-130m, 3 rounds by default

Writes a run directory whose newest checkpoint holds the preset's random weights and an Adam-shaped optimizer state
(what a trained run holds), outside the repository (``--cache-dir``). Then, in a fresh process per measurement,
interleaved over ``--rounds``, it opens the run as ``depthlab diagnose RUN`` did before and does now:

* ``in-memory``: old: ``plan_engine(RUN, cpu, fp32, None)`` then ``load_target(RUN)``; new:
  ``load_target(RUN, stream=None)`` (the model fits here, so both load it in memory);
* ``streamed``: old: ``plan_engine(RUN, ..., True)`` then ``open_layerwise(RUN)``; new: ``load_target(RUN, stream=True)``.

Each process reports its wall time for the open and the bytes it checksummed (``sha256_file`` counted). The median
of each is in ``results/open_target_cpu.json`` with the machine, versions and command.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent("""
    import json, sys, time
    import torch
    torch.set_num_threads(1)
    import depthlab.base.store.checkpoint as C
    counted = [0]
    original = C.sha256_file
    def counting(path, *a, **k):
        from pathlib import Path
        counted[0] += Path(path).stat().st_size
        return original(path, *a, **k)
    C.sha256_file = counting
    run, variant, engine = sys.argv[1], sys.argv[2], sys.argv[3]
    cpu, f32 = torch.device("cpu"), torch.float32
    import transformers, safetensors  # noqa: E401 - imported before the clock starts, in both trees
    from depthlab.targets import load_target
    if variant == "old":  # the older tree's modules
        from depthlab.analysis.diagnostics.streamed_runner import plan_engine
        from depthlab.targets.layerwise import open_layerwise
    t0 = time.perf_counter()
    if variant == "old":  # the command line before: plan (checkpoint opened), then load (opened again)
        plan = plan_engine(run, cpu, f32, engine == "streamed" or None)
        target = open_layerwise(run, cpu, f32, f32) if plan.streamed else load_target(run)
    else:  # the library now: one call, the checkpoint opened once
        target = load_target(run, stream=True if engine == "streamed" else None)
    seconds = time.perf_counter() - t0
    kind = type(target).__name__
    print(json.dumps({"seconds": seconds, "hashed_bytes": counted[0], "target": kind}))
""")


def write_run(preset: str, cache: Path) -> Path:
    """A run directory with one checkpoint: ``preset``'s random weights and an Adam-shaped optimizer state."""
    import torch

    import depthlab as d
    from depthlab.base.store.checkpoint import save_checkpoint
    from depthlab.train import TrainConfig

    run = cache / f"{preset}-run"
    if (run / "checkpoint").is_dir():
        return run
    cfg = d.from_preset(preset, scheme="lns")
    model = d.build_model(cfg)
    state = model.state_dict()
    optim = {"state": {i: {"step": torch.tensor(1.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
                       for i, p in enumerate(model.parameters())}, "param_groups": []}
    config = {"model": cfg.to_dict(), "train": TrainConfig(data="builtin").to_dict(), "tokenizer": None}
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.json").write_text(json.dumps(config))
    save_checkpoint(run, 1, state, optim, {"tokens": 0}, config)
    return run


def measure(src: Path, run: Path, variant: str, engine: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-c", CHILD, str(run), variant, engine], capture_output=True, text=True,
                         env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", type=Path, required=True, help="the src/ folder of the tree to compare against")
    p.add_argument("--preset", default="llama-130m")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "depthlab" / "bench")
    p.add_argument("--out", default=None, help="folder or .json file (default: outside the checkout; "
                   "--out benchmarks/results updates the committed result)")
    args = p.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_out import result_path

    from depthlab.base.provenance import versions

    args.out = result_path("open_target_cpu.json", args.out)

    run = write_run(args.preset, args.cache_dir)
    trees = {"old": args.old.resolve(), "new": ROOT / "src"}
    raw: dict[str, list[dict]] = {}
    for _ in range(args.rounds):
        for engine in ("in-memory", "streamed"):
            for variant, src in trees.items():
                raw.setdefault(f"{engine}/{variant}", []).append(measure(src, run, variant, engine))
    summary = {key: {"seconds_median": statistics.median(r["seconds"] for r in rows),
                     "hashed_bytes": rows[0]["hashed_bytes"], "target": rows[0]["target"]} for key, rows in raw.items()}
    ckpt_bytes = sum(f.stat().st_size for f in (run / "checkpoint").rglob("*") if f.is_file())
    result = {"what": __doc__.splitlines()[0], "preset": args.preset, "checkpoint_bytes": ckpt_bytes,
              "summary": summary, "raw": raw, "cpu": cpu_name(), "cores": os.cpu_count(), "versions": versions(),
              "command": "python benchmarks/open_target.py " + " ".join(sys.argv[1:])}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for key, s in summary.items():
        print(f"{key:<20} {s['seconds_median']:7.2f} s  checksummed {s['hashed_bytes'] / 2**30:.2f} GiB  ({s['target']})")
    print(f"checkpoint: {ckpt_bytes / 2**30:.2f} GiB; wrote {args.out}")


if __name__ == "__main__":
    main()
