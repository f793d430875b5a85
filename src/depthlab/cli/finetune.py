"""``depthlab finetune``: supervised fine-tuning of a depthlab run or an HF model directory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from depthlab.cli._args import refuse_early
from depthlab.cli._options import Section, add_config_flag
from depthlab.train.config import DIST_MODES, DTYPES, OPTIMIZERS, WEIGHT_DTYPES, TrainConfig

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
row, padded (--pack packs them). --dtype bf16 keeps the weights and Adam's moments in bf16 with no
fp32 copy (half the memory; updates rounded stochastically; on a CPU each linear layer computes in fp32
from its bf16 weight); --weights fp32 with it trains under bf16 autocast over fp32 weights instead.
Outputs in --out as for `depthlab train`: config.json (with
"finetune": source, data, template name + text), tokenizer/, metrics.jsonl, summary.json, checkpoint/.
"""

#: The TrainConfig fields a fine-tuning run takes as flags (its tokenizer is the source's; SFT records, not text).
TRAIN = Section("train", TrainConfig, exclude=("tokenizer", "val_data", "text_field", "streaming"),
                choices={"optimizer": OPTIMIZERS, "dtype": DTYPES, "dist": DIST_MODES, "weights": WEIGHT_DTYPES},
                helps={"dtype": "compute precision: auto (bf16 on CUDA, fp32 on CPU) | fp32 | bf16 (with --weights auto: "
                                "bf16 weights, no fp32 copy) (default auto)",
                       "weights": "weight dtype: auto (bf16 with --dtype bf16, else fp32; fp32 with --optimizer muon) | "
                                  "fp32 (with --dtype bf16: autocast over fp32 weights) | bf16",
                       "data": "builtin-sft | FILE.json | FILE.jsonl (Alpaca or chat records)",
                       "pack": "pack examples into rows (default: one padded example per row)",
                       "steps": "optimizer steps (default: 3 epochs)",
                       "lr": "peak learning rate (default 1e-4; 3e-5 from 100M parameters)",
                       "seq_len": "tokens per row; longer examples are cut (default 256)",
                       "batch_size": "global batch in rows (default 16)"})


def register(subparsers) -> None:
    p = subparsers.add_parser("finetune", help="supervised fine-tuning (prompt masked) of a run or an HF model",
                              description=__doc__ + "\n\n" + USAGE,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", nargs="?", metavar="SOURCE", help="depthlab run / checkpoint dir, or HF model dir")
    p.add_argument("--out", help="run directory (must not exist unless --resume)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a fine-tuning run from its latest checkpoint")
    p.add_argument("--template", default=None, help="prompt template: alpaca (default), llm-adapters")
    p.add_argument("-q", "--quiet", action="store_true", default=None, help="no progress bar")
    TRAIN.add_to(p)
    add_config_flag(p)
    p.set_defaults(func=run)


def _configs(args):
    """(source, TrainConfig, out, resume, template) from the arguments (the saved run's when resuming)."""
    from depthlab.base.errors import DepthlabError
    from depthlab.train.rundir import saved_config

    given = TRAIN.given(args)
    if not args.resume:
        if not (args.source and args.out and given.get("data")):
            raise DepthlabError("give SOURCE, --data and --out (or --resume RUN_DIR)")
        return args.source, TrainConfig(**{"pack": False, **given}), args.out, False, args.template or "alpaca"
    if args.out and Path(args.out).resolve() != Path(args.resume).resolve():
        raise DepthlabError(f"--out {args.out!r} differs from --resume {args.resume!r}; give one run directory")
    saved = saved_config(Path(args.resume))
    ft = saved.get("finetune")
    if not ft:
        raise DepthlabError(f"cannot resume {args.resume!r}: not a fine-tuning run (no 'finetune' in config.json)")
    cfg = TrainConfig.from_dict({**saved["train"], **given})
    return ft["source"]["path"], cfg, args.resume, True, args.template or ft["template"]["name"]


def run(args) -> int:
    if not args.resume and args.source:
        refuse_early(args.source, "finetune")  # a model type it cannot convert, from config.json before torch is imported
    from depthlab.base.provenance import command_line
    from depthlab.train import TrainingDiverged
    from depthlab.train.finetune import finetune

    source, cfg, out, resume, template = _configs(args)
    try:
        s = finetune(source, cfg, out, resume=resume, template=template, quiet=bool(args.quiet),
                     command=command_line(args.argv))
    except TrainingDiverged as err:
        print(f"depthlab finetune: error: {err}", file=sys.stderr)
        return 1
    print(f"{out}: {s['steps']} steps, held-out response loss {s['eval_loss']:.4f} (ppl {s['eval_ppl']:.2f}), "
          f"{s['tokens']} response tokens in {s['wall_s']:.1f}s")
    return 0
