"""``depthlab export``: write a training run as a vanilla Hugging Face checkpoint (LNS folded in)."""

from __future__ import annotations

import argparse

from depthlab.base.precision import PRECISIONS

USAGE = """\
examples:
  depthlab export runs/lns --hf exported/lns            # latest checkpoint of a run
  depthlab export runs/lns/checkpoint/step-000300 --hf exported/lns-300 --weights bf16

The result loads with plain `transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)`, no custom
code, and gives the run's logits: LNS's 1/sqrt(l) is folded into the norm weights (exact at
inference). Schemes vanilla Llama cannot express are refused in one line naming them (the README's
scheme table says which schemes export).
"""

#: --dtype of earlier releases, read as --weights for one release (fp16 included).
OLD_DTYPES = (*PRECISIONS, "fp16")


def register(subparsers) -> None:
    p = subparsers.add_parser("export", help="write a run as a vanilla Hugging Face checkpoint (LNS folded)",
                              description=__doc__ + "\n\n" + USAGE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", metavar="RUN_DIR_OR_CHECKPOINT", help="a depthlab run directory or one of its checkpoints")
    p.add_argument("--hf", required=True, metavar="OUT_DIR", help="output directory (must not exist or be empty)")
    p.add_argument("--weights", choices=PRECISIONS, default=None,
                   help="weight dtype: auto (the run's own: fp32, or bf16 for a run trained with --weights bf16) | fp32 "
                        "| bf16 (half the size)")
    p.add_argument("--dtype", choices=OLD_DTYPES, default=None,
                   help="compute precision: export computes nothing, so it takes none; for one release --dtype X "
                        "without --weights is read as --weights X, as before (deprecated; fp16 too)")
    p.set_defaults(func=main)


def main(args) -> int:
    from depthlab.cli._args import refuse_early

    refuse_early(args.run, "export")  # an HF model directory is no run: said before torch is imported
    from depthlab.base.errors import DepthlabError
    from depthlab.base.fileio import fresh_out
    from depthlab.base.precision import torch_dtype
    from depthlab.base.provenance import command_line
    from depthlab.cli._args import precision_of
    from depthlab.hf import to_hf
    from depthlab.train import load_run

    if args.dtype is not None and args.weights is not None:
        raise DepthlabError(f"--dtype {args.dtype}: export computes nothing, so it takes no compute precision; "
                            "drop --dtype (--weights sets the exported weights)")
    weights = precision_of(args)[0]
    out = fresh_out(args.hf, "--hf")
    model, tokenizer, _ = load_run(args.run)
    dtype = next(model.parameters()).dtype if weights == "auto" else torch_dtype(weights)
    to_hf(model, out, dtype=dtype, tokenizer=tokenizer, command=command_line(args.argv))
    print(f"wrote {out} ({model.cfg.scheme}, {model.cfg.n_layers} layers): "
          f"AutoModelForCausalLM.from_pretrained({str(out)!r}) loads it")
    return 0
