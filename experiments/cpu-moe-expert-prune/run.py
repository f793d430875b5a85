"""A small Qwen3-MoE trained here, then REAP vs routing frequency vs random expert removal at 25 % and 50 %.

    PYTHONPATH=src OMP_NUM_THREADS=1 python3 experiments/cpu-moe-expert-prune/run.py      # ~15 min on one core
    PYTHONPATH=src python3 experiments/cpu-moe-expert-prune/run.py --skip-train               # prune the saved model again

1. Train (``train``): a 4-block Qwen3-MoE (width 128, 16 routed experts of width 128 per block, top-2, router aux
   loss 0.01, tied embeddings; transformers' own modeling code) from scratch on the built-in corpus' train split,
   tokenized by depthlab's ``bpe:4096``, for ``--minutes`` (or ``--steps``); saved with its tokenizer as an HF model
   directory in the cache (not committed: ``--model-dir``), so ``depthlab prune DIR --unit expert`` reads it.
2. Prune (``prune_all``): for 25 % and 50 % of the experts of every block, each method (``reap``, ``frequency``,
   ``random``; both engines: the in-memory one and ``--stream``) chooses on the first ``--tokens`` tokens of the
   corpus' val split (prune's own held-out loss); extra random draws (``--random-seeds``) are given as ``--experts``.
   Every export is then scored in plain transformers on the NEXT ``--tokens`` val tokens, which no method chose on.

Writes ``results.json`` and ``results.png`` here (``--out``).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
CACHE = Path.home() / ".cache" / "depthlab" / "experiments" / "cpu-moe-expert-prune"
CONFIG = dict(vocab_size=4096, hidden_size=128, intermediate_size=256, moe_intermediate_size=128, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=16, num_experts_per_tok=2,
              decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, router_aux_loss_coef=0.01,
              output_router_logits=True, tie_word_embeddings=True, max_position_embeddings=512, rope_theta=10000.0)
METHODS = ("reap", "frequency", "random")


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=12.0, help="training time budget (stops at --steps first)")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--tokens", type=int, default=8192, help="held-out tokens: choose on the first, score on the next")
    p.add_argument("--fractions", default="0.25,0.5")
    p.add_argument("--random-seeds", type=int, default=4, help="extra random draws (besides prune's own)")
    p.add_argument("--skip-train", action="store_true", help="reuse the model saved in --model-dir")
    p.add_argument("--model-dir", default=str(CACHE / "model"))
    p.add_argument("--out", default=str(HERE))
    return p.parse_args()


def tokenizer():
    """depthlab's ``bpe:4096`` of the built-in corpus as an HF fast tokenizer (what the model directory ships)."""
    from transformers import PreTrainedTokenizerFast

    from depthlab.data import build_tokenizer, iter_documents
    from depthlab.data.tokenizers import EOS_TOKEN, PAD_TOKEN

    tok = build_tokenizer("bpe:4096", iter_documents("builtin", "train"))
    return tok, PreTrainedTokenizerFast(tokenizer_object=tok.tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN)


def train(args: argparse.Namespace) -> dict:
    """Train the MoE from scratch for the time budget; save it (with its tokenizer) to ``--model-dir``."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from depthlab.data import load_sequences

    torch.manual_seed(0)
    tok, hf_tok = tokenizer()
    seqs = load_sequences("builtin", tok, args.seq_len, split="train", seed=0)
    config = Qwen3MoeConfig(**{**CONFIG, "vocab_size": tok.vocab_size}, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id,
                            bos_token_id=tok.eos_id)
    model = Qwen3MoeForCausalLM(config).train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warm, curve, t0, step = 100, [], time.time(), 0
    budget = args.minutes * 60
    while step < args.steps and time.time() - t0 < budget:
        # cosine over whichever budget runs out first (time or steps), so the rate has decayed when training stops
        frac = min(1.0, max((time.time() - t0) / budget, step / args.steps))
        lr = args.lr * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = seqs.rank_batch(step, args.batch_size, 0, 1)
        rows = torch.cat([x, y[:, -1:]], 1)  # the packed window again: transformers shifts the labels itself
        out = model(input_ids=rows, labels=rows, output_router_logits=True)  # labels shifted inside
        ce = out.loss - config.router_aux_loss_coef * out.aux_loss
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 25 == 0:
            curve.append({"step": step, "s": round(time.time() - t0, 1), "lr": lr, "ce": ce.item(),
                          "aux": out.aux_loss.item()})
            logging.info("step %d  %.0f s  ce %.3f  aux %.3f", step, time.time() - t0, ce.item(), out.aux_loss.item())
        step += 1
    model.config.output_router_logits = False
    model.eval().save_pretrained(args.model_dir)
    hf_tok.save_pretrained(args.model_dir)
    n = sum(p.numel() for p in model.parameters())
    return {"steps": step, "seconds": round(time.time() - t0, 1), "tokens": step * args.batch_size * args.seq_len,
            "params": n, "config": CONFIG, "curve": curve, "lr": args.lr, "batch_size": args.batch_size,
            "seq_len": args.seq_len}


def heldout(tok, tokens: int) -> torch.Tensor:
    """The val tokens ``tokens .. 2*tokens`` of the built-in corpus (prune chooses on the first ``tokens``) as
    (N, 129) windows."""
    from depthlab.data import eval_token_batches

    rows = torch.cat(list(eval_token_batches("builtin", tok, 2 * tokens, 129, 8)))
    return rows[len(rows) // 2:]


def score(path: Path, rows: torch.Tensor) -> float:
    """Mean next-token loss of the checkpoint at ``path`` on ``rows``, in plain transformers."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(rows), 8):
            b = rows[i:i + 8]
            logits = model(input_ids=b[:, :-1]).logits
            total += torch.nn.functional.cross_entropy(logits.flatten(0, 1), b[:, 1:].flatten(), reduction="sum").item()
            n += b[:, 1:].numel()
    return total / n


def prune_one(model_dir: str, out: Path, tokens: int, stream: bool, **choose) -> dict:
    """One ``prune --unit expert`` (in memory or streamed): its choice, loss on the choosing tokens, seconds."""
    from depthlab.analysis.diagnostics import load_target
    from depthlab.prune import PruneOptions, prune_target
    from depthlab.targets.stream.open import open_streamed

    opts = PruneOptions(unit="expert", data="builtin", tokens=tokens, seq_len=128, batch_size=8, progress=False,
                        latency_tokens=4, **choose)
    t0 = time.time()
    rep = prune_target(open_streamed(model_dir) if stream else load_target(model_dir), opts, out)
    return {"removed": {str(b): e for b, e in rep["removed_experts"].items()}, "loss_choose": rep["loss"]["pruned"],
            "original_choose": rep["loss"]["original"], "seconds": round(time.time() - t0, 1), "report": rep}


def routing(rep: dict) -> dict:
    """Per block, the share of routed tokens each expert got and REAP's saliencies (from prune.json's scores)."""
    return {b: {k: v for k, v in s.items() if k in ("reap", "frequency")} for b, s in rep["scores"]["blocks"].items()}


def prune_all(args: argparse.Namespace) -> dict:
    """Every method at every fraction on both engines, extra random draws, and every export scored on fresh tokens."""
    tok, _ = tokenizer()
    rows = heldout(tok, args.tokens)
    work = CACHE / "exports"
    subprocess.run(["rm", "-rf", str(work)], check=True)
    original = score(Path(args.model_dir), rows)
    n_exp, results, scores = CONFIG["num_experts"], {}, None
    for frac in map(float, args.fractions.split(",")):
        per = {}
        for method in METHODS:
            mem = prune_one(args.model_dir, work / f"{method}-{frac}", args.tokens, False, method=method, fraction=frac)
            streamed = prune_one(args.model_dir, work / f"{method}-{frac}-stream", args.tokens, True, method=method,
                                 fraction=frac)
            scores = scores or routing(mem["report"])
            per[method] = {"removed": mem["removed"], "same_experts_streamed": mem["removed"] == streamed["removed"],
                           "loss_choose": mem["loss_choose"], "loss_choose_streamed": streamed["loss_choose"],
                           "loss_heldout": score(work / f"{method}-{frac}", rows),
                           "loss_heldout_streamed_export": score(work / f"{method}-{frac}-stream", rows),
                           "seconds": mem["seconds"], "seconds_streamed": streamed["seconds"]}
            logging.info("%.2f %s: held-out %.4f (original %.4f)", frac, method, per[method]["loss_heldout"], original)
        draws = []
        k = round(frac * n_exp)
        for seed in range(1, args.random_seeds + 1):
            g = torch.Generator().manual_seed(1000 + seed)
            chosen = [f"{b}:{e}" for b in range(1, CONFIG["num_hidden_layers"] + 1)
                      for e in sorted(torch.randperm(n_exp, generator=g)[:k].tolist())]
            r = prune_one(args.model_dir, work / f"random{seed}-{frac}", args.tokens, False, experts=chosen)
            draws.append({"seed": 1000 + seed, "removed": r["removed"], "loss_choose": r["loss_choose"],
                          "loss_heldout": score(work / f"random{seed}-{frac}", rows)})
        per["random_draws"] = draws
        results[str(frac)] = per
    return {"original_heldout": original, "heldout_tokens": int(rows[:, 1:].numel()), "fractions": results,
            "routing_scores": scores, "exports_dir": str(work)}


def figure(res: dict, path: Path) -> None:
    """Training curve and held-out Δloss of each method at each fraction (random: prune's draw + extra draws)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    curve = res["train"]["curve"]
    a.plot([c["step"] for c in curve], [c["ce"] for c in curve])
    a.set(xlabel="step", ylabel="train cross-entropy", title="Qwen3-MoE 4x16 experts, top-2 (built-in corpus)")
    base = res["prune"]["original_heldout"]
    fracs = list(res["prune"]["fractions"])
    width = 0.25
    for i, m in enumerate(METHODS):
        ys = [res["prune"]["fractions"][f][m]["loss_heldout"] - base for f in fracs]
        b.bar([j + (i - 1) * width for j in range(len(fracs))], ys, width, label=m)
    for j, f in enumerate(fracs):
        draws = [d["loss_heldout"] - base for d in res["prune"]["fractions"][f]["random_draws"]]
        b.scatter([j + width] * len(draws), draws, color="k", s=10, zorder=3, label="other random draws" if j == 0 else None)
    b.set_xticks(range(len(fracs)), [f"{float(f):.0%} removed" for f in fracs])
    b.set(ylabel=f"held-out Δloss (original {base:.3f})", title="experts removed from every block")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def lscpu() -> dict:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    keep = ("Model name", "CPU family", "Model", "CPU(s)")
    return {k.strip(): v.strip() for k, v in (ln.split(":", 1) for ln in out.splitlines() if ":" in ln) if k.strip() in keep}


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args = parse()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    out = Path(args.out)
    previous = json.loads((out / "results.json").read_text()) if (out / "results.json").is_file() else {}
    res = {"command": "python3 " + " ".join(["experiments/cpu-moe-expert-prune/run.py", *sys.argv[1:]]),
           "date": time.strftime("%Y-%m-%d"), "lscpu": lscpu(), "python": platform.python_version(),
           "torch": torch.__version__, "threads": torch.get_num_threads(),
           "machine": "shared machine: 2 cores, other agents' jobs beside this one; it ran on one core (torch threads 1)"}
    import transformers

    res["transformers"] = transformers.__version__
    res["train"] = previous["train"] if args.skip_train else train(args)
    t0 = time.time()
    res["prune"] = prune_all(args)
    res["prune"]["seconds"] = round(time.time() - t0, 1)
    res["summary"] = {f: {m: round(v[m]["loss_heldout"] - res["prune"]["original_heldout"], 4) for m in METHODS}
                      | {"random_draws_mean": round(sum(d["loss_heldout"] for d in v["random_draws"])
                                                    / max(1, len(v["random_draws"])) - res["prune"]["original_heldout"], 4),
                         "both_engines_same_experts": all(v[m]["same_experts_streamed"] for m in METHODS)}
                      for f, v in res["prune"]["fractions"].items()}
    from depthlab.base.fileio import write_json_atomic

    for v in res["prune"]["fractions"].values():  # the prune.json reports are in the exports, not the result
        for m in METHODS:
            v[m].pop("report", None)
    write_json_atomic(out / "results.json", res)
    figure(res, out / "results.png")
    print(json.dumps(res["summary"], indent=1))


if __name__ == "__main__":
    main()
