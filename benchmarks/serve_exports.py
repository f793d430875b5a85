"""What each pruned export buys where it is served: SmolLM2-135M's exports loaded in plain transformers, side by side.

    python benchmarks/serve_exports.py --heal-dir ~/.cache/depthlab/bench/smollm2-heal-linear --result benchmarks/results

Exports (built here unless given): the original (fp32 safetensors from the GGUF), 8 blocks removed (no heal, ``--heal
linear``, ``--heal lora``: ``benchmarks/prune_heal_linear.py``'s exports when ``--heal-dir`` names its folder), 8
attention units removed (``prune --unit attn --method angular-block``: zeroed projections plus ``per_layer_config``
skip entries), healed or not. Each (export, round) is its own child process: ``AutoModelForCausalLM.from_pretrained``
(fp32), greedy ``generate`` of ``--new-tokens`` at batch 1 and 8 from a ``--prompt-tokens`` prompt (tokens/s), time to
first token (``max_new_tokens=1`` at batch 1), peak RSS (``os.wait4``); the file size is the safetensors bytes. Rounds
interleave the exports (round r runs every export once); the best of the rounds is reported. The machine is shared
(its load average is recorded). Result: ``serve_exports_smollm2_cpu.json`` (``--result``; default outside the checkout).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import streamed_8b as s8  # noqa: E402  (machine info, the SmolLM2 safetensors cache, the depthlab child argv)
from bench_out import result_path  # noqa: E402
from prune_heal import lscpu, run_sampled  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def measure(path: str, prompt_tokens: int, new_tokens: int, out: str) -> None:
    """(child) Load ``path`` in plain transformers and time generation; write the numbers to ``out``."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    load_s = time.perf_counter() - t0
    vocab = model.config.vocab_size
    ids = torch.randint(100, vocab - 1, (8, prompt_tokens), generator=torch.Generator().manual_seed(0))
    kw = {"do_sample": False, "pad_token_id": 0, "use_cache": True}
    res = {"load_s": round(load_s, 3)}
    with torch.no_grad():
        model.generate(ids[:1, :8], max_new_tokens=2, min_new_tokens=2, **kw)  # warm-up
        t0 = time.perf_counter()
        model.generate(ids[:1], max_new_tokens=1, min_new_tokens=1, **kw)
        res["ttft_s"] = time.perf_counter() - t0
        for b in (1, 8):
            t0 = time.perf_counter()
            model.generate(ids[:b], max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kw)
            res[f"tokens_per_s_batch{b}"] = b * new_tokens / (time.perf_counter() - t0)
    Path(out).write_text(json.dumps(res))


def build(args: argparse.Namespace, work: Path) -> dict[str, Path]:
    """The exports to compare: name -> directory (pruned here where not given)."""
    src = Path(args.src)
    exports = {"original": s8._smollm2_dir(argparse.Namespace(cache_dir=None))}
    heal = Path(args.heal_dir) if args.heal_dir else None
    common = ["--tokens", str(args.tokens), "--weights", "fp32", "--no-progress"]
    jobs = {"blocks-8": ["--remove", "8", "--method", "angular-block"]}
    if heal is not None:
        exports.update({f"blocks-8-{h}": heal / h for h in ("none", "linear", "lora")})
        exports["blocks-8"] = exports.pop("blocks-8-none")
        jobs = {}
    jobs["attn-8"] = ["--unit", "attn", "--remove", "8", "--method", "angular-block"]
    jobs["attn-8-lora"] = ["--unit", "attn", "--remove", "8", "--method", "angular-block", "--heal", "lora",
                           "--heal-steps", str(args.heal_steps), "--heal-batch-size", str(args.heal_batch_size)]
    for name, extra in jobs.items():
        dest = work / name
        if not (dest / "prune.json").is_file():
            child = run_sampled(s8.depthlab("prune", "smollm2", *common, *extra, "--out", str(dest)),
                                work / f"{name}.log", src)
            if child["exit"] != 0:
                raise SystemExit(f"prune {name} failed:\n" + "\n".join(child["log_tail"]))
        exports[name] = dest
    return exports


def run(args: argparse.Namespace) -> dict:
    work = Path(args.out or Path.home() / ".cache" / "depthlab" / "bench" / "serve-exports")
    work.mkdir(parents=True, exist_ok=True)
    exports = build(args, work)
    rows: dict[str, list[dict]] = {name: [] for name in exports}
    for r in range(args.rounds):
        for name, path in exports.items():
            out = work / f"measure-{name}-{r}.json"
            argv = [sys.executable, __file__, "--measure", str(path), "--measure-out", str(out),
                    "--prompt-tokens", str(args.prompt_tokens), "--new-tokens", str(args.new_tokens)]
            child = run_sampled(argv, work / f"measure-{name}-{r}.log", Path(args.src))
            if child["exit"] != 0:
                raise SystemExit(f"measuring {name} failed:\n" + "\n".join(child["log_tail"]))
            rows[name].append({**json.loads(out.read_text()), "peak_rss_bytes": child["peak_rss_bytes"]})
    table = {}
    for name, path in exports.items():
        runs = rows[name]
        pj = Path(path) / "prune.json"
        rep = json.loads(pj.read_text()) if pj.is_file() else {}
        table[name] = {"dir": str(path), "file_bytes": sum(f.stat().st_size for f in Path(path).glob("*.safetensors")),
                       "n_layers": json.loads((Path(path) / "config.json").read_text())["num_hidden_layers"],
                       "tokens_per_s_batch1": max(x["tokens_per_s_batch1"] for x in runs),
                       "tokens_per_s_batch8": max(x["tokens_per_s_batch8"] for x in runs),
                       "ttft_s": min(x["ttft_s"] for x in runs), "peak_rss_bytes": min(x["peak_rss_bytes"] for x in runs),
                       "loss": rep.get("loss"), "removed": rep.get("removed_blocks"), "unit": rep.get("unit", "block"),
                       "heal": (rep.get("heal") or {}).get("mode"), "rounds": runs}
    return {"exports": table, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "rounds": args.rounds}


def main() -> None:
    from depthlab.base.fileio import write_json_atomic

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heal-dir", help="benchmarks/prune_heal_linear.py's output folder (its none/linear/lora exports)")
    ap.add_argument("--tokens", type=int, default=1024, help="held-out tokens of the prunes built here")
    ap.add_argument("--heal-steps", type=int, default=20, help="LoRA steps of the attention export's heal")
    ap.add_argument("--heal-batch-size", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--src", default=str(ROOT / "src"))
    ap.add_argument("--shared-note", default="the 2-core machine was shared with other agents' jobs during the run")
    ap.add_argument("--out")
    ap.add_argument("--result")
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    ap.add_argument("--measure-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        measure(args.measure, args.prompt_tokens, args.new_tokens, args.measure_out)
        return
    load_before = list(os.getloadavg())
    result = run(args)
    record = {"command": "python " + shlex.join(["benchmarks/serve_exports.py", *sys.argv[1:]]), **s8.machine(),
              "lscpu": lscpu(), "shared": args.shared_note, **result}
    record["machine"]["load_average"], record["machine"]["load_average_after"] = load_before, list(os.getloadavg())
    path = result_path("serve_exports_smollm2_cpu.json", args.result)
    write_json_atomic(path, record)
    for name, row in result["exports"].items():
        print(f"{name:16s} {row['n_layers']:3d} layers {row['file_bytes'] / 1e6:7.1f} MB  "
              f"{row['tokens_per_s_batch1']:6.1f} tok/s b1  {row['tokens_per_s_batch8']:6.1f} tok/s b8  "
              f"TTFT {row['ttft_s'] * 1e3:6.1f} ms  peak {row['peak_rss_bytes'] / 1e9:.2f} GB")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
