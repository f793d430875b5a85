"""What the LM head's cross-entropy in chunks of rows (``depthlab.models.nn.loss.linear_cross_entropy``) saves and
costs against the plain path (``F.cross_entropy(x @ W.T, labels)`` and its backward), on this machine's CPU.

    python benchmarks/chunked_ce.py --out benchmarks/results        # the committed result

Each measurement is a fresh child process (so that its peak RSS, ``VmHWM``, is its own): the head's input ``x``
(tokens x d_model) and weight (vocab x d_model) drawn, then ``--repeats`` forward + backward passes of one path,
each timed; the child reports the median time and its peak RSS above what it held before the first pass. The paths
alternate over ``--rounds``. The shapes default to SmolLM2-135M's head (d_model 576, vocabulary 49,152) at 8,192
tokens, fp32 (a CPU's training dtype): the plain path's logits alone are 8,192 x 49,152 x 4 B = 1.6 GB, and their
gradient as much again. Result: ``chunked_ce_cpu.json`` with the CPU (``lscpu``), versions and load averages.
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
from bench_out import OUT_HELP, result_path  # noqa: E402  (sibling module)
from prune_heal import lscpu  # noqa: E402


def _hwm() -> int:
    return int(next(line for line in open("/proc/self/status") if line.startswith("VmHWM")).split()[1]) * 1024


def child(path: str, tokens: int, d_model: int, vocab: int, repeats: int) -> dict:
    """One path's median forward + backward time and peak RSS above the inputs."""
    import torch
    import torch.nn.functional as F

    from depthlab.models.nn.loss import default_rows, linear_cross_entropy

    torch.manual_seed(0)
    x = torch.randn(tokens, d_model, requires_grad=True)
    w = (torch.randn(vocab, d_model) * 0.02).requires_grad_()
    labels = torch.randint(vocab, (tokens,))
    before, times, loss = _hwm(), [], None
    for _ in range(repeats):
        x.grad = w.grad = None
        t0 = time.perf_counter()
        loss = linear_cross_entropy(x, w, labels) if path == "chunked" else F.cross_entropy(x @ w.t(), labels)
        loss.backward()
        times.append(time.perf_counter() - t0)
    return {"path": path, "median_s": round(statistics.median(times), 4), "times_s": [round(t, 4) for t in times],
            "peak_rss_above_inputs_bytes": _hwm() - before, "loss": float(loss),
            "rows_per_chunk": default_rows(tokens, vocab, d_model) if path == "chunked" else None,
            "threads": torch.get_num_threads()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--d-model", type=int, default=576)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=None, help=OUT_HELP)
    p.add_argument("--child", choices=("plain", "chunked"), help=argparse.SUPPRESS)
    args = p.parse_args()
    shape = [str(args.tokens), str(args.d_model), str(args.vocab), str(args.repeats)]
    if args.child:
        print(json.dumps(child(args.child, *map(int, shape))))
        return
    load, runs = os.getloadavg(), []
    for r in range(args.rounds):
        for path in (("plain", "chunked") if r % 2 == 0 else ("chunked", "plain")):
            out = subprocess.run([sys.executable, __file__, "--child", path, "--tokens", shape[0], "--d-model", shape[1],
                                  "--vocab", shape[2], "--repeats", shape[3]], capture_output=True, text=True, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(runs[-1]), flush=True)
    summary = {m: {"median_s": statistics.median(r["median_s"] for r in runs if r["path"] == m),
                   "peak_rss_above_inputs_gib": round(statistics.median(
                       r["peak_rss_above_inputs_bytes"] for r in runs if r["path"] == m) / 2**30, 3)}
               for m in ("plain", "chunked")}
    losses = {r["path"]: r["loss"] for r in runs}
    summary["loss_abs_diff"] = abs(losses["plain"] - losses["chunked"])
    report = {"benchmark": "chunked_ce", "command": "python benchmarks/chunked_ce.py " + " ".join(sys.argv[1:]),
              "lscpu": lscpu(), "load_average_before": load, "load_average_after": os.getloadavg(),
              "settings": {"tokens": args.tokens, "d_model": args.d_model, "vocab": args.vocab, "dtype": "float32",
                           "repeats": args.repeats, "rounds": args.rounds},
              "summary": summary, "runs": runs}
    from depthlab.base.fileio import write_json_atomic

    path = result_path("chunked_ce_cpu.json", args.out)
    write_json_atomic(path, report)
    print(json.dumps(summary), f"\nwrote {path}")


if __name__ == "__main__":
    main()
