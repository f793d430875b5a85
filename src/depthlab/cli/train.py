"""``depthlab train``: pre-train a model of one scheme on a corpus; resumable; torchrun-ready."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from depthlab.cli._args import check_preset, model_flags, model_from_args, scheme_help, schemes_epilog
from depthlab.cli._options import Section, add_config_flag
from depthlab.train.config import DIST_MODES, DTYPES, OPTIMIZERS, WEIGHT_DTYPES, TrainConfig

USAGE = """\
examples:
  depthlab train --preset tiny --scheme lns --data builtin --steps 300 --out runs/lns
  depthlab train --preset tiny --scheme pre --set n_layers=8 --data corpus.jsonl --text-field body --out runs/pre
  depthlab train --config run.yaml --out runs/a           # any option below from a YAML/JSON file
  depthlab train --config runs/a/config.json --out runs/b # run a again, exactly
  depthlab train --resume runs/lns                       # continue from the latest checkpoint
  depthlab train --init-from pruned/lns-12/run --data builtin --steps 300 --out runs/lns-12-healed
  depthlab train --preset vit-tiny --scheme lns:position=after-branch --data digits --out runs/vit
  torchrun --nproc_per_node 8 -m depthlab train --preset llama-130m --scheme lns \\
      --data hf:allenai/c4:en --tokenizer hf:t5-base --seq-len 256 --batch-size 512 --dist fsdp --out runs/130m

Unset options take the preset's defaults (docs/paper.md §4: lr, steps, warm-up, seq len 256, batch 512;
tiny: CPU-sized). Outputs in --out: config.json, tokenizer/, metrics.jsonl, summary.json, checkpoint/,
layer_variance.png and loss.png.
"""

#: Every TrainConfig field is a flag (``depthlab.cli._options``); its help is the field's comment.
TRAIN = Section("train", TrainConfig,
                choices={"optimizer": OPTIMIZERS, "dtype": DTYPES, "dist": DIST_MODES, "weights": WEIGHT_DTYPES})


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="pre-train a model (one normalization scheme) on a corpus",
                              description=__doc__ + "\n\n" + USAGE, epilog=schemes_epilog(),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    model_flags(p, scheme_help())
    TRAIN.add_to(p)
    r = p.add_argument_group("run directory")
    r.add_argument("--out", help="run directory (must not exist unless --resume)")
    r.add_argument("--resume", metavar="RUN_DIR", help="continue RUN_DIR from its latest checkpoint")
    r.add_argument("--init-from", metavar="SOURCE",
                   help="start a new run from the weights, model config and tokenizer of SOURCE: a depthlab run "
                        "(e.g. a pruned one: <prune --out>/run) or an HF model directory; fresh optimizer, step 0")
    r.add_argument("--allow-changed", metavar="KEYS",
                   help="with --resume: schedule settings that may differ from the saved run, "
                        "e.g. lr,warmup,min_lr_ratio (recorded in config.json)")
    r.add_argument("--no-plots", action="store_true", default=None,
                   help="skip layer_variance.png / loss.png in the run directory")
    r.add_argument("-q", "--quiet", action="store_true", default=None, help="no progress bar")
    add_config_flag(p)
    p.set_defaults(func=run)


def build_configs(args):
    """(model config, TrainConfig, out_dir, resume, start) from parsed args (saved config when resuming;
    the source's model and tokenizer with ``--init-from``)."""
    from depthlab.base.errors import DepthlabError
    from depthlab.models.kinds import config_from_saved
    from depthlab.train.rundir import saved_config

    resume = args.resume is not None
    if resume and args.init_from:
        raise DepthlabError("give --resume RUN_DIR or --init-from SOURCE, not both")
    if resume and args.out and Path(args.out).resolve() != Path(args.resume).resolve():
        raise DepthlabError(f"--out {args.out!r} differs from --resume {args.resume!r}; give one run directory")
    out = args.resume if resume else args.out
    if not out:
        raise DepthlabError("give --out RUN_DIR (or --resume RUN_DIR)")
    given = TRAIN.given(args)
    if args.init_from:
        model_cfg, train_cfg, start = _init_from(args, given)
        return model_cfg, train_cfg, out, False, start
    if not resume:
        return model_from_args(args), TrainConfig(**given), out, False, None
    saved = saved_config(Path(out))
    if args.preset and not args.scheme:
        args.scheme = saved["model"]["scheme"]  # a preset given on resume keeps the run's scheme
    model_cfg = model_from_args(args, base=config_from_saved(saved))
    return model_cfg, TrainConfig.from_dict({**saved["train"], **given}), out, True, None


def _init_from(args, given: dict):
    """(model config, TrainConfig, StartFrom) for ``--init-from``: the source's model config (its scheme and,
    for a pruned run, each block's original depth), weights and tokenizer; the run's settings from the flags."""
    from depthlab.base.errors import DepthlabError
    from depthlab.models.config import ModelConfig
    from depthlab.train.data import load_train_data
    from depthlab.train.start import StartFrom, load_source

    if args.preset or args.scheme or args.model_set or args.model_section:
        raise DepthlabError("--init-from takes the model from its source; drop --preset, --scheme and --set")
    src = load_source(args.init_from, "--init-from source")
    if not isinstance(src.model_cfg, ModelConfig):
        raise DepthlabError(f"--init-from {args.init_from!r} is not a language model; it starts LM runs only")
    start = StartFrom(src.tokenizer, src.state_dict, load_train_data, {"init_from": src.info})
    return src.model_cfg, TrainConfig(**{**given, "tokenizer": src.tokenizer.spec}), start


def _allowed(text: str | None, resume: bool) -> tuple[str, ...]:
    from depthlab.base.errors import DepthlabError

    keys = tuple(k.strip().replace("-", "_") for k in (text or "").split(",") if k.strip())
    if keys and not resume:
        raise DepthlabError(f"--allow-changed {text!r} applies to --resume only")
    return keys


def run(args) -> int:
    check_preset(args)  # before the imports below (torch): a misspelt preset is refused as fast as a bad flag
    from depthlab.base.provenance import command_line
    from depthlab.train import TrainingDiverged, train
    from depthlab.train.distributed import is_main_process

    model_cfg, train_cfg, out, resume, start = build_configs(args)
    try:
        summary = train(model_cfg, train_cfg, out, resume=resume, quiet=bool(args.quiet),
                        command=command_line(args.argv), allow_changed=_allowed(args.allow_changed, resume),
                        start=start)
    except TrainingDiverged as err:
        print(f"depthlab train: error: {err}", file=sys.stderr)
        return 1
    if is_main_process():
        if not args.no_plots:
            from depthlab.analysis.plots.training import run_figures

            run_figures(out)
        lv = summary["layer_variance"]
        headline = f"ppl {summary['eval_ppl']:.2f}" if "eval_ppl" in summary else \
            f"top-1 accuracy {100 * summary['eval_acc']:.2f} %"
        unit = "tokens" if "eval_ppl" in summary else "images"
        print(f"{out}: eval loss {summary['eval_loss']:.4f}, {headline}, "
              f"last-block variance {lv[-1]:.3g}, {summary['tokens']} {unit} in {summary['wall_s']:.1f}s "
              f"({summary['tokens_per_s']:.0f} {'tok' if unit == 'tokens' else 'img'}/s)")
    return 0
