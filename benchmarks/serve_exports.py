"""What each pruned export buys where it is served: SmolLM2-135M's and a small MoE's exports in plain transformers.

    python benchmarks/serve_exports.py --heal-dir ~/.cache/depthlab/bench/smollm2-heal-linear --result benchmarks/results

Exports (built here unless given), for two models side by side in one run:
- SmolLM2-135M: the original (fp32 safetensors from the GGUF), 8 blocks removed (no heal, ``--heal linear``, ``--heal
  lora``: ``benchmarks/prune_heal_linear.py``'s exports when ``--heal-dir`` names its folder), 8 attention units
  removed (``prune --unit attn --method angular-block``: zeroed projections plus ``per_layer_config`` skip entries);
- the small Qwen3-MoE of ``experiments/cpu-moe-expert-prune`` (``--moe-dir``; skipped when absent): 25 % and 50 % of
  the experts removed (REAP), the 50 % one healed with LoRA (``--moe-heal-steps``), 1 of its 4 blocks removed and 1
  attention unit removed (angular-block).
Each (export, round) is its own child process: ``AutoModelForCausalLM.from_pretrained`` (fp32), greedy ``generate``
of ``--new-tokens`` at batch 1 and 8 from a ``--prompt-tokens`` prompt (tokens/s), time to first token
(``max_new_tokens=1`` at batch 1), peak RSS (``os.wait4``); the file size is the safetensors bytes. Rounds interleave
the exports (round r runs every export once); the best of the rounds is reported. Quality, once per export in its own
child: the held-out loss on the first ``--loss-tokens`` tokens of the built-in corpus' val split (the same tokens for
every export of a model) and the built-in MC accuracy (``builtin-mc``, first ``--mc-limit`` items). The machine is
shared (its load average is recorded). Result: ``serve_exports_cpu.json`` (``--result``; default outside the checkout).
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


MOE_DIR = Path.home() / ".cache" / "depthlab" / "experiments" / "cpu-moe-expert-prune" / "model"


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


def quality(path: str, tokens: int, mc_limit: int, out: str) -> None:
    """(child) Held-out loss on the built-in val split's first ``tokens`` tokens and built-in MC accuracy."""
    import torch

    from depthlab.analysis.diagnostics.removal import nll_sum
    from depthlab.analysis.evaluate import evaluate
    from depthlab.prune.options import PruneOptions
    from depthlab.prune.pipeline import held_out_batches
    from depthlab.targets import load_target

    target = load_target(path)
    total, n = 0.0, 0
    with torch.no_grad():
        for x, y in held_out_batches(target, PruneOptions(tokens=tokens, seq_len=256, batch_size=8)):
            s, k = nll_sum(target.model(input_ids=x).logits, y)
            total, n = total + s, n + k
    mc = evaluate(target, "builtin-mc", limit=mc_limit, progress=False)["builtin-mc"]
    Path(out).write_text(json.dumps({"loss": total / n, "loss_tokens": n, "mc_acc": mc["acc"],
                                     "mc_acc_norm": mc.get("acc_norm"), "mc_n": mc.get("n"),
                                     "mc_acc_stderr": mc.get("acc_stderr")}))


def prune_jobs(args: argparse.Namespace, work: Path, source: str, jobs: dict[str, list[str]]) -> dict[str, Path]:
    """``depthlab prune SOURCE`` for each job (skipped when its export is already there): name -> directory."""
    out = {}
    work.mkdir(parents=True, exist_ok=True)
    for name, extra in jobs.items():
        dest = work / name
        if not (dest / "prune.json").is_file():
            child = run_sampled(s8.depthlab("prune", source, "--weights", "fp32", "--no-progress", *extra,
                                            "--out", str(dest)), work / f"{name}.log", Path(args.src))
            if child["exit"] != 0:
                raise SystemExit(f"prune {name} failed:\n" + "\n".join(child["log_tail"]))
        out[name] = dest
    return out


def build(args: argparse.Namespace, work: Path) -> dict[str, dict[str, Path]]:
    """The exports to compare, per model: model -> name -> directory (pruned here where not given)."""
    smol = {"original": s8._smollm2_dir(argparse.Namespace(cache_dir=None))}
    tok = ["--tokens", str(args.tokens)]
    jobs = {"blocks-8": [*tok, "--remove", "8", "--method", "angular-block"]}
    if args.heal_dir:
        heal = Path(args.heal_dir)
        smol.update({"blocks-8": heal / "none", "blocks-8-linear": heal / "linear", "blocks-8-lora": heal / "lora"})
        jobs = {}
    jobs["attn-8"] = [*tok, "--unit", "attn", "--remove", "8", "--method", "angular-block"]
    if args.attn_heal_steps:
        jobs["attn-8-lora"] = [*jobs["attn-8"], "--heal", "lora", "--heal-steps", str(args.attn_heal_steps),
                               "--heal-batch-size", str(args.heal_batch_size)]
    smol.update(prune_jobs(args, work / "smollm2", "smollm2", jobs))
    models = {"smollm2": smol}
    moe_dir = Path(args.moe_dir)
    if (moe_dir / "config.json").is_file():
        mtok = [*tok, "--seq-len", "128"]
        exp = [*mtok, "--unit", "expert", "--method", "reap"]
        models["moe"] = {"original": moe_dir, **prune_jobs(args, work / "moe", str(moe_dir), {
            "experts-25%": [*exp, "--fraction", "0.25"], "experts-50%": [*exp, "--fraction", "0.5"],
            "experts-50%-lora": [*exp, "--fraction", "0.5", "--heal", "lora", "--heal-steps", str(args.moe_heal_steps),
                                 "--heal-batch-size", str(args.heal_batch_size), "--seq-len", "128"],
            "blocks-1": [*mtok, "--remove", "1", "--method", "angular-block"],
            "attn-1": [*mtok, "--unit", "attn", "--remove", "1", "--method", "angular-block"]})}
    return models


def child(args: argparse.Namespace, argv: list[str], log: Path, out: Path) -> dict:
    """This script in a child (``--measure``/``--quality``): its JSON and its peak RSS."""
    res = run_sampled([sys.executable, __file__, *argv, "--out-json", str(out)], log, Path(args.src))
    if res["exit"] != 0:
        raise SystemExit(f"{shlex.join(argv)} failed:\n" + "\n".join(res["log_tail"]))
    return {**json.loads(out.read_text()), "peak_rss_bytes": res["peak_rss_bytes"], "wall_s": res["wall_s"]}


def row(path: Path, runs: list[dict], qual: dict) -> dict:
    """One export's line of the table: the best of its rounds, its quality, what prune.json says it is."""
    pj = path / "prune.json"
    rep = json.loads(pj.read_text()) if pj.is_file() else {}
    config = json.loads((path / "config.json").read_text())
    return {"dir": str(path), "file_bytes": sum(f.stat().st_size for f in path.glob("*.safetensors")),
            "n_layers": config["num_hidden_layers"], "experts": config.get("num_experts"),
            "tokens_per_s_batch1": max(x["tokens_per_s_batch1"] for x in runs),
            "tokens_per_s_batch8": max(x["tokens_per_s_batch8"] for x in runs),
            "ttft_s": min(x["ttft_s"] for x in runs), "peak_rss_bytes": min(x["peak_rss_bytes"] for x in runs),
            "heldout_loss": qual["loss"], "mc_acc": qual["mc_acc"], "mc_acc_norm": qual["mc_acc_norm"],
            "mc_n": qual["mc_n"], "removed_blocks": rep.get("removed_blocks"),
            "removed_experts": rep.get("removed_experts"), "unit": rep.get("unit", "block") if rep else None,
            "heal": (rep.get("heal") or {}).get("mode"), "per_layer_config": config.get("per_layer_config"),
            "rounds": runs, "quality": qual}


def run(args: argparse.Namespace) -> dict:
    work = Path(args.out or Path.home() / ".cache" / "depthlab" / "bench" / "serve-exports")
    work.mkdir(parents=True, exist_ok=True)
    models = build(args, work)
    flat = [(m, name, Path(path)) for m, exports in models.items() for name, path in exports.items()]
    rounds: dict[tuple[str, str], list[dict]] = {(m, n): [] for m, n, _ in flat}
    for r in range(args.rounds):
        for m, name, path in flat:
            rounds[m, name].append(child(args, ["--measure", str(path), "--prompt-tokens", str(args.prompt_tokens),
                                                "--new-tokens", str(args.new_tokens)],
                                         work / f"measure-{m}-{name}-{r}.log", work / f"measure-{m}-{name}-{r}.json"))
    table: dict[str, dict[str, dict]] = {m: {} for m in models}
    for m, name, path in flat:
        qual = child(args, ["--quality", str(path), "--loss-tokens", str(args.loss_tokens), "--mc-limit",
                            str(args.mc_limit)], work / f"quality-{m}-{name}.log", work / f"quality-{m}-{name}.json")
        table[m][name] = row(path, rounds[m, name], qual)
    return {"exports": table, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "rounds": args.rounds,
            "loss_tokens": args.loss_tokens, "mc_limit": args.mc_limit}


def main() -> None:
    from depthlab.base.fileio import write_json_atomic

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heal-dir", help="benchmarks/prune_heal_linear.py's output folder (its none/linear/lora exports)")
    ap.add_argument("--moe-dir", default=str(MOE_DIR), help="the small MoE of experiments/cpu-moe-expert-prune")
    ap.add_argument("--tokens", type=int, default=1024, help="held-out tokens of the prunes built here")
    ap.add_argument("--attn-heal-steps", type=int, default=0, help="LoRA steps of a healed attention export (0: none)")
    ap.add_argument("--moe-heal-steps", type=int, default=20, help="LoRA steps of the healed 50 %% expert export")
    ap.add_argument("--heal-batch-size", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--loss-tokens", type=int, default=2048, help="held-out tokens of each export's loss")
    ap.add_argument("--mc-limit", type=int, default=60, help="builtin-mc items")
    ap.add_argument("--src", default=str(ROOT / "src"))
    ap.add_argument("--shared-note", default="the 2-core machine was shared with other agents' jobs during the run")
    ap.add_argument("--out")
    ap.add_argument("--result")
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    ap.add_argument("--quality", help=argparse.SUPPRESS)
    ap.add_argument("--out-json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        return measure(args.measure, args.prompt_tokens, args.new_tokens, args.out_json)
    if args.quality:
        return quality(args.quality, args.loss_tokens, args.mc_limit, args.out_json)
    load_before = list(os.getloadavg())
    result = run(args)
    record = {"command": "python " + shlex.join(["benchmarks/serve_exports.py", *sys.argv[1:]]), **s8.machine(),
              "lscpu": lscpu(), "shared": args.shared_note, **result}
    record["machine"]["load_average"], record["machine"]["load_average_after"] = load_before, list(os.getloadavg())
    path = result_path("serve_exports_cpu.json", args.result)
    write_json_atomic(path, record)
    for m, rows in result["exports"].items():
        for name, r in rows.items():
            print(f"{m:8s} {name:17s} {r['n_layers']:3d} layers {r['file_bytes'] / 1e6:7.1f} MB  "
                  f"{r['tokens_per_s_batch1']:6.1f} tok/s b1  {r['tokens_per_s_batch8']:6.1f} tok/s b8  "
                  f"TTFT {r['ttft_s'] * 1e3:6.1f} ms  peak {r['peak_rss_bytes'] / 1e9:.2f} GB  "
                  f"loss {r['heldout_loss']:.3f}  MC {r['mc_acc']:.3f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
