"""``depthlab prune``: remove blocks from a model, optionally heal it, and write a Hugging Face
checkpoint that plain ``transformers`` loads (plus a report)."""

from __future__ import annotations

import argparse
import shlex
import sys

USAGE = """\
examples:
  depthlab prune smollm2 --remove 6 --method removal --out pruned/smollm2-24
  depthlab prune smollm2 --budget 0.5 --out pruned/smollm2-budget          # the most blocks within +0.5 nats
  depthlab prune path/to/hf-model --remove 8 --method angular-block --heal-steps 500 --data my.txt --out pruned/x
  depthlab prune runs/lns --remove 4 --out pruned/lns-12
  depthlab prune runs/lns --blocks 13,14,15 --out pruned/lns-own
  depthlab train --init-from pruned/lns-12/run --data builtin --steps 500 --out runs/lns-12   # continue training it

Methods: removal (greedy, SLEB-style: drop the block whose removal costs least on held-out text,
re-measure, repeat), angular-block (Gromov et al. 2024: the contiguous run of n blocks whose input
and output are closest in angle), influence (ShortGPT's Block Influence, 1 - cos of block input and
output). Block numbers are 1-based, in the numbering of the model given.

Writes into --out (new or empty): the HF checkpoint (config.json, model.safetensors, tokenizer files),
prune.json, angular_*.png, report.html; for a depthlab run also run/, a depthlab run directory.
The export is checked: reloaded with AutoModelForCausalLM, its logits are compared with the in-memory
pruned model (max |Δ| printed) and generate runs with the KV cache.
Cost: angular-block and influence need one pass over --tokens; greedy removal tries every remaining
block at each step (about L/2 forward passes per step; SmolLM2, 2,048 tokens, one thread of a busy
2-core CPU: ~5 min a step), so lower --tokens for it on a CPU.
"""


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated block numbers, got {text!r}") from None


def register(subparsers) -> None:
    from depthlab.prune.select import METHODS

    p = subparsers.add_parser("prune", help="remove blocks (chosen by a diagnosis), heal, export a smaller HF model",
                              description=__doc__ + "\n\n" + USAGE,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", metavar="TARGET", help="run dir / checkpoint, HF dir, .gguf, hub id, smollm2")
    p.add_argument("--out", required=True, help="output directory (must not exist or be empty)")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--remove", type=int, metavar="N", help="remove N blocks")
    how.add_argument("--budget", type=float, metavar="NATS", help="remove the most blocks within NATS of extra loss")
    how.add_argument("--blocks", type=_ints, metavar="LIST", help="remove exactly these blocks, e.g. 21,22,23")
    p.add_argument("--method", choices=METHODS, default="removal", help="how to choose blocks (default removal)")
    p.add_argument("--data", default="builtin",
                   help="text: its val split chooses and evaluates, its train split heals (default builtin)")
    p.add_argument("--tokens", type=int, default=2048, help="held-out tokens (default 2048)")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per sequence (default 256)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per forward (default 8)")
    h = p.add_argument_group("healing")
    h.add_argument("--heal-steps", type=int, default=0, help="continued-training steps after pruning (default 0)")
    h.add_argument("--heal", choices=("full", "lora"), default="full", help="train all weights, or LoRA (needs peft)")
    h.add_argument("--heal-lr", type=float, default=1e-4, help="AdamW learning rate (default 1e-4)")
    h.add_argument("--heal-batch-size", type=int, default=8, help="sequences per healing step (default 8)")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1, mps")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"), help="weights while pruning (default fp32)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from depthlab.cli.diagnose import _device_dtype
    from depthlab.diagnostics import load_target
    from depthlab.errors import DepthlabError
    from depthlab.prune import HealOptions, PruneOptions, check_options, prune_target
    from depthlab.prune.heal import check_heal

    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DepthlabError(f"output directory {str(out)!r} exists and is not empty; give a new --out")
    progress = not args.no_progress and sys.stderr.isatty()
    heal = HealOptions(data=args.data, steps=args.heal_steps, mode=args.heal, lr=args.heal_lr,
                       batch_size=args.heal_batch_size, seq_len=args.seq_len, progress=progress)
    opts = PruneOptions(method=args.method, remove=args.remove, budget=args.budget, blocks=args.blocks,
                        data=args.data, tokens=args.tokens, seq_len=args.seq_len, batch_size=args.batch_size,
                        heal=heal, progress=progress)
    check_heal(heal)  # e.g. --heal lora without peft: before the model is loaded
    if not progress:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # transformers' loading/saving bars, too
    check_options(opts, n_layers=10**9)  # what needs no model; the range checks follow once it is loaded
    device, dtype = _device_dtype(args)
    target = load_target(args.target, device=device, dtype=dtype)
    report = prune_target(target, opts, out, command="depthlab prune " + " ".join(shlex.quote(a) for a in _argv(args)))
    exp = report["export"]
    print(report.get("summary") or "")
    print(f"export check: max |Δ logit| = {exp['max_abs_logit_diff']:.3e} (reloaded vs in-memory pruned), "
          f"generate with KV cache {'ok' if exp['generate_cache_matches_no_cache'] else 'DIFFERS from no cache'}")
    print(f"wrote {out}: AutoModelForCausalLM.from_pretrained({str(out)!r}) loads it; report: {out / 'report.html'}")
    if report.get("run_dir"):
        print(f"depthlab run directory: {report['run_dir']} (depthlab diagnose / depthlab train --init-from accept it)")
    return 0


def _argv(args: argparse.Namespace) -> list[str]:
    argv = sys.argv[1:]
    return argv[argv.index("prune") + 1:] if "prune" in argv else [args.target]
