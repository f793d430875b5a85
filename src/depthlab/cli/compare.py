"""``depthlab compare``: train several schemes identically, diagnose each, report side by side."""

from __future__ import annotations

import argparse

from depthlab.cli._args import schemes_epilog
from depthlab.cli._downstream import add_downstream_arguments, downstream_from_args

USAGE = """\
examples:
  depthlab compare --schemes pre,lns --preset tiny --steps 300 --out cmp/tiny
  depthlab compare --schemes pre,lns,mix,post --preset llama-71m --data my.jsonl --steps 5000 --out cmp/71m
  depthlab compare --schemes pre,lns --seeds 0,1,2 --set n_layers=24 --out cmp/deep
  depthlab compare --schemes pre,lns --preset tiny --steps 300 --finetune builtin-sft --eval builtin-mc --out cmp/sft
  depthlab compare --schemes lns,lns:position=after-branch,lns:position=before-norm --out cmp/positions
  depthlab compare --preset vit-tiny --data digits --schemes pre,layerscale,lns:position=after-branch,lns \
      --steps 600 --out cmp/vit           # ViTs: held-out top-1 accuracy instead of perplexity

Every scheme gets the same seed, data order, token budget and hyper-parameters. Writes summary.json,
summary.md (the paper's Table 1 shape), figures and report.html in --out; runs/<scheme>-seed<k>/ holds
each run with its diagnostics. Run the same command again to resume an interrupted compare.
--finetune DATA --eval TASKS then fine-tunes every run identically and scores it on the tasks
(summary.md gains the paper's Table 2 shape: accuracy per task, average, Δ vs the baseline).
"""


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _seeds(text: str) -> list[int]:
    from depthlab.errors import DepthlabError

    try:
        return [int(t) for t in _csv(text)]
    except ValueError:
        raise DepthlabError(f"--seeds expects comma-separated integers, got {text!r}") from None


def add_shared_arguments(p: argparse.ArgumentParser, steps: int | None = None, eval_tokens: int | None = None,
                         diag_tokens: int = 16384, jobs: int = 1) -> None:
    """Flags shared by ``compare`` and ``demo`` (which passes its own defaults)."""
    p.add_argument("--data", help="training data (default builtin: the King James Bible; ViT presets: digits, "
                   "or a folder of class sub-folders, or hf:NAME)")
    p.add_argument("--tokenizer", help="bytes | bpe:N | hf:NAME (default bpe:4096)")
    p.add_argument("--steps", type=int, default=steps,
                   help=f"optimizer steps per run (default: {steps or 'the preset' + chr(39) + 's'})")
    p.add_argument("--seq-len", type=int, help="tokens per sequence")
    p.add_argument("--batch-size", type=int, help="global batch in sequences")
    p.add_argument("--lr", type=float, help="peak learning rate (default: the preset's)")
    p.add_argument("--eval-tokens", type=int, default=eval_tokens,
                   help="held-out tokens per evaluation during training "
                        f"(default: {eval_tokens or 'the preset' + chr(39) + 's'})")
    p.add_argument("--seeds", type=_seeds, default=[0], help="comma-separated seeds, one run per scheme each (default 0)")
    p.add_argument("--diag-tokens", type=int, default=diag_tokens,
                   help=f"held-out tokens for the diagnostics (default {diag_tokens})")
    p.add_argument("--no-jacobian", dest="jacobian", action="store_false", help="skip block Jacobians")
    p.add_argument("--device", help="cpu | cuda (default: cuda when available)")
    p.add_argument("--jobs", type=int, default=jobs,
                   help=f"runs trained side by side, the cores split between them (default {jobs})")


def register(subparsers) -> None:
    p = subparsers.add_parser("compare", help="train + diagnose several schemes side by side (paper Table 1)",
                              description=__doc__ + "\n\n" + USAGE, epilog=schemes_epilog(),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--schemes", type=_csv, required=True,
                   help="comma-separated scheme variants NAME[:KEY=VALUE...], e.g. pre,lns,lns:position=after-branch")
    p.add_argument("--preset", default="tiny", help="model preset (default tiny), an LM preset or vit-tiny / vit-s")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", dest="model_set",
                   help="override a ModelConfig field for every run, e.g. --set n_layers=24")
    add_shared_arguments(p)
    add_downstream_arguments(p)
    p.add_argument("--out", required=True, help="output directory")
    p.set_defaults(func=main)


def build_config(args, schemes: list[str], preset: str, model_set: list[str] | None):
    from depthlab.cli._args import parse_overrides
    from depthlab.compare import CompareConfig
    from depthlab.diagnostics import DiagnoseOptions
    from depthlab.families import family_of_preset
    from depthlab.train import TrainConfig

    data = args.data or ("digits" if family_of_preset(preset).name == "vit" else "builtin")
    train = TrainConfig(data=data, tokenizer=args.tokenizer, steps=args.steps, seq_len=args.seq_len,
                        batch_size=args.batch_size, lr=args.lr, eval_tokens=args.eval_tokens, device=args.device)
    diag = DiagnoseOptions(tokens=args.diag_tokens, jacobian=args.jacobian, progress=False)
    return CompareConfig(schemes=schemes, preset=preset, model_overrides=parse_overrides(model_set), seeds=args.seeds,
                         train=train, diagnose=diag, downstream=downstream_from_args(args))


def run_and_print(cfg, out: str, command: str, jobs: int = 1) -> int:
    import logging
    from pathlib import Path

    from depthlab.compare import compare, markdown_table
    from depthlab.store.lock import RunLock

    def progress(scheme: str, seed: int, row: dict) -> None:
        metric = f"ppl {row['eval_ppl']:.2f}" if "eval_ppl" in row else f"top-1 {100 * row['eval_acc']:.2f} %"
        logging.getLogger("depthlab").info("done %s seed %d: held-out loss %.4f, %s", scheme, seed,
                                           row["eval_loss"], metric)

    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)  # to lock it; the CLI removes it again if the compare fails at once
    with RunLock(path):  # one writer: a second compare on the same --out stops here, nothing touched
        result = compare(cfg, out, command=command, on_run=progress, jobs=jobs)
    print(markdown_table(result["table"]))
    print(f"\nreport: {out.rstrip('/')}/report.html   (table: summary.md, numbers: summary.json)")
    return 0


def main(args) -> int:
    from depthlab.provenance import command_line

    command = command_line(args.argv)
    return run_and_print(build_config(args, args.schemes, args.preset, args.model_set), args.out, command, args.jobs)
