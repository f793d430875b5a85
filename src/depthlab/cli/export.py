"""``depthlab export``: write a training run as a vanilla Hugging Face checkpoint (LNS folded in)."""

from __future__ import annotations

import argparse

USAGE = """\
examples:
  depthlab export runs/lns --hf exported/lns            # latest checkpoint of a run
  depthlab export runs/lns/checkpoint/step-000300 --hf exported/lns-300 --dtype bf16

The result loads with plain `transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)`, no custom
code, and gives the run's logits: LNS's 1/sqrt(l) is folded into the norm weights (exact at
inference). Schemes vanilla Llama cannot express are refused in one line naming them (the README's
scheme table says which schemes export).
"""

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def register(subparsers) -> None:
    p = subparsers.add_parser("export", help="write a run as a vanilla Hugging Face checkpoint (LNS folded)",
                              description=__doc__ + "\n\n" + USAGE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", metavar="RUN_DIR_OR_CHECKPOINT", help="a depthlab run directory or one of its checkpoints")
    p.add_argument("--hf", required=True, metavar="OUT_DIR", help="output directory (must not exist or be empty)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="weight dtype of the export (default fp32)")
    p.set_defaults(func=main)


def main(args) -> int:
    from pathlib import Path

    import torch

    from depthlab.base.errors import DepthlabError
    from depthlab.hf import to_hf
    from depthlab.train import load_run

    out = Path(args.hf)
    if out.exists() and any(out.iterdir()):
        raise DepthlabError(f"output directory {str(out)!r} is not empty; give a new --hf directory")
    model, tokenizer, _ = load_run(args.run)
    to_hf(model, out, dtype=getattr(torch, DTYPES[args.dtype]), tokenizer=tokenizer)
    print(f"wrote {out} ({model.cfg.scheme}, {model.cfg.n_layers} layers): "
          f"AutoModelForCausalLM.from_pretrained({str(out)!r}) loads it")
    return 0
