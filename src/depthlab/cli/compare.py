"""``depthlab compare``: train several schemes identically, diagnose each, report side by side."""

from __future__ import annotations

import argparse

from depthlab.analysis.diagnostics.options import DiagnoseOptions
from depthlab.cli._args import schemes_epilog
from depthlab.cli._options import Section, add_config_flag
from depthlab.compare.config import CompareConfig, Downstream, diagnose_defaults
from depthlab.train.config import DIST_MODES, DTYPES, OPTIMIZERS, WEIGHT_DTYPES, TrainConfig

USAGE = """\
examples:
  depthlab compare --schemes pre,lns --preset tiny --steps 300 --out cmp/tiny
  depthlab compare --schemes pre,lns,mix,post --preset llama-71m --data my.jsonl --steps 5000 --out cmp/71m
  depthlab compare --schemes pre,lns --seeds 0,1,2 --set n_layers=24 --out cmp/deep
  depthlab compare --schemes pre,lns --preset tiny --steps 300 --finetune builtin-sft --eval builtin-mc --out cmp/sft
  depthlab compare --schemes lns,lns:position=after-branch,lns:position=before-norm --out cmp/positions
  depthlab compare --preset vit-tiny --data digits --schemes pre,layerscale,lns:position=after-branch,lns \\
      --steps 600 --out cmp/vit           # ViTs: held-out top-1 accuracy instead of perplexity
  depthlab compare --config compare.yaml --out cmp/x     # any option below from a YAML/JSON file

Every scheme gets the same seed, data order, token budget and hyper-parameters. Writes summary.json,
summary.md (the paper's Table 1 shape), figures and report.html in --out; runs/<scheme>-seed<k>/ holds
each run with its diagnostics. Run the same command again to resume an interrupted compare.
--finetune DATA --eval TASKS then fine-tunes every run identically and scores it on the tasks
(summary.md gains the paper's Table 2 shape: accuracy per task, average, Δ vs the baseline).
"""

#: The flags, each derived from a field of the settings (``depthlab.cli._options``).
COMPARE = Section("compare", CompareConfig, include=("schemes", "preset", "seeds", "jobs"), title="comparison",
                  types={"schemes": "list[str]"},  # CompareConfig parses each variant, once
                  helps={"schemes": "comma-separated scheme variants NAME[:KEY=VALUE...], e.g. pre,lns,"
                                    "lns:position=after-branch (required)",
                         "preset": "model preset of every run (default tiny): an LM preset or vit-tiny / vit-s",
                         "seeds": "comma-separated seeds, one run per scheme and seed (default 0)"})
TRAIN = Section("train", TrainConfig, exclude=("seed",), title="training (every run)",
                choices={"optimizer": OPTIMIZERS, "dtype": DTYPES, "dist": DIST_MODES, "weights": WEIGHT_DTYPES},
                helps={"data": "training data (default builtin: the King James Bible; ViT presets: digits, or a folder "
                               "of class sub-folders, or hf:NAME)"})
DIAGNOSE = Section("diagnose", DiagnoseOptions, prefix="diag-", exclude=("progress", "stream"), rename={"jacobian": "jacobian"},
                   title="diagnosis (every run)",
                   helps={"tokens": "held-out tokens for the diagnostics (default 16384)",
                          "data": "text to diagnose on (default: the training --data, its held-out split)"})
DOWNSTREAM = Section("downstream", Downstream, prefix="finetune-", title="downstream (paper Table 2): fine-tune each "
                     "run, then evaluate it", rename={"finetune": "finetune", "tasks": "eval", "limit": "eval-limit",
                                                      "eval_batch_size": "task-batch-size"})


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    """The flags ``compare`` and ``demo`` share (demo sets its own defaults on them)."""
    COMPARE.add_to(p)
    p.add_argument("--set", action="append", metavar="KEY=VALUE", dest="model_set",
                   help="override a model config field for every run, e.g. --set n_layers=24")
    TRAIN.add_to(p)
    DIAGNOSE.add_to(p)
    p.add_argument("--out", help="output directory (required)")
    add_config_flag(p)


def register(subparsers) -> None:
    p = subparsers.add_parser("compare", help="train + diagnose several schemes side by side (paper Table 1)",
                              description=__doc__ + "\n\n" + USAGE, epilog=schemes_epilog(),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_compare_arguments(p)
    DOWNSTREAM.add_to(p)
    p.set_defaults(func=main)


def build_config(args) -> CompareConfig:
    """The CompareConfig the arguments (and ``--config``) describe; the data default follows the preset's family."""
    from depthlab.base.errors import DepthlabError
    from depthlab.cli._args import parse_overrides
    from depthlab.models.kinds import kind_of_preset

    given = COMPARE.given(args)
    if not given.get("schemes"):
        raise DepthlabError("give --schemes, e.g. --schemes pre,lns")
    if not args.out:
        raise DepthlabError("give --out DIR for the comparison")
    train = TRAIN.given(args)
    if "data" not in train:
        train["data"] = "digits" if kind_of_preset(given.get("preset", "tiny")).name == "vit" else "builtin"
    preset = given.get("preset", "tiny")
    diagnose = DiagnoseOptions(**{**diagnose_defaults(preset, train["data"]), **DIAGNOSE.given(args), "progress": False})
    return CompareConfig(**given, model_overrides=parse_overrides(args.model_set), train=TrainConfig(**train),
                         diagnose=diagnose, downstream=Downstream(**DOWNSTREAM.given(args)))


def run_and_print(cfg: CompareConfig, out: str, command: str) -> int:
    import logging
    from pathlib import Path

    from depthlab.base.store.lock import RunLock
    from depthlab.compare import compare, markdown_table
    from depthlab.compare.experiment import check_compare_dir

    def progress(scheme: str, seed: int, row: dict) -> None:
        metric = f"ppl {row['eval_ppl']:.2f}" if "eval_ppl" in row else f"top-1 {100 * row['eval_acc']:.2f} %"
        logging.getLogger("depthlab").info("%s seed %d: held-out loss %.4f, %s", scheme, seed,
                                           row["eval_loss"], metric)

    path = Path(out)
    check_compare_dir(cfg, path)  # refused before the lock file is made in a directory that is not ours
    path.mkdir(parents=True, exist_ok=True)  # to lock it; the CLI removes it again if the compare fails at once
    with RunLock(path):  # one writer: a second compare on the same --out stops here, nothing touched
        result = compare(cfg, out, command=command, on_run=progress)
    print(markdown_table(result["table"]))
    print(f"\nreport: {out.rstrip('/')}/report.html   (table: summary.md, numbers: summary.json)")
    return 0


def main(args) -> int:
    from depthlab.base.provenance import command_line

    return run_and_print(build_config(args), args.out, command_line(args.argv))
