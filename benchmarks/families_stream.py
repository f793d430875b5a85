"""``diagnose`` streamed against in memory on every streamable family of the registry (depthlab.hf.families).

    python benchmarks/families_stream.py --out benchmarks/results   # every family, 3 rounds; the committed result
    python benchmarks/families_stream.py --families mixtral llama --rounds 5   # into ~/.cache/depthlab/bench-results

For each family: its tiny random model (``depthlab.hf.tiny.save_tiny``: width 32, vocabulary 300, the entry's
fix-ups; here 8 layers) saved with a byte tokenizer into a temporary directory, then ``diagnose`` (angular distance of
all pairs, variance, the removal sweep; no Jacobian; the attention/MLP units and the logit lens only with ``--units``,
in both engines) on ``--tokens`` built-in tokens, opened and run in memory
(``diagnose(load_target(DIR))``) and streamed (``diagnose(DIR, stream=True)``), the two interleaved over ``--rounds``
(the order alternating). Reports the median wall time of each, their ratio and the largest |Δ| between the two
reports' numbers, in ``families_stream_cpu.json`` (bench_out.result_path: ``--out``) with the machine (CPU model
from /proc/cpuinfo), versions and command. On models this small both engines are dominated by fixed costs
(building the skeleton, recording the layer calls, Python per layer): the ratio says what streaming costs where it
is not needed, not how it scales.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_out import result_path  # noqa: E402 - a sibling module


def machine() -> dict:
    from depthlab.base.provenance import versions

    info = {"platform": platform.platform(), "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads()}
    try:
        text = Path("/proc/cpuinfo").read_text()
        info["cpu"] = next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"machine": info, "versions": versions()}


def _flat(x):
    return [v for item in x for v in _flat(item)] if isinstance(x, list) else [x]


def max_diff(a: dict, b: dict) -> float:
    """The largest |Δ| over the angular matrix, variance, loss and removal Δloss of two diagnose reports."""
    worst = 0.0
    for x, y in ((a["angular"]["matrix"], b["angular"]["matrix"]), (a["variance"]["variance"], b["variance"]["variance"]),
                 ([a["loss"]["loss"]], [b["loss"]["loss"]]), (a["removal"]["delta_loss"], b["removal"]["delta_loss"])):
        worst = max([worst, *(abs(u - v) for u, v in zip(_flat(x), _flat(y)) if u is not None and v is not None)])
    return worst


def measure(path: Path, args: argparse.Namespace) -> dict:
    from depthlab.analysis.diagnostics import DiagnoseOptions, diagnose
    from depthlab.targets import load_target

    opts = dict(tokens=args.tokens, seq_len=args.seq_len, batch_size=args.batch_size, jacobian=False, joint_check=False,
                sublayers=args.units, lens=args.units, progress=False)

    runs = {
        "in_memory": lambda: diagnose(load_target(str(path)), DiagnoseOptions(**opts)),
        "streamed": lambda: diagnose(str(path), DiagnoseOptions(**opts, stream=True)),
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    reports: dict[str, dict] = {}
    for r in range(args.rounds):
        for name in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            t0 = time.perf_counter()
            reports[name] = runs[name]()
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"seconds": {k: round(v, 3) for k, v in med.items()}, "all_seconds": times,
            "ratio_streamed_over_in_memory": round(med["streamed"] / med["in_memory"], 3),
            "max_abs_diff": max_diff(reports["streamed"], reports["in_memory"]),
            "n_layers": reports["streamed"]["engine"]["layers_computed"]}


def main() -> None:
    from depthlab.base.fileio import write_json_atomic
    from depthlab.hf.families import FAMILIES, supporting
    from depthlab.hf.tiny import save_tiny

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", nargs="*", default=None, help="model types (default: every streamable family)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--units", action="store_true", help="also the attention/MLP units and the logit lens (diagnose's "
                    "default), in both engines")
    ap.add_argument("--out", default=None, help="folder or .json file (default: outside the checkout)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    families = args.families or supporting("stream")
    load_before = list(os.getloadavg())
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model_type in families:
            path = save_tiny(model_type, Path(tmp) / model_type, jitter=False, num_hidden_layers=args.layers)
            out[model_type] = {"kind": FAMILIES[model_type].kind, **measure(path, args)}
            print(model_type, json.dumps(out[model_type]["seconds"]), out[model_type]["ratio_streamed_over_in_memory"],
                  f"max|Δ|={out[model_type]['max_abs_diff']:.2g}", flush=True)
    record = {"command": "python " + shlex.join(["benchmarks/families_stream.py", *sys.argv[1:]]), **machine(),
              "settings": {k: v for k, v in vars(args).items() if k not in ("out", "families")},
              "load_average_before": load_before, "load_average_after": list(os.getloadavg()), "families": out}
    path = result_path("families_stream_cpu.json", args.out)
    write_json_atomic(path, record, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
