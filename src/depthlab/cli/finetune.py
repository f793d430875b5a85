"""``depthlab finetune``: supervised fine-tuning of a depthlab run or an HF model directory."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

USAGE = """\
examples:
  depthlab finetune runs/lns --data commonsense_170k.json --out runs/lns-sft
  depthlab finetune runs/lns --data builtin-sft --steps 200 --out runs/lns-sft     # offline
  depthlab finetune path/to/hf-model --data alpaca.json --lr 3e-5 --out runs/hf-sft
  depthlab finetune --resume runs/lns-sft                                        # continue exactly
  depthlab evaluate runs/lns-sft --tasks arc_e.jsonl,piqa.jsonl --out evals/lns-sft

SOURCE: a depthlab run directory (its latest checkpoint) or one checkpoint, or a Hugging Face model
directory. The model keeps its scheme (an LNS run stays LNS; an LNS-marked HF model loads as lns) and
its tokenizer. --data: builtin-sft (offline, from the built-in corpus's training books) or a .json /
.jsonl file of Alpaca {instruction, input, output} (Commonsense170K) or chat {messages} records; the
prompt is masked, so only response tokens count in the loss. A seeded 5% (at most 200 records) is
held out for the evaluation loss.

Defaults (full fine-tuning; LLM-Adapters' LoRA recipe is lr 3e-4, 3 epochs, 100 warm-up steps,
batch 16, cut-off 256): lr 1e-4 (3e-5 from 100M non-embedding parameters), 3 epochs of the training
rows, warm-up 100 steps (at most 10%), batch 16, seq len 256 (at most the model's), one example per
row, padded (--pack packs them). Outputs in --out as for `depthlab train`: config.json (with
"finetune": source, data, template name + text), tokenizer/, metrics.jsonl, summary.json, checkpoint/.
"""

#: CLI flag (argparse dest) -> TrainConfig field.
_FLAGS = ("data", "seq_len", "batch_size", "micro_batch_size", "steps", "lr", "warmup", "min_lr_ratio", "optimizer",
          "weight_decay", "grad_clip", "seed", "device", "dtype", "eval_every", "variance_every", "log_every",
          "ckpt_every", "keep_last")


def register(subparsers) -> None:
    p = subparsers.add_parser("finetune", help="supervised fine-tuning (prompt masked) of a run or an HF model",
                              description=__doc__ + "\n\n" + USAGE,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", nargs="?", metavar="SOURCE", help="depthlab run / checkpoint dir, or HF model dir")
    p.add_argument("--data", help="builtin-sft | FILE.json | FILE.jsonl (Alpaca or chat records)")
    p.add_argument("--out", help="run directory (must not exist unless --resume)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a fine-tuning run from its latest checkpoint")
    p.add_argument("--template", default=None, help="prompt template: alpaca (default), llm-adapters")
    p.add_argument("--pack", action="store_true", help="pack examples into rows (default: one padded example per row)")
    p.add_argument("--seq-len", type=int, help="tokens per row; longer examples are cut (default 256)")
    p.add_argument("--batch-size", type=int, help="global batch in rows (default 16)")
    p.add_argument("--micro-batch-size", type=int, help="rows per forward (gradient accumulation)")
    p.add_argument("--steps", type=int, help="optimizer steps (default: 3 epochs)")
    p.add_argument("--lr", type=float, help="peak learning rate (default 1e-4; 3e-5 from 100M parameters)")
    p.add_argument("--warmup", type=float, help="warm-up: fraction of steps (<1) or steps (default min(100, steps/10))")
    p.add_argument("--min-lr-ratio", type=float, help="cosine floor as a fraction of lr (default 0.1)")
    p.add_argument("--optimizer", choices=("adam", "adamw"))
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--grad-clip", type=float)
    p.add_argument("--seed", type=int, help="data order (default 0)")
    p.add_argument("--device", help="cpu | cuda | cuda:N")
    p.add_argument("--dtype", choices=("auto", "fp32", "bf16"))
    p.add_argument("--eval-every", type=int)
    p.add_argument("--variance-every", type=int)
    p.add_argument("--log-every", type=int)
    p.add_argument("--ckpt-every", type=int)
    p.add_argument("--keep-last", type=int)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _configs(args):
    """(source, TrainConfig, out, resume, template) from the arguments (the saved run's when resuming)."""
    from depthlab.errors import DepthlabError
    from depthlab.train import TrainConfig

    given = {k: getattr(args, k) for k in _FLAGS if getattr(args, k) is not None}
    if not args.resume:
        if not (args.source and args.out and args.data):
            raise DepthlabError("give SOURCE, --data and --out (or --resume RUN_DIR)")
        return args.source, TrainConfig(**given, pack=args.pack), args.out, False, args.template or "alpaca"
    if args.out and Path(args.out).resolve() != Path(args.resume).resolve():
        raise DepthlabError(f"--out {args.out!r} differs from --resume {args.resume!r}; give one run directory")
    path = Path(args.resume) / "config.json"
    saved = json.loads(path.read_text()) if path.is_file() else {}
    ft = saved.get("finetune")
    if not ft:
        raise DepthlabError(f"cannot resume {args.resume!r}: not a fine-tuning run (no 'finetune' in config.json)")
    cfg = TrainConfig.from_dict({**saved["train"], **given, **({"pack": True} if args.pack else {})})
    return ft["source"]["path"], cfg, args.resume, True, args.template or ft["template"]["name"]


def run(args) -> int:
    from depthlab.finetune.run import finetune
    from depthlab.provenance import command_line
    from depthlab.train import TrainingDiverged

    source, cfg, out, resume, template = _configs(args)
    try:
        s = finetune(source, cfg, out, resume=resume, template=template, quiet=args.quiet,
                     command=command_line(args.argv))
    except TrainingDiverged as err:
        print(f"depthlab finetune: error: {err}", file=sys.stderr)
        return 1
    print(f"{out}: {s['steps']} steps, held-out response loss {s['eval_loss']:.4f} (ppl {s['eval_ppl']:.2f}), "
          f"{s['tokens']} response tokens in {s['wall_s']:.1f}s")
    return 0
