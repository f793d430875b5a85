"""Why LNS compiled 2-3x longer than Pre-LN: the cold ``torch.compile`` of one training step, per scheme.

usage:
    python benchmarks/compile_time.py                       # pre, lns (literal 1/sqrt(l)), lns (lifted), 12 blocks
    python benchmarks/compile_time.py --layers 4,12 --cases pre,lns,lns+lifted,lns:position=before-norm+lifted

Each case runs in a fresh process with an empty inductor cache (the FX-graph and AOT-autograd caches off), so every
compile is cold: build the model (``tiny`` shrunk to width 64 unless ``--set``), wrap it in the trainer's loss
module, ``torch.compile`` it and time the first forward + backward. ``+lifted`` first calls
``depthlab.models.nn.norms.lift_constants`` (what the trainer's ``compile_for_training`` does); without it the
constant scales stay float literals, as before the fix. Recorded per case: the compile seconds, the number of
generated kernels (C++ on a CPU, Triton on CUDA: one source file each, identical kernels deduplicated), dynamo's
graphs, graph breaks and recompiles. On a shared machine the seconds drift with the load; the kernel counts do not.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_out import save_report  # noqa: E402  (sibling module)

CASE_CODE = r"""
import glob, json, os, sys, time
import torch
from depthlab import build_model, from_preset
from depthlab.models.nn.norms import lift_constants
from depthlab.train.distributed import LMLoss
scheme, layers, lift, device, sets = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4], json.loads(sys.argv[5])
torch.manual_seed(0)
cfg = from_preset("tiny", **{"d_model": 64, "n_heads": 2, "d_ff": 128, **sets, "n_layers": layers, "scheme": scheme})
model = LMLoss(build_model(cfg, device=device)).train()
lifted = lift_constants(model) if lift else 0
compiled = torch.compile(model)
x, y = (torch.randint(cfg.vocab_size, (2, 64), device=device) for _ in range(2))
t = time.perf_counter()
compiled(x, y).loss.backward()
if device.startswith("cuda"):
    torch.cuda.synchronize()
seconds = time.perf_counter() - t
from torch._dynamo.utils import counters
root = os.environ["TORCHINDUCTOR_CACHE_DIR"]
if device.startswith("cuda"):
    kernels = sum("@triton.jit" in open(f).read() for f in glob.glob(root + "/**/*.py", recursive=True))
else:
    kernels = len(glob.glob(root + "/**/*.main.cpp", recursive=True))
print("RESULT " + json.dumps({"compile_s": round(seconds, 1), "kernels": kernels, "lifted": lifted,
      "graphs": counters["stats"]["unique_graphs"], "graph_breaks": sum(counters["graph_break"].values()),
      "recompiles": sum(counters["recompiles"].values())}))
"""


def run_case(case: str, layers: int, device: str, sets: dict, threads: int | None) -> dict:
    """One cold compile in a fresh process: its RESULT line as a dict (or the error)."""
    scheme, lift = (case[: -len("+lifted")], True) if case.endswith("+lifted") else (case, False)
    with tempfile.TemporaryDirectory(prefix="depthlab-compile-") as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
               "TORCHINDUCTOR_AUTOGRAD_CACHE": "0", "PYTHONPATH": os.pathsep.join(
                   [str(Path(__file__).resolve().parents[1] / "src"), os.environ.get("PYTHONPATH", "")])}
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", CASE_CODE, scheme, str(layers), "1" if lift else "0", device,
                               json.dumps(sets)], capture_output=True, text=True, env=env)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        return {"case": case, "layers": layers, "error": (proc.stderr or proc.stdout).strip().splitlines()[-1:]}
    return {"case": case, "layers": layers, **json.loads(line[len("RESULT "):]),
            "process_s": round(time.perf_counter() - t, 1)}


def cpu_name() -> str:
    try:
        return next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="pre,lns,lns+lifted", help="schemes, each optionally +lifted (default pre,lns,lns+lifted)")
    p.add_argument("--layers", default="12", help="comma-separated block counts (default 12)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="model override (ints), e.g. d_model=128")
    p.add_argument("--repeats", type=int, default=1, help="rounds over the cases (interleaved)")
    p.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of each case")
    p.add_argument("--out", default=None, help="result JSON (default: print only)")
    args = p.parse_args(argv)
    sets = {k: int(v) for k, v in (item.split("=", 1) for item in args.set)}
    rows = []
    for r in range(args.repeats):
        for layers in [int(n) for n in args.layers.split(",")]:
            for case in [c.strip() for c in args.cases.split(",") if c.strip()]:
                row = {"round": r + 1, **run_case(case, layers, args.device, sets, args.threads), "loadavg": os.getloadavg()[0]}
                print(json.dumps(row), flush=True)
                rows.append(row)
    import torch

    report = {"benchmark": "compile_time", "command": "python benchmarks/compile_time.py " + " ".join(argv or sys.argv[1:]),
              "device": args.device, "cpu": cpu_name(), "torch": torch.__version__,
              "python": platform.python_version(), "model_overrides": sets, "rows": rows}
    save_report(report, args.out)
    return report


if __name__ == "__main__":
    main()
