"""``depthlab train``: pre-train a model of one scheme on a corpus; resumable; torchrun-ready."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from depthlab.cli._args import parse_overrides, scheme_help, schemes_epilog

USAGE = """\
examples:
  depthlab train --preset tiny --scheme lns --data builtin --steps 300 --out runs/lns
  depthlab train --preset tiny --scheme pre --set n_layers=8 --data corpus.jsonl --text-field body --out runs/pre
  depthlab train --resume runs/lns                       # continue from the latest checkpoint
  depthlab train --init-from pruned/lns-12/run --data builtin --steps 300 --out runs/lns-12-healed
  depthlab train --preset vit-tiny --scheme lns --set lns_position=after-branch --data digits --out runs/vit
  torchrun --nproc_per_node 8 -m depthlab train --preset llama-130m --scheme lns \\
      --data hf:allenai/c4:en --tokenizer hf:t5-base --seq-len 256 --batch-size 512 --dist fsdp --out runs/130m

Unset options take the preset's defaults (docs/paper.md §4: lr, steps, warm-up, seq len 256, batch 512;
tiny: CPU-sized). Outputs in --out: config.json, tokenizer/, metrics.jsonl, summary.json, checkpoint/,
layer_variance.png and loss.png.
"""


#: CLI flag (argparse dest) -> TrainConfig field, for the flags that map one to one.
_TRAIN_FLAGS = ("data", "val_data", "text_field", "tokenizer", "seq_len", "batch_size", "micro_batch_size", "steps",
                "lr", "warmup", "min_lr_ratio", "optimizer", "weight_decay", "grad_clip", "seed", "device", "dtype",
                "dist", "eval_every", "eval_tokens", "variance_every", "probe_batch_size", "log_every", "ckpt_every",
                "keep_last", "cache_dir", "removal_every")


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="pre-train a model (one normalization scheme) on a corpus",
                              description=__doc__ + "\n\n" + USAGE, epilog=schemes_epilog(),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    m = p.add_argument_group("model")
    m.add_argument("--preset", help="model preset (default tiny): an LM preset (depthlab.PRESETS) or a ViT preset "
                   "(vit-tiny, vit-s; then --data digits | IMAGE_DIR | hf:NAME)")
    m.add_argument("--scheme", help=scheme_help())
    m.add_argument("--set", action="append", metavar="KEY=VALUE", dest="model_set",
                   help="override a ModelConfig field or a scheme option, e.g. --set n_layers=8 (repeatable)")
    d = p.add_argument_group("data")
    d.add_argument("--data", help="builtin | file.txt/.jsonl/.parquet | dir | glob | hf:NAME[:CONFIG] | token-shard "
                   "dir; ViT presets: digits | folder of class sub-folders | hf:NAME")
    d.add_argument("--val-data", help="explicit held-out source (default: held-out split of --data)")
    d.add_argument("--text-field", help="text field of .jsonl/.parquet/hf data (default text)")
    d.add_argument("--tokenizer", help="bytes | bpe:N | hf:NAME_OR_PATH (default bpe:4096)")
    d.add_argument("--seq-len", type=int, help="tokens per sequence")
    d.add_argument("--no-pack", dest="pack", action="store_false", default=None,
                   help="pad each document instead of packing (pad positions masked)")
    d.add_argument("--streaming", action="store_true", default=None,
                   help="tokenize on the fly in stream order (default for hf: data; for corpora larger than memory)")
    o = p.add_argument_group("optimisation")
    o.add_argument("--batch-size", type=int, help="global batch in sequences")
    o.add_argument("--micro-batch-size", type=int, help="sequences per rank per forward (gradient accumulation)")
    o.add_argument("--steps", type=int, help="optimizer steps")
    o.add_argument("--lr", type=float, help="peak learning rate")
    o.add_argument("--warmup", type=float, help="warm-up: fraction of steps (<1) or number of steps")
    o.add_argument("--min-lr-ratio", type=float, help="cosine floor as a fraction of lr (default 0.1)")
    o.add_argument("--optimizer", choices=("adam", "adamw"))
    o.add_argument("--weight-decay", type=float)
    o.add_argument("--grad-clip", type=float, help="clip the global grad norm (default: no clipping)")
    o.add_argument("--seed", type=int, help="fixes init and data order (default 0)")
    x = p.add_argument_group("execution")
    x.add_argument("--device", help="cpu | cuda | cuda:N (default: cuda when available)")
    x.add_argument("--dtype", choices=("auto", "fp32", "bf16"), help="auto = bf16 autocast on CUDA, fp32 on CPU")
    x.add_argument("--compile", action="store_true", default=None, help="torch.compile the model")
    x.add_argument("--dist", choices=("none", "ddp", "fsdp"), help="under torchrun: DDP or FSDP2")
    r = p.add_argument_group("run directory, evaluation, checkpoints")
    r.add_argument("--out", help="run directory (must not exist unless --resume)")
    r.add_argument("--resume", metavar="RUN_DIR", help="continue RUN_DIR from its latest checkpoint")
    r.add_argument("--init-from", metavar="SOURCE",
                   help="start a new run from the weights, model config and tokenizer of SOURCE: a depthlab run "
                        "(e.g. a pruned one: <prune --out>/run) or an HF model directory; fresh optimizer, step 0")
    r.add_argument("--allow-changed", metavar="KEYS", default="",
                   help="with --resume: schedule settings that may differ from the saved run, "
                        "e.g. lr,warmup,min_lr_ratio (recorded in config.json)")
    r.add_argument("--eval-every", type=int, help="steps between held-out evaluations (0 = end only)")
    r.add_argument("--eval-tokens", type=int, help="held-out tokens per evaluation")
    r.add_argument("--variance-every", type=int, help="steps between depth probes (variance, tracking; default steps/20)")
    r.add_argument("--probe-batch-size", type=int, help="sequences in the fixed held-out probe batch (default 8)")
    r.add_argument("--no-track-depth", dest="track_depth", action="store_false", default=None,
                   help="probe the layerwise variance only (no angular distance, contribution, norm gain, removal)")
    r.add_argument("--no-track-removal", dest="track_removal", action="store_false", default=None,
                   help="track depth without the removal Δloss (L partial forwards per probe; for big models)")
    r.add_argument("--removal-every", type=int, help="the removal Δloss at every n-th probe and the last (default 4)")
    r.add_argument("--log-every", type=int, help="steps between train lines in metrics.jsonl (default 10)")
    r.add_argument("--ckpt-every", type=int, help="steps between checkpoints (0 = end only)")
    r.add_argument("--keep-last", type=int, help="checkpoints kept (default 2)")
    r.add_argument("--cache-dir", help="tokenizer/token cache (default $DEPTHLAB_CACHE or ~/.cache/depthlab)")
    r.add_argument("--tensorboard", action="store_true", default=None, help="also log to <out>/tensorboard")
    r.add_argument("--no-plots", action="store_true", help="skip layer_variance.png / loss.png in the run directory")
    r.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def build_configs(args):
    """(ModelConfig, TrainConfig, out_dir, resume, start) from parsed args (saved config when resuming;
    the source's model and tokenizer with ``--init-from``)."""
    from depthlab.configure import configure, from_preset
    from depthlab.errors import DepthlabError
    from depthlab.families import config_from_saved
    from depthlab.train import TrainConfig

    resume = args.resume is not None
    if resume and args.init_from:
        raise DepthlabError("give --resume RUN_DIR or --init-from SOURCE, not both")
    if resume and args.out and Path(args.out).resolve() != Path(args.resume).resolve():
        raise DepthlabError(f"--out {args.out!r} differs from --resume {args.resume!r}; give one run directory")
    out = args.resume if resume else args.out
    if not out:
        raise DepthlabError("give --out RUN_DIR (or --resume RUN_DIR)")
    given = {k: getattr(args, k) for k in _TRAIN_FLAGS if getattr(args, k) is not None}
    for flag in ("pack", "streaming", "compile", "tensorboard", "track_depth", "track_removal"):
        if getattr(args, flag) is not None:
            given[flag] = getattr(args, flag)
    overrides = parse_overrides(args.model_set)
    scheme = {"scheme": args.scheme} if args.scheme else {}  # before its options, so --set can name them
    if resume:
        cfg_path = Path(out) / "config.json"
        if not cfg_path.is_file():
            raise DepthlabError(f"cannot resume {out!r}: no config.json there (not a run directory)")
        saved = json.loads(cfg_path.read_text())
        if args.preset:
            model_cfg = from_preset(args.preset, **{"scheme": saved["model"]["scheme"], **scheme, **overrides})
        elif args.scheme or overrides:
            model_cfg = configure(config_from_saved(saved), **{**scheme, **overrides})
        else:
            model_cfg = config_from_saved(saved)
        train_cfg = TrainConfig.from_dict({**saved["train"], **given})
    elif args.init_from:
        model_cfg, train_cfg, start = _init_from(args, given)
        return model_cfg, train_cfg, out, False, start
    else:
        model_cfg = from_preset(args.preset or "tiny", **{**scheme, **overrides})
        train_cfg = TrainConfig(**given)
    return model_cfg, train_cfg, out, resume, None


def _init_from(args, given: dict):
    """(model config, TrainConfig, StartFrom) for ``--init-from``: the source's model config (its scheme and,
    for a pruned run, each block's original depth), weights and tokenizer; the run's settings from the flags."""
    from depthlab.config import ModelConfig
    from depthlab.errors import DepthlabError
    from depthlab.train import TrainConfig
    from depthlab.train.data import load_train_data
    from depthlab.train.start import StartFrom, load_source

    if args.preset or args.scheme or args.model_set:
        raise DepthlabError("--init-from takes the model from its source; drop --preset, --scheme and --set")
    src = load_source(args.init_from, "--init-from source")
    if not isinstance(src.model_cfg, ModelConfig):
        raise DepthlabError(f"--init-from {args.init_from!r} is not a language model; it starts LM runs only")
    start = StartFrom(src.tokenizer, src.state_dict, load_train_data, {"init_from": src.info})
    return src.model_cfg, TrainConfig(**{**given, "tokenizer": src.tokenizer.spec}), start


def _allowed(text: str, resume: bool) -> tuple[str, ...]:
    from depthlab.errors import DepthlabError

    keys = tuple(k.strip().replace("-", "_") for k in text.split(",") if k.strip())
    if keys and not resume:
        raise DepthlabError(f"--allow-changed {text!r} applies to --resume only")
    return keys


def run(args) -> int:
    from depthlab.provenance import command_line
    from depthlab.train import TrainingDiverged, train
    from depthlab.train.distributed import is_main_process

    model_cfg, train_cfg, out, resume, start = build_configs(args)
    try:
        summary = train(model_cfg, train_cfg, out, resume=resume, quiet=args.quiet, command=command_line(args.argv),
                        allow_changed=_allowed(args.allow_changed, resume), start=start)
    except TrainingDiverged as err:
        print(f"depthlab train: error: {err}", file=sys.stderr)
        return 1
    if is_main_process():
        if not args.no_plots:
            from depthlab.plots.training import run_figures

            run_figures(out)
        lv = summary["layer_variance"]
        headline = f"ppl {summary['eval_ppl']:.2f}" if "eval_ppl" in summary else \
            f"top-1 accuracy {100 * summary['eval_acc']:.2f} %"
        unit = "tokens" if "eval_ppl" in summary else "images"
        print(f"{out}: eval loss {summary['eval_loss']:.4f}, {headline}, "
              f"last-block variance {lv[-1]:.3g}, {summary['tokens']} {unit} in {summary['wall_s']:.1f}s "
              f"({summary['tokens_per_s']:.0f} {'tok' if unit == 'tokens' else 'img'}/s)")
    return 0
